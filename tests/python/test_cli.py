"""The holdpoint command line, end to end: exit codes (0 valid, 1 invalid, 2 usage or
I/O), expected digests and sha256sum sidecars, JSON reports, `convert` in both
directions (checked against what Python's torch wrote and what it loads back), and
`codes` against the X-macro list in include/holdpoint/base/error.h.

Run by ctest with the oracle Python (torch 2.13)."""

import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
from collections import OrderedDict

import torch

import harness
import oracle

HOLDPOINT = harness.holdpoint_binary()
cli = harness.cli
first_code = harness.first_code


def state_dict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    model(torch.randn(5, 4))  # moves the running statistics
    return model.state_dict()


def check_verify(report, tmp):
    path = os.path.join(tmp, "model.pt")
    torch.save(state_dict(), path)
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()

    r = cli("verify", path)
    report.check(r.returncode == 0 and r.stdout.startswith("valid:"), f"verify valid file: {r.describe()}")
    r = cli("verify", path, "--sha256", digest)
    report.check(r.returncode == 0 and "digest matches" in r.stdout, f"verify --sha256 right: {r.describe()}")
    r = cli("verify", path, "--sha256", "0" * 64)
    report.check(r.returncode == 1 and first_code(r) == "sha256_mismatch", f"verify --sha256 wrong: {r.describe()}")
    r = cli("verify", path, "--sha256", "xyz")
    report.check(r.returncode == 2 and first_code(r) == "sha256_invalid", f"verify --sha256 malformed: {r.describe()}")

    # Sidecars: what sha256sum writes is what --sidecar reads.
    r = cli("verify", path, "--sidecar")
    report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"missing sidecar: {r.describe()}")
    with open(path + ".sha256", "w") as f:
        f.write(f"{digest}  model.pt\n")
    r = cli("verify", path, "--sidecar")
    report.check(r.returncode == 0, f"sha256sum-style sidecar: {r.describe()}")
    with open(path + ".sha256", "w") as f:
        f.write(f"{digest}  other.pt\n")
    r = cli("verify", path, "--sidecar")
    report.check(r.returncode == 1 and first_code(r) == "sidecar_invalid", f"sidecar for another file: {r.describe()}")
    r = cli("verify", path, "--sidecar", "--sha256", digest)
    report.check(r.returncode == 2, f"--sidecar with --sha256 is a usage error: {r.describe()}")

    r = cli("verify", path, "--json")
    report.check(r.returncode == 0, f"verify --json: {r.describe()}")
    if r.returncode == 0:
        out = r.json()
        report.check(out.get("valid") is True and out.get("sha256") == digest and out.get("format") == "pytorch_zip",
                     f"verify --json fields: {out}")

    # One flipped byte inside a tensor's record: invalid, with the damage named, in
    # both output forms.
    damaged = os.path.join(tmp, "damaged.pt")
    data = bytearray(open(path, "rb").read())
    record = next(r for r in oracle.zip_records(bytes(data)) if r["name"].startswith("data/") and r["size"] > 0)
    data[record["offset"]] ^= 0xFF
    open(damaged, "wb").write(data)
    r = cli("verify", damaged)
    report.check(r.returncode == 1 and first_code(r) == "zip_crc_mismatch", f"damaged file: {r.describe()}")
    r = cli("verify", damaged, "--json")
    report.check(r.returncode == 1 and r.json().get("code") == "zip_crc_mismatch", f"damaged --json: {r.describe()}")

    r = cli("verify", os.path.join(tmp, "missing.pt"))
    report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"missing file: {r.describe()}")
    r = cli("verify", tmp)
    report.check(r.returncode == 2 and first_code(r) == "io_not_regular_file", f"directory: {r.describe()}")


