"""holdpoint.diff and `python -m holdpoint diff` (the Python face of `holdpoint diff`, whose
own tests are tests/python/test_cli_diff.py and tests/unit/checkpoint_diff_test.cpp):
identical files are the same, one planted element is reported by path with its figures,
a tolerance admits it, the report equals the CLI's, and a file that does not verify raises
its code (exit 2 from the module)."""

import os
import shutil
import subprocess
import sys
import tempfile

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def module(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(harness.BUILD_DIR, "python"))
    return subprocess.run([sys.executable, "-m", "holdpoint", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def main():
    report = harness.Report("python_diff")
    tmp = tempfile.mkdtemp(prefix="holdpoint-py-diff-")
    try:
        a, b, bad = (os.path.join(tmp, n) for n in ("a.pt", "b.pt", "bad.pt"))
        torch.manual_seed(0)
        state = {"model": {"w": torch.randn(64, 8)}, "epoch": 3}
        torch.save(state, a)
        state["model"]["w"][5, 2] += 0.25
        torch.save(state, b)

        same = holdpoint.diff(a, a)
        report.check(same["same"] and not same["entries"], f"a file against itself: {same}")
        result = holdpoint.diff(a, b)
        entries = result["entries"]
        report.check(not result["same"] and len(entries) == 1 and entries[0]["path"] == "model/w",
                     f"one planted element: {entries}")
        deviation = entries[0].get("deviation", {}) if entries else {}
        report.check(deviation.get("differing") == 1 and abs(deviation.get("max_abs_deviation", 0) - 0.25) < 1e-6,
                     f"its figures: {deviation}")
        report.check(holdpoint.diff(a, b, atol=0.3)["same"], "atol 0.3 admits a deviation of 0.25")
        report.check(not holdpoint.diff(a, b, atol=0.1)["same"], "atol 0.1 does not")
        cli = harness.cli("diff", a, b)
        report.check(cli.returncode == 1 and cli.stdout == result["text"], f"the CLI prints the same report: "
                     f"{cli.describe()} vs {result['text']!r}")

        with open(a, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        with open(bad, "wb") as f:
            f.write(data)
        harness.expect_raises(report, "a damaged file", "zip_crc_mismatch", lambda: holdpoint.diff(a, bad),
                              holdpoint.Error)
        harness.expect_raises(report, "a missing file", "io_open_failed",
                              lambda: holdpoint.diff(a, os.path.join(tmp, "absent.pt")), holdpoint.Error)

        r = module("diff", a, a)
        report.check(r.returncode == 0 and r.stdout.startswith("same:"), f"python -m holdpoint diff, same: {r}")
        r = module("diff", a, b, "--json")
        report.check(r.returncode == 1 and '"model/w"' in r.stdout, f"python -m holdpoint diff --json: {r}")
        r = module("diff", a, bad)
        report.check(r.returncode == 2 and "zip_crc_mismatch" in r.stdout, f"python -m holdpoint diff, damaged: {r}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
