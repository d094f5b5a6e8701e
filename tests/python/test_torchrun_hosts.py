"""The C++ example examples/torchrun/train under `torchrun --no-python`, on one
host and on two, through restarts and world-size changes (docs/distributed.md,
"Running under torchrun").

Two "hosts" are network namespaces joined by a veth pair (host_namespaces.py);
both see this test's temporary folder, their shared file system. Each runs a
torchrun agent: c10d rendezvous served by host 0, two ranks per host,
GLOO_SOCKET_IFNAME its veth, --max-restarts high. The ranks join the world from
torchrun's variables (holdpoint::join_world_from_environment) and resume from the
run's LATEST on every start; the test never tells them to.

1. reference: the example straight through on one host as 1 rank, and on two
   hosts as 4 ranks: the same final model bit for bit (the example's trajectory
   does not depend on the world size), and `holdpoint verify RUN` passes;
2. kills: one two-host run, saving every update (synchronously, then
   asynchronously after the agents are restarted halfway), SIGKILLed KILLS times
   at random moments: a random rank, or every process of host 1 (the test then
   starts its agent again). After each, the world restarts and rank 0 resumes
   from a step no older than the last save that returned before the kill. Then
   host 1's link is taken down while every rank waits inside a save
   (--hold-save): the save fails on every rank, nothing is committed for that
   step, and once the link is back the world resumes. The run ends with the
   reference's model, and `holdpoint verify RUN` passes;
3. resize: a run of 4 ranks on two hosts stopped at step A, continued by 2
   ranks on one host to step B, and finished by 3 ranks: each start resumes
   from the last one's LATEST (its saved world size reported), and the end is
   the reference's model.

4. the Trainer: examples/torchrun/trainer (the ready Trainer made a data-parallel
   rank by holdpoint::make_data_parallel) on two hosts as 4 ranks, straight
   through, and again through TRAINER_KILLS kills (a random rank, or every
   process of host 1) and host 1's link taken down inside a save, with the
   resumes the program does by itself: the same final model, bit for bit, and
   `holdpoint verify RUN` passes. Then the run goes on with 2 ranks and with 3:
   each resumes, and every rank ends with the same model (not the 4-rank
   trajectory: the Trainer's sums depend on the world size).

Default: 4 kills of the example (the last a whole host) and 2 of the Trainer
(the second a whole host), about 3 minutes on 2 cores; 20 and 10 in the long
tier (HOLDPOINT_LARGE_TESTS=1, every fifth kill a whole host), about 6 minutes. HOLDPOINT_TORCHRUN_KILLS=N sets the kills; the random choices come from HOLDPOINT_TORCHRUN_SEED (printed).
Needs root for the namespaces: without it the test fails, saying why.
"""

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness
from host_namespaces import EventLog, NamespaceError, TwoHosts, all_gone, process_state