def check_inspect(report, tmp):
    path = os.path.join(tmp, "inspect.pt")
    sd = state_dict()
    torch.save(sd, path)
    r = cli("inspect", path)
    report.check(r.returncode == 0, f"inspect: {r.describe()}")
    for key in sd:
        report.check(f"'{key}': Tensor" in r.stdout, f"inspect lists {key}")
    r = cli("inspect", path, "--json")
    report.check(r.returncode == 0, f"inspect --json: {r.describe()}")
    if r.returncode == 0:
        out = r.json()
        report.check(out["summary"]["tensors"] == len(sd), f"tensor count {out['summary']}")
        report.check(out["markers"].get("version") == 3 and out["markers"].get("uses_binfloat") is False,
                     f"markers {out['markers']}")
        report.check(out["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest(), "inspect sha256")
    bad = os.path.join(tmp, "bad.pt")
    open(bad, "wb").write(b"definitely not a checkpoint")
    r = cli("inspect", bad)
    report.check(r.returncode == 1 and first_code(r) == "unknown_format", f"inspect invalid: {r.describe()}")


def check_convert(report, tmp):
    source = os.path.join(tmp, "source.pt")
    sd = state_dict()
    torch.save(sd, source)
    st = os.path.join(tmp, "model.safetensors")
    back = os.path.join(tmp, "back.pt")

    r = cli("convert", source, st, "--sidecar")
    report.check(r.returncode == 0 and "verified by re-reading" in r.stdout, f"convert to safetensors: {r.describe()}")
    report.check(os.path.exists(st + ".sha256"), "convert --sidecar wrote the sidecar")
    r = cli("verify", st, "--sidecar")
    report.check(r.returncode == 0, f"converted file matches its sidecar: {r.describe()}")
    r = cli("convert", st, back)
    report.check(r.returncode == 0, f"convert back to .pt: {r.describe()}")
    if r.returncode == 0:
        # Python loads the round-tripped file with the restricted loader and gets the
        # same tensors it saved, bit for bit.
        loaded = torch.load(back, weights_only=True)
        report.check(list(loaded) == list(sd), f"keys survive in order: {list(loaded)} vs {list(sd)}")
        for key, value in sd.items():
            other = loaded.get(key)
            report.check(other is not None and other.dtype == value.dtype and torch.equal(other, value),
                         f"{key} survives pt -> safetensors -> pt")

    nested = os.path.join(tmp, "nested.pt")
    torch.save({"model": sd, "epoch": 3}, nested)
    out = os.path.join(tmp, "nested.safetensors")
    r = cli("convert", nested, out)
    report.check(r.returncode == 1 and first_code(r) == "convert_not_flat", f"nested mapping: {r.describe()}")
    report.check(not os.path.exists(out), "a refused conversion writes nothing")
    leftovers = [n for n in os.listdir(tmp) if ".staging-" in n]
    report.check(not leftovers, f"no staging files left: {leftovers}")


def check_convert_plain_dict_is_not_dict_vs_ordereddict(report, tmp):
    """Regression: every file Python wrote with torch.save({...}) failed conversion to
    safetensors with "converted file differs from the input: <root>: dict vs OrderedDict".
    safetensors has one mapping type and no requires_grad, so the check after writing
    compares keys, dtypes, shapes and bytes only."""
    source = os.path.join(tmp, "plain_dict.pt")
    saved = {"w": torch.nn.Parameter(torch.arange(6.0).reshape(2, 3)), "b": torch.tensor([1, 2, 3])}
    torch.save(saved, source)
    out = os.path.join(tmp, "plain_dict.safetensors")
    r = cli("convert", source, out)
    report.check(r.returncode == 0 and "verified by re-reading" in r.stdout, f"plain dict -> safetensors: {r.describe()}")
    report.check("dict vs OrderedDict" not in r.stderr, "no dict vs OrderedDict difference is reported")
    if r.returncode == 0:
        from safetensors.torch import load_file
        loaded = load_file(out)
        report.check(set(loaded) == set(saved) and all(torch.equal(loaded[k], saved[k].detach()) for k in saved),
                     "safetensors' loader reads the tensors torch.save wrote")
    # The .pt direction keeps the plain dict (a .pt file can hold it).
    back = os.path.join(tmp, "plain_dict.back.pt")
    r = cli("convert", source, back)
    report.check(r.returncode == 0, f"plain dict -> .pt: {r.describe()}")
    if r.returncode == 0:
        loaded = torch.load(back, weights_only=True)
        report.check(type(loaded) is dict and loaded["w"].requires_grad, f"plain dict -> .pt keeps {type(loaded)}")


def check_safetensors_leading_whitespace(report, tmp):
    """JSON whitespace around the header object is valid (the reference parses the header
    with serde_json); anything else before the '{' is not safetensors."""
    from safetensors import deserialize
    body = json.dumps({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = struct.pack("<ff", 1.5, -2.0)

    def write(name, header):
        path = os.path.join(tmp, name)
        raw = struct.pack("<Q", len(header)) + header + data
        with open(path, "wb") as f:
            f.write(raw)
        return path, raw

    for label, header in (("space", b" " + body), ("newline", b"\n" + body), ("tab", b"\t" + body),
                          ("mixed", b"\r\n \t  " + body), ("both ends", b"  " + body + b" \n\t")):
        path, raw = write(f"ws-{label}.safetensors", header)
        deserialize(raw)  # the reference accepts it
        r = harness.inspect(path)
        report.check(r.returncode == 0 and r.json()["format"] == "safetensors", f"leading {label}: {r.describe()}")
        if r.returncode == 0:
            # The entries, whichever mapping kind each side calls the root.
            ours = harness.normalize_storage_keys(list(r.json()["tree"].values())[0])
            theirs = harness.normalize_storage_keys(list(oracle.load(path)["tree"].values())[0])
            report.check(ours == theirs, f"leading {label}: inspect differs from the oracle")
        r = cli("verify", path)
        report.check(r.returncode == 0, f"leading {label}: verify {r.describe()}")
        out = os.path.join(tmp, f"ws-{label}.pt")
        r = cli("convert", path, out)
        report.check(r.returncode == 0 and torch.equal(torch.load(out, weights_only=True)["t"], torch.tensor([1.5, -2.0])),
                     f"leading {label}: convert to .pt {r.describe()}")

    # Not JSON whitespace: the reference refuses these, and holdpoint does not take them
    # for safetensors at all.
    for label, header in (("form feed", b"\x0c" + body), ("vertical tab", b"\x0b" + body),
                          ("no-break space", b"\xc2\xa0" + body), ("NUL", b"\x00" + body),
                          ("byte order mark", b"\xef\xbb\xbf" + body), ("only blanks", b"    ")):
        path, raw = write(f"not-ws-{label}.safetensors", header)
        try:
            deserialize(raw)
            report.check(False, f"{label}: the reference accepted it")
        except Exception:  # noqa: BLE001 - any refusal by the reference will do
            pass
        r = cli("inspect", path)
        report.check(r.returncode == 1 and first_code(r) == "unknown_format", f"{label} before '{{': {r.describe()}")
    # Text with blanks after byte 8: its first 8 bytes are no plausible header length.
    for label, text in (("prose", b"This is text      {not json}"), ("eight blanks", b"        \n {}")):
        path = os.path.join(tmp, f"text-{label}.txt")
        with open(path, "wb") as f:
            f.write(text)
        r = cli("inspect", path)
        report.check(r.returncode == 1 and first_code(r) == "unknown_format", f"{label}: {r.describe()}")


def check_codes(report):
    with open(os.path.join(harness.SOURCE_DIR, "include", "holdpoint", "base", "error.h"), encoding="utf-8") as f:
        declared = re.findall(r"^\s*X\(([a-z0-9_]+),", f.read(), re.MULTILINE)
    r = cli("codes")
    report.check(r.returncode == 0, f"codes: {r.describe()}")
    listed = [line.split("\t")[0] for line in r.stdout.splitlines() if line]
    report.check(listed == declared, f"codes lists exactly error.h's codes ({len(listed)} vs {len(declared)})")
    r = cli("codes", "--json")
    report.check(r.returncode == 0 and [x["code"] for x in r.json()] == declared, "codes --json")
    report.check(all(x["meaning"] for x in r.json()), "every code has a meaning")


def check_usage(report):
    for args in ([], ["frobnicate"], ["verify"], ["convert", "only-one-arg"]):
        r = cli(*args)
        report.check(r.returncode == 2, f"usage error {args}: {r.describe()}")
    r = cli("--version")
    report.check(r.returncode == 0 and r.stdout.startswith("holdpoint "), f"--version: {r.describe()}")


def main():
    harness.require_executable(HOLDPOINT)
    report = harness.Report("test_cli")
    tmp = tempfile.mkdtemp(prefix="holdpoint-cli-")
    try:
        check_verify(report, tmp)
        check_inspect(report, tmp)
        check_convert(report, tmp)
        check_convert_plain_dict_is_not_dict_vs_ordereddict(report, tmp)
        check_safetensors_leading_whitespace(report, tmp)
        check_codes(report)
        check_usage(report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
