"""holdpoint.dcp against stock torch.distributed.checkpoint, same run, same state (issue 36):

    python bench/dcp_bench.py [--worlds 2,4] [--cases big,many] [--repeat R] [--mib M] [--tensors N]
                              [--cold] [--commit-worlds 2,4,8] [--commit-mib M] [--dir DIR] [--json FILE]

Every world is W spawned processes on this host, one Gloo group over a FileStore.
Two states:
  * big: M MiB (default 1024) of float32 in 8 DTensors of (8 M, 4096), each sharded
    on dim 0 across the W ranks;
  * many: N (default 20,000) plain tensors of 1000 float32, the same on every rank
    (replicated: DCP's planner gives each to one rank to write; every rank loads all).
Timed on the same state in the same processes, each operation for holdpoint and stock
back to back, alternating which goes first, each figure the median of R (default 6,
after one untimed round of each); files are deleted only when the world ends:
  * save: the dcp.save call, from the ranks' common start (after a barrier) to the last
    rank's return. holdpoint.dcp.StorageWriter (per-item SHA-256, fsync, read-back,
    rename, directory fsync, the step manifest committed) against
    FileSystemWriter(folder, sync_files=True) (each file fsynced; no directory fsync);
  * load: dcp.load into preallocated targets (zeroed outside the clock and compared
    with the state after it); the page cache is warm (the files were just written);
    holdpoint.dcp.StorageReader checks every item it reads against its SHA-256;
    with --cold, a second load after `echo 1 > /proc/sys/vm/drop_caches` (needs root);
  * async: dcp.async_save (thread variant): the time until it returns; the save's
    completion is waited for outside the clock.
The ratio is holdpoint / stock: of the medians, and paired (the median of each
repetition's own ratio; the disk's pace drifts between repetitions, less within a pair).

--commit-worlds: the coordinator's commit at W ranks (saves of the many state, and of
the big one at --commit-mib MiB). finish() (holdpoint: .metadata pickled, published
and read back, the step manifest committed; stock: .metadata written and fsynced), the
gather of the write results (the last rank's end of write_data to the coordinator's
start of finish), the final broadcast (end of finish to the last rank's return), the
bytes of every message DCP pickles, and the sizes of the step manifest and .metadata.
On 2 cores, 8 ranks measure the coordinator, not the ranks' I/O.
Prints Markdown.
"""

import argparse
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import types
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
COLUMNS = 4096  # the big state's tensors are (8 M, 4096) float32: 8 of them make M MiB


# ---- in every rank ---------------------------------------------------------------------------

