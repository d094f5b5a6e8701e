"""The c10d/Gloo smoke example (examples/ddp/allreduce_smoke, docs/distributed-notes.md):
2 and 4 ranks on loopback joined through a c10d::FileStore (and once through a
TCPStore) run allreduce, a variable-length byte allgather, a broadcast and a barrier;
every rank must print the same, correct results. Then the crash probe: a rank that
SIGKILLs itself before a collective makes every surviving rank fail fast (exit 3 with
a Gloo connection error), well inside the collective timeout.

Skips (exit 0) when the example was not built (no c10d Gloo headers or symbols).
Run by ctest with the oracle Python (torch 2.13)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import harness

EXAMPLE = os.path.join(harness.BUILD_DIR, "examples", "ddp", "allreduce_smoke")
PROCESS_TIMEOUT_S = 120  # libtorch start-up of 4 processes on a loaded 2-core machine
COLLECTIVE_TIMEOUT_MS = 60000
DECISION = "commit step-00000042"


def expected_digest_text(rank):
    return hashlib.sha256(f"holdpoint-shard-{rank}".encode()).hexdigest() + "+" * rank


def launch(world, store, extra=(), per_rank=None, timeout_ms=COLLECTIVE_TIMEOUT_MS):
    """Starts `world` ranks; returns [(rank, returncode, parsed stdout or None, stderr)]."""
    procs = []
    for rank in range(world):
        args = [EXAMPLE, "--rank", str(rank), "--world-size", str(world), "--store", store,
                "--timeout-ms", str(timeout_ms), *extra, *((per_rank or {}).get(rank, ()))]
        if not harness.SANITIZED:
            args = ["prlimit", f"--as={harness.ADDRESS_SPACE_LIMIT}", "--"] + args
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            out, err = p.communicate()
            results.append((rank, None, None, "timed out"))
            continue
        try:
            parsed = json.loads(out.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            parsed = None
        results.append((rank, p.returncode, parsed, err.decode("utf-8", "replace")))
    return results


def check_world(report, tmp, world, extra=(), label="file"):
    store = os.path.join(tmp, f"{label}-{world}.store")
    results = launch(world, store, extra)
    expected_sum = world * (world + 1) / 2
    expected_gather = [expected_digest_text(r) for r in range(world)]
    for rank, code, out, err in results:
        what = f"{label} world={world} rank={rank}"
        if not report.check(code == 0 and out is not None, f"{what}: exit {code}, stderr tail {err.strip()[-300:]!r}"):
            continue
        report.check(out["rank"] == rank and out["world_size"] == world and out["ok"] is True, f"{what}: ok")
        report.check(out["allreduce"] == [expected_sum] * 4, f"{what}: allreduce {out['allreduce']}")
        report.check(out["allgather"] == expected_gather, f"{what}: allgather {out['allgather']}")
        report.check(out["broadcast"] == DECISION, f"{what}: broadcast {out['broadcast']!r}")
        report.check(out["barrier"] == "ok", f"{what}: barrier")
        print(f"  {what}: setup {out['setup_ms']:.0f} ms, collectives {out['collectives_ms']:.0f} ms")
    # torch's FileStore removes its file when the last of `world` instances is destroyed.
    # That clean-up is torch's, best effort, and not something holdpoint promises: one CI
    # run (2026-12-02, under a parallel test load) found the file left after a clean run
    # in which every collective passed. So it is reported, not asserted; the launcher
    # (this test's finally, like any launcher) removes the directory either way.
    if os.path.exists(store):
        print(f"  note: {label} world={world}: torch's FileStore left its file after a clean run")


def check_crash_propagates(report, tmp, world, victim, phase):
    store = os.path.join(tmp, f"crash-{world}-{phase}.store")
    start = time.monotonic()
    # The collective timeout (10 min) is far beyond the process deadline (2 min): a
    # survivor that finishes at all saw the peer's death, not the timeout.
    results = launch(world, store, per_rank={victim: ("--die-before", phase)}, timeout_ms=600000)
    elapsed = time.monotonic() - start
    for rank, code, out, err in results:
        what = f"crash world={world} victim={victim} before {phase}: rank {rank}"
        if rank == victim:
            report.check(code == -9, f"{what} was SIGKILLed (exit {code})")
            continue
        report.check(code == 3 and out is not None and "error" in out, f"{what} fails with exit 3 (exit {code})")
        if out is not None and "error" in out:
            report.check("Connection" in out["error"] and "\n" not in out["error"],
                         f"{what}: a one-line Gloo connection error: {out['error']!r}")
    report.check(elapsed < PROCESS_TIMEOUT_S, f"crash world={world}: survivors failed in {elapsed:.1f} s")
    print(f"  crash world={world} victim={victim} before {phase}: survivors failed in {elapsed:.1f} s (with start-up)")


def main():
    if not (os.path.isfile(EXAMPLE) and os.access(EXAMPLE, os.X_OK)):
        print(f"test_ddp_smoke: skipped: {EXAMPLE} was not built (no c10d Gloo headers or symbols)")
        return 0
    report = harness.Report("test_ddp_smoke")
    tmp = tempfile.mkdtemp(prefix="holdpoint-ddp-")
    try:
        check_world(report, tmp, 2)
        check_world(report, tmp, 4)
        check_world(report, tmp, 2, extra=("--device", "interface"), label="file-lo")
        # A TCPStore on 127.0.0.1 (rank 0 serves); the port is derived from the pid to
        # keep concurrent runs apart.
        port = 20000 + os.getpid() % 20000
        check_world(report, tmp, 2, extra=("--store-kind", "tcp", "--port", str(port)), label="tcp")
        check_crash_propagates(report, tmp, 2, victim=1, phase="allreduce")
        check_crash_propagates(report, tmp, 4, victim=2, phase="barrier")
        r = harness.run([EXAMPLE, "--rank", "2", "--world-size", "2", "--store", os.path.join(tmp, "x")])
        report.check(r.returncode == 2, f"a rank outside the world is a usage error: {r.describe()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
