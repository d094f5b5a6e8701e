"""holdpoint for Python: open PyTorch checkpoints safely and completely.

Every file is read by holdpoint's restricted reader (the C++ core): nothing in it
is ever executed, every size is bounded, and a digest given by the caller is
checked before anything is returned. Beyond what ``torch.load(weights_only=True)``
accepts, it reads the values trainers store beside their weights as data: NumPy
arrays and scalars (a NumPy RNG state), Python RNG states, OrderedDicts and
Counters. See docs/python.md.

    import holdpoint
    state = holdpoint.load("rng_state.pth")            # never runs pickle code
    holdpoint.save("model.pt", model.state_dict())     # atomic, with model.pt.sha256
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Union, cast

from ._errors import Error
from . import _native
from ._convert import COMPAT_MODES, TensorFactory, TensorInfo, as_plain_data, describe_tensor, tensor_parts
from ._training import Generators, Progress, RandomSampler, SequentialSampler, TrainingState, plain_spec
from ._trust import TrustPolicy, native_trust

__all__ = [
    "Error",
    "Generators",
    "Progress",
    "RandomSampler",
    "SequentialSampler",
    "TrainingState",
    "RunDirectory",
    "TensorInfo",
    "TrustPolicy",
    "diff",
    "error_codes",
    "inspect",
    "load",
    "load_distributed_checkpoint",
    "load_model_state",
    "load_with_info",
    "restore_rng_states",
    "save",
    "sign",
    "verify",
]

__version__: str = _native.__version__

PathLike = Union[str, "os.PathLike[str]"]
Limits = Mapping[str, Union[int, bool]]


def _path(path: PathLike) -> str:
    return os.fspath(path)


def load_with_info(path: PathLike, *, expected_sha256: Optional[str] = None, limits: Optional[Limits] = None,
                   tensors: str = "auto", trust: Optional[TrustPolicy] = None,
                   compute_sha256: bool = False, compat: Optional[str] = None) -> tuple[Any, dict]:
    """Like :func:`load`, and also returns what was checked: ``{"format", "sha256",
    "digest_checked", "bytes", "warnings"}``. ``sha256`` is the file's digest
    where one was computed: always with ``expected_sha256`` or ``trust``
    (``digest_checked`` is then True), and with ``compute_sha256=True``;
    otherwise None, since a load with no digest to check skips the hash pass.
    A ``torch.distributed.checkpoint`` folder reads as :func:`load` reads it,
    with format ``"torch.distributed.checkpoint"``, no ``"bytes"`` and
    ``sha256`` None."""
    if compat not in COMPAT_MODES:
        raise Error(f"compat must be one of {COMPAT_MODES}, not {compat!r}", "invalid_argument")
    if _native.is_distributed_checkpoint(_path(path)):
        _refuse_digest_of_folder(path, expected_sha256, trust)
        root = load_distributed_checkpoint(path, limits=limits, tensors=tensors)
        return (as_plain_data(root) if compat else root), _folder_info()
    root, info = _native.load(_path(path), expected_sha256, dict(limits) if limits else None, TensorFactory(tensors),
                              native_trust(trust), compute_sha256)
    if info["format"] == "safetensors":
        root = dict(root)  # as safetensors.torch.load_file returns it
    return (as_plain_data(root) if compat else root), info


def _refuse_digest_of_folder(path: PathLike, expected_sha256: Optional[str], trust: Optional[TrustPolicy],
                             sidecar: bool = False) -> None:
    if expected_sha256 is not None or trust is not None or sidecar:
        raise Error(f"{_path(path)}: a torch.distributed.checkpoint folder has no single digest or signature to "
                    "check; verify its files instead", "invalid_argument", _path(path))


def _folder_info() -> dict:
    """What load_with_info, verify and inspect report of a DCP folder: it has no
    single digest or size."""
    return {"format": "torch.distributed.checkpoint", "sha256": None, "digest_checked": False, "warnings": []}


def load(path: PathLike, *, expected_sha256: Optional[str] = None, limits: Optional[Limits] = None,
         tensors: str = "auto", trust: Optional[TrustPolicy] = None, compat: Optional[str] = None) -> Any:
    """Reads a checkpoint (a torch.save zip, a pre-1.6 torch.save stream, a
    safetensors file, or a ``torch.distributed.checkpoint`` folder: see
    :func:`load_distributed_checkpoint`) with holdpoint's restricted reader and
    returns what it holds: dicts (``collections.OrderedDict`` where the file has
    one, with ``_metadata``), lists, tuples, sets, ints, floats, complex, str,
    bytes, bytearray, None, tensors, and torch's ``dtype``, ``Size``, ``device``
    and ``layout`` objects, each of the type ``torch.load`` returns (the torch
    types only where torch imports; without it, their names as str and a
    ``torch.Size`` as a tuple).

    - ``expected_sha256``: the file's SHA-256 (64 hex digits) from a source you
      trust. The whole file is hashed and compared before anything is returned;
      a mismatch raises :class:`Error` with code ``sha256_mismatch``.
    - ``trust``: a :class:`TrustPolicy`; the file's signature (``<path>.sig``) is
      checked before a byte of it is read, and the digest it vouches for becomes
      the one the file must have.
    - With neither, the file is not hashed: every zip CRC-32 and structural
      rule is still checked, so damage is still refused (``zip_crc_mismatch``
      and others), but no SHA-256 is computed, as none could be compared. This
      keeps a load as fast as ``torch.load(weights_only=True)``. Ask for the
      digest with :func:`load_with_info` and ``compute_sha256=True``.
    - ``limits``: bounds of the reader, by ``holdpoint::Limits`` field name
      (``{"max_tensors": 1000}``); docs/format.md section 9 lists them.
    - ``tensors``: ``"torch"`` gives ``torch.Tensor`` (an ``nn.Parameter`` where
      the file has one), ``"numpy"`` gives NumPy arrays, and ``"auto"`` (the
      default) gives torch tensors when torch is installed and NumPy arrays
      otherwise. Arrays NumPy pickled (a NumPy RNG state) come back as NumPy
      arrays either way.
    - ``compat="data"``: torch's and NumPy's value types in their plain forms, for
      code written against them: a ``torch.dtype``, ``device`` or ``layout`` as its
      str, a ``torch.Size`` as a tuple, a NumPy scalar as a Python scalar.
      Containers, their sharing and tensors are unchanged.

    Tensors view the load's private copy of the file without copying; it is freed
    when the last of them is. Raises :class:`Error` (``.code`` names the reason)
    for anything the reader refuses.
    """
    return load_with_info(path, expected_sha256=expected_sha256, limits=limits, tensors=tensors, trust=trust,
                          compat=compat)[0]


def load_distributed_checkpoint(folder: PathLike, *, limits: Optional[Limits] = None, tensors: str = "auto",
                                metadata_only: bool = False) -> Any:
    """Reads a ``torch.distributed.checkpoint`` folder (what ``dcp.save`` writes with
    its FileSystemWriter: ``.metadata`` and ``*.distcp``) and returns the nested
    state dict it holds, as DCP's own template-free load
    (``dcp_to_torch_save``) rebuilds it, without executing anything.

    ``.metadata`` is decoded by the restricted reader (DCP's dataclasses as
    records: dicts of their fields with the class under ``"__class__"``); each
    item is read into private memory and parsed as the untrusted ``torch.save``
    archive it is; a tensor saved in chunks (by several ranks) is assembled after
    the chunks were checked to tile it exactly. Non-tensor values, which DCP's own
    loader unpickles with ``weights_only=False``, are read as data like any file.

    ``metadata_only=True`` returns the decoded ``.metadata`` instead. Errors:
    :class:`Error` with ``dcp_metadata_invalid``, ``dcp_item_missing``,
    ``dcp_range_invalid``, ``dcp_transform_unsupported``, or the reader's code
    for a malformed item.
    """
    return _native.load_distributed_checkpoint(_path(folder), dict(limits) if limits else None,
                                               TensorFactory(tensors), metadata_only)


_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module", "model_state")


def _is_tensor_mapping(value: Any) -> bool:
    if not isinstance(value, dict) or not value:
        return False
    for key, item in value.items():
        if not isinstance(key, str) or not hasattr(item, "shape"):
            return False
    return True


def load_model_state(path: PathLike, *, expected_sha256: Optional[str] = None, limits: Optional[Limits] = None,
                     key: Optional[str] = None, tensors: str = "auto", trust: Optional[TrustPolicy] = None) -> dict:
    """The model's state dict in a checkpoint, ready for ``model.load_state_dict``.

    The file itself when it is a state dict (names to tensors); otherwise the entry
    ``key``, or the first of "model" (holdpoint's and Accelerate's layout),
    "state_dict" (Lightning), "model_state_dict" (the PyTorch tutorial), "module"
    and "model_state" that is a state dict. Raises :class:`Error` with code
    ``legacy_layout_unrecognized`` when there is none.
    """
    root = load(path, expected_sha256=expected_sha256, limits=limits, tensors=tensors, trust=trust)
    if key is None and _is_tensor_mapping(root):
        return root
    candidates = (key,) if key is not None else _MODEL_KEYS
    if isinstance(root, dict):
        for name in candidates:
            value = root.get(name)
            if _is_tensor_mapping(value):
                return cast(dict, value)
    shown = ", ".join(str(k) for k in list(root)[:12]) if isinstance(root, dict) else type(root).__name__
    raise Error(f"{_path(path)}: no model state dict under {', '.join(candidates)} (the file holds {shown})",
                "legacy_layout_unrecognized", _path(path))


# Where frameworks keep each generator's state in their RNG files.
_RNG_LAYOUTS = {
    # Hugging Face Trainer rng_state.pth
    "python": "python", "numpy": "numpy", "cpu": "torch", "cuda": "cuda",
    # Accelerate random_states_<rank>.pkl
    "random_state": "python", "numpy_random_seed": "numpy", "torch_manual_seed": "torch",
    "torch_cuda_manual_seed": "cuda",
}


def restore_rng_states(states: Mapping[str, Any]) -> list[str]:
    """Restores Python's ``random``, NumPy's global ``RandomState``, torch's CPU
    generator and, where present and available, the CUDA generators, from an RNG
    file's contents as :func:`load` returns them: a Hugging Face Trainer's
    ``rng_state.pth`` or an Accelerate ``random_states_<rank>.pkl``. Returns
    the generators restored ("python", "numpy", "torch", "cuda"). Raises
    :class:`Error` (``invalid_argument``) when ``states`` holds none of them,
    before changing any generator."""
    found = {kind: states[key] for key, kind in _RNG_LAYOUTS.items() if isinstance(states, Mapping) and key in states}
    if not found:
        shown = ", ".join(map(str, list(states)[:12])) if isinstance(states, Mapping) else type(states).__name__
        raise Error(f"no RNG state found (keys: {shown})", "invalid_argument")
    restored = []
    if "python" in found:
        import random

        state = found["python"]
        random.setstate((state[0], tuple(state[1]), state[2]))
        restored.append("python")
    if "numpy" in found:
        import numpy

        numpy.random.set_state(found["numpy"])
        restored.append("numpy")
    if "torch" in found or "cuda" in found:
        import torch

        if "torch" in found:
            torch.random.set_rng_state(_as_byte_tensor(torch, found["torch"]))
            restored.append("torch")
        if "cuda" in found and torch.cuda.is_available():
            cuda = found["cuda"]
            if isinstance(cuda, (list, tuple)):
                torch.cuda.random.set_rng_state_all([_as_byte_tensor(torch, s) for s in cuda])
            else:
                torch.cuda.random.set_rng_state(_as_byte_tensor(torch, cuda))
            restored.append("cuda")
    return restored


def _as_byte_tensor(torch, state):
    return state if isinstance(state, torch.Tensor) else torch.from_numpy(state)


def save(path: PathLike, mapping: Any, *, sidecar: bool = True, durable: bool = True,
         torch_1_13_compatible: bool = False) -> dict:
    """Writes ``mapping`` as a PyTorch zip checkpoint that
    ``torch.load(path, weights_only=True)`` reads, atomically: the file appears
    complete under its name or not at all, and a crash never leaves a torn file.

    ``mapping`` may hold dicts (str or int keys), OrderedDicts, lists, tuples,
    None, bool, int, float, str, bytes, torch tensors (any device; written from the
    CPU) and NumPy arrays and scalars (written as tensors and plain values).
    Tensors that share a storage share it in the file. ``sidecar`` also writes
    ``<path>.sha256`` (``sha256sum -c`` format); ``durable`` fsyncs the file and
    its directory before returning. Returns ``{"sha256", "bytes", "tensors",
    "storages"}``.
    """
    return _native.save(_path(path), mapping, sidecar, durable, torch_1_13_compatible, tensor_parts)


def verify(path: PathLike, *, expected_sha256: Optional[str] = None, sidecar: bool = False,
           limits: Optional[Limits] = None, trust: Optional[TrustPolicy] = None) -> dict:
    """Checks a checkpoint completely (every structure, CRC-32 and tensor bound)
    without keeping its tensors: memory stays bounded whatever the file's size.
    ``expected_sha256`` or ``sidecar=True`` (``<path>.sha256``) also checks the
    digest. Returns ``{"valid": True, "format", "sha256", "digest_checked",
    "bytes", "warnings"}``; raises :class:`Error` when the file is refused. With
    ``trust``, the file's signature is checked first (see :class:`TrustPolicy`)."""
    if _native.is_distributed_checkpoint(_path(path)):
        _refuse_digest_of_folder(path, expected_sha256, trust, sidecar)
        _native.load_distributed_checkpoint(_path(path), dict(limits) if limits else None, describe_tensor, False)
        return {"valid": True, **_folder_info()}
    return _native.verify(_path(path), expected_sha256, sidecar, dict(limits) if limits else None,
                          native_trust(trust))


