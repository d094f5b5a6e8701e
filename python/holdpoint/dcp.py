"""holdpoint as the storage layer of ``torch.distributed.checkpoint`` (docs/dcp.md).

Change one argument of a DCP save or load::

    import torch.distributed.checkpoint as dcp
    import holdpoint.dcp

    dcp.save(state, storage_writer=holdpoint.dcp.StorageWriter("run/", signing_key="k.pem"))
    dcp.load(state, storage_reader=holdpoint.dcp.StorageReader("run/", trust=policy))

Each save becomes a generation of a holdpoint run directory: every rank publishes
its data file atomically (staged, each item digested while it streams, fsynced,
read back, renamed, the folder fsynced), then the coordinator publishes
``.metadata`` and commits a step manifest listing every file's size and the
SHA-256 of every item, signed when a key is given. LATEST moves only then. The
generation's folder (``checkpoints/step-<N>.shards/``) stays a plain DCP folder
that stock ``FileSystemReader`` loads.

A load reads ``.metadata`` and every non-tensor value with holdpoint's
restricted reader (never ``pickle.load`` or ``torch.load(weights_only=False)``),
checks each item's bytes against the manifest before they reach a tensor, reads
only the items its plan needs, and changes no rank's state unless every rank
read and checked all of its items.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import io
import os
import pickle
import threading
import uuid
import warnings
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader as _StorageReaderBase
from torch.distributed.checkpoint.storage import StorageWriter as _StorageWriterBase
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _native
from ._convert import TensorFactory, tensor_parts
from ._errors import Error
from ._training import plain_spec
from ._trust import TrustPolicy, native_trust

__all__ = ["StorageWriter", "StorageReader", "close_runs"]

_DCP_VERSION = "1.0.0"  # what stock FileSystemWriter writes in torch 2.13


def _path(path: Any) -> str:
    return os.fspath(path)


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector stays off while a step converts every
    item of a save or load (tens of thousands of records and tensors, all kept
    alive): each full collection scans the whole heap, which then holds the
    state and DCP's plans, and at 20,000 tensors the collections took more time
    than the conversions. Nothing made here forms a cycle; reference counting
    frees as always, and only cycles (from any thread) wait for the step to end."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _coded(method):
    """DCP reports a rank's failure as text (a CheckpointException, or an
    AssertionError naming a failed read_metadata): the code goes into it.
    The step runs with the cyclic collector paused (_collector_paused)."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            with _collector_paused():
                return method(*args, **kwargs)
        except Error as error:
            if f"[{error.code}]" in str(error):
                raise
            raise Error(f"[{error.code}] {error}", error.code, error.path, error.detail) from error
    return wrapper


# ---- the run directories this process coordinates saves into ---------------------------

# One open RunDirectory per run and process, on the coordinator: opening
# recovers and verifies LATEST (every byte of it), which a save should not pay
# each time, and holds the run's lock, so a second writer is refused. The lock
# beside it serialises saves of one run from several threads (dcp.async_save's
# thread variant). close_runs() lets go of them.
_runs: dict[str, tuple[Any, threading.Lock, Optional[str]]] = {}
_runs_lock = threading.Lock()


def _coordinator_run(path: str, signing_key: Optional[str]):
    key = os.path.realpath(path)
    with _runs_lock:
        entry = _runs.get(key)
        if entry is not None and entry[2] != signing_key:
            # Another key for the same run: the open run signs with the key it
            # was opened with, so it is closed (once no save uses it) and reopened.
            with entry[1]:
                del _runs[key]
            entry = None
        if entry is None:
            entry = (_native.RunDirectory(path, True, True, None, None, False, None, signing_key), threading.Lock(),
                     signing_key)
            _runs[key] = entry
        return entry[0], entry[1]


def close_runs() -> None:
    """Closes the run directories this process opened to commit DCP saves into,
    releasing their locks (another process, or ``holdpoint.RunDirectory`` in this
    one, may then open them for writing). The next save opens them again."""
    with _runs_lock:
        for _run, lock, _key in list(_runs.values()):
            with lock:
                pass
        _runs.clear()


@dataclasses.dataclass(frozen=True)
class _SavePlanData:
    """What the coordinator tells every rank: where to write, under which name."""
    prefix: str
    step: int
    folder: str


