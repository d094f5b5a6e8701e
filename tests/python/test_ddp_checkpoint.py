"""Sharded checkpoints of a data-parallel run, end to end (examples/ddp/train.cpp,
holdpoint/dist/distributed.h): the launcher starts W ranks over Gloo on loopback, which save
through DistributedCheckpointer into a run directory.

a. `holdpoint verify-resume` passes on the example with 2 and with 4 ranks: the resumed
   run reproduces the continuous one (every component, rank-local ones per rank), and
   the negative control (generators re-seeded) diverges.
b. Crash matrix (2 ranks, saves every 2 steps): a rank SIGKILLs itself in the save of
   step 6 before its shard, after its shard, before the commit, or after the step
   manifest is durable but before LATEST moves. The launcher fails, LATEST stays on
   step 4 (`holdpoint ls`, read-only), and a restart on the same run directory resumes
   from it and ends with the uninterrupted run's weights, in a run directory that
   verifies and holds no leftover shards or staging files.
c. Tamper: one flipped byte in a copied checkpoint's rank-1 shard makes every rank reject
   the load (shard_digest_mismatch, or distributed_rank_failed naming it) with its live
   state unchanged; the untouched original still resumes.
d. World-size change 4 -> 2 (unqualified, allowed): the 19 updates of both runs consume
   each row exactly once in each of epochs 0, 1 and 2. Without the permission, or with
   the cpu-gloo-ddp-v1 profile, the load fails with distributed_world_size_changed.
e. Interop: Python's torch 2.13 `torch.load(..., weights_only=True)` opens the step manifest and every shard; the shard digests match
   the manifest's records, each model tensor is held by exactly one shard, and the
   model reassembled in Python hashes to the run's model_sha256.
f. Random kills (`kills`): a 2-rank run saving every step (24 steps) on one run
   directory is restarted again and again, and one random rank gets SIGKILL at a random
   moment once the ranks have connected (a kill during Gloo's rendezvous would leave the
   peer waiting out the launcher's 20 s grace). The peer exits on its own, the launcher
   fails; before each restart a read-only look (`holdpoint ls --json`, the directory
   listing) finds LATEST never gone or moved back, `holdpoint verify RUN` passing, and
   counts the kills that landed inside a save (an uncommitted step-N.shards/ or
   step-N.pt newer than LATEST, or a staging file). The restart runs the remaining steps
   from the step recovery names; the run that completes ends with the uninterrupted run's
   weights, and its run directory holds steps 1..24 with their shards and nothing else.
   HOLDPOINT_KILL_CYCLES=N sets the number of kills (default 6; 60 with
   HOLDPOINT_LARGE_TESTS=1, which also requires a kill inside a save).
Plus the launcher's usage errors (exit 2).

Skips (exit 0) when the example was not built (no c10d Gloo headers or symbols, or no
holdpoint_dist). Run by ctest with the oracle Python (torch 2.13)."""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness

