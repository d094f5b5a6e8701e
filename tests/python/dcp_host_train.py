"""One rank of the two-host training run of test_dcp_hosts.py (docs/dcp-faults.md).

Launched by torchrun on each host (network namespace); every rank runs this:

    torchrun --nnodes=2 --nproc-per-node=2 ... dcp_host_train.py -- --work DIR --storage holdpoint ...

A small FSDP2 model (fully_shard over init_device_mesh("cpu", (4,))) and Adam are
trained on data that depends only on the seed, the step and the rank, so any two
runs of the same steps end bit-identical. After every step the model, the
optimizer and the step counter are checkpointed with dcp.save (odd steps) or
dcp.async_save (even steps), in one of three ways (--storage):

- holdpoint: a generation of the holdpoint run directory WORK/run, through
  holdpoint.dcp.StorageWriter; at start the run's LATEST is loaded through
  holdpoint.dcp.StorageReader when the run has one;
- stock-folders: stock FileSystemWriter(WORK/stock/step-N, sync_files=True), then
  rank 0 writes the folder's name into WORK/stock/latest, which a start loads;
- stock-overwrite: stock FileSystemWriter(WORK/stock/checkpoint, sync_files=True),
  one folder overwritten by every save; a start loads it when it has a .metadata.

torchrun restarts the whole world after a failure, and the restarted ranks resume
from what the storage says is the newest checkpoint. Saves run on a Gloo group of
their own (dcp.async_save's collectives then never interleave with the training
step's) whose timeout (--checkpoint-timeout) bounds how long a save waits for an
unreachable peer. Rank 0 writes the final full state to WORK/final.pt (torch.save)
for the test to compare.

Every rank appends what it does to WORK/events.jsonl, one JSON object a line
(start, resumed, resume-failed, saving, saved, save-failed, killing, gate, trained,
checked), which the test follows. WORK/plan.json (optional) lists faults, each
fired once: a marker WORK/fired/<id> says it fired, so a restarted world does not
repeat it (TORCHELASTIC_RESTART_COUNT cannot say so: each agent counts its own
restarts, and an agent started again counts from 0).
- {"id", "kind": "kill", "step", "rank", "fraction"}: when the rank calls the save of
  `step`, it starts a timer that SIGKILLs it, wherever it is then, after `fraction`
  of the median duration of this run's earlier saves of the same kind;
- {"id", "kind": "gate", "step"}: every rank waits, before the save of `step`, until
  WORK/gates/<id>.open exists, so the test can arrange a fault (fill the disk, take
  a link down, kill a host) for that save.

--load-checks FILE: after training, the same world runs the load checks the file
lists (test_dcp_hosts.py, "load faults"): for each case rank 0 damages a file of
the last generation between barriers, every rank loads through StorageReader, and
each writes its outcomes to WORK/load-checks-<rank>.json.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import holdpoint  # noqa: E402
import holdpoint.dcp  # noqa: E402

SEED = 20261207
WIDTH = 256


class Events:
    """Appends one JSON line per event to WORK/events.jsonl (O_APPEND: lines of
    several ranks never interleave)."""

    def __init__(self, work, rank):
        self.rank = rank
        self.fd = os.open(os.path.join(work, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.host = os.environ.get("HOLDPOINT_HOST", "?")

    def log(self, event, **fields):
        record = {"t": time.time(), "event": event, "rank": self.rank, "pid": os.getpid(), "host": self.host,
                  "restart": self.restart, **fields}
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def build(mesh):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(32, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.ReLU(), torch.nn.Linear(WIDTH, 8))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, optimizer


def train_step(model, optimizer, step, rank):
    generator = torch.Generator().manual_seed(SEED * 1000 + step * 16 + rank)
    x = torch.randn(16, 32, generator=generator)
    y = torch.randn(16, 8, generator=generator)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def checkpoint_state(model, optimizer, step):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "progress": {"step": step}}


def full(state):
    """Every DTensor made whole (a collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: full(v) for k, v in state.items()}
    if isinstance(state, list):
        return [full(v) for v in state]
    if isinstance(state, DTensor):
        return state.full_tensor().clone()
    if isinstance(state, torch.Tensor):
        return state.clone()
    return state


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


# ---- storage: where a save goes, what a start resumes from --------------------------------

