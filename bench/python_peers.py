"""Python checkpoint peers for bench/checkpoint_bench: how long the usual Python
ways of saving and loading a state dict take, on the same state shape as the
C++ benchmark, in the same run.

    python_peers.py --tensors N --elements E --dir DIR
                    [--repeat R] [--peers torch,safetensors,dcp] [--world W]
                    [--no-fresh]

The state is an OrderedDict ``layer{i}.weight`` -> ``torch.rand(E)`` (float32,
N tensors); tensor i is drawn from its own generator seeded with SEED + i, so
every process (and every rank's share) builds the same values.
``torch.set_num_threads(1)`` everywhere.

What is timed (each figure is the median of R runs, in seconds):

* Saves end when the data is durable: every file written was fsynced, and so
  was the directory that holds it (and, for a checkpoint directory, the
  directory itself). Before each save the previous output is removed, outside
  the clock.
* Loads end when the result is usable. Before each load the previous result is
  released, outside the clock. Loaders that only map the file (torch.load with
  mmap=True, and safetensors, whose default backend maps the file privately)
  are reported twice: the call alone (``*_open`` / ``safetensors_load``) and
  the call plus reading one byte of every page of every tensor (``*_touch``).
  The last result of each loader is compared with the saved state outside the
  clock; a mismatch aborts the run.
* ``<loader>_fresh``: the same load, once per new process, R processes. The
  child (this script with the hidden ``--child-load PEER PATH``) imports torch,
  safetensors and torch.distributed.checkpoint before it starts the clock, so
  the figure is the first load in a process, not interpreter start-up.
* ``dcp_*_{W}ranks`` (``--world`` W >= 2): W Gloo ranks on 127.0.0.1, spawned
  with torch.multiprocessing, rank r holding its contiguous share of the
  tensors (the total bytes are the same). Rank 0 times the collective
  ``dcp.save`` / ``dcp.load`` between two barriers.

Every load reads files written just before, so they come from the page cache
(nothing here can drop it); the figures are warm-cache figures.

Output: one JSON object on stdout (progress goes to stderr):

    {"torch_version", "safetensors_version", "tensors", "elements", "repeat",
     "world", "bytes", "file_bytes": {save peer: bytes on disk},
     "seconds": {peer: median seconds}, "notes": {peer: what it does}}

Everything is written below a private directory made inside DIR, removed on
exit, failure and SIGTERM included.
"""

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Optional

import safetensors
import safetensors.torch
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

SEED = 20240521
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
FORMAT_NAMES = ("torch", "safetensors", "dcp")
# A collective that waits longer than this means a rank is gone.
RANK_TIMEOUT = datetime.timedelta(minutes=10)


def log(message: str) -> None:
    print(f"python_peers: {message}", file=sys.stderr, flush=True)


# --- the state -------------------------------------------------------------


def tensor_name(index: int) -> str:
    return f"layer{index}.weight"


def make_tensor(index: int, elements: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(SEED + index)
    return torch.rand(elements, generator=generator)


def make_state(indices: Iterable[int], elements: int) -> "OrderedDict[str, torch.Tensor]":
    return OrderedDict((tensor_name(i), make_tensor(i, elements)) for i in indices)


def empty_state(names: Iterable[str], elements: int) -> Dict[str, torch.Tensor]:
    """Destination tensors for DCP, which loads in place."""
    return {name: torch.empty(elements) for name in names}


def rank_indices(tensors: int, rank: int, world: int) -> range:
    """Rank `rank`'s contiguous share of the tensor indices."""
    return range(rank * tensors // world, (rank + 1) * tensors // world)


def check_same(loaded: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor], peer: str) -> None:
    if sorted(loaded) != sorted(expected):
        raise RuntimeError(f"{peer}: loaded names differ from the saved ones")
    for name, tensor in expected.items():
        if not torch.equal(loaded[name], tensor):
            raise RuntimeError(f"{peer}: {name} differs from the saved tensor")


def touch_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Reads one byte of every page each tensor spans (the first byte, every
    PAGE_BYTES-th byte after it, and the last byte), which faults in a mapped
    tensor at the cost of one read per page. Returns a sum so that the reads
    have a use."""
    total = 0
    for tensor in tensors:
        raw = tensor.detach().reshape(-1).view(torch.uint8).numpy()
        if raw.size:
            total += int(raw[::PAGE_BYTES].sum()) + int(raw[-1])
    return total


# --- durability and the files on disk ---------------------------------------


def fsync_path(path: str) -> None:
    """fsync through a new descriptor: on Linux it flushes the file's (or the
    directory's) dirty data whichever descriptor wrote it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable(path: str) -> None:
    """fsyncs a file, or every file in a (flat) directory and the directory,
    then the directory that holds `path`, so that its name is durable too."""
    if os.path.isdir(path):
        for entry in sorted(os.listdir(path)):
            fsync_path(os.path.join(path, entry))
    fsync_path(path)
    fsync_path(os.path.dirname(os.path.abspath(path)))


def remove_path(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def bytes_on_disk(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, entry)) for entry in os.listdir(path))
    return os.path.getsize(path)