TRAIN = os.path.join(harness.BUILD_DIR, "examples", "ddp", "train")
HOLDPOINT = harness.holdpoint_binary()
RUN_TIMEOUT_S = 120  # one launch; 4 ranks start in ~2 s on an idle 2-core machine
VERIFY_TIMEOUT_S = 300
ROWS = 48
CRASHES = [("before-shard", 1, 6), ("after-shard", 1, 6), ("before-commit", 0, 6), ("published", 0, 6)]
KILL_STEPS = 24
KILLS = int(os.environ.get("HOLDPOINT_KILL_CYCLES", "60" if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1" else "6"))
KILL_SEED = 20261201
HANG_S = 30  # a launcher still running this long after a kill (or before its ranks connect) hangs


def train(*args, timeout=RUN_TIMEOUT_S):
    # No address-space cap: LibTorch and Gloo threads reserve generously, per rank.
    return harness.run([TRAIN, *map(str, args)], timeout=timeout, limit_memory=False)


def load_summary(report, out, label):
    path = os.path.join(out, "summary.json")
    if not report.check(os.path.isfile(path), f"{label}: no summary.json in {out}"):
        return None
    with open(path) as f:
        return json.load(f)


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def step_name(step):
    return f"step-{step:08d}"


def check_output_layout(report, out, world, step, label):
    """The verifier's layout: checkpoint.pt (step manifest), its sidecar, and the shards
    beside it in step-N.shards/; no FileStore left behind."""
    manifest = os.path.join(out, "checkpoint.pt")
    report.check(os.path.isfile(manifest), f"{label}: checkpoint.pt")
    sidecar = os.path.join(out, "checkpoint.pt.sha256")
    if report.check(os.path.isfile(sidecar), f"{label}: checkpoint.pt.sha256"):
        with open(sidecar) as f:
            text = f.read()
        report.check(os.path.isfile(manifest) and text == f"{sha256_file(manifest)}  checkpoint.pt\n",
                     f"{label}: the sidecar holds the manifest's digest: {text!r}")
    shards = os.path.join(out, f"{step_name(step)}.shards")
    names = sorted(os.listdir(shards)) if os.path.isdir(shards) else []
    report.check(names == [f"rank-{r:05d}.pt" for r in range(world)], f"{label}: shards beside it: {names}")
    leftovers = [n for n in os.listdir(out) if n.startswith(".store")]
    report.check(leftovers == [], f"{label}: the launcher removed its FileStore: {leftovers}")


def rejected_lines(stderr, rank):
    return [line for line in stderr.splitlines() if line.startswith(f"rank {rank}: load rejected: ")]


def check_rejected(report, r, world, label, code, also_ok=None):
    """Every rank prints `rank R: load rejected: CODE: ...` (or `also_ok`'s code, if its
    line also names CODE) and `rank R: state unchanged: true`."""
    report.check(r.returncode not in (0, 2, None), f"{label}: the launcher fails: {r.describe()}")
    for rank in range(world):
        lines = rejected_lines(r.stderr, rank)
        good = [line for line in lines
                if line.startswith(f"rank {rank}: load rejected: {code}: ")
                or (also_ok and line.startswith(f"rank {rank}: load rejected: {also_ok}: ") and code in line)]
        report.check(len(lines) == 1 and good, f"{label}: rank {rank} rejects with {code}: {lines or r.stderr[-600:]}")
        report.check(f"rank {rank}: state unchanged: true" in r.stderr.splitlines(),
                     f"{label}: rank {rank} state unchanged: {r.stderr[-600:]!r}")
    return r


# ---- a. verify-resume ----------------------------------------------------------------


def check_verify_resume(report, tmp, world):
    label = f"verify-resume world {world}"
    out = os.path.join(tmp, f"verify-{world}")
    args = [HOLDPOINT, "verify-resume", "--trainer", TRAIN, "--output", out, "--steps", "8", "--cut", "3",
            "--trainer-arg", "--world", "--trainer-arg", str(world), "--trainer-arg", "--save-every",
            "--trainer-arg", "2"]
    r = harness.run(args, timeout=VERIFY_TIMEOUT_S, limit_memory=False)
    report.check(r.returncode == 0, f"{label}: {r.describe()}")
    path = os.path.join(out, "verification.json")
    if not report.check(os.path.isfile(path), f"{label}: verification.json"):
        return
    with open(path) as f:
        v = json.load(f)
    report.check(v["all_checks_passed"] is True and v["positive"] is True and v["negative_divergence_detected"] is True,
                 f"{label}: verdict all={v['all_checks_passed']} positive={v['positive']} "
                 f"negative={v['negative_divergence_detected']} failures={v.get('failures', [])[:3]} "
                 f"error={v.get('error')}")
    if not v.get("results"):
        return
    result = v["results"][0]
    positive = {c["quantity"]: c for c in result["resumed"]}
    for quantity in ["model", "optimizer", "scheduler", "progress", "sample_ids", "lr", "loss"]:
        report.check(positive.get(quantity, {}).get("verdict") == "pass", f"{label}: {quantity} passes")
    for rank in range(world):
        for component in ["sampler", "rng"]:
            quantity = f"{component}@rank{rank}"
            report.check(positive.get(quantity, {}).get("verdict") == "pass",
                         f"{label}: the rank-local {quantity} is compared and passes ({sorted(positive)})")
        report.check(f"rng_next.rank{rank}.gain" in positive, f"{label}: rank {rank}'s draws are traced")
    for c in result["resumed"]:
        report.check(c["max_abs_deviation"] in (None, 0.0), f"{label}: full resume deviation is exactly 0: {c}")
    report.check(positive.get("model", {}).get("values_compared") == 33, f"{label}: 33 parameters compared")
    diverged = {c["quantity"] for c in result["resumed_no_rng"] if c["verdict"] == "diverged"}
    report.check({"model", "loss"} <= diverged, f"{label}: the negative control diverges: {sorted(diverged)}")
    with open(os.path.join(out, "runs", "continuous", "output", "summary.json")) as f:
        continuous = json.load(f)
    report.check(continuous["world_size"] == world and continuous["profile"] == "cpu-gloo-ddp-v1",
                 f"{label}: summary world_size and profile")
    report.check(all(len(entry["sample_ids"]) == 3 * world for entry in continuous["trace"]),
                 f"{label}: each update consumes 3 rows per rank")
    check_output_layout(report, os.path.join(out, "runs", "resumed", "output"), world, 8, label + " resumed")
    print(f"  {label}: passed; control max weight deviation {result.get('negative_max_weight_deviation')}")


# ---- b. crash matrix -----------------------------------------------------------------


def list_run(run):
    r = harness.run([HOLDPOINT, "ls", run, "--json"])
    try:
        return r, json.loads(r.stdout)
    except ValueError:
        return r, None


def check_crash(report, tmp, reference_sha, phase, victim, step):
    label = f"crash {phase} rank {victim} step {step}"
    base = os.path.join(tmp, f"crash-{phase}")
    os.makedirs(base)
    run = os.path.join(base, "run")
    r = train("--world", 2, "--steps", 8, "--save-every", 2, "--run", run, "--output", os.path.join(base, "first"),
              "--crash", f"{phase}:{victim}:{step}")
    report.check(r.returncode not in (0, 2, None), f"{label}: the launcher fails: {r.describe()}")
    report.check(f"train: rank {victim} killed by signal 9" in r.stderr,
                 f"{label}: the launcher names the killed rank: {r.stderr[-500:]!r}")
    report.check(f"rank {victim}: crashing at {phase} of the save of step {step}" in r.stderr,
                 f"{label}: the crash happened where asked")
    survivor = 1 - victim
    report.check(re.search(rf"^train: rank {survivor} exited with code 1$", r.stderr, re.MULTILINE) is not None,
                 f"{label}: the surviving rank fails (its collective saw the death): {r.stderr[-500:]!r}")

    ls, listing = list_run(run)
    if report.check(listing is not None, f"{label}: holdpoint ls --json: {ls.describe()}"):
        report.check(listing["latest"] == f"{step_name(4)}.pt", f"{label}: LATEST stays on step 4: {listing['latest']}")
        committed = [g for g in listing["generations"] if g.get("latest")]
        report.check([g["step"] for g in committed] == [4], f"{label}: the LATEST generation is step 4")
        report.check(all(g["step"] <= 4 for g in listing["generations"]),
                     f"{label}: no generation after step 4: {[g['name'] for g in listing['generations']]}")
        uncommitted = listing["recovery"]["removed_uncommitted"]
        report.check(any(name.startswith(f"{step_name(6)}.shards") for name in uncommitted)
                     and (phase != "published" or f"{step_name(6)}.pt" in uncommitted),
                     f"{label}: recovery would remove the uncommitted step 6: {uncommitted}")

    restart_out = os.path.join(base, "restart")
    r = train("--world", 2, "--steps", 4, "--save-every", 2, "--run", run, "--output", restart_out)
    if not report.check(r.returncode == 0, f"{label}: the restart succeeds: {r.describe()}"):
        return
    summary = load_summary(report, restart_out, label)
    if summary:
        report.check(summary["global_step"] == 8 and [e["step"] for e in summary["trace"]] == [5, 6, 7, 8],
                     f"{label}: the restart resumed from step 4 and ran to 8")
        report.check(str(summary["resumed_from"]).endswith(f"{step_name(4)}.pt"),
                     f"{label}: resumed from LATEST: {summary['resumed_from']}")
        report.check(summary["model_sha256"] == reference_sha,
                     f"{label}: the restarted run ends with the reference weights")
    v = harness.run([HOLDPOINT, "verify", run])
    report.check(v.returncode == 0, f"{label}: holdpoint verify RUN: {v.describe()}")

    checkpoints = os.path.join(run, "checkpoints")
    entries = sorted(os.listdir(checkpoints))
    want = sorted(f"{step_name(s)}{suffix}" for s in (2, 4, 6, 8) for suffix in (".pt", ".pt.sha256", ".shards"))
    report.check(entries == want, f"{label}: checkpoints/ holds exactly steps 2-8 with their shards: {entries}")
    hidden = []
    for root, dirs, files in os.walk(run):
        hidden += [os.path.relpath(os.path.join(root, n), run) for n in dirs + files
                   if n.startswith(".") and n != ".holdpoint-lock"]
    report.check(hidden == [], f"{label}: no staging files left: {hidden}")
    for s in (2, 4, 6, 8):
        shards = os.path.join(checkpoints, f"{step_name(s)}.shards")
        names = sorted(os.listdir(shards)) if os.path.isdir(shards) else None
        report.check(names == ["rank-00000.pt", "rank-00001.pt"], f"{label}: step {s}'s shards: {names}")
    print(f"  {label}: LATEST stayed on step 4, restart matched the reference")


def check_crash_matrix(report, tmp):
    ref = os.path.join(tmp, "crash-reference")
    r = train("--world", 2, "--steps", 8, "--save-every", 2, "--output", ref)
    if not report.check(r.returncode == 0, f"crash reference run: {r.describe()}"):
        return
    summary = load_summary(report, ref, "crash reference")
    if not summary:
        return
    check_output_layout(report, ref, 2, 8, "crash reference")
    for phase, victim, step in CRASHES:
        check_crash(report, tmp, summary["model_sha256"], phase, victim, step)


# ---- f. random kills -----------------------------------------------------------------


def rank_children(launcher):
    """{rank: pid} of the launcher's children that are ranks (`--rank R` in their cmdline)."""
    pids = []
    try:
        for task in os.listdir(f"/proc/{launcher}/task"):
            with open(f"/proc/{launcher}/task/{task}/children") as f:
                pids += [int(x) for x in f.read().split()]
    except OSError:
        return {}
    ranks = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "--rank" in args[:-1]:
            ranks[int(args[args.index("--rank") + 1])] = pid
    return ranks


def established_sockets():
    """Inodes of the established TCP sockets (the ranks' Gloo pairs run over loopback)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "01":
                inodes.add(fields[9])
    return inodes


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        pass
    return inodes


class Launch:
    """One launcher in a session of its own (its ranks share its process group and die
    with it), timed from the start."""

    def __init__(self, args):
        self.began = time.monotonic()
        self.process = subprocess.Popen([TRAIN, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True)

    def wait_connected(self, world, timeout):
        """{rank: pid} once every rank holds an established TCP socket (the group is up);
        {} when the launcher ended first; None after `timeout`."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            ranks = rank_children(self.process.pid)
            if len(ranks) == world:
                established = established_sockets()
                if all(socket_inodes(pid) & established for pid in ranks.values()):
                    return ranks
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return {}

    def finish(self, timeout):
        """(exit code, stdout, stderr); the exit code is None after killing a launcher
        that outlived `timeout`, with its whole process group."""
        try:
            out, err = self.process.communicate(timeout=timeout)
            return self.process.returncode, out, err
        except subprocess.TimeoutExpired:
            self.kill_group()
            out, err = self.process.communicate()
            return None, out, err

    def kill_group(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def step_of(name):
    match = re.fullmatch(r"step-(\d{8})\.(pt|shards)", name or "")
    return int(match.group(1)) if match else None


def read_latest(run):
    try:
        with open(os.path.join(run, "LATEST")) as f:
            return f.read().split()[0]
    except (OSError, IndexError):
        return None


def interrupted_save(run, latest):
    """What only a save interrupted by the kill leaves: a step manifest or shard directory
    newer than LATEST (none: 0), or a staging file anywhere in the run directory."""
    latest_step = step_of(latest) or 0
    checkpoints = os.path.join(run, "checkpoints")
    uncommitted = sorted(n for n in os.listdir(checkpoints) if (step_of(n) or 0) > latest_step)
    staging = []
    for root, dirs, files in os.walk(run):
        staging += [os.path.relpath(os.path.join(root, n), run) for n in dirs + files
                    if n.startswith(".") and n != ".holdpoint-lock"]
    return uncommitted, sorted(staging)


def check_kill_aftermath(report, label, run, had_latest, stats):
    """Read-only looks at RUN after a kill; returns the step manifest the restart resumes
    from (None: none), or False when the case cannot go on."""
    latest = read_latest(run)
    if had_latest:
        report.check(latest is not None, f"{label}: LATEST is gone (it named {had_latest})")
        report.check((step_of(latest) or 0) >= step_of(had_latest),
                     f"{label}: LATEST moved back from {had_latest} to {latest}")
    if not os.path.isdir(os.path.join(run, "checkpoints")):
        # Killed before the coordinator created the run directory.
        report.check(not had_latest and latest is None, f"{label}: {run} lost its checkpoints/")
        return None
    uncommitted, staging = interrupted_save(run, latest)
    if uncommitted or staging:
        stats["mid_save"] += 1
        kind = ("staging file" if staging else
                "step manifest" if any(n.endswith(".pt") for n in uncommitted) else "shards only")
        stats["kinds"][kind] = stats["kinds"].get(kind, 0) + 1
    ls, listing = list_run(run)
    if not report.check(ls.returncode == 0 and listing is not None, f"{label}: holdpoint ls --json: {ls.describe()}"):
        return False
    recovery = listing.get("recovery") or {}
    report.check(listing.get("latest") == latest,
                 f"{label}: ls names LATEST {listing.get('latest')}, the file {latest}")
    report.check(not recovery.get("damaged") and not recovery.get("quarantined"),
                 f"{label}: recovery would move generations aside: {recovery.get('lines')}")
    handled = " ".join(recovery.get("removed_uncommitted", []) + recovery.get("adopted", []))
    for name in uncommitted:
        report.check(name in handled, f"{label}: recovery neither removes nor adopts {name}: {recovery.get('lines')}")
    report.check(not (uncommitted or staging) or recovery.get("clean") is False,
                 f"{label}: recovery calls the run clean beside {uncommitted + staging}")
    resume_from = recovery.get("latest")
    if latest is not None:
        report.check(resume_from == latest, f"{label}: recovery would resume from {resume_from}, LATEST is {latest}")
        v = harness.run([HOLDPOINT, "verify", run], timeout=VERIFY_TIMEOUT_S)
        report.check(v.returncode == 0, f"{label}: holdpoint verify RUN: {v.describe()}")
    elif resume_from is not None:
        # A first save killed after its step manifest was durable: adopted, not lost.
        report.check(resume_from in recovery.get("adopted", []), f"{label}: recovery would resume from {resume_from}")
    return resume_from


def check_completed_run(report, label, run, out, reference_sha, resumed_from):
    summary = load_summary(report, out, label)
    if summary:
        first = (step_of(resumed_from) or 0) + 1
        report.check(summary["global_step"] == KILL_STEPS
                     and [e["step"] for e in summary["trace"]] == list(range(first, KILL_STEPS + 1)),
                     f"{label}: ran steps {first}..{KILL_STEPS}: global_step {summary['global_step']}")
        report.check(str(summary["resumed_from"]).endswith(resumed_from) if resumed_from
                     else summary["resumed_from"] is None,
                     f"{label}: resumed from {summary['resumed_from']}, recovery named {resumed_from}")
        report.check(summary["model_sha256"] == reference_sha, f"{label}: ends with the uninterrupted run's weights")
    v = harness.run([HOLDPOINT, "verify", run], timeout=VERIFY_TIMEOUT_S)
    report.check(v.returncode == 0, f"{label}: holdpoint verify RUN: {v.describe()}")
    checkpoints = os.path.join(run, "checkpoints")
    entries = sorted(os.listdir(checkpoints))
    want = sorted(f"{step_name(s)}{suffix}" for s in range(1, KILL_STEPS + 1)
                  for suffix in (".pt", ".pt.sha256", ".shards"))
    report.check(entries == want, f"{label}: checkpoints/ holds exactly steps 1-{KILL_STEPS} with their shards: "
                 f"extra {sorted(set(entries) - set(want))}, missing {sorted(set(want) - set(entries))}")
    orphans = [n for n in entries if n.endswith(".shards") and n[:-len(".shards")] + ".pt" not in entries]
    report.check(orphans == [], f"{label}: shard directories without their step manifest: {orphans}")
    _, staging = interrupted_save(run, read_latest(run))
    report.check(staging == [], f"{label}: no staging files left: {staging}")
    for s in range(1, KILL_STEPS + 1):
        shards = os.path.join(checkpoints, f"{step_name(s)}.shards")
        names = sorted(os.listdir(shards)) if os.path.isdir(shards) else None
        report.check(names == ["rank-00000.pt", "rank-00001.pt"], f"{label}: step {s}'s shards: {names}")


def check_random_kills(report, tmp):
    common = ["--world", 2, "--save-every", 1]
    reference = os.path.join(tmp, "kills-reference")
    launch = Launch([*common, "--steps", KILL_STEPS, "--output", reference])
    connected = launch.wait_connected(2, HANG_S)
    ready = time.monotonic() - launch.began
    code, _, err = launch.finish(RUN_TIMEOUT_S)
    duration = time.monotonic() - launch.began
    if not report.check(code == 0 and connected, f"kills: the reference run: exit {code}, ranks {connected}: "
                        f"{err.strip().splitlines()[-3:]}"):
        return
    summary = load_summary(report, reference, "kills reference")
    if not summary:
        return
    reference_sha = summary["model_sha256"]
    work = duration - ready  # training and saving, once the ranks are connected
    print(f"  kills: the reference run took {duration:.2f} s, {ready:.2f} s of it until the ranks connected")

    rng = random.Random(KILL_SEED)
    stats = {"mid_save": 0, "kinds": {}}
    kills = launches = rounds = 0
    slowest_exit = 0.0
    began = time.monotonic()
    while kills < KILLS:
        rounds += 1
        base = os.path.join(tmp, f"kills-{rounds}")
        os.makedirs(base)
        run = os.path.join(base, "run")
        resume_from = None  # the step manifest the next launch resumes from
        had_latest = None
        while True:
            launches += 1
            label = f"kills: run {rounds} launch {launches}"
            out = os.path.join(base, f"launch-{launches}")
            remaining = KILL_STEPS - (step_of(resume_from) or 0)
            # Alternate synchronous and asynchronous saves (save_async on a background group).
            mode = ["--async"] if launches % 2 == 0 else []
            launch = Launch([*common, *mode, "--steps", remaining, "--run", run, "--output", out])
            victim = killed_at = None
            if kills < KILLS:
                ranks = launch.wait_connected(2, HANG_S)
                if ranks is None:
                    launch.kill_group()
                    launch.finish(HANG_S)
                    report.check(False, f"{label}: the ranks did not connect within {HANG_S} s")
                    return
                if ranks:
                    # The remaining work, plus a little: some launches finish first.
                    time.sleep(rng.uniform(0, 1.1 * work * max(remaining / KILL_STEPS, 0.2)))
                    victim = rng.randrange(2)
                    try:
                        os.kill(ranks[victim], signal.SIGKILL)
                        killed_at = time.monotonic()
                    except ProcessLookupError:
                        victim = None
            code, _, err = launch.finish(HANG_S if killed_at else RUN_TIMEOUT_S)
            tail = err.strip().splitlines()[-4:]
            if code is None:
                report.check(False, f"{label}: the launcher hung; killed its process group "
                             f"({'rank %d killed' % victim if killed_at else 'no kill'}): {tail}")
                return
            if killed_at and code != 0:
                kills += 1
                exit_after = time.monotonic() - killed_at
                slowest_exit = max(slowest_exit, exit_after)
                report.check(code == 1 and f"train: rank {victim} killed by signal 9" in err,
                             f"{label}: the launcher names the killed rank {victim}: exit {code}: {tail}")
                report.check("still running" not in err and f"train: rank {1 - victim} killed" not in err,
                             f"{label}: rank {1 - victim} exited on its own ({exit_after:.2f} s): {tail}")
                resume_from = check_kill_aftermath(report, label, run, had_latest, stats)
                if resume_from is False:
                    return
                had_latest = read_latest(run)
                continue
            # A launch that ran to the end (the kill, if any, came too late to land).
            if report.check(code == 0, f"{label}: exit {code}: {tail}"):
                check_completed_run(report, label, run, out, reference_sha, resume_from)
            break
    elapsed = time.monotonic() - began
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(stats["kinds"].items())) or "none"
    print(f"  kills: {kills} kills over {launches} launches on {rounds} run director{'y' if rounds == 1 else 'ies'} "
          f"in {elapsed:.1f} s; "
          f"{stats['mid_save']} landed inside a save ({kinds}); every peer exited on its own, "
          f"the slowest launcher {slowest_exit:.2f} s after its kill; every completed run matched the reference")
    if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1":
        report.check(stats["mid_save"] >= 1, f"kills: none of {kills} kills landed inside a save")


# ---- c. tamper -----------------------------------------------------------------------


def check_tamper(report, tmp):
    original = os.path.join(tmp, "tamper-original")
    r = train("--world", 2, "--steps", 4, "--output", original)
    if not report.check(r.returncode == 0, f"tamper: the original run: {r.describe()}"):
        return
    check_output_layout(report, original, 2, 4, "tamper original")
    copy = os.path.join(tmp, "tamper-copy")
    shutil.copytree(original, copy)  # copies: the run directory's hard links stay intact
    shard = os.path.join(copy, f"{step_name(4)}.shards", "rank-00001.pt")
    with open(shard, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    r = train("--world", 2, "--steps", 2, "--resume", os.path.join(copy, "checkpoint.pt"),
              "--output", os.path.join(tmp, "tamper-resumed"))
    check_rejected(report, r, 2, "tamper", "shard_digest_mismatch", also_ok="distributed_rank_failed")
    for line in rejected_lines(r.stderr, 0) + rejected_lines(r.stderr, 1):
        if ": distributed_rank_failed: " in line:
            report.check("rank 1" in line, f"tamper: distributed_rank_failed names rank 1: {line}")
    report.check(not os.path.exists(os.path.join(tmp, "tamper-resumed", "summary.json")),
                 "tamper: the rejected run wrote no summary")

    # The untouched original resumes: the rejection was the flipped byte.
    r = train("--world", 2, "--steps", 2, "--resume", os.path.join(original, "checkpoint.pt"),
              "--output", os.path.join(tmp, "tamper-control"))
    if report.check(r.returncode == 0, f"tamper: the original still resumes: {r.describe()}"):
        summary = load_summary(report, os.path.join(tmp, "tamper-control"), "tamper control")
        if summary:
            report.check(summary["global_step"] == 6, f"tamper control: ends at step 6: {summary['global_step']}")
    print("  tamper: every rank rejected the flipped shard byte with its state unchanged")


# ---- d. world-size change ------------------------------------------------------------


def check_world_size_change(report, tmp):
    four = os.path.join(tmp, "world-4")
    r = train("--world", 4, "--steps", 5, "--save-every", 5, "--output", four)
    if not report.check(r.returncode == 0, f"world 4: {r.describe()}"):
        return
    check_output_layout(report, four, 4, 5, "world 4")
    first = load_summary(report, four, "world 4")
    checkpoint = os.path.join(four, "checkpoint.pt")

    r = train("--world", 2, "--steps", 1, "--resume", checkpoint, "--output", os.path.join(tmp, "world-2-refused"))
    check_rejected(report, r, 2, "4 -> 2 without --allow-world-size-change", "distributed_world_size_changed")
    r = train("--world", 2, "--steps", 1, "--resume", checkpoint, "--allow-world-size-change",
              "--output", os.path.join(tmp, "world-2-qualified"))
    check_rejected(report, r, 2, "4 -> 2 under cpu-gloo-ddp-v1", "distributed_world_size_changed")
    report.check(all("cpu-gloo-ddp-v1" in line for rank in (0, 1) for line in rejected_lines(r.stderr, rank)),
                 "4 -> 2 under cpu-gloo-ddp-v1: the rejection names the profile as the reason")

    two = os.path.join(tmp, "world-2")
    r = train("--world", 2, "--steps", 14, "--resume", checkpoint, "--allow-world-size-change",
              "--profile", "unqualified", "--output", two)
    if not report.check(r.returncode == 0, f"4 -> 2 unqualified: {r.describe()}"):
        return
    second = load_summary(report, two, "world 2")
    if not (first and second):
        return
    report.check(second["world_size_changed"] is True and second["saved_world_size"] == 4
                 and second["world_size"] == 2 and second["profile"] == "unqualified",
                 f"4 -> 2: summary records the change: {second['world_size_changed']} {second['saved_world_size']}")
    trace = first["trace"] + second["trace"]
    report.check([e["step"] for e in trace] == list(range(1, 20)), "4 -> 2: steps 1..19 without a gap")
    report.check([len(e["sample_ids"]) for e in trace] == [12] * 5 + [6] * 14, "4 -> 2: 12 rows, then 6, per update")
    by_epoch = {}
    for entry in trace:
        by_epoch.setdefault(entry["epoch"], []).extend(entry["sample_ids"])
    report.check(sorted(by_epoch) == [0, 1, 2], f"4 -> 2: epochs {sorted(by_epoch)}")
    for epoch, ids in sorted(by_epoch.items()):
        report.check(sorted(ids) == list(range(ROWS)),
                     f"4 -> 2: epoch {epoch} consumes every row exactly once ({len(ids)} ids, "
                     f"{len(set(ids))} distinct)")
    check_output_layout(report, two, 2, 19, "world 2")
    print("  world size 4 -> 2: epochs 0, 1, 2 each consumed rows 0..47 exactly once")


# ---- usage ---------------------------------------------------------------------------


def check_torch_interop(report, tmp):
    import torch  # the oracle's (torch 2.13), never holdpoint

    out = os.path.join(tmp, "interop")
    # The default encoding (Python floats as BINFLOAT), which torch 2.x reads.
    r = train("--world", 2, "--steps", 4, "--save-every", 4, "--output", out)
    if not report.check(r.returncode == 0, f"interop run: {r.describe()}"):
        return
    summary = load_summary(report, out, "interop")
    step = torch.load(os.path.join(out, "checkpoint.pt"), map_location="cpu", weights_only=True)
    manifest = step.get("holdpoint", {})
    report.check(list(step.keys()) == ["holdpoint"], f"the step manifest holds only its manifest: {list(step.keys())}")
    report.check(manifest.get("kind") == "sharded", f"kind {manifest.get('kind')!r}")
    sharding = manifest.get("sharding", {})
    report.check(sharding.get("world_size") == 2 and sharding.get("step") == 4, f"sharding {sharding}")
    shards = []
    for record in sharding.get("shards", []):
        path = os.path.join(out, step_name(4) + ".shards", "rank-%05d.pt" % record["rank"])
        report.check(sha256_file(path) == record["sha256"] and os.path.getsize(path) == record["size"],
                     f"shard {record['rank']}: size and SHA-256 are the step manifest's")
        shard = torch.load(path, map_location="cpu", weights_only=True)
        report.check(shard["holdpoint"]["kind"] == "shard" and shard["holdpoint"]["sharding"]["rank"] == record["rank"],
                     f"shard {record['rank']} names itself")
        shards.append(shard)
    if not report.check(len(shards) == 2, "two shards read"):
        return
    model = {}
    for key in shards[0]["model"].keys():
        held = [s["model"][key] for s in shards if isinstance(s["model"][key], torch.Tensor)]
        report.check(len(held) == 1, f"model[{key!r}] is held by exactly one shard ({len(held)})")
        if held:
            model[key] = held[0]
    digest = hashlib.sha256()
    for tensor in model.values():
        digest.update(tensor.contiguous().numpy().tobytes())
    report.check(summary is not None and digest.hexdigest() == summary.get("model_sha256"),
                 "the model reassembled by Python's torch hashes to the run's model_sha256")
    for rank, shard in enumerate(shards):
        report.check(shard["sampler"]["rank"] == rank and shard["sampler"]["world_size"] == 2,
                     f"shard {rank} holds rank {rank}'s sampler")


def check_async_saves(report, tmp):
    """--async (save_async on a background group) writes the same bytes as synchronous saves,
    and an async run killed in a background save restarts to the same weights."""
    sync_out, async_out = os.path.join(tmp, "sync"), os.path.join(tmp, "async")
    r_sync = train("--world", 2, "--steps", 6, "--save-every", 2, "--output", sync_out)
    r_async = train("--world", 2, "--steps", 6, "--save-every", 2, "--output", async_out, "--async")
    if not report.check(r_sync.returncode == 0 and r_async.returncode == 0,
                        f"sync and async runs: {r_sync.describe()} / {r_async.describe()}"):
        return
    for step in (2, 4, 6):
        for rel in (f"{step_name(step)}.pt", f"{step_name(step)}.shards/rank-00000.pt",
                    f"{step_name(step)}.shards/rank-00001.pt"):
            a = os.path.join(sync_out, "run", "checkpoints", rel)
            b = os.path.join(async_out, "run", "checkpoints", rel)
            report.check(os.path.isfile(b) and sha256_file(a) == sha256_file(b),
                         f"async: {rel} is byte-identical to the synchronous save's")
    reference = load_summary(report, sync_out, "sync")
    # Rank 1 dies inside the background save of step 4; the restart resumes from step 2.
    run = os.path.join(tmp, "async-crash-run")
    r = train("--world", 2, "--steps", 6, "--save-every", 2, "--run", run, "--async",
              "--output", os.path.join(tmp, "async-crash"), "--crash", "after-shard:1:4")
    report.check(r.returncode == 1 and "rank 1 killed by signal 9" in r.stderr,
                 f"async crash: the launcher names the killed rank: {r.describe()}")
    _, listing = list_run(run)
    report.check(listing is not None and listing.get("latest") == f"{step_name(2)}.pt",
                 f"async crash: LATEST stays on step 2: {listing and listing.get('latest')}")
    r = train("--world", 2, "--steps", 4, "--save-every", 2, "--run", run, "--async",
              "--output", os.path.join(tmp, "async-restart"))
    restarted = load_summary(report, os.path.join(tmp, "async-restart"), "async restart") if r.returncode == 0 else None
    report.check(restarted is not None and reference is not None and
                 restarted.get("model_sha256") == reference.get("model_sha256"),
                 f"async crash: the restart ends with the uninterrupted run's weights: {r.describe()}")


def check_usage(report, tmp):
    exists = os.path.join(tmp, "exists")
    os.makedirs(exists)
    r = train("--steps", 1, "--output", exists)
    report.check(r.returncode == 2 and "exists" in r.stderr, f"an existing output directory: {r.describe()}")
    for bad in (["--crash", "sideways:0:1"], ["--crash", "published:5:1"], ["--profile", "cpu-basic-v1"],
                ["--world", "0"], ["--omit-rng-restore"]):
        r = train("--steps", 1, "--output", os.path.join(tmp, "never"), *bad)
        report.check(r.returncode == 2, f"usage error for {bad}: {r.describe()}")
    report.check(not os.path.exists(os.path.join(tmp, "never")), "a usage error creates no output directory")


def main():
    if not (os.path.isfile(TRAIN) and os.access(TRAIN, os.X_OK)):
        print(f"test_ddp_checkpoint: skipped: {TRAIN} was not built (no c10d Gloo or no holdpoint_dist)")
        return 0
    harness.require_executable(HOLDPOINT)
    report = harness.Report("test_ddp_checkpoint")
    tmp = tempfile.mkdtemp(prefix="holdpoint-ddp-checkpoint-")
    selected = sys.argv[1:] or ["usage", "verify", "crash", "kills", "tamper", "world", "interop", "async"]
    try:
        if "usage" in selected:
            check_usage(report, tmp)
        if "verify" in selected:
            check_verify_resume(report, tmp, 2)
            check_verify_resume(report, tmp, 4)
        if "crash" in selected:
            check_crash_matrix(report, tmp)
        if "kills" in selected:
            check_random_kills(report, tmp)
        if "tamper" in selected:
            check_tamper(report, tmp)
        if "world" in selected:
            check_world_size_change(report, tmp)
        if "interop" in selected:
            check_torch_interop(report, tmp)
        if "async" in selected:
            check_async_saves(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