class _ItemRecord(NamedTuple):
    """A written item, as it travels to the coordinator in its WriteResult. DCP
    pickles every rank's results into one message to the coordinator, so this is
    a tuple holding the digest's 32 bytes, not a dataclass with 64 hexadecimal
    digits: a WriteResult pickles to about 111 bytes instead of 156 (stock DCP's:
    80), the digest being nearly all that holdpoint adds."""
    relative_path: str
    offset: int
    length: int
    sha256: bytes
    file_size: int


class StorageWriter(_StorageWriterBase, BlockingAsyncStager):
    """Writes ``dcp.save`` / ``dcp.async_save`` into the holdpoint run directory ``run``.

    - ``step``: the generation's step; by default the one after LATEST's (0 for a
      new run). A step already committed is refused (``run_generation_exists``).
    - ``signing_key``: a private key file (``holdpoint keygen``); the step manifest is
      signed in the run's chain (docs/threat-model.md, "Signing a run").
    - ``epoch`` and ``metrics`` go to the run's index (``holdpoint ls``).
    - ``durable=False`` skips the fsyncs (tests only: a crash may then lose data).

    Every rank must be given the same ``run``, which all hosts see (a shared file
    system). Non-tensor values must be plain data (what ``holdpoint.save`` writes:
    None, bool, int, float, str, bytes, lists, tuples, dicts, tensors); anything else
    is refused at save with ``write_value_unsupported`` naming its key, because the
    restricted reader could never load it back.

    ``dcp.async_save`` copies the state as it does for stock ``FileSystemWriter``
    (``BlockingAsyncStager``: a CPU copy, made before ``async_save`` returns);
    DCP's own default stager takes three to four times as long over 20,000 tensors.
    """

    def __init__(self, run: Any, *, step: Optional[int] = None, signing_key: Any = None, epoch: int = 0,
                 metrics: Optional[dict] = None, semantic_identity: str = "python-dcp", durable: bool = True) -> None:
        _StorageWriterBase.__init__(self)
        BlockingAsyncStager.__init__(self)
        self.run = _path(run)
        self.step = step
        self.signing_key = _path(signing_key) if signing_key is not None else None
        self.epoch = epoch
        self.metrics = dict(metrics or {})
        self.semantic_identity = semantic_identity
        self.durable = durable
        self.is_coordinator = False
        self.rank: Optional[int] = None
        self.committed: Optional[dict] = None  # on the coordinator, after finish()
        self._planned: Optional[tuple[int, str]] = None  # on the coordinator: (step, folder)

    # -- DCP's StorageWriter interface -------------------------------------------------------

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.run = _path(checkpoint_id)
        self.committed = None
        self._planned = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        if kwargs.get("use_collectives") is False:
            raise Error("holdpoint.dcp.StorageWriter needs DCP's collectives (use_collectives=True): a generation "
                        "is committed once, by the coordinator, after every rank wrote", "invalid_argument")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    @_coded
    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        run, lock = _coordinator_run(self.run, self.signing_key)
        with lock:
            step = self.step
            if step is None:
                latest = run.latest()
                step = latest["step"] + 1 if latest else 0
            folder = str(run.prepare_dcp_folder(step))
        self._planned = (step, folder)
        return [dataclasses.replace(plan, storage_data=_SavePlanData(f"__{i}_", step, folder))
                for i, plan in enumerate(plans)]

    @_coded
    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        where: _SavePlanData = plan.storage_data
        name = f"{where.prefix}0.distcp"
        # As stock DCP orders them: values first, then tensors.
        ordered = ([item for item in plan.items if item.type == WriteItemType.BYTE_IO] +
                   [item for item in plan.items if item.type != WriteItemType.BYTE_IO])
        data = [_item_data(item, planner.resolve_data(item)) for item in ordered]
        results: list[WriteResult] = []
        if ordered:
            record = _native.write_dcp_file(where.folder, name, data, self.durable, tensor_parts)
            _check_values_readable(where.folder, record, ordered)
            size = record["size"]
            for item, (offset, length, sha256) in zip(ordered, record["ranges"]):
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=_ItemRecord(name, offset, length, bytes.fromhex(sha256), size)))
        future: Future = Future()
        future.set_result(results)
        return future

    @_coded
    def finish(self, metadata: _md.Metadata, results: list[list[WriteResult]]) -> None:
        run, lock = _coordinator_run(self.run, self.signing_key)
        files: dict[str, dict] = {}
        storage_data = {}
        for rank_results in results:
            for result in rank_results:
                item: _ItemRecord = result.storage_data
                storage_data[result.index] = _StorageInfo(item.relative_path, item.offset, item.length)
                record = files.setdefault(item.relative_path,
                                          {"name": item.relative_path, "size": item.file_size, "ranges": []})
                record["ranges"].append((item.offset, item.length, item.sha256.hex()))
        for record in files.values():
            record["ranges"].sort()
        if self._planned is None:
            raise Error("StorageWriter.finish before prepare_global_plan", "invalid_argument")
        step, folder = self._planned
        metadata.version = _DCP_VERSION
        metadata.storage_data = storage_data
        metadata.storage_meta = _md.StorageMeta(checkpoint_id=folder, save_id=str(uuid.uuid4()))
        metadata_record = _native.write_dcp_file(folder, ".metadata", [pickle.dumps(metadata)], self.durable,
                                                 tensor_parts)
        # What holdpoint's own reader could not decode is never committed.
        _native.read_dcp_metadata(folder, metadata_record, None)
        with lock:
            self.committed = run.commit_dcp(step, self.epoch, len(results), [metadata_record, *files.values()],
                                            self.metrics, plain_spec(self.semantic_identity))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never chosen automatically: name it as storage_writer