class Storage:
    def __init__(self, kind, work):
        self.kind = kind
        self.run = os.path.join(work, "run")
        self.stock = os.path.join(work, "stock")

    def writer(self, step):
        if self.kind == "holdpoint":
            return holdpoint.dcp.StorageWriter(self.run, step=step)
        return dcp.FileSystemWriter(self.folder(step), sync_files=True)

    def folder(self, step):
        name = f"step-{step:08d}" if self.kind == "stock-folders" else "checkpoint"
        return os.path.join(self.stock, name)

    def saved(self, step, rank):
        """After a save of `step` returned on every rank: the user's pointer."""
        if self.kind == "stock-folders" and rank == 0:
            # As training scripts commonly do: the pointer is rewritten in place.
            with open(os.path.join(self.stock, "latest"), "w") as f:
                f.write(f"step-{step:08d}\n")

    def resume_source(self):
        """("holdpoint", generation name) or ("stock", folder) of the newest
        checkpoint, or None for a fresh start (rank 0 decides, for every rank)."""
        if self.kind == "holdpoint":
            if not os.path.isdir(self.run):
                return None
            latest = holdpoint.RunDirectory(self.run, recover=False, create=False).latest()
            return None if latest is None else ("holdpoint", latest["name"])
        if self.kind == "stock-folders":
            pointer = os.path.join(self.stock, "latest")
            if not os.path.exists(pointer):
                return None
            with open(pointer) as f:
                return ("stock", os.path.join(self.stock, f.read().strip()))
        folder = self.folder(0)
        return ("stock", folder) if os.path.exists(os.path.join(folder, ".metadata")) else None

    def reader(self, source):
        if source[0] == "holdpoint":
            return holdpoint.dcp.StorageReader(self.run)
        return dcp.FileSystemReader(source[1])


# ---- faults ---------------------------------------------------------------------------------

class Faults:
    def __init__(self, work, events, rank):
        self.work, self.events, self.rank = work, events, rank
        path = os.path.join(work, "plan.json")
        self.plan = []
        if os.path.exists(path):
            with open(path) as f:
                self.plan = json.load(f)
        os.makedirs(os.path.join(work, "fired"), exist_ok=True)
        os.makedirs(os.path.join(work, "gates"), exist_ok=True)
        self.in_save = None  # the step whose save is in flight on this rank

    def _fired(self, fault):
        """A kill fired, or a gate opened, before (in this world or an earlier one)."""
        marker = ("fired", fault["id"]) if fault["kind"] == "kill" else ("gates", fault["id"] + ".open")
        return os.path.exists(os.path.join(self.work, *marker))

    def before_save(self, step, asynchronous):
        for fault in self.plan:
            if fault["step"] != step or self._fired(fault):
                continue
            if fault["kind"] == "gate":
                self._wait_at_gate(fault)
            elif fault["kind"] == "kill" and fault["rank"] == self.rank:
                delay = fault["fraction"] * self._typical_save_seconds(asynchronous)
                timer = threading.Timer(delay, self._kill, args=(fault, delay))
                timer.daemon = True
                timer.start()

    def _typical_save_seconds(self, asynchronous):
        """The median duration of this run's earlier saves of the same kind (from
        the event log, which outlives restarts): a kill lands at a fraction of it."""
        with open(os.path.join(self.work, "events.jsonl")) as f:
            seconds = sorted(e["seconds"] for e in map(json.loads, f)
                             if e["event"] == "saved" and e["asynchronous"] == asynchronous)
        return seconds[len(seconds) // 2] if seconds else 0.2

    def _wait_at_gate(self, fault):
        self.events.log("gate", id=fault["id"], step=fault["step"])
        deadline = time.monotonic() + 300
        while not self._fired(fault):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {fault['id']} was not opened within 300 s")
            time.sleep(0.01)

    def _kill(self, fault, delay):
        with open(os.path.join(self.work, "fired", fault["id"]), "x"):
            pass
        self.events.log("killing", id=fault["id"], step=fault["step"], delay=delay, in_save=self.in_save)
        os.kill(os.getpid(), signal.SIGKILL)


# ---- training ---------------------------------------------------------------------------------

def train(args, rank, mesh, events):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    storage = Storage(args.storage, args.work)
    faults = Faults(args.work, events, rank)
    # async_save's collectives run on a thread of their own while the training
    # step runs its own: a group of their own keeps the two apart.
    checkpoint_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.checkpoint_timeout))
    model, optimizer = build(mesh)

    source = [storage.resume_source() if rank == 0 else None]
    dist.broadcast_object_list(source, src=0)
    first = 1
    if source[0] is not None:
        state = checkpoint_state(model, optimizer, 0)
        reader = storage.reader(source[0])
        try:
            dcp.load(state, storage_reader=reader)
        except BaseException as error:  # noqa: BLE001 - recorded, then the rank fails as it would
            events.log("resume-failed", source=str(source[0][1]), error=str(error)[-2000:])
            raise
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        first = state["progress"]["step"] + 1
        loaded = reader.loaded["name"] if source[0][0] == "holdpoint" else os.path.basename(source[0][1])
        events.log("resumed", step=first - 1, source=loaded,
                   recovery=getattr(reader, "recovery", []))

    pending = None  # (future, step) of an async save in flight
    for step in range(first, args.steps + 1):
        train_step(model, optimizer, step, rank)
        if pending is not None:
            wait_async(pending, storage, rank, events, faults)
            pending = None
        state = checkpoint_state(model, optimizer, step)
        asynchronous = step % 2 == 0
        faults.before_save(step, asynchronous)
        events.log("saving", step=step, asynchronous=asynchronous)
        faults.in_save = step
        began = time.monotonic()
        try:
            if asynchronous:
                pending = (dcp.async_save(state, storage_writer=storage.writer(step), process_group=checkpoint_group),
                           step, began)
                continue
            dcp.save(state, storage_writer=storage.writer(step), process_group=checkpoint_group)
        except BaseException as error:  # noqa: BLE001 - recorded, then the rank fails as it would
            events.log("save-failed", step=step, seconds=time.monotonic() - began, error=str(error)[-2000:])
            raise
        faults.in_save = None
        events.log("saved", step=step, seconds=time.monotonic() - began, asynchronous=False)
        storage.saved(step, rank)
    if pending is not None:
        wait_async(pending, storage, rank, events, faults)

    state = checkpoint_state(model, optimizer, args.steps)
    final = full({"model": state["model"], "optim": state["optim"]})
    if rank == 0:
        staging = os.path.join(args.work, "final.pt.partial")
        torch.save(final, staging)
        os.replace(staging, os.path.join(args.work, "final.pt"))
    events.log("trained", step=args.steps)
    return final


