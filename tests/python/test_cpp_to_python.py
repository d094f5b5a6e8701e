"""holdpoint save_mapping -> Python: does torch load exactly what C++ wrote?

`write_interop_fixtures [--torch-1-13-compatible] OUTDIR` (tests/tools) saves a set
of Values with save_mapping, in the default encoding and in the torch 1.13
compatibility mode, and writes `<file>.expected.json`, the canonical tree of each
Value as built in C++. Run by torch 2.13 (the oracle), this test checks both
encodings; test_compat_cpp_to_python.py runs it with Debian's torch 1.13 for the
compatibility mode. For every file it checks that
  - Python's zipfile reads the archive and every CRC-32 is right (torch never checks CRCs);
  - torch.load(f, weights_only=True) accepts it;
  - the loaded object encodes (canonical.py, on real torch tensors) to the expected tree:
    same container kinds and key order, ints, strings, dtypes, shapes, strides, offsets,
    requires_grad, element bytes (SHA-256), and the same storage sharing (storage keys
    renumbered by first reference on both sides);
  - the independent oracle reads the same tree from the file's bytes.

Exit status 0 when everything matches, 1 otherwise.
"""

import io
import json
import os
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import canonical  # noqa: E402
import oracle  # noqa: E402

import torch  # noqa: E402

# Every fixture the tool must produce; a tool that silently writes fewer fails here.
EXPECTED_FIXTURES = [
    "dtypes", "shapes", "views", "two_views_one_storage", "tied", "unicode_keys", "nested", "int_edges",
    "floats", "many_entries", "ordered_dict", "ordered_dict_root", "bytes_compat",
]


# Encodings this interpreter's torch must read: torch 1.13's weights_only loader has
# no BINFLOAT, so it reads only the compatibility mode.
MODES = ["default", "compat"] if int(torch.__version__.split(".")[0]) >= 2 else ["compat"]


def main(modes=MODES):
    report = harness.Report(f"cpp_to_python (torch {torch.__version__}: {', '.join(modes)})")
    tool = os.path.join(harness.BUILD_DIR, "tests", "tools", "write_interop_fixtures")
    harness.require_executable(tool)
    with tempfile.TemporaryDirectory(prefix="holdpoint-cpp2py-") as root:
        for mode in modes:
            tmp = os.path.join(root, mode)
            flags = ["--torch-1-13-compatible"] if mode == "compat" else []
            result = harness.run([tool, *flags, tmp], timeout=120, limit_memory=False)
            report.check(result.returncode == 0, f"write_interop_fixtures {result.describe()}\n{result.stdout}")
            check_fixtures(report, tmp, mode)
    return report.finish()


def check_fixtures(report, tmp, mode):
    for fixture in EXPECTED_FIXTURES:
        name = f"{mode}/{fixture}"
        path = os.path.join(tmp, fixture + ".pt")
        if not report.check(os.path.isfile(path) and os.path.isfile(path + ".expected.json"),
                            f"{name}: the tool did not write {name}.pt and its expected tree"):
            continue
        with open(path + ".expected.json", encoding="utf-8") as f:
            expected = harness.normalize_storage_keys(json.load(f))
        with open(path, "rb") as f:
            data = f.read()

        try:
            bad = zipfile.ZipFile(io.BytesIO(data)).testzip()
            report.check(bad is None, f"{name}: zipfile finds a bad CRC-32 in {bad}")
        except (zipfile.BadZipFile, ValueError, NotImplementedError) as e:
            report.check(False, f"{name}: zipfile cannot read the archive: {e}")

        try:
            loaded = torch.load(path, weights_only=True)
        except Exception as e:  # any failure to load is the finding
            report.check(False, f"{name}: torch.load(weights_only=True) failed: {type(e).__name__}: {e}")
            loaded = None
        if loaded is not None:
            try:
                got = harness.normalize_storage_keys(canonical.encode(loaded, storage_keys="zip"))
                diff = canonical.first_difference(expected, got)
                report.check(diff is None, f"{name}: torch.load result differs (expected vs Python): {diff}")
            except TypeError as e:
                report.check(False, f"{name}: torch.load returned something unencodable: {e}")

        try:
            got = harness.normalize_storage_keys(oracle.load(path)["tree"])
            diff = canonical.first_difference(expected, got)
            report.check(diff is None, f"{name}: oracle reads a different tree (expected vs oracle): {diff}")
        except oracle.OracleError as e:
            report.check(False, f"{name}: oracle refused the file: {e}")


if __name__ == "__main__":
    sys.exit(main())