def _item_data(item, data):
    if item.type == WriteItemType.BYTE_IO:
        return data.getbuffer() if isinstance(data, io.BytesIO) else bytes(data)
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    # Raw bytes carry no lazy conj/neg bit: the elements themselves are written.
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    # Only the item's own elements are written, not a larger storage it views.
    whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    if not (tensor.is_contiguous() and tensor.storage_offset() == 0 and whole):
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _check_values_readable(folder: str, record: dict, ordered: list) -> None:
    """Reads back every non-tensor value with the restricted reader."""
    values = [i for i, item in enumerate(ordered) if item.type == WriteItemType.BYTE_IO]
    if not values:
        return
    try:
        _native.read_dcp_items(folder, record, values, None, TensorFactory("torch"))
    except Error as error:
        # Which one: each alone.
        for i in values:
            try:
                _native.read_dcp_items(folder, record, [i], None, TensorFactory("torch"))
            except Error as one:
                raise Error(f"dcp.save: the value at '{ordered[i].index.fqn}' is not plain data that holdpoint "
                            f"reads back ({one.code}: {one})", "write_value_unsupported", folder) from one
        raise error


# ---- the read side ---------------------------------------------------------------------------

class StorageReader(_StorageReaderBase):
    """Reads ``dcp.load`` from a DCP generation of the holdpoint run directory ``run``.

    - ``generation``: ``"latest"`` (the default), ``"best"``, a generation name
      (``"step-00000005.pt"``) or a step number.
    - ``trust``: a :class:`holdpoint.TrustPolicy`; the run's signatures are checked
      (a rollback, a broken chain, a missing signature are refused) and the step
      manifest must carry a valid signature before anything is read.
    - ``limits``: bounds of the restricted reader (``holdpoint.Limits``).
    - ``process_group``: the group ``dcp.load`` runs on, when not the default one;
      the ranks agree on it that each read and checked its items.

    The run is opened read-only: a load changes nothing on disk. As a resume from
    the run would, ``"latest"`` is the newest generation that verifies: when LATEST's
    own generation is damaged, the one before it is loaded, with a warning, and
    ``recovery`` lists what was found (under a trust policy, a signed generation
    that is gone or damaged is refused instead: ``signature_rollback``).
    ``loaded`` names the generation read.
    """

    def __init__(self, run: Any, *, generation: Any = "latest", trust: Optional[TrustPolicy] = None,
                 limits: Optional[dict] = None, process_group: Any = None) -> None:
        super().__init__()
        self.run = _path(run)
        self.generation = generation
        self.trust = trust
        self.limits = dict(limits) if limits else None
        self.process_group = process_group
        self.loaded: Optional[dict] = None  # the generation read, after read_metadata()
        self.recovery: list[str] = []         # what the run's records say is wrong, if anything
        self._folder = ""
        self._files: dict[str, dict] = {}
        self._ranges: dict[tuple[str, int, int], int] = {}
        self._storage_data: dict = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id:
            self.run = _path(checkpoint_id)
        self._storage_data = {}

    @_coded
    def read_metadata(self) -> _md.Metadata:
        run = _native.RunDirectory(self.run, False, False, self.limits, None, False, native_trust(self.trust), None)
        generation = _find_generation(run, self.generation)
        self.recovery = run.recovery()
        if self.recovery and self.generation == "latest":
            # As a resume from the run would: the newest generation that verifies.
            warnings.warn(f"holdpoint.dcp: {self.run}: loading {generation['name']}; the run's records say: " +
                          "; ".join(self.recovery), stacklevel=3)
        if generation["kind"] != "dcp":
            raise Error(f"{self.run}: {generation['name']} is a generation of kind {generation['kind']}, not a "
                        "torch.distributed.checkpoint one", "checkpoint_kind_mismatch", self.run)
        root, _info = run.load(generation["name"], TensorFactory("torch"))
        layout = root["holdpoint"]["dcp"]
        self.loaded = generation
        self._folder = os.path.join(self.run, "checkpoints", f"step-{generation['step']:08d}.shards")
        self._files = {record["name"]: record for record in layout["files"]}
        self._ranges = {}
        for record in layout["files"]:
            for i, (offset, length, _sha256) in enumerate(record["ranges"]):
                self._ranges[(record["name"], offset, length)] = i
        records = _native.read_dcp_metadata(self._folder, self._files[".metadata"], self.limits)
        metadata = _metadata_from_records(records, self._folder)
        # Every item must be a range the manifest digests, before any is read.
        for index, info in metadata.storage_data.items():
            self._range_of(index, info)
        return metadata

    def set_up_storage_reader(self, metadata: _md.Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @_coded
    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        # 1. Read and check every item this rank needs, into private memory.
        values: dict[tuple[str, int], Any] = {}
        failure: Optional[BaseException] = None
        try:
            wanted: dict[str, set[int]] = {}
            for item in plan.items:
                name, i = self._range_of(item.storage_index, self._storage_data[item.storage_index])
                wanted.setdefault(name, set()).add(i)
            for name, indexes in wanted.items():
                order = sorted(indexes)
                decoded = _native.read_dcp_items(self._folder, self._files[name], order, self.limits,
                                                 TensorFactory("torch"))
                values.update({(name, i): value for i, value in zip(order, decoded)})
        except BaseException as error:  # noqa: BLE001 - every rank must reach the agreement below
            failure = error
        # 2. Every rank says whether it succeeded; none changes its state unless all did.
        if not _all_ranks_succeeded(failure is None, self.process_group):
            if failure is not None:
                raise failure
            raise Error("dcp.load: another rank could not read or check its items; no rank's state was changed",
                        "distributed_rank_failed", self._folder)
        # 3. Apply.
        for item in plan.items:
            info = self._storage_data[item.storage_index]
            value = values[self._range_of(item.storage_index, info)]
            if item.type == LoadItemType.BYTE_IO:
                _load_value(planner, item, value)
                continue
            if not isinstance(value, torch.Tensor):
                raise Error(f"{self._folder}: the item for '{item.storage_index.fqn}' holds a "
                            f"{type(value).__name__}, not a tensor", "dcp_metadata_invalid", self._folder)
            tensor = narrow_tensor_by_index(value, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != tensor.size():
                raise Error(f"{self._folder}: '{item.storage_index.fqn}' has size {tuple(tensor.size())} in the "
                            f"checkpoint and {tuple(target.size())} in the state", "dcp_metadata_invalid",
                            self._folder)
            target.copy_(tensor)
            planner.commit_tensor(item, target)
        future: Future = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # never chosen automatically: name it as storage_reader

    def _range_of(self, index: _md.MetadataIndex, info: Any) -> tuple[str, int]:
        key = (info.relative_path, info.offset, info.length)
        i = self._ranges.get(key)
        if i is None or key[0] == ".metadata":
            raise Error(f"{self._folder}/.metadata places '{index.fqn}' at bytes [{info.offset}, +{info.length}) of "
                        f"{info.relative_path}, which the step manifest does not list as a range",
                        "dcp_range_unlisted", self._folder)
        return key[0], i


def _find_generation(run, which: Any) -> dict:
    if which in ("latest", "best"):
        found = run.latest() if which == "latest" else run.best()
        if found is None:
            raise Error(f"{run.path}: the run has no {which} generation", "run_no_generation", str(run.path))
        return found
    for generation in run.generations():
        if generation["name"] == which or (isinstance(which, int) and generation["step"] == which):
            return generation
    wanted = which if isinstance(which, str) else f"step-{which:08d}.pt" if isinstance(which, int) else None
    for check in run.damaged():
        if check["name"] == wanted:
            raise Error(f"{run.path}: {wanted} does not verify: {check['detail']}", check["code"], str(run.path),
                        check["detail"])
    raise Error(f"{run.path}: the run has no generation {which!r}", "invalid_argument", str(run.path))


def _all_ranks_succeeded(ok: bool, group: Any) -> bool:
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    flag = torch.tensor([0 if ok else 1], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item()) == 0


def _load_value(planner: LoadPlanner, item, value: Any) -> None:
    """What DefaultLoadPlanner.load_bytes does, with a value already decoded by
    the restricted reader instead of torch.load(weights_only=False)."""
    if isinstance(planner, DefaultLoadPlanner) and type(planner).load_bytes is DefaultLoadPlanner.load_bytes:
        from torch.distributed.checkpoint._nested_dict import set_element  # noqa: PLC0415 - DCP's own helper

        if planner.flatten_state_dict:
            set_element(planner.original_state_dict, planner.mappings[item.dest_index.fqn], value)
        else:
            planner.state_dict[item.dest_index.fqn] = value
        return
    # A planner of the user's own: it gets the value's bytes, re-written from
    # what the restricted reader decoded (plain data only).
    stream = io.BytesIO()
    torch.save(value, stream)
    stream.seek(0)
    planner.load_bytes(item, stream)


# ---- .metadata records to DCP's dataclasses ----------------------------------------------------

_MD = "torch.distributed.checkpoint.metadata."


def _metadata_from_records(root: Any, folder: str) -> _md.Metadata:
    def invalid(where: str, what: str):
        return Error(f"{folder}/.metadata: {where}: {what}", "dcp_metadata_invalid", folder)

    def record(value: Any, cls: str, where: str) -> dict:
        if not isinstance(value, dict) or value.get("__class__") != cls:
            raise invalid(where, f"not a {cls} record")
        return value

    def torch_constant(name: Any, kind: type, where: str):
        # dtypes and layouts come back as themselves; memory formats as their names.
        if isinstance(name, kind):
            return name
        value = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
        if not isinstance(value, kind):
            raise invalid(where, f"{name!r} is not a {kind.__name__}")
        return value

    def size(value: Any, where: str) -> torch.Size:
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, int) and v >= 0 for v in value):
            raise invalid(where, "is not a tuple of non-negative ints")
        return torch.Size(value)

    top = record(root, _MD + "Metadata", "the root")
    items = {}
    for fqn, entry in (top.get("state_dict_metadata") or {}).items():
        cls = entry.get("__class__") if isinstance(entry, dict) else None
        if cls == _MD + "BytesStorageMetadata":
            items[fqn] = _md.BytesStorageMetadata()
            continue
        where = f"state_dict_metadata[{fqn!r}]"
        entry = record(entry, _MD + "TensorStorageMetadata", where)
        p = record(entry.get("properties"), _MD + "TensorProperties", where + ".properties")
        properties = _md.TensorProperties(
            dtype=torch_constant(p.get("dtype"), torch.dtype, where + ".dtype"),
            layout=torch_constant(p.get("layout", "torch.strided"), torch.layout, where + ".layout"),
            requires_grad=bool(p.get("requires_grad", False)),
            memory_format=torch_constant(p.get("memory_format", "torch.contiguous_format"), torch.memory_format,
                                         where + ".memory_format"),
            pin_memory=bool(p.get("pin_memory", False)))
        chunks = [_md.ChunkStorageMetadata(offsets=size(c.get("offsets"), where + ".chunks"),
                                           sizes=size(c.get("sizes"), where + ".chunks"))
                  for c in (record(c, _MD + "ChunkStorageMetadata", where + ".chunks") for c in entry.get("chunks", []))]
        items[fqn] = _md.TensorStorageMetadata(properties=properties, size=size(entry.get("size"), where + ".size"),
                                               chunks=chunks)
    storage_data = {}
    for pair in top.get("storage_data") or []:
        key = record(pair[0], _MD + "MetadataIndex", "storage_data key")
        info = record(pair[1], "torch.distributed.checkpoint.filesystem._StorageInfo", "storage_data")
        offset = key.get("offset")
        index = _md.MetadataIndex(fqn=key["fqn"], offset=None if offset is None else torch.Size(offset),
                                  index=key.get("index"))
        storage_data[index] = _StorageInfo(info["relative_path"], info["offset"], info["length"])
    meta = top.get("storage_meta")
    storage_meta = None
    if isinstance(meta, dict):
        storage_meta = _md.StorageMeta(checkpoint_id=meta.get("checkpoint_id"), save_id=meta.get("save_id"),
                                       modules=list(meta.get("modules") or []))
    return _md.Metadata(state_dict_metadata=items, planner_data=top.get("planner_data"), storage_data=storage_data,
                        storage_meta=storage_meta, version=top.get("version"))
