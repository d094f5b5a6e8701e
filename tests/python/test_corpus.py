"""Verdicts on the real-world and hostile corpus (tests/corpus), driven by
tests/corpus_verdicts.tsv (path, verdict, code, note).

For every row, under an address-space cap (4 GB, skipped on sanitized builds) and a
20 s timeout per run:
  accept:  `holdpoint verify` and `verify --json` exit 0; `inspect --json --digests`
           exits 0 and reports the tree the independent oracle (oracle.py) reads from
           the same bytes (storage keys up to renaming), the same format, size and
           SHA-256, and the records Python's zipfile (zip) or the oracle (legacy
           storages, safetensors tensors) finds. For safetensors the oracle is a small
           JSON/struct decoder; dict vs ordered dict is not compared.
  reject:  `verify` exits 1 and prints `invalid: <code>: ...` with the row's code;
           `verify --json` agrees; `inspect` exits 1 (never prints a tree); and the
           oracle refuses the file too (a cross-check of the verdict itself).
A code of `?` accepts any rejection code and prints it, for rows not pinned yet.

Then every non-zip sample in malicious/ is wrapped as the data.pkl of a well-formed
archive, so that it reaches the pickle VM: holdpoint may accept it only if the oracle
reads it to the same tree, and must otherwise reject it with a pickle/storage/tensor
code, within the same bounds.

Every file under tests/corpus/{real_pt,malicious,safetensors} must have a row, and every
row must name an existing file. Exit status 0 when all checks pass, 1 otherwise.
"""

import hashlib
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import canonical  # noqa: E402
import harness  # noqa: E402
import oracle  # noqa: E402

CORPUS_FOLDERS = ("real_pt", "malicious", "safetensors")
VERDICTS = os.path.join(harness.SOURCE_DIR, "tests", "corpus_verdicts.tsv")


def error_code_names():
    with open(os.path.join(harness.SOURCE_DIR, "include", "holdpoint", "base", "error.h"), encoding="utf-8") as f:
        return set(re.findall(r"^\s*X\((\w+),", f.read(), re.M))