def diff(a: PathLike, b: PathLike, *, atol: float = 0.0, rtol: float = 0.0, limits: Optional[Limits] = None,
         trust: Optional[TrustPolicy] = None) -> dict:
    """Compares two checkpoint files tensor by tensor, in bounded memory, as
    ``holdpoint diff`` does (docs/cli.md, "diff"): both are verified through the
    restricted reader first, then read a chunk at a time. Returns the JSON report as
    a dict: ``"same"`` (no difference beyond ``atol + rtol * |b|``), ``"entries"``
    (each with ``path``, ``section``, ``change``, the two sides and, for numbers and
    tensors, the count of differing elements and the largest absolute and relative
    deviation), both files' digests, and ``"text"``, the report as the CLI prints it.
    Raises :class:`Error` when a file does not verify."""
    import json

    report_json, text = _native.diff(_path(a), _path(b), float(atol), float(rtol), dict(limits) if limits else None,
                                     native_trust(trust))
    report = cast(dict, json.loads(report_json))
    report["text"] = text
    return report


def sign(path: PathLike, *, key: PathLike, previous_sha256: Optional[str] = None,
         limits: Optional[Limits] = None) -> dict:
    """Verifies ``path`` completely, then writes ``<path>.sig``: a statement of its
    name, size, SHA-256 and (for a holdpoint checkpoint) step, config identity and
    profile, signed with the private key file ``key`` (``holdpoint keygen``; an
    Ed25519 PEM key or a holdpoint HMAC key). ``previous_sha256`` records the
    generation signed before it. The key never leaves this process's memory.
    Returns ``{"signature", "key_id", "sha256", "bytes"}``. To sign a whole run,
    use :meth:`RunDirectory.sign`."""
    return _native.sign(_path(path), _path(key), previous_sha256, dict(limits) if limits else None)


