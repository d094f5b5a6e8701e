"""Python torch.save -> holdpoint: does the C++ reader see exactly what Python wrote?

1. make_python_fixtures.py writes ~20 files with the running torch's own torch.save
   (torch 2.13, the oracle; test_compat_python_to_cpp.py runs it with torch 1.13) (zip and
   legacy `_use_new_zipfile_serialization=False`, pickle protocol 2 and 4) and, for each,
   the canonical tree of the LIVE object that was saved.
2. The oracle (oracle.py) must read every fixture to exactly that tree. This proves the
   oracle that test_corpus.py relies on, against ground truth rather than against C++.
3. `holdpoint inspect FILE --json --digests` must report the same tree (dtypes, shapes,
   strides, offsets, storage keys, requires_grad, Parameter-ness, SHA-256 of every
   tensor's elements, keys in order, int/float bits; storage keys up to renaming, so
   exactly which tensors share a storage), the right format, file size and
   SHA-256, and the same records: for zip files name, payload offset, size and CRC-32 as
   Python's zipfile finds them, for legacy streams each storage's offset and size.

Exit status 0 when everything matches, 1 otherwise (each mismatch is printed with a
path to the first differing node).
"""

import hashlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import canonical  # noqa: E402
import harness  # noqa: E402
import make_python_fixtures  # noqa: E402
import oracle  # noqa: E402


def main():
    report = harness.Report("python_to_cpp")
    harness.require_executable(harness.holdpoint_binary())
    with tempfile.TemporaryDirectory(prefix="holdpoint-py2cpp-") as tmp:
        paths = make_python_fixtures.write_fixtures(tmp)
        report.check(len(paths) >= 20, f"expected at least 20 fixtures, got {len(paths)}")
        for path in paths:
            name = os.path.basename(path)
            with open(path + ".expected.json", encoding="utf-8") as f:
                expected = json.load(f)
            with open(path, "rb") as f:
                data = f.read()
            legacy = data[:4] != b"PK\x03\x04"

            # The oracle against ground truth.
            try:
                got = oracle.load(path)
                diff = canonical.first_difference(expected, got["tree"])
                report.check(diff is None, f"{name}: oracle disagrees with the saved object: {diff}")
            except oracle.OracleError as e:
                report.check(False, f"{name}: oracle refused a torch.save file: {e}")

            # The C++ reader against ground truth.
            result = harness.inspect(path)
            if not report.check(result.returncode == 0, f"{name}: inspect {result.describe()}"):
                continue
            try:
                out = result.json()
            except ValueError as e:
                report.check(False, f"{name}: inspect printed invalid JSON: {e}")
                continue
            # Storage keys are compared up to renaming: the CLI may number storages by first
            # reference instead of printing the file's keys (legacy keys are addresses).
            diff = canonical.first_difference(harness.normalize_storage_keys(expected),
                                              harness.normalize_storage_keys(out.get("tree")))
            report.check(diff is None, f"{name}: tree differs (expected vs holdpoint): {diff}")
            fmt = "pytorch_legacy" if legacy else "pytorch_zip"
            report.check(out.get("format") == fmt, f"{name}: format {out.get('format')!r}, expected {fmt!r}")
            report.check(out.get("bytes") == len(data), f"{name}: bytes {out.get('bytes')} != {len(data)}")
            sha = hashlib.sha256(data).hexdigest()
            report.check(out.get("sha256") == sha, f"{name}: sha256 {out.get('sha256')} != {sha}")
            storages = harness.count_storages(expected)
            summary = out.get("summary") or {}
            report.check(summary.get("storages") == storages,
                         f"{name}: summary.storages {summary.get('storages')} != {storages}")
            harness.check_records(report, name, data, fmt, out.get("records"))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