def read_verdicts(report, codes):
    rows = {}
    with open(VERDICTS, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith("#") or line.startswith("path\t"):
                continue
            fields = line.split("\t")
            if not report.check(len(fields) == 4, f"corpus_verdicts.tsv:{lineno}: expected 4 columns"):
                continue
            path, verdict, code, note = fields
            report.check(path not in rows, f"corpus_verdicts.tsv:{lineno}: duplicate row for {path}")
            report.check(verdict in ("accept", "reject"), f"corpus_verdicts.tsv:{lineno}: verdict {verdict!r}")
            if verdict == "reject":
                report.check(code == "?" or code in codes, f"corpus_verdicts.tsv:{lineno}: unknown code {code!r}")
            else:
                report.check(code == "-", f"corpus_verdicts.tsv:{lineno}: accept rows have code '-'")
            rows[path] = (verdict, code, note)
    return rows


def corpus_files():
    out = []
    for folder in CORPUS_FOLDERS:
        for name in sorted(os.listdir(os.path.join(harness.CORPUS_DIR, folder))):
            out.append(f"{folder}/{name}")
    return out


def normalize_safetensors(tree):
    """Whether the header's object is read as a dict or an ordered dict is a representation
    choice; entry order, dtypes, shapes, strides, offsets and digests are not."""
    tree = harness.normalize_storage_keys(tree)
    if isinstance(tree, dict) and len(tree) == 1 and next(iter(tree)) in ("dict", "odict"):
        return {"dict": next(iter(tree.values()))}
    return tree


def printed_code(text):
    m = re.search(r"^invalid: (\w+): ", text, re.M)
    return m.group(1) if m else None


def check_accept(report, rel, path, data):
    binary = harness.holdpoint_binary()
    r = harness.run([binary, "verify", path])
    report.check(r.returncode == 0, f"{rel}: verify should accept, got {r.describe()}")
    r = harness.run([binary, "verify", path, "--json"])
    if report.check(r.returncode == 0, f"{rel}: verify --json should accept, got {r.describe()}"):
        try:
            report.check(r.json().get("valid") is True, f"{rel}: verify --json did not say valid: {r.stdout[:200]}")
        except ValueError:
            report.check(False, f"{rel}: verify --json printed invalid JSON: {r.stdout[:200]}")

    try:
        want = oracle.load(path)
    except oracle.OracleError as e:
        report.check(False, f"{rel}: the oracle refuses a file the verdict accepts: {e}")
        return
    r = harness.inspect(path)
    if not report.check(r.returncode == 0, f"{rel}: inspect {r.describe()}"):
        return
    try:
        out = r.json()
    except ValueError as e:
        report.check(False, f"{rel}: inspect printed invalid JSON: {e}")
        return
    report.check(out.get("format") == want["format"], f"{rel}: format {out.get('format')!r} != {want['format']!r}")
    report.check(out.get("bytes") == len(data), f"{rel}: bytes {out.get('bytes')} != {len(data)}")
    sha = hashlib.sha256(data).hexdigest()
    report.check(out.get("sha256") == sha, f"{rel}: sha256 {out.get('sha256')} != {sha}")
    if want["format"] == "safetensors":
        diff = canonical.first_difference(normalize_safetensors(want["tree"]), normalize_safetensors(out.get("tree")))
    else:
        diff = canonical.first_difference(harness.normalize_storage_keys(want["tree"]),
                                          harness.normalize_storage_keys(out.get("tree")))
    report.check(diff is None, f"{rel}: tree differs (oracle vs holdpoint): {diff}")
    harness.check_records(report, rel, data, want["format"], out.get("records"))


def check_reject(report, rel, path, code):
    binary = harness.holdpoint_binary()
    r = harness.run([binary, "verify", path])
    got = printed_code(r.stdout + "\n" + r.stderr)
    if report.check(r.returncode == 1, f"{rel}: verify should reject (exit 1), got {r.describe()}"):
        if code == "?":
            print(f"  NOTE {rel}: rejected with {got} (row not pinned)")
            report.check(got is not None, f"{rel}: verify printed no 'invalid: <code>:' line")
        else:
            report.check(got == code, f"{rel}: rejected with {got}, expected {code}")
    r = harness.run([binary, "verify", path, "--json"])
    if report.check(r.returncode == 1, f"{rel}: verify --json should exit 1, got {r.describe()}"):
        try:
            j = r.json()
            report.check(j.get("valid") is False and (code == "?" or j.get("code") == code) and j.get("code") == got,
                         f"{rel}: verify --json says {j}, expected code {code} (plain verify said {got})")
        except ValueError:
            report.check(False, f"{rel}: verify --json printed invalid JSON: {r.stdout[:200]}")
    r = harness.inspect(path, digests=False)
    report.check(r.returncode == 1 and '"tree"' not in r.stdout,
                 f"{rel}: inspect should fail (exit 1), got {r.describe()}")
    # The oracle runs in a bounded child process: these files are hostile.
    r = harness.run([sys.executable, "-I", oracle.__file__, path, "--no-digests"])
    report.check(r.returncode == 1, f"{rel}: the oracle should refuse a file the verdict rejects, got "
                 f"{r.describe()}")


# Codes of the layers that judge pickle content, as opposed to container detection.
PAYLOAD_CODE_PREFIXES = ("pickle_", "persistent_id_", "storage_", "tensor_")


def wrap_as_checkpoint(payload, path):
    """A well-formed zip checkpoint whose data.pkl is `payload`, so that the payload reaches
    the pickle VM instead of stopping at format detection."""
    harness.pickle_archive(path, payload)


def check_wrapped_payload(report, rel, data, tmpdir, codes_seen):
    """Differential check of the pickle VM against the oracle on a hostile payload:
    holdpoint may accept only what the oracle reads to the same tree; otherwise it must
    reject it (exit 1) from a pickle/storage/tensor layer, within the resource bounds."""
    path = os.path.join(tmpdir, rel.replace("/", "__") + ".wrapped.pt")
    wrap_as_checkpoint(data, path)
    label = f"{rel} (as data.pkl)"
    r = harness.run([harness.holdpoint_binary(), "verify", path, "--json"])
    if r.returncode == 1:
        try:
            code = r.json().get("code")
        except ValueError:
            code = None
        codes_seen[code] = codes_seen.get(code, 0) + 1
        report.check(isinstance(code, str) and code.startswith(PAYLOAD_CODE_PREFIXES),
                     f"{label}: rejected with {code}, expected a pickle/storage/tensor-layer code")
        return
    if not report.check(r.returncode == 0, f"{label}: verify {r.describe()}"):
        return
    codes_seen["accepted"] = codes_seen.get("accepted", 0) + 1
    o = harness.run([sys.executable, "-I", oracle.__file__, path], timeout=60)
    if not report.check(o.returncode == 0, f"{label}: holdpoint accepts what the oracle refuses: {o.stdout[:200]}"):
        return
    r = harness.inspect(path)
    if report.check(r.returncode == 0, f"{label}: inspect {r.describe()}"):
        diff = canonical.first_difference(harness.normalize_storage_keys(json.loads(o.stdout)["tree"]),
                                          harness.normalize_storage_keys(r.json().get("tree")))
        report.check(diff is None, f"{label}: tree differs (oracle vs holdpoint): {diff}")


def main():
    report = harness.Report("corpus")
    harness.require_executable(harness.holdpoint_binary())
    if harness.SANITIZED:
        print("sanitized build: running without the address-space cap")
    rows = read_verdicts(report, error_code_names())
    files = corpus_files()
    for rel in files:
        report.check(rel in rows, f"{rel}: no row in tests/corpus_verdicts.tsv")
    for rel in rows:
        report.check(rel in files, f"corpus_verdicts.tsv names {rel}, which is not in the corpus")
    for rel in files:
        if rel not in rows:
            continue
        verdict, code, _ = rows[rel]
        path = os.path.join(harness.CORPUS_DIR, rel)
        with open(path, "rb") as f:
            data = f.read()
        if verdict == "accept":
            check_accept(report, rel, path, data)
        else:
            check_reject(report, rel, path, code)

    # Most hostile samples are bare pickles that stop at format detection (unknown_format);
    # wrapped into a valid archive they exercise the pickle VM itself.
    codes_seen = {}
    with tempfile.TemporaryDirectory(prefix="holdpoint-corpus-") as tmpdir:
        for rel in files:
            if not rel.startswith("malicious/"):
                continue
            with open(os.path.join(harness.CORPUS_DIR, rel), "rb") as f:
                data = f.read()
            if data[:4] != b"PK\x03\x04":
                check_wrapped_payload(report, rel, data, tmpdir, codes_seen)
    print("wrapped payloads:", ", ".join(f"{k}={v}" for k, v in sorted(codes_seen.items(), key=str)))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
