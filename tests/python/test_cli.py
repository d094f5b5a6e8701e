"""The holdpoint command line, end to end: exit codes (0 valid, 1 invalid, 2 usage or
I/O), expected digests and sha256sum sidecars, JSON reports, `convert` in both
directions (checked against what Python's torch wrote and what it loads back), and
`codes` against the X-macro list in include/holdpoint/error.h.

Run by ctest with Debian's /usr/bin/python3 (torch 1.13)."""

import hashlib
import json
import os
import re
import shutil
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


def check_codes(report):
    with open(os.path.join(harness.SOURCE_DIR, "include", "holdpoint", "error.h"), encoding="utf-8") as f:
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
        check_codes(report)
        check_usage(report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