# --- savers: write `state` to `path`, durably --------------------------------


def save_torch(state: Dict[str, torch.Tensor], path: str) -> None:
    torch.save(state, path)
    make_durable(path)


def save_safetensors(state: Dict[str, torch.Tensor], path: str) -> None:
    safetensors.torch.save_file(state, path)
    make_durable(path)


class quiet_dcp(warnings.catch_warnings):
    """Silences DCP's "assuming the intent is to save in a single process"
    warning, which it gives on every call without a process group."""

    def __enter__(self):
        result = super().__enter__()
        warnings.filterwarnings("ignore", message=".*single process.*")
        return result


def save_dcp(state: Dict[str, torch.Tensor], path: str) -> None:
    """One process, no process group: DCP runs its single-process path
    (no_dist). sync_files=True makes the writer fsync its files itself;
    make_durable then fsyncs them again, because DCP fsyncs .metadata.tmp
    before flushing its buffered stream (a metadata file under the 8 KiB
    buffer is fsynced empty), and fsyncs the directory, which DCP does not do
    after renaming .metadata.tmp to .metadata."""
    with quiet_dcp():
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
    make_durable(path)


# --- loaders: (path, names, elements) -> state --------------------------------


def load_torch(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def load_torch_mmap_open(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, mmap=True)


def load_torch_mmap_touch(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    state = load_torch_mmap_open(path, names, elements)
    touch_pages(state.values())
    return state


def load_safetensors(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    return safetensors.torch.load_file(path)


def load_safetensors_touch(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    state = load_safetensors(path, names, elements)
    touch_pages(state.values())
    return state


def load_dcp(path: str, names: List[str], elements: int) -> Dict[str, torch.Tensor]:
    """DCP loads into tensors the caller provides; allocating them is timed."""
    state = empty_state(names, elements)
    with quiet_dcp():
        dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    return state


LOADERS: Dict[str, Callable[[str, List[str], int], Dict[str, torch.Tensor]]] = {
    "torch_load_weights_only": load_torch,
    "torch_load_mmap_open": load_torch_mmap_open,
    "torch_load_mmap_touch": load_torch_mmap_touch,
    "safetensors_load": load_safetensors,
    "safetensors_load_touch": load_safetensors_touch,
    "dcp_load": load_dcp,
}


@dataclasses.dataclass
class Format:
    save_peer: str
    output_name: str  # a file, or a directory for DCP
    save: Callable[[Dict[str, torch.Tensor], str], None]
    loads: List[str]  # LOADERS keys, timed in this process
    fresh_loads: List[str]  # LOADERS keys, also timed in fresh processes


FORMATS: Dict[str, Format] = {
    "torch": Format(
        "torch_save", "state.pt", save_torch,
        ["torch_load_weights_only", "torch_load_mmap_open", "torch_load_mmap_touch"],
        ["torch_load_weights_only", "torch_load_mmap_touch"]),
    "safetensors": Format(
        "safetensors_save", "state.safetensors", save_safetensors,
        ["safetensors_load", "safetensors_load_touch"],
        ["safetensors_load", "safetensors_load_touch"]),
    "dcp": Format("dcp_save", "state.dcp", save_dcp, ["dcp_load"], ["dcp_load"]),
}

NOTES = {
    "torch_save": "torch.save(state, path) (zip format), then fsync of the file and of its "
                  "directory; no digest",
    "torch_load_weights_only": "torch.load(path, weights_only=True): reads every byte into new "
                               "memory; zip CRC not checked, no digest",
    "torch_load_mmap_open": "torch.load(path, weights_only=True, mmap=True), the call alone: "
                            "tensors are mapped, no tensor byte read yet; no digest",
    "torch_load_mmap_touch": "torch_load_mmap_open plus reading one byte of every page of every "
                             "tensor; no digest",
    "safetensors_save": "safetensors.torch.save_file, then fsync of the file and of its "
                        "directory; no digest",
    "safetensors_load": "safetensors.torch.load_file (default backend 'mmap'): tensors are a "
                        "private mapping of the file, no tensor byte read yet; header checked, "
                        "no digest",
    "safetensors_load_touch": "safetensors_load plus reading one byte of every page of every "
                              "tensor; no digest",
    "dcp_save": "torch.distributed.checkpoint.save with FileSystemWriter(sync_files=True), one "
                "process without a process group (DCP's no_dist path), then fsync of every "
                "file and of the directory again (DCP fsyncs .metadata.tmp before flushing "
                "its buffered stream, and never fsyncs the directory); one .distcp file plus "
                ".metadata; no digest",
    "dcp_load": "torch.distributed.checkpoint.load into torch.empty tensors (allocation timed) "
                "with FileSystemReader, one process (no_dist); every tensor read and copied "
                "into place; no digest",
}


def fresh_note(peer: str) -> str:
    return (f"{peer} once in a new process (imports done before the clock), median of the "
            f"processes; file in the page cache")


def ranks_notes(world: int) -> Dict[str, str]:
    return {
        f"dcp_save_{world}ranks": f"{world} Gloo ranks on 127.0.0.1 (torch.multiprocessing), "
                                  f"each saving its contiguous share of the tensors with "
                                  f"dcp.save(FileSystemWriter(sync_files=True)); rank 0's wall "
                                  f"time between two barriers, including rank 0's fsync of "
                                  f"every file and of the directory; no digest",
        f"dcp_load_{world}ranks": f"{world} Gloo ranks, each loading its share into torch.empty "
                                  f"tensors with dcp.load(FileSystemReader); rank 0's wall time "
                                  f"between two barriers; no digest",
    }


# --- timing -----------------------------------------------------------------


def time_call(call: Callable[[], object]):
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def time_saves(fmt: Format, state: Dict[str, torch.Tensor], path: str, repeat: int) -> List[float]:
    seconds = []
    for run in range(repeat):
        remove_path(path)
        elapsed, _ = time_call(lambda: fmt.save(state, path))
        seconds.append(elapsed)
        log(f"{fmt.save_peer} {run + 1}/{repeat}: {elapsed:.4f} s")
    return seconds


def time_loads(peer: str, path: str, expected: Dict[str, torch.Tensor], repeat: int) -> List[float]:
    loader = LOADERS[peer]
    names, elements = list(expected), next(iter(expected.values())).numel()
    seconds, loaded = [], None
    for run in range(repeat):
        loaded = None  # released outside the clock
        elapsed, loaded = time_call(lambda: loader(path, names, elements))
        seconds.append(elapsed)
        log(f"{peer} {run + 1}/{repeat}: {elapsed:.4f} s")
    check_same(loaded, expected, peer)
    return seconds


def time_fresh_loads(peer: str, path: str, tensors: int, elements: int, repeat: int) -> List[float]:
    command = [sys.executable, os.path.abspath(__file__), "--tensors", str(tensors),
               "--elements", str(elements), "--child-load", peer, path]
    seconds = []
    for run in range(repeat):
        child = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        elapsed = float(child.stdout.split()[-1])
        seconds.append(elapsed)
        log(f"{peer}_fresh {run + 1}/{repeat}: {elapsed:.4f} s")
    return seconds


def child_load(peer: str, path: str, tensors: int, elements: int) -> None:
    """The body of a fresh process: one timed load, its seconds on stdout."""
    names = [tensor_name(i) for i in range(tensors)]
    elapsed, _ = time_call(lambda: LOADERS[peer](path, names, elements))
    print(repr(elapsed), flush=True)


# --- one format in this process ----------------------------------------------


@dataclasses.dataclass
class Results:
    file_bytes: Dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: Dict[str, float] = dataclasses.field(default_factory=dict)
    notes: Dict[str, str] = dataclasses.field(default_factory=dict)

    def record(self, peer: str, runs: List[float], note: str) -> None:
        self.seconds[peer] = statistics.median(runs)
        self.notes[peer] = note


def bench_format(fmt: Format, state, work_dir: str, args, results: Results) -> None:
    path = os.path.join(work_dir, fmt.output_name)
    try:
        results.record(fmt.save_peer, time_saves(fmt, state, path, args.repeat), NOTES[fmt.save_peer])
        results.file_bytes[fmt.save_peer] = bytes_on_disk(path)
        for peer in fmt.loads:
            results.record(peer, time_loads(peer, path, state, args.repeat), NOTES[peer])
        if args.fresh:
            for peer in fmt.fresh_loads:
                runs = time_fresh_loads(peer, path, args.tensors, args.elements, args.repeat)
                results.record(f"{peer}_fresh", runs, fresh_note(peer))
    finally:
        remove_path(path)


# --- DCP across ranks ---------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank_main(rank: int, world: int, port: int, tensors: int, elements: int, repeat: int,
              path: str, result_queue) -> None:
    """One rank of the multi-rank DCP run (started by torch.multiprocessing)."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=RANK_TIMEOUT)
    try:
        shard = make_state(rank_indices(tensors, rank, world), elements)
        saves = [time_rank_save(shard, path, rank) for _ in range(repeat)]
        loads, loaded = [], None
        for _ in range(repeat):
            loaded = None  # released outside the clock
            elapsed, loaded = time_rank_load(list(shard), elements, path)
            loads.append(elapsed)
        check_same(loaded, shard, f"dcp_load_{world}ranks (rank {rank})")
        dist.barrier()
        if rank == 0:
            result_queue.put({"save": saves, "load": loads, "file_bytes": bytes_on_disk(path)})
    finally:
        dist.destroy_process_group()


def time_rank_save(shard: Dict[str, torch.Tensor], path: str, rank: int) -> float:
    if rank == 0:
        remove_path(path)
    dist.barrier()
    start = time.perf_counter()
    dcp.save(shard, storage_writer=dcp.FileSystemWriter(path, sync_files=True))
    if rank == 0:  # every rank's files are closed once dcp.save returns
        make_durable(path)
    dist.barrier()
    return time.perf_counter() - start


def time_rank_load(names: List[str], elements: int, path: str):
    dist.barrier()
    start = time.perf_counter()
    state = empty_state(names, elements)
    dcp.load(state, storage_reader=dcp.FileSystemReader(path))
    dist.barrier()
    return time.perf_counter() - start, state


def run_ranks(world: int, rank_args: tuple) -> None:
    """Runs rank_main(rank, *rank_args) in `world` spawned processes and waits
    for them (a failing rank raises here). Whatever ends the wait, no rank
    outlives it, so that nothing writes into a directory being removed."""
    context = mp.start_processes(rank_main, args=rank_args, nprocs=world, join=False,
                                 start_method="spawn")
    try:
        while not context.join():
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join()


def bench_ranks(args, work_dir: str, results: Results) -> None:
    path = os.path.join(work_dir, f"state.dcp{args.world}")
    result_queue = mp.get_context("spawn").SimpleQueue()
    log(f"dcp across {args.world} Gloo ranks, {args.repeat} saves and loads")
    try:
        run_ranks(args.world, (args.world, free_port(), args.tensors, args.elements,
                               args.repeat, path, result_queue))
        figures = result_queue.get()
    finally:
        remove_path(path)
    notes = ranks_notes(args.world)
    for kind in ("save", "load"):
        peer = f"dcp_{kind}_{args.world}ranks"
        log(f"{peer}: {' '.join(f'{s:.4f}' for s in figures[kind])} s")
        results.record(peer, figures[kind], notes[peer])
    results.file_bytes[f"dcp_save_{args.world}ranks"] = figures["file_bytes"]


# --- command line ---------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, required=True, help="number of tensors N")
    parser.add_argument("--elements", type=int, required=True, help="float32 elements per tensor")
    parser.add_argument("--dir", help="where to write (a private subdirectory, removed at exit)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--peers", default=",".join(FORMAT_NAMES),
                        help=f"comma-separated formats among {','.join(FORMAT_NAMES)}")
    parser.add_argument("--world", type=int, default=1,
                        help="also run DCP across this many Gloo ranks when >= 2")
    parser.add_argument("--no-fresh", dest="fresh", action="store_false",
                        help="skip the loads timed in fresh processes")
    parser.add_argument("--child-load", nargs=2, metavar=("PEER", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.tensors < 1 or args.elements < 1:
        parser.error("--tensors and --elements must be at least 1")
    if args.child_load:
        if args.child_load[0] not in LOADERS:
            parser.error(f"unknown loader {args.child_load[0]}")
        return args
    if not args.dir:
        parser.error("--dir is required")
    if args.repeat < 1 or not 1 <= args.world <= args.tensors:
        parser.error("--repeat must be at least 1, --world between 1 and --tensors")
    args.peers = [name for name in args.peers.split(",") if name]
    unknown = [name for name in args.peers if name not in FORMATS]
    if unknown or not args.peers:
        parser.error(f"--peers takes names among {','.join(FORMAT_NAMES)}, not {unknown}")
    return args


def raise_on_sigterm() -> None:
    """Turns SIGTERM into SystemExit so that the clean-up in `finally` runs."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_benchmark(args: argparse.Namespace) -> dict:
    made_dir = not os.path.isdir(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix="python_peers.", dir=args.dir)
    results = Results()
    try:
        state = make_state(range(args.tensors), args.elements)
        for name in args.peers:
            bench_format(FORMATS[name], state, work_dir, args, results)
        if "dcp" in args.peers and args.world >= 2:
            bench_ranks(args, work_dir, results)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        if made_dir:
            shutil.rmtree(args.dir, ignore_errors=True)
    return {
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "tensors": args.tensors,
        "elements": args.elements,
        "repeat": args.repeat,
        "world": args.world,
        "bytes": sum(t.numel() * t.element_size() for t in state.values()),
        "file_bytes": results.file_bytes,
        "seconds": results.seconds,
        "notes": results.notes,
    }


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    if args.child_load:
        child_load(args.child_load[0], args.child_load[1], args.tensors, args.elements)
        return
    raise_on_sigterm()
    print(json.dumps(run_benchmark(args), indent=1))


if __name__ == "__main__":
    main()