def wait_async(pending, storage, rank, events, faults):
    future, step, began = pending
    try:
        future.result()
    except BaseException as error:  # noqa: BLE001
        events.log("save-failed", step=step, seconds=time.monotonic() - began, error=str(error)[-2000:])
        raise
    faults.in_save = None
    events.log("saved", step=step, seconds=time.monotonic() - began, asynchronous=True)
    storage.saved(step, rank)


# ---- load checks ------------------------------------------------------------------------------

def load_checks(args, rank, mesh, events, final):
    """Each case: rank 0 damages one file of the run's last generation (between
    barriers), every rank loads through StorageReader into a fresh model, records
    the outcome and whether its live state changed, and rank 0 puts the file back.
    A case names its damage by file and item ("the largest model item of
    __3_0.distcp"); rank 0 finds the bytes from .metadata."""
    with open(args.load_checks) as f:
        cases = json.load(f)
    run = os.path.join(args.work, "run")
    results = {}
    for case in cases:
        where = [locate_damage(run, case) if rank == 0 else None]
        dist.broadcast_object_list(where, src=0)
        pristine = damage_file(where[0]) if rank == 0 else None
        dist.barrier()
        model, optimizer = build(mesh)
        state = checkpoint_state(model, optimizer, -1)
        if case.get("only") == "model":
            state = {"model": state["model"], "progress": state["progress"]}
        before = full(state)
        outcome = {"damage": where[0]}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                reader = holdpoint.dcp.StorageReader(run, generation=case["generation"])
                dcp.load(state, storage_reader=reader)
                outcome["loaded"] = reader.loaded["step"]
                outcome["progress"] = state["progress"]["step"]
                outcome["model_equals_final"] = same(full(state["model"]), final["model"])
            except BaseException as error:  # noqa: BLE001 - DCP wraps a rank's refusal in a CheckpointException
                outcome["error"] = str(error)[-3000:]
                outcome["unchanged"] = same(full(state), before)
        outcome["warnings"] = [str(w.message) for w in caught if "holdpoint" in str(w.message)]
        results[case["name"]] = outcome
        dist.barrier()
        if pristine is not None:
            with open(where[0]["path"], "wb") as f:
                f.write(pristine)
        dist.barrier()
    with open(os.path.join(args.work, f"load-checks-{rank}.json"), "w") as f:
        json.dump(results, f)
    events.log("checked", cases=len(cases))


def locate_damage(run, case):
    """The file and byte offset a case damages, in the generation it names."""
    damage = case["damage"]
    latest = holdpoint.RunDirectory(run, recover=False, create=False).latest()
    folder = os.path.join(run, "checkpoints", f"step-{latest['step']:08d}.shards")
    path = os.path.join(folder, damage["file"])
    if damage["kind"] == "truncate":
        return {"kind": "truncate", "path": path, "offset": os.path.getsize(path) - damage["bytes"]}
    metadata = dcp.FileSystemReader(folder).read_metadata()
    items = [(info.length, info.offset, index.fqn) for index, info in metadata.storage_data.items()
             if info.relative_path == damage["file"] and index.fqn.startswith(damage["item"])]
    length, offset, fqn = max(items)
    return {"kind": "flip", "path": path, "offset": offset + length // 2, "item": fqn}


def damage_file(where):
    with open(where["path"], "rb") as f:
        pristine = f.read()
    body = bytearray(pristine)
    if where["kind"] == "truncate":
        del body[where["offset"]:]
    else:
        body[where["offset"]] ^= 0x5A
    with open(where["path"], "wb") as f:
        f.write(body)
    return pristine


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True)
    parser.add_argument("--storage", choices=["holdpoint", "stock-folders", "stock-overwrite"], default="holdpoint")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--pg-timeout", type=float, default=60.0, help="the default group's (training, start)")
    parser.add_argument("--checkpoint-timeout", type=float, default=10.0,
                        help="the checkpoint group's: a save whose peer is unreachable fails after this long")
    parser.add_argument("--load-checks", help="after training, run the load checks this JSON file lists")
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    events = Events(args.work, rank)
    events.log("start", world=dist.get_world_size())
    final = train(args, rank, mesh, events)
    if args.load_checks:
        load_checks(args, rank, mesh, events, final)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