def _init(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def _states(case, config, rank, world, mesh):
    """The state to save and preallocated targets of the same layout."""
    if case == "big":
        from torch.distributed.tensor import DTensor, Shard

        rows = config["mib"] * 8
        generator = torch.Generator().manual_seed(1000 + rank)
        state, targets = {}, {}
        for i in range(8):
            local = torch.empty(rows // world, COLUMNS).uniform_(generator=generator)
            state[f"layer{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            targets[f"layer{i}.weight"] = DTensor.from_local(torch.zeros_like(local), mesh, [Shard(0)],
                                                             run_check=False)
        return state, targets
    state = {f"t{i}": torch.arange(1000, dtype=torch.float32) + i for i in range(config["tensors"])}
    return state, {name: torch.zeros(1000) for name in state}


def _locals(state):
    return [value.to_local() if hasattr(value, "to_local") else value for value in state.values()]


def _check_loaded(state, targets, what):
    for saved, loaded in zip(_locals(state), _locals(targets)):
        if not torch.equal(saved, loaded):
            raise SystemExit(f"{what}: the loaded state differs from the saved one")
    for loaded in _locals(targets):
        loaded.zero_()


def _drop_caches(rank):
    dist.barrier()
    if rank == 0:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    dist.barrier()


def _compare_rank(rank, world, init_file, case, config, work, out):
    import holdpoint.dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    mesh = _init(rank, world, init_file)
    state, targets = _states(case, config, rank, world, mesh)
    run = os.path.join(work, "holdpoint-run")
    records = []

    def timed(label, repetition, action):
        dist.barrier()
        start = time.perf_counter()
        result = action()
        end = time.perf_counter()
        records.append({"label": label, "rep": repetition, "start": start, "end": end})
        return result

    def holdpoint_operation(operation, repetition):
        if operation == "save":
            timed("save holdpoint", repetition, lambda: dcp.save(state, storage_writer=holdpoint.dcp.StorageWriter(run)))
        elif operation.endswith("load"):
            if operation == "cold load":
                _drop_caches(rank)
            timed(f"{operation} holdpoint", repetition,
                  lambda: dcp.load(targets, storage_reader=holdpoint.dcp.StorageReader(run)))
            _check_loaded(state, targets, f"holdpoint ({operation})")
        else:
            timed("async holdpoint", repetition,
                  lambda: dcp.async_save(state, storage_writer=holdpoint.dcp.StorageWriter(run))).result()

    def stock_operation(operation, repetition):
        folder = os.path.join(work, f"stock-{repetition + 1}")
        if operation == "save":
            timed("save stock", repetition,
                  lambda: dcp.save(state, storage_writer=FileSystemWriter(folder, sync_files=True)))
        elif operation.endswith("load"):
            if operation == "cold load":
                _drop_caches(rank)
            timed(f"{operation} stock", repetition, lambda: dcp.load(targets, storage_reader=FileSystemReader(folder)))
            _check_loaded(state, targets, f"stock ({operation})")
        else:
            timed("async stock", repetition, lambda: dcp.async_save(
                state, storage_writer=FileSystemWriter(folder + "-async", sync_files=True))).result()

    # Each operation runs for both back to back, the order alternating;
    # repetition -1 is the untimed warm-up of both (the first save opens the
    # run). holdpoint's load reads LATEST, the save just made (the async save
    # comes after the loads). Nothing is deleted until the world ends: on this
    # machine's virtual disk a save into blocks just freed runs two to three
    # times as fast as one into new space, so deleting stock's folders between
    # repetitions made whichever save came first after it look fast.
    operations = ["save", "load"] + (["cold load"] if config["cold"] else []) + ["async"]
    for repetition in range(-1, config["repeat"]):
        for operation in operations:
            pair = (holdpoint_operation, stock_operation)
            for run_operation in pair if repetition % 2 == 0 else reversed(pair):
                run_operation(operation, repetition)
    dist.barrier()
    if rank == 0:
        holdpoint.dcp.close_runs()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(records, f)
    dist.barrier()
    dist.destroy_process_group()


def _commit_rank(rank, world, init_file, case, config, work, out):
    """Saves with the coordinator's steps timed (holdpoint and stock writers subclassed,
    holdpoint's native calls wrapped in this process only)."""
    import holdpoint.dcp
    from holdpoint import _native
    from torch.distributed.checkpoint import FileSystemWriter

    mesh = _init(rank, world, init_file)
    state, _targets = _states(case, config, rank, world, mesh)
    run = os.path.join(work, "holdpoint-run")
    current: dict = {}   # the record of the save in progress, on this rank
    records = []

    def clocked(name, function):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                current.setdefault("phases", {}).setdefault(name, 0.0)
                current["phases"][name] += time.perf_counter() - start
        return wrapper

    native_write = _native.write_dcp_file

    def write_dcp_file(folder, name, *args):
        if name == ".metadata":
            return clocked(".metadata published", native_write)(folder, name, *args)
        return native_write(folder, name, *args)

    _native.write_dcp_file = write_dcp_file
    _native.read_dcp_metadata = clocked(".metadata read back", _native.read_dcp_metadata)
    holdpoint.dcp.pickle = types.SimpleNamespace(dumps=clocked(".metadata pickled", pickle.dumps))

    class TimedRun:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def commit_dcp(self, *args):
            return clocked("step manifest committed", self._inner.commit_dcp)(*args)

        def prepare_dcp_folder(self, *args):
            return clocked("generation folder created", self._inner.prepare_dcp_folder)(*args)

    coordinator_run = holdpoint.dcp._coordinator_run
    holdpoint.dcp._coordinator_run = lambda *args: (lambda pair: (TimedRun(pair[0]), pair[1]))(
        coordinator_run(*args))

    def instrumented(base):
        class Timed(base):
            def prepare_global_plan(self, plans):
                current["local plan bytes"] = [len(pickle.dumps(plan)) for plan in plans]
                start = time.perf_counter()
                out_plans = super().prepare_global_plan(plans)
                current["prepare_global_plan"] = time.perf_counter() - start
                current["global plan bytes"] = [len(pickle.dumps(plan)) for plan in out_plans]
                return out_plans

            def write_data(self, plan, planner):
                future = super().write_data(plan, planner)
                future.wait()
                current["write end"] = time.perf_counter()
                return future

            def finish(self, metadata, results):
                current["finish start"] = time.perf_counter()
                super().finish(metadata, results)
                current["finish end"] = time.perf_counter()
                current["write result bytes"] = [len(pickle.dumps(r)) for r in results]
                current["write results"] = [len(r) for r in results]
                current["metadata bytes"] = len(pickle.dumps(metadata))
        return Timed

    holdpoint_writer, stock_writer = instrumented(holdpoint.dcp.StorageWriter), instrumented(FileSystemWriter)
    for repetition in range(-1, config["repeat"]):
        for kind in ("holdpoint", "stock"):
            current.clear()
            folder = os.path.join(work, f"stock-{repetition + 1}")
            writer = holdpoint_writer(run) if kind == "holdpoint" else stock_writer(folder, sync_files=True)
            dist.barrier()
            current["start"] = time.perf_counter()
            dcp.save(state, storage_writer=writer)
            current["return"] = time.perf_counter()
            if rank == 0 and kind == "holdpoint":
                step = writer.committed["step"]
                checkpoints = os.path.join(run, "checkpoints")
                current["step manifest bytes"] = os.path.getsize(os.path.join(checkpoints, f"step-{step:08d}.pt"))
                current[".metadata file bytes"] = os.path.getsize(
                    os.path.join(checkpoints, f"step-{step:08d}.shards", ".metadata"))
            if rank == 0 and kind == "stock":
                current[".metadata file bytes"] = os.path.getsize(os.path.join(folder, ".metadata"))
            records.append({"kind": kind, "rep": repetition, **current})
            dist.barrier()
            if rank == 0 and kind == "stock":
                shutil.rmtree(folder)
    if rank == 0:
        holdpoint.dcp.close_runs()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(records, f)
    dist.barrier()
    dist.destroy_process_group()


def _spawned(rank, target, world, init_file, case, config, work, out):
    sys.path.insert(0, config["python_path"])
    torch.manual_seed(rank)
    target(rank, world, init_file, case, config, work, out)


# ---- the launcher ------------------------------------------------------------------------------

def _world(target, world, case, config, parent):
    work = tempfile.mkdtemp(prefix=f"dcp-{case}-w{world}-", dir=parent)
    out = os.path.join(work, "results")
    os.mkdir(out)
    init_file = os.path.join(work, "store")
    try:
        mp.spawn(_spawned, args=(target, world, init_file, case, config, work, out), nprocs=world, join=True)
        ranks = []
        for rank in range(world):
            with open(os.path.join(out, f"rank-{rank}.json")) as f:
                ranks.append(json.load(f))
        return ranks
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _spans(ranks, label):
    """Per timed repetition: the last rank's end minus the first rank's start."""
    repetitions = sorted({r["rep"] for r in ranks[0] if r["label"] == label and r["rep"] >= 0})
    spans = []
    for repetition in repetitions:
        rows = [r for rank in ranks for r in rank if r["label"] == label and r["rep"] == repetition]
        spans.append(max(r["end"] for r in rows) - min(r["start"] for r in rows))
    return spans


def _paired_ratio(ours, theirs):
    """The median of the repetitions' own ratios (each pair ran back to back)."""
    return statistics.median(a / b for a, b in zip(ours, theirs))


def _describe(case, config):
    if case == "big":
        return f"big: {config['mib']} MiB in 8 DTensors of ({config['mib'] * 8}, {COLUMNS}) float32, Shard(0)"
    return f"many: {config['tensors']} tensors of 1000 float32, replicated (each written by one rank)"


def compare(config, parent, report):
    targets = {"save": 1.0, "load": 1.15, "async": 1.0}
    print("### holdpoint.dcp against stock DCP, same state, same processes\n")
    print("| state | ranks | operation | holdpoint (s) | stock (s) | holdpoint / stock | paired ratio | target | |")
    print("|---|---|---|---|---|---|---|---|---|")
    for case in config["cases"]:
        for world in config["worlds"]:
            ranks = _world(_compare_rank, world, case, config, parent)
            row = {"case": case, "world": world}
            operations = ["save", "load", "async"] + (["cold load"] if config["cold"] else [])
            for operation in operations:
                ours, theirs = _spans(ranks, f"{operation} holdpoint"), _spans(ranks, f"{operation} stock")
                mine, stock = statistics.median(ours), statistics.median(theirs)
                ratio, paired = mine / stock, _paired_ratio(ours, theirs)
                bound = targets.get(operation)
                verdict = "" if bound is None else ("met" if max(ratio, paired) <= bound else
                                                    "**not met**" if min(ratio, paired) > bound else "**mixed**")
                print(f"| {case} | {world} | {operation} | {mine:.3f} | {stock:.3f} | {ratio:.2f} | {paired:.2f} | "
                      f"{'' if bound is None else f'<= {bound:.2f}'} | {verdict} |", flush=True)
                row[operation] = {"holdpoint": ours, "stock": theirs, "ratio": ratio, "paired": paired}
            report.append(row)
    print()
    for row in report:
        print(f"- {_describe(row['case'], config)}, {row['world']} ranks: all runs (s): " + "; ".join(
            f"{op} holdpoint {' '.join(f'{s:.3f}' for s in row[op]['holdpoint'])} / stock "
            f"{' '.join(f'{s:.3f}' for s in row[op]['stock'])}"
            for op in row if op not in ("case", "world")))


def commit_costs(config, parent, report):
    print("\n### The coordinator's commit (finish) by world size\n")
    print("| state | ranks | writer | finish (ms) | gather of write results (ms) | final broadcast (ms) | "
          "whole save (s) | write results (bytes/rank, max) | .metadata (bytes) | step manifest (bytes) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    phases_rows = []
    for case in config["commit_cases"]:
        case_config = dict(config, mib=config["commit_mib"])
        for world in config["commit_worlds"]:
            ranks = _world(_commit_rank, world, case, case_config, parent)
            for kind in ("holdpoint", "stock"):
                reps = sorted({r["rep"] for r in ranks[0] if r["kind"] == kind and r["rep"] >= 0})
                finish, gather, broadcast, whole = [], [], [], []
                phases: dict[str, list[float]] = {}
                for repetition in reps:
                    rows = [next(r for r in rank if r["kind"] == kind and r["rep"] == repetition) for rank in ranks]
                    coordinator = rows[0]
                    finish.append(coordinator["finish end"] - coordinator["finish start"])
                    gather.append(coordinator["finish start"] - max(r["write end"] for r in rows))
                    broadcast.append(max(r["return"] for r in rows) - coordinator["finish end"])
                    whole.append(max(r["return"] for r in rows) - min(r["start"] for r in rows))
                    for name, seconds in coordinator.get("phases", {}).items():
                        phases.setdefault(name, []).append(seconds)
                last = next(r for r in ranks[0] if r["kind"] == kind and r["rep"] == reps[-1])
                manifest = last.get("step manifest bytes")
                print(f"| {case} | {world} | {kind} | {1000 * statistics.median(finish):.1f} | "
                      f"{1000 * statistics.median(gather):.1f} | {1000 * statistics.median(broadcast):.1f} | "
                      f"{statistics.median(whole):.3f} | {max(last['write result bytes'])} "
                      f"({max(last['write results'])} items) | {last['.metadata file bytes']} | "
                      f"{manifest if manifest else '-'} |", flush=True)
                entry = {"case": case, "world": world, "kind": kind, "finish": finish, "gather": gather,
                         "broadcast": broadcast, "whole": whole,
                         "phases": {k: statistics.median(v) for k, v in phases.items()},
                         "local plan bytes": last["local plan bytes"], "global plan bytes": last["global plan bytes"],
                         "write result bytes": last["write result bytes"], "write results": last["write results"],
                         "metadata bytes": last["metadata bytes"], ".metadata file bytes": last[".metadata file bytes"],
                         "step manifest bytes": manifest}
                report.append(entry)
                if kind == "holdpoint":
                    phases_rows.append(entry)
    print("\nholdpoint's finish() on the coordinator, by phase (ms, median):\n")
    names = [".metadata pickled", ".metadata published", ".metadata read back", "step manifest committed"]
    print("| state | ranks | " + " | ".join(names) + " | rest (records built) | prepare_global_plan (folder created) |")
    print("|---|---|" + "---|" * (len(names) + 2))
    for entry in phases_rows:
        total = statistics.median(entry["finish"])
        parts = [entry["phases"].get(name, 0.0) for name in names]
        folder = entry["phases"].get("generation folder created", 0.0)
        print(f"| {entry['case']} | {entry['world']} | " + " | ".join(f"{1000 * p:.1f}" for p in parts) +
              f" | {1000 * (total - sum(parts)):.1f} | {1000 * folder:.1f} |")
    print("\nMessages DCP pickles per save (bytes, last repetition): local plans gathered, global plans scattered, "
          "write results gathered (per rank), Metadata broadcast to every rank:\n")
    for entry in report:
        if "local plan bytes" in entry:
            print(f"- {entry['case']}, {entry['world']} ranks, {entry['kind']}: local plans "
                  f"{entry['local plan bytes']}; global plans {entry['global plan bytes']}; write results "
                  f"{entry['write result bytes']} for {entry['write results']} items; Metadata "
                  f"{entry['metadata bytes']}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--cases", default="big,many")
    parser.add_argument("--repeat", type=int, default=6, help="even: each goes first as often")
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=20000)
    parser.add_argument("--cold", action="store_true", help="also load after dropping the page cache (root)")
    parser.add_argument("--commit-worlds", default="", help="e.g. 2,4,8: the coordinator's commit cost")
    parser.add_argument("--commit-cases", default="many,big")
    parser.add_argument("--commit-mib", type=int, default=64)
    parser.add_argument("--no-compare", action="store_true", help="only the commit costs")
    parser.add_argument("--dir", help="where the runs are written (default: a temporary folder)")
    parser.add_argument("--json", help="also write every figure here")
    parser.add_argument("--build-dir", default=os.environ.get("HOLDPOINT_BUILD_DIR",
                                                              os.path.join(os.path.dirname(HERE), "build")))
    args = parser.parse_args()
    config = {"worlds": [int(w) for w in args.worlds.split(",") if w],
              "cases": [c for c in args.cases.split(",") if c],
              "commit_worlds": [int(w) for w in args.commit_worlds.split(",") if w],
              "commit_cases": [c for c in args.commit_cases.split(",") if c],
              "repeat": args.repeat, "mib": args.mib, "tensors": args.tensors, "cold": args.cold,
              "commit_mib": args.commit_mib, "python_path": os.path.abspath(os.path.join(args.build_dir, "python"))}
    if args.mib % 8 or any(args.mib * 8 % w for w in config["worlds"]):
        parser.error("--mib times 8 must divide by every world size")
    os.environ["PYTHONPATH"] = config["python_path"] + os.pathsep + os.environ.get("PYTHONPATH", "")
    parent = args.dir or tempfile.gettempdir()
    print("## holdpoint.dcp against torch.distributed.checkpoint (issue 36)\n")
    print(f"command: python {' '.join(sys.argv)}  ")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    report: list = []
    if not args.no_compare:
        compare(config, parent, report)
    if config["commit_worlds"]:
        commit_costs(config, parent, report)
    print(f"\nLoad average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