TRAINER = os.path.join(harness.BUILD_DIR, "examples", "torchrun", "train")
# The ready Trainer under torchrun (make_data_parallel).
READY_TRAINER = os.path.join(harness.BUILD_DIR, "examples", "torchrun", "trainer")
# The short form in the normal run; the full count in the long tier.
KILLS = int(os.environ.get("HOLDPOINT_TORCHRUN_KILLS",
                           "20" if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1" else "4"))
TRAINER_KILLS = int(os.environ.get("HOLDPOINT_TORCHRUN_TRAINER_KILLS",
                                   "10" if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1" else "2"))
SEED = int(os.environ.get("HOLDPOINT_TORCHRUN_SEED", "20261207"))
STEPS = 240
DEADLINE_S = 1200
RDZV_PORT = 29600
WAIT_S = 120                 # a world's start, or a restart, on a loaded 2-core machine
TIMEOUT_MS = 15000           # the example's store and collective timeout
HOLD_MS = 3000               # how long every rank waits inside the save the link is cut in


def torchrun(nnodes, nproc, run_id, endpoint, max_restarts, host_address=None, is_host=None, program=TRAINER):
    """A torchrun line: examples/torchrun/README.md's two-host line (endpoint
    given) or its one-host line (--standalone)."""
    args = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1"]
    if endpoint is None:
        args += ["--standalone"]
    else:
        args += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}"]
    if is_host is not None:
        args += [f"--rdzv-conf=is_host={'true' if is_host else 'false'}", f"--local-addr={host_address}"]
    return args + ["--no-python", program, "--"]


def example_args(run, events, steps, extra=()):
    return ["--run", run, "--steps", str(steps), "--events", events, "--timeout-ms", str(TIMEOUT_MS), *extra]


def agent_env(interface=None):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               # A restarted world meets in a fresh store (pytorch/pytorch#135712).
               TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    if interface:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


class TwoHostWorld:
    """Two torchrun agents (one per namespace) running the example on one run."""

    def __init__(self, hosts, work, name, args, deadline, program=TRAINER):
        self.hosts, self.work, self.name, self.args, self.deadline = hosts, work, name, args, deadline
        self.program = program
        self.agents = [None, None]
        self.events = EventLog(os.path.join(work, "events.jsonl"))

    def start_agent(self, host):
        hosts = self.hosts
        args = torchrun(2, 2, self.name, f"{hosts.addresses[0]}:{RDZV_PORT}", 100, hosts.addresses[host],
                        host == 0, self.program) + self.args
        log = open(os.path.join(self.work, f"agent-{host}.log"), "a")
        self.agents[host] = hosts.popen(host, args, env=agent_env(hosts.interfaces[host]), stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def start(self):
        for host in (0, 1):
            self.start_agent(host)

    def running(self):
        return any(agent is not None and agent.poll() is None for agent in self.agents)

    def wait_for(self, predicate, timeout=WAIT_S):
        end = min(time.monotonic() + timeout, self.deadline)
        while time.monotonic() < end:
            for event in self.events.poll():
                if predicate(event):
                    return event
            if not self.running():
                return next((e for e in self.events.poll() if predicate(e)), None)
            time.sleep(0.02)
        return None

    def finish(self, timeout=WAIT_S * 3):
        end = min(time.monotonic() + timeout, self.deadline)
        while time.monotonic() < end and self.running():
            time.sleep(0.1)
        return [agent.poll() if agent else None for agent in self.agents]

    def stop(self):
        for host in (0, 1):
            self.hosts.kill_host(host)
        for agent in self.agents:
            if agent is not None:
                try:
                    agent.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass

    def tail(self, lines=12):
        out = []
        for host in (0, 1):
            path = os.path.join(self.work, f"agent-{host}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text = [line for line in f.read().splitlines() if "hostname of the client" not in line]
                out.append(f"--- agent {host}:\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


def final_of(events):
    finals = [e for e in events.poll() if e["event"] == "final" and e["rank"] == 0]
    return finals[-1] if finals else None


def verify_run(report, label, run):
    v = harness.cli("verify", run, timeout=300)
    report.check(v.returncode == 0, f"{label}: holdpoint verify RUN: {v.describe()}")


# ---- 1. references ------------------------------------------------------------------------------

def one_host(report, work, label, nproc, steps, deadline):
    """torchrun on this host (loopback), as the README's one-host line runs it."""
    os.makedirs(work, exist_ok=True)
    run, events = os.path.join(work, "run"), os.path.join(work, "events.jsonl")
    args = torchrun(1, nproc, label, None, 3) + example_args(run, events, steps)
    result = subprocess.run(args, env=agent_env(), capture_output=True, text=True,
                            timeout=max(10, min(WAIT_S * 3, deadline - time.monotonic())))
    ok = report.check(result.returncode == 0, f"{label}: torchrun exit {result.returncode}: "
                      f"{(result.stdout + result.stderr)[-1500:]}")
    return run, EventLog(events), result.stdout if ok else None


def references(report, hosts, root, deadline):
    run1, events1, out = one_host(report, os.path.join(root, "ref-1"), "ref-1", 1, STEPS, deadline)
    single = final_of(events1)
    if not report.check(single is not None and single["step"] == STEPS, f"one rank: final event {single}"):
        return None
    report.check(f"final {STEPS} {single['sha256']}" in (out or ""), "one rank: rank 0 prints the final line")
    verify_run(report, "one rank", run1)

    work = os.path.join(root, "ref-4")
    os.makedirs(work)
    world = TwoHostWorld(hosts, work, "ref4", example_args(os.path.join(work, "run"),
                                                           os.path.join(work, "events.jsonl"), STEPS), deadline)
    began = time.monotonic()
    world.start()
    codes = world.finish()
    world.stop()
    four = final_of(world.events)
    report.check(codes == [0, 0], f"two hosts: agents exit {codes}\n{world.tail()}")
    if report.check(four is not None, "two hosts: a final event"):
        report.check(four["world"] == 4 and four["sha256"] == single["sha256"],
                     f"4 ranks on two hosts end as 1 rank does: {four} vs {single}")
    starts = world.events.matching("start")
    report.check(sorted(e["rank"] for e in starts) == [0, 1, 2, 3], f"two hosts: ranks 0..3 started once: {starts}")
    verify_run(report, "two hosts", os.path.join(work, "run"))
    print(f"reference: {STEPS} steps; 1 rank and 4 ranks on two hosts agree "
          f"({time.monotonic() - began:.0f} s for the two-host run)", flush=True)
    return single["sha256"]


# ---- 2. kills and a link taken down -------------------------------------------------------------

def current_ranks(world, since):
    """rank -> pid of the world started after `since` (once all four started)."""
    pids = {}
    for e in world.events.matching("start", since=since):
        pids[e["rank"]] = e["pid"]
    return pids


def resumed_after(world, since):
    return world.wait_for(lambda e: e["event"] == "resumed" and e["rank"] == 0 and e["t"] > since)


def whole_host_kills(kills):
    """Which kills take every process of host 1: every fifth, or the last of a short series."""
    return set(range(4, kills, 5)) or {kills - 1}


def kill_cycle(report, world, rng, index, last_resume_t, whole_host):
    """One kill, then the world's resume; returns the resume event (None: stop)."""
    # Let the world train (and save) a little first.
    time.sleep(rng.uniform(0.1, 1.5))
    pids = current_ranks(world, last_resume_t - 30)
    killed_at = time.time()
    saved_before = [e["step"] for e in world.events.matching("saved", rank=0) if e["t"] <= killed_at]
    if whole_host:
        label = f"kill {index + 1}: every process of host 1"
        world.hosts.kill_host(1)
        world.start_agent(1)
    else:
        rank = rng.randrange(4)
        label = f"kill {index + 1}: rank {rank}"
        if rank not in pids:
            report.check(False, f"{label}: no pid for the rank among {pids}")
            return None
        try:
            os.kill(pids[rank], signal.SIGKILL)
        except ProcessLookupError:
            pass
    event = resumed_after(world, killed_at)
    if not report.check(event is not None, f"{label}: the world resumed\n{world.tail()}"):
        return None
    floor = max(saved_before, default=0)
    report.check(event["step"] >= floor, f"{label}: resumed at {event['step']}, older than step {floor}, "
                                         f"saved before the kill")
    print(f"  {label}: resumed at step {event['step']} ({event['t'] - killed_at:.1f} s)", flush=True)
    return event


def link_down_in_save(report, hosts, work, name, args, hold, deadline, program=TRAINER, label="link"):
    """Starts a world whose every rank waits inside the save of step `hold`
    (--hold-save), takes host 1's link down meanwhile, and brings it back once
    every rank has failed: nothing is committed for that step, and the world
    resumes from the save before it. Returns the world, still running."""
    world = TwoHostWorld(hosts, work, name, args + ["--hold-save", f"{hold}:{HOLD_MS}"], deadline, program)
    started = time.time()
    world.start()
    holding = world.wait_for(lambda e: len(world.events.matching("holding", since=started, step=hold)) == 4,
                             timeout=WAIT_S)
    if report.check(holding is not None, f"{label}: every rank waits inside the save of step {hold}\n{world.tail()}"):
        pids = list(current_ranks(world, started).values())
        hosts.set_link(1, up=False)
        cut = time.time()
        # Down until every rank of that world has failed (the hold, then the
        # commit's collective timing out), so the save cannot complete late;
        # back before torchrun's agents give up on their own store (60 s).
        gone = all_gone(pids, timeout=(HOLD_MS + TIMEOUT_MS) / 1000 + 20)
        hosts.set_link(1, up=True)
        left = [f"{pid}: {process_state(pid)}" for pid in pids]
        report.check(gone, f"{label}: every rank of the cut-off world exits (left: {left})\n{world.tail()}")
        for host in (0, 1):
            if world.agents[host].poll() is not None:
                world.start_agent(host)  # an agent whose rendezvous gave up while cut off
        committed = [e for e in world.events.matching("saved", since=started) if e["step"] == hold]
        report.check(not committed, f"{label}: no rank reports the save of step {hold} done: {committed}")
        event = resumed_after(world, cut)
        if report.check(event is not None, f"{label}: the world resumed once the link was back\n{world.tail()}"):
            report.check(event["step"] == hold - 1, f"{label}: resumed at {event['step']}, the save before {hold}")
            print(f"  {label}: link down in the save of step {hold}: resumed at {event['step']}", flush=True)
    return world


def kills_and_link(report, hosts, root, reference, deadline):
    rng = random.Random(SEED)
    work = os.path.join(root, "kills")
    os.makedirs(work)
    run, events = os.path.join(work, "run"), os.path.join(work, "events.jsonl")
    # Saves every update; each update sleeps a little so a kill finds work to interrupt.
    common = ["--save-every", "1", "--sleep-ms", "60"]
    halves = [common, common + ["--async"]]
    done = 0
    world = None
    for part, extra in enumerate(halves):
        kills = KILLS // 2 if part == 0 else KILLS - KILLS // 2
        world = TwoHostWorld(hosts, work, f"kills{part}", example_args(run, events, STEPS, extra), deadline)
        started = time.time()
        world.start()
        first = world.wait_for(lambda e: e["event"] in ("resumed",) and e["rank"] == 0 and e["t"] > started) \
            if part else world.wait_for(lambda e: e["event"] == "saved" and e["rank"] == 0 and e["t"] > started)
        if not report.check(first is not None, f"kills, part {part}: the world started\n{world.tail()}"):
            world.stop()
            return
        last = first["t"]
        for _ in range(kills):
            event = kill_cycle(report, world, rng, done, last, done in whole_host_kills(KILLS))
            done += 1
            if event is None:
                world.stop()
                return
            last = event["t"]
        if part == 0:
            world.stop()

    # The link: every rank waits inside the save of a coming step while host 1
    # is cut off; the commit's collective times out on every rank.
    latest_saved = max((e["step"] for e in world.events.matching("saved", rank=0)), default=0)
    world.stop()
    world = link_down_in_save(report, hosts, work, "link", example_args(run, events, STEPS, common),
                              latest_saved + 6, deadline)
    codes = world.finish()
    world.stop()
    report.check(codes == [0, 0], f"kills: agents exit {codes}\n{world.tail()}")
    final = final_of(world.events)
    report.check(final is not None and final["step"] == STEPS and final["sha256"] == reference,
                 f"after {done} kills and a link down, the model is the reference's: {final}")
    verify_run(report, "kills", run)


# ---- 3. world-size changes ----------------------------------------------------------------------

def resize(report, hosts, root, reference, deadline):
    work = os.path.join(root, "resize")
    os.makedirs(work)
    run, events = os.path.join(work, "run"), os.path.join(work, "events.jsonl")
    stop_a, stop_b = 70, 150
    world = TwoHostWorld(hosts, work, "resize4", example_args(run, events, stop_a), deadline)
    world.start()
    codes = world.finish()
    world.stop()
    if not report.check(codes == [0, 0], f"resize: 4 ranks to step {stop_a}: agents exit {codes}\n{world.tail()}"):
        return
    log = EventLog(events)
    for nproc, steps, saved_world in ((2, stop_b, 4), (3, STEPS, 2)):
        label = f"resize: {nproc} ranks to step {steps}"
        began = time.time()
        args = torchrun(1, nproc, f"resize{nproc}", None, 3) + example_args(run, events, steps)
        result = subprocess.run(args, env=agent_env(), capture_output=True, text=True,
                                timeout=max(10, min(WAIT_S * 3, deadline - time.monotonic())))
        if not report.check(result.returncode == 0, f"{label}: exit {result.returncode}: "
                            f"{(result.stdout + result.stderr)[-1500:]}"):
            return
        resumed = [e for e in log.matching("resumed", since=began)]
        report.check(len(resumed) == nproc and all(e["saved_world"] == saved_world and e["world"] == nproc
                                                   for e in resumed),
                     f"{label}: every rank resumed a checkpoint of {saved_world} ranks: {resumed}")
    final = final_of(log)
    report.check(final is not None and final["world"] == 3 and final["sha256"] == reference,
                 f"4 -> 2 -> 3 ranks end with the reference's model: {final}")
    verify_run(report, "resize", run)
    print(f"resize: 4 ranks to {stop_a}, 2 to {stop_b}, 3 to {STEPS}: the reference's model", flush=True)


# ---- 4. the ready Trainer --------------------------------------------------------------------

def ready_trainer(report, hosts, root, deadline):
    steps = 150
    work = os.path.join(root, "trainer-ref")
    os.makedirs(work)
    world = TwoHostWorld(hosts, work, "trainer-ref", example_args(os.path.join(work, "run"),
                                                                  os.path.join(work, "events.jsonl"), steps),
                         deadline, READY_TRAINER)
    world.start()
    codes = world.finish()
    world.stop()
    reference = final_of(world.events)
    report.check(codes == [0, 0], f"trainer, straight: agents exit {codes}\n{world.tail()}")
    if not report.check(reference is not None and reference["step"] == steps and reference["world"] == 4,
                        f"trainer, straight: a final event at step {steps} from 4 ranks: {reference}"):
        return
    finals = [e for e in world.events.matching("final")]
    report.check(len({e["sha256"] for e in finals}) == 1 and len(finals) == 4,
                 f"trainer, straight: every rank ends with the same model: {finals}")

    rng = random.Random(SEED + 1)
    work = os.path.join(root, "trainer-kills")
    os.makedirs(work)
    run, events = os.path.join(work, "run"), os.path.join(work, "events.jsonl")
    common = ["--save-every", "1", "--sleep-ms", "60"]
    world = TwoHostWorld(hosts, work, "trainer-kills", example_args(run, events, steps, common), deadline,
                         READY_TRAINER)
    started = time.time()
    world.start()
    first = world.wait_for(lambda e: e["event"] == "saved" and e["rank"] == 0 and e["t"] > started)
    if not report.check(first is not None, f"trainer, kills: the world started\n{world.tail()}"):
        world.stop()
        return
    last = first["t"]
    # The second kill takes a whole host, and every fifth after it; the others one rank.
    for index in [0, 4] + list(range(5, 5 + TRAINER_KILLS - 2)):
        event = kill_cycle(report, world, rng, index, last, index % 5 == 4)
        if event is None:
            world.stop()
            return
        last = event["t"]
    # Host 1's link taken down while every rank waits inside a save.
    latest_saved = max((e["step"] for e in world.events.matching("saved", rank=0)), default=0)
    world.stop()
    world = link_down_in_save(report, hosts, work, "trainer-link", example_args(run, events, steps, common),
                              latest_saved + 4, deadline, READY_TRAINER, "trainer, link")
    codes = world.finish()
    world.stop()
    report.check(codes == [0, 0], f"trainer, kills: agents exit {codes}\n{world.tail()}")
    final = final_of(world.events)
    report.check(final is not None and final["step"] == steps and final["sha256"] == reference["sha256"],
                 f"trainer: after {TRAINER_KILLS} kills and a link down, the model is the straight run's: "
                 f"{final} vs {reference}")
    verify_run(report, "trainer, kills", run)
    print(f"trainer: {steps} steps on 4 ranks; after {TRAINER_KILLS} kills and a link down, the straight run's "
          "model", flush=True)

    # Another number of ranks resumes the same run (on another trajectory: the
    # batches and the sums depend on the world size).
    log = EventLog(events)
    for nproc, to in ((2, steps + 20), (3, steps + 40)):
        label = f"trainer, resize: {nproc} ranks to step {to}"
        began = time.time()
        args = torchrun(1, nproc, f"trainer-resize{nproc}", None, 3, program=READY_TRAINER) + \
            example_args(run, events, to)
        result = subprocess.run(args, env=agent_env(), capture_output=True, text=True,
                                timeout=max(10, min(WAIT_S * 3, deadline - time.monotonic())))
        if not report.check(result.returncode == 0, f"{label}: exit {result.returncode}: "
                            f"{(result.stdout + result.stderr)[-1500:]}"):
            return
        resumed = log.matching("resumed", since=began)
        report.check(len(resumed) == nproc and all(e["world"] == nproc for e in resumed),
                     f"{label}: every rank resumed: {resumed}")
        ended = [e for e in log.matching("final", since=began)]
        report.check(len(ended) == nproc and len({e["sha256"] for e in ended}) == 1 and ended[0]["step"] == to,
                     f"{label}: every rank ends at step {to} with the same model: {ended}")
    verify_run(report, "trainer, resize", run)
    print(f"trainer: resized 4 -> 2 -> 3 ranks to step {steps + 40}", flush=True)


def main():
    report = harness.Report("torchrun_hosts")
    harness.require_executable(TRAINER)
    harness.require_executable(READY_TRAINER)
    deadline = time.monotonic() + DEADLINE_S
    print(f"seed {SEED}, {KILLS} kills", flush=True)
    root = tempfile.mkdtemp(prefix="holdpoint-torchrun-")
    try:
        with TwoHosts() as hosts:
            reference = references(report, hosts, root, deadline)
            if reference:
                kills_and_link(report, hosts, root, reference, deadline)
                resize(report, hosts, root, reference, deadline)
            ready_trainer(report, hosts, root, deadline)
    except NamespaceError as error:
        report.check(False, f"the two hosts could not be made: {error}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