def inspect(path: PathLike, *, expected_sha256: Optional[str] = None, limits: Optional[Limits] = None,
            trust: Optional[TrustPolicy] = None) -> dict:
    """What a checkpoint holds, without loading tensor bytes: ``{"format",
    "sha256", "bytes", "tree", "records", "markers", ...}``. In ``tree``, each tensor
    is a :class:`TensorInfo` (dtype, shape, stride, offset)."""
    if _native.is_distributed_checkpoint(_path(path)):
        _refuse_digest_of_folder(path, expected_sha256, trust)
        tree = _native.load_distributed_checkpoint(_path(path), dict(limits) if limits else None, describe_tensor,
                                                   False)
        return {**_folder_info(), "tree": tree, "records": [], "markers": {}}
    return _native.inspect(_path(path), expected_sha256, dict(limits) if limits else None, describe_tensor,
                           native_trust(trust))


def error_codes() -> dict[str, str]:
    """Every error code, by name, with its description (the C++ ``holdpoint::ErrorCode``)."""
    return _native.error_codes()


class RunDirectory:
    """A holdpoint run directory (``checkpoints/``, ``LATEST``, ``BEST``,
    ``index.json``), as the C++ ``holdpoint::RunDirectory`` keeps it.

    Opening one recovers it (``recover=True``, the default): unfinished staging
    files are removed and a damaged generation is never LATEST (see
    docs/publication.md, "Recovery on open"). ``recover=False`` inspects without changing anything.
    Every load is verified against the run's own record of the generation.

    ``trust`` (a :class:`TrustPolicy`): every load and verify also checks the
    generation's signature first, and :meth:`TrainingState.resume` checks the whole
    run's (:meth:`verify_signatures`). Opening under a policy judges the run's
    signatures before recovery touches a file: LATEST behind the newest signed
    generation, or that generation gone or damaged, is ``signature_rollback``; a
    generation missing from the chain (the oldest included) is
    ``signature_chain_broken``. A policy's ``min_head_step`` / ``expected_head`` (an
    outside witness) also catches a whole directory put back.
    ``signing_key`` (a private key file): each commit is signed once LATEST names
    it, and LATEST, BEST and ``index.json`` after it (docs/threat-model.md,
    "Signing a run").
    """

    def __init__(self, path: PathLike, *, recover: bool = True, create: bool = True,
                 limits: Optional[Limits] = None, best_metric: Optional[str] = None,
                 higher_is_better: bool = False, trust: Optional[TrustPolicy] = None,
                 signing_key: Optional[PathLike] = None) -> None:
        self.trust = trust
        self._run = _native.RunDirectory(_path(path), recover, create, dict(limits) if limits else None,
                                         best_metric, higher_is_better, native_trust(trust),
                                         None if signing_key is None else _path(signing_key))

    @property
    def path(self) -> str:
        return os.fspath(self._run.path)

    def generations(self) -> list[dict]:
        """Every generation, oldest first: name, step, epoch, kind, bytes, sha256, saved_at, metrics."""
        return self._run.generations()

    def latest(self) -> Optional[dict]:
        return self._run.latest()

    def best(self) -> Optional[dict]:
        return self._run.best()

    def recovery(self) -> list[str]:
        """What opening the directory found and did, one line each."""
        return self._run.recovery()

    def file_path(self, generation: str = "latest") -> str:
        return os.fspath(self._run.file_path(generation))

    def load(self, generation: str = "latest", *, tensors: str = "auto") -> Any:
        """Loads a generation ("latest", "best" or a name like "step-00000005.pt"),
        checked against the SHA-256 and size the run recorded for it."""
        return self._run.load(generation, TensorFactory(tensors))[0]

    def verify(self, generation: str = "latest") -> dict:
        """Checks one generation without loading it: ``{"name", "ok", "code", "detail"}``."""
        return self._run.verify(generation)

    def sign(self, key: PathLike) -> list[str]:
        """Signs every committed generation not signed yet, each naming the one
        before it, then LATEST, BEST and ``index.json``; returns the files written."""
        return self._run.sign(_path(key))

    def verify_signatures(self, trust: Optional[TrustPolicy] = None) -> list[dict]:
        """Every signature of the run under ``trust`` (default: the run's own), one
        ``{"name", "ok", "code", "detail"}`` each: the generations', the chain
        (``signature_chain_broken``), and LATEST's, BEST's and ``index.json``'s
        (``signature_rollback`` for a pointer put back)."""
        policy = trust if trust is not None else self.trust
        if policy is None:
            raise Error("verify_signatures needs a TrustPolicy", "invalid_argument", self.path)
        return self._run.verify_signatures(native_trust(policy))

    def require_signatures(self, trust: Optional[TrustPolicy] = None) -> None:
        """:meth:`verify_signatures`, raising :class:`Error` with the first failure's code."""
        for check in self.verify_signatures(trust):
            if not check["ok"]:
                raise Error(f"{self.path}: {check['name']}: {check['detail']}", check["code"], self.path,
                            check["detail"])

    def commit(self, components: Mapping[str, Any], *, step: int, epoch: int = 0, kind: str = "resume",
               metrics: Optional[Mapping[str, float]] = None, semantic_identity: str = "python") -> dict:
        """Writes ``components`` (``{"model": model.state_dict(), "optimizer": ...}``)
        as generation ``step`` and publishes it atomically: the file, its sidecar,
        the index and LATEST (and BEST when ``metrics`` say so). The file is a
        holdpoint checkpoint: its manifest records each component's digest, so a
        load checks each one, and the C++ library and CLI read it like their own."""
        return self._run.commit(components, step, epoch, kind, dict(metrics or {}), plain_spec(semantic_identity),
                                tensor_parts)

    def __repr__(self) -> str:
        return f"RunDirectory({self.path!r})"
