"""A 10-step CPU training run interrupted at step 5 (mid-epoch: batch 4 of 24
rows, so the cut falls at cursor 20) and resumed in a fresh process reaches the
same trajectory and the same final state, bit for bit, as the uninterrupted run;
the same resume without restoring the generators (negative control) diverges.

Compared: every update's sample ids, loss and learning rate (IEEE-754 bits), and
the final checkpoints' model, optimizer, scheduler, generators, sampler,
progress and history (holdpoint inspect --json --digests, which hashes every
tensor). The trainer is tests/tools/train_steps.cpp."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import harness

TRAINER = os.path.join(harness.BUILD_DIR, "tests", "tools", "train_steps")
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "sampler", "progress", "history"]


def train(report, out, steps, resume=None, omit_rng=False):
    args = [TRAINER, "--steps", str(steps), "--output", out]
    if resume:
        args += ["--resume", resume]
    if omit_rng:
        args.append("--omit-rng-restore")
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    report.check(r.returncode == 0, f"{' '.join(args[1:])}: exit {r.returncode}: {r.stderr.decode()[-300:]}")
    with open(os.path.join(out, "trace.json")) as f:
        return json.load(f)


def components(report, checkpoint):
    r = harness.inspect(checkpoint, digests=True)
    report.check(r.returncode == 0, f"inspect {checkpoint}: {r.describe()}")
    tree = dict((k["str"], v) for k, v in r.json()["tree"]["dict"])
    return {name: harness.normalize_storage_keys(tree.get(name)) for name in COMPONENTS}


def main():
    harness.require_executable(TRAINER)
    report = harness.Report("test_resume_fresh_process")
    tmp = tempfile.mkdtemp(prefix="holdpoint-resume-")
    try:
        a = train(report, os.path.join(tmp, "continuous"), 10)
        b1 = train(report, os.path.join(tmp, "interrupted"), 5)
        cut = os.path.join(tmp, "interrupted", "checkpoint.pt")
        b2 = train(report, os.path.join(tmp, "resumed"), 10, resume=cut)
        c = train(report, os.path.join(tmp, "no-rng"), 10, resume=cut, omit_rng=True)

        report.check(len(a["steps"]) == 10 and len(b1["steps"]) == 5 and len(b2["steps"]) == 5,
                     "step counts 10 / 5 / 5")
        report.check(b2.get("resumed_at_step") == 5, f"resumed at step {b2.get('resumed_at_step')}")
        report.check(b2.get("profile") == "cpu-shuffled-singleworker-v1", f"profile {b2.get('profile')}")
        report.check(b1["steps"][-1]["ids"] and a["steps"][4]["epoch"] == 0 and a["steps"][5]["epoch"] == 0,
                     "the cut at step 5 falls inside epoch 0")
        joined = b1["steps"] + b2["steps"]
        for x, y in zip(a["steps"], joined):
            report.check(x == y, f"step {x['step']}: continuous {x} vs interrupted+resumed {y}")
        ids = [i for s in a["steps"][:6] for i in s["ids"]]
        report.check(sorted(ids) == list(range(24)), "epoch 0 consumes every sample exactly once")

        final_a = components(report, os.path.join(tmp, "continuous", "checkpoint.pt"))
        final_b = components(report, os.path.join(tmp, "resumed", "checkpoint.pt"))
        for name in COMPONENTS:
            report.check(final_a[name] is not None and final_a[name] == final_b[name],
                         f"final {name} differs between the continuous and the resumed run")

        # Negative control: without the generators the trajectory must diverge
        # (dropout masks and the next epoch's order), or the test could not fail.
        diverged = any(x != y for x, y in zip(a["steps"][5:], c["steps"]))
        report.check(diverged, "resuming without restoring the generators did not diverge")
        final_c = components(report, os.path.join(tmp, "no-rng", "checkpoint.pt"))
        report.check(final_c["model"] != final_a["model"], "negative control reached the same parameters")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
