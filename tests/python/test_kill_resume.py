"""Real crashes: a training process on a run directory (tests/tools/train_run.cpp)
is SIGKILLed at 30+ random moments, many of them inside a save, and restarted
each time; it must end with parameters bit-identical to an uninterrupted run,
and the run directory must verify (`holdpoint verify RUN`). Then preemption:
SIGTERM makes it save at the next step boundary and exit 75 with LATEST at
that step; a second signal makes it exit 76 at once, and the run still
resumes to the same result.

Kills alternate between synchronous and asynchronous saves. Before each
restart the directory is inspected read-only (`holdpoint ls --json`), which
counts kills that left a staging file or an uncommitted generation behind:
kills that landed inside a save.

HOLDPOINT_KILL_CYCLES sets the number of kills (default 32; 300 in the opt-in
long tier, HOLDPOINT_LARGE_TESTS=1)."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness

TRAINER = os.path.join(harness.BUILD_DIR, "tests", "tools", "train_run")
STEPS = 160
COMMON = ["--steps", str(STEPS), "--every", "2", "--width", "2048", "--keep-last", "3"]
PACE_MS = 40
SIGNAL_AFTER_S = 0.5
KILLS = int(os.environ.get("HOLDPOINT_KILL_CYCLES", "300" if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1" else "32"))


def start(run_dir, asynchronous, paced=False):
    args = [TRAINER, "--run", run_dir] + COMMON + (["--async"] if asynchronous else [])
    if paced:
        # At least 40 ms a step (6.4 s a run) however fast or loaded the
        # machine: a signal sent half a second in always lands mid-run.
        args += ["--sleep-ms", str(PACE_MS)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=300):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def final_line(out):
    for line in out.splitlines():
        if line.startswith("final "):
            return line
    return None


def ls_json(run_dir):
    r = harness.run([harness.holdpoint_binary(), "ls", run_dir, "--json"], timeout=60)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, None


def left_mid_save(listing):
    """True when a read-only look finds what only an interrupted save leaves."""
    recovery = (listing or {}).get("recovery") or {}
    return bool(recovery.get("removed_staging") or recovery.get("removed_uncommitted"))


def wait_for_line(process, prefix, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            return None
        if line.startswith(prefix):
            return line
    return None


def main():
    report = harness.Report("kill_resume")
    harness.require_executable(TRAINER)
    harness.require_executable(harness.holdpoint_binary())
    rng = random.Random(20261130)
    work = tempfile.mkdtemp(prefix="holdpoint-kill-")
    try:
        # The uninterrupted reference, which also measures how long a run takes.
        reference_dir = os.path.join(work, "reference")
        began = time.time()
        code, out, err = finish(start(reference_dir, False))
        duration = time.time() - began
        reference = final_line(out)
        report.check(code == 0 and reference, f"reference run: exit {code}: {err[-300:]}")
        if not reference:
            return report.finish()
        print(f"reference: {reference} in {duration:.2f} s")

        # Kill at random moments until KILLS kills happened; a run that
        # completes first is checked and a new run directory starts.
        kills = mid_save = rounds = 0
        while kills < KILLS:
            rounds += 1
            run_dir = os.path.join(work, f"killed-{rounds}")
            completed = False
            while not completed:
                process = start(run_dir, asynchronous=kills % 2 == 1)
                time.sleep(rng.uniform(0.05, max(0.3, duration * 0.45)))
                if process.poll() is None and kills < KILLS:
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    kills += 1
                    code, listing = ls_json(run_dir) if os.path.isdir(run_dir) else (0, None)
                    report.check(code in (0, 1, 2), f"ls after kill {kills}: exit {code}")
                    if left_mid_save(listing):
                        mid_save += 1
                    continue
                code, out, err = finish(process)
                report.check(code == 0, f"round {rounds}: exit {code}: {err[-400:]}")
                line = final_line(out)
                report.check(line == reference, f"round {rounds}: {line!r} differs from the reference {reference!r}")
                v = harness.run([harness.holdpoint_binary(), "verify", run_dir], timeout=120)
                report.check(v.returncode == 0, f"round {rounds}: holdpoint verify RUN: {v.describe()}")
                completed = True
        print(f"{kills} kills over {rounds} run(s); {mid_save} left an interrupted save behind")
        report.check(kills >= 30, f"only {kills} kills")
        report.check(mid_save >= 3, f"only {mid_save} kills landed inside a save; the test lost its point")

        # Preemption: one SIGTERM saves at the next step boundary and exits 75.
        run_dir = os.path.join(work, "preempted")
        process = start(run_dir, asynchronous=True, paced=True)
        report.check(wait_for_line(process, "fresh") is not None, "preempted run did not start")
        time.sleep(SIGNAL_AFTER_S)
        process.send_signal(signal.SIGTERM)
        code, out, err = finish(process)
        report.check(code == 75, f"SIGTERM: exit {code} (want 75): {err[-300:]}")
        steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("preempted ")]
        report.check(len(steps) == 1, f"SIGTERM: no 'preempted' line in {out!r}")
        with open(os.path.join(run_dir, "LATEST")) as f:
            latest = f.read().split()[0]
        if steps:
            report.check(latest == f"step-{steps[0]:08d}.pt", f"LATEST is {latest}, the preempted step was {steps[0]}")
        code, out, err = finish(start(run_dir, asynchronous=False))
        report.check(code == 0 and final_line(out) == reference, f"after preemption: exit {code}, {final_line(out)}")

        # A second signal aborts at once (exit 76); nothing is corrupted.
        run_dir = os.path.join(work, "aborted")
        process = start(run_dir, asynchronous=False, paced=True)
        report.check(wait_for_line(process, "fresh") is not None, "aborted run did not start")
        time.sleep(SIGNAL_AFTER_S)
        # Two different signals: two identical standard signals sent back to
        # back may be merged into one by the kernel before delivery.
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGINT)
        code, out, err = finish(process)
        report.check(code == 76, f"two signals: exit {code} (want 76): {err[-300:]}")
        code, out, err = finish(start(run_dir, asynchronous=True))
        report.check(code == 0 and final_line(out) == reference, f"after abort: exit {code}, {final_line(out)}")
        v = harness.run([harness.holdpoint_binary(), "verify", run_dir], timeout=120)
        report.check(v.returncode == 0, f"after abort: holdpoint verify RUN: {v.describe()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
