"""holdpoint.TrainingState: a whole training state saved and resumed from Python.

The file is the one the C++ ``holdpoint::TrainingState`` writes and reads
(docs/resume-contract.md): a plain dict of components beside a manifest that
records the run's identity, its resume profile, its configuration identity
and each component's digest and contract. The same core functions write it and
check it on load, so a checkpoint saved in Python resumes in C++ and the
reverse (docs/python.md, "Resuming across languages").

Components are Python objects with ``state_dict()`` and ``load_state_dict()``:
a ``torch.nn.Module``, an optimizer, an LR scheduler, a ``GradScaler``, and the
classes below for what PyTorch keeps no state of (the generators, the
sampler's place in its epoch, the step counters).
"""

from __future__ import annotations

import copy
import random as _random_module
import sys
from typing import Any, Iterator, Mapping, Optional

from . import _native
from ._convert import TensorFactory, finish_tensor, tensor_parts
from ._errors import Error
from ._trust import native_trust

PROFILES = ("cpu-basic-v1", "cpu-shuffled-singleworker-v1", "cuda-single-device-v1", "cpu-gloo-ddp-v1",
            "unqualified")

# The order components are applied in, as in C++: the model first, so that the
# optimizer's parameters are the restored ones; generators last, so that
# nothing run while restoring consumes randomness after it was restored.
_APPLY_RANK = {"model": 0, "scheduler": 1, "optimizer": 2, "scaler": 3, "progress": 4, "early_stop": 5,
               "history": 6, "sampler": 1000, "rng": 1001}



def _state_error(code: str, detail: str) -> Error:
    return Error(detail, code)


def _torch():
    import torch

    return torch


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _require_int(state: Mapping, key: str, component: str, minimum: int = 0) -> int:
    value = state[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise _state_error("state_type_invalid", f"{component}['{key}'] is a {type(value).__name__}, not an int")
    if value < minimum:
        raise _state_error("state_value_invalid", f"{component}['{key}'] = {value} is below {minimum}")
    return value


def _names(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "")


def _require_keys(state: Any, keys: tuple[str, ...], component: str) -> None:
    if not isinstance(state, Mapping):
        raise _state_error("state_type_invalid", f"{component} is a {type(state).__name__}, not a dict")
    missing = [str(k) for k in keys if k not in state]
    if missing:
        raise _state_error("state_key_missing", f"{component} lacks {_names(missing)}")
    unknown = [str(k) for k in state if k not in keys]
    if unknown:
        raise _state_error("state_key_unknown", f"{component} has keys the live object does not: {_names(unknown)}")


# ---- progress --------------------------------------------------------------------------------

class Progress:
    """Where the run is: optimizer updates (``global_step``), the epoch, batches into
    it and samples seen. The state layout of the C++ ``holdpoint::Progress``."""

    _KEYS = ("global_step", "epoch", "batch_in_epoch", "samples_seen")

    def __init__(self, global_step: int = 0, epoch: int = 0, batch_in_epoch: int = 0, samples_seen: int = 0):
        self.global_step = global_step
        self.epoch = epoch
        self.batch_in_epoch = batch_in_epoch
        self.samples_seen = samples_seen

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in self._KEYS}

    def validate_state_dict(self, state: Mapping) -> None:
        _require_keys(state, self._KEYS, "progress")
        for key in self._KEYS:
            _require_int(state, key, "progress")

    def load_state_dict(self, state: Mapping) -> None:
        self.validate_state_dict(state)
        for key in self._KEYS:
            setattr(self, key, state[key])

    def __repr__(self) -> str:
        return "Progress(" + ", ".join(f"{k}={getattr(self, k)}" for k in self._KEYS) + ")"


# ---- samplers --------------------------------------------------------------------------------

class _Sampler:
    """Indices 0..n-1, one epoch at a time, resumable mid-epoch: ``next()`` returns the
    next index or None at the end of the epoch, ``start_epoch(e)`` begins epoch e.
    Iterating yields the rest of the current epoch (starting the next one first if
    this one is used up), so it also serves as a DataLoader's ``sampler`` with
    ``num_workers=0``."""

    kind = ""

    def __init__(self, num_samples: int) -> None:
        if not isinstance(num_samples, int) or num_samples < 0:
            raise Error(f"sampler: num_samples {num_samples!r} is not an int >= 0", "invalid_argument")
        self.num_samples = num_samples
        self.epoch = 0
        self.cursor = 0

    def __len__(self) -> int:
        return self.num_samples

    def _index(self, position: int) -> int:
        raise NotImplementedError

    def next(self) -> Optional[int]:
        if self.cursor == self.num_samples:
            return None
        index = self._index(self.cursor)
        self.cursor += 1
        return index

    def __iter__(self) -> Iterator[int]:
        if self.cursor == self.num_samples and self.num_samples:
            self.start_epoch(self.epoch + 1)
        while True:
            index = self.next()
            if index is None:
                return
            yield index

    def start_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _check_header(self, state: Any, keys: tuple[str, ...]) -> None:
        _require_keys(state, keys, "sampler")
        if state["kind"] != self.kind:
            raise _state_error("state_value_invalid", f"sampler['kind'] is {state['kind']!r}, the live sampler is "
                                                      f"{self.kind!r}")
        if _require_int(state, "num_samples", "sampler") != self.num_samples:
            raise _state_error("state_value_invalid", f"sampler['num_samples'] is {state['num_samples']}, the live "
                                                      f"sampler has {self.num_samples}")
        _require_int(state, "epoch", "sampler")
        cursor = _require_int(state, "cursor", "sampler")
        if cursor > self.num_samples:
            raise _state_error("state_value_invalid", f"sampler['cursor'] = {cursor} is outside 0..{self.num_samples}")


class SequentialSampler(_Sampler):
    """0, 1, ..., n-1 every epoch; the C++ ``holdpoint::SequentialSampler``."""

    kind = "sequential"
    _KEYS = ("kind", "num_samples", "epoch", "cursor")

    def _index(self, position: int) -> int:
        return position

    def start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.cursor = 0

    def state_dict(self) -> dict:
        return {"kind": self.kind, "num_samples": self.num_samples, "epoch": self.epoch, "cursor": self.cursor}

    def validate_state_dict(self, state: Mapping) -> None:
        self._check_header(state, self._KEYS)

    def load_state_dict(self, state: Mapping) -> None:
        self.validate_state_dict(state)
        self.epoch, self.cursor = state["epoch"], state["cursor"]


class RandomSampler(_Sampler):
    """A fresh permutation of 0..n-1 each epoch, drawn with
    ``torch.randperm(n, generator=generator)`` from an explicit CPU generator that
    the run registers (in :class:`Generators`); the epoch's order and the cursor are
    its state. Draws, layout and checks are those of the C++
    ``holdpoint::RandomSampler``, which also draws epoch 0's order when built."""

    kind = "random"
    _KEYS = ("kind", "num_samples", "epoch", "order", "cursor")

    def __init__(self, num_samples: int, generator: Any) -> None:
        super().__init__(num_samples)
        torch = _torch()
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise Error("sampler: RandomSampler needs a CPU torch.Generator", "invalid_argument")
        self.generator = generator
        self.start_epoch(0)

    def _index(self, position: int) -> int:
        return int(self.order[position])

    def start_epoch(self, epoch: int) -> None:
        torch = _torch()
        self.order = torch.randperm(self.num_samples, generator=self.generator, dtype=torch.int64)
        self.epoch = epoch
        self.cursor = 0

    def state_dict(self) -> dict:
        return {"kind": self.kind, "num_samples": self.num_samples, "epoch": self.epoch, "order": self.order,
                "cursor": self.cursor}

    def validate_state_dict(self, state: Mapping) -> None:
        torch = _torch()
        self._check_header(state, self._KEYS)
        order = state["order"]
        if not _is_tensor(order):
            raise _state_error("state_type_invalid", f"sampler['order'] is a {type(order).__name__}, not a tensor")
        if order.dtype != torch.int64:
            raise _state_error("state_dtype_mismatch", f"sampler['order'] has dtype {order.dtype}, not torch.int64")
        if tuple(order.shape) != (self.num_samples,):
            raise _state_error("state_shape_mismatch", f"sampler['order'] is not a 1-d tensor of the "
                                                       f"{self.num_samples} sample indices")
        if not torch.equal(torch.sort(order).values, torch.arange(self.num_samples, dtype=torch.int64)):
            raise _state_error("state_value_invalid", f"sampler['order'] is not a permutation of "
                                                      f"0..{self.num_samples - 1}")

    def load_state_dict(self, state: Mapping) -> None:
        self.validate_state_dict(state)
        self.order = state["order"].clone().contiguous()
        self.epoch, self.cursor = state["epoch"], state["cursor"]


# ---- generators ------------------------------------------------------------------------------

def _numpy_array(value: Any):
    import numpy

    return value.numpy() if _is_tensor(value) else numpy.asarray(value)


class _Source:
    """One registered generator: its kind, and how its state is read, checked and set."""

    def __init__(self, name: str, generator: Any) -> None:
        self.name = name
        self.generator = generator
        self.kind = self._kind_of(generator)

    @staticmethod
    def _kind_of(generator: Any) -> str:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(generator, torch.Generator):
            if generator.device.type != "cpu":
                return f"torch.{generator.device.type}"
            return "torch.cpu"
        if generator is _random_module or isinstance(generator, _random_module.Random):
            return "python.random"
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            if generator is numpy.random or isinstance(generator, numpy.random.RandomState):
                return "numpy.random.RandomState"
            if isinstance(generator, numpy.random.Generator):
                return "numpy.random.Generator"
        raise Error(f"generator '{generator!r}' is not a torch.Generator, random.Random, numpy.random.RandomState "
                    "or numpy.random.Generator", "invalid_argument")

    def get_state(self) -> Any:
        g = self.generator
        if self.kind.startswith("torch."):
            return g.get_state()
        if self.kind == "python.random":
            return g.getstate()
        if self.kind == "numpy.random.RandomState":
            return g.get_state(legacy=True) if hasattr(g, "get_state") else None
        return g.bit_generator.state  # PCG64 holds 128-bit ints: pickled as LONG1, read back as ints

    def _restored(self, state: Any) -> Any:
        """A generator of the same kind holding `state` (raises if it cannot)."""
        if self.kind.startswith("torch."):
            torch = _torch()
            if not _is_tensor(state) or state.dtype != torch.uint8:
                raise ValueError("not a uint8 tensor")
            trial = torch.Generator(device=self.generator.device)
            trial.set_state(state.clone())
            if not torch.equal(trial.get_state(), state):
                raise ValueError("does not restore to the same bytes")
            return state.clone()
        if self.kind == "python.random":
            version, internal, gauss = state
            trial = _random_module.Random()
            trial.setstate((version, tuple(internal), gauss))
            return trial.getstate()
        import numpy

        if self.kind == "numpy.random.RandomState":
            name, keys, pos, has_gauss, cached = state
            restored = (name, _numpy_array(keys).astype(numpy.uint32, copy=True), int(pos), int(has_gauss),
                        float(cached))
            numpy.random.RandomState().set_state(restored)
            return restored
        if not isinstance(state, dict) or "bit_generator" not in state:
            raise ValueError("not a bit generator state")
        name = state["bit_generator"]
        if name != type(self.generator.bit_generator).__name__:
            raise ValueError(f"a {name} state for a {type(self.generator.bit_generator).__name__} generator")
        decoded = {k: (_numpy_array(v).copy() if _is_tensor(v) else v) for k, v in state.items()}
        type(self.generator.bit_generator)().state = decoded
        return decoded

    def set_state(self, restored: Any) -> None:
        g = self.generator
        if self.kind.startswith("torch."):
            g.set_state(restored)
        elif self.kind == "python.random":
            g.setstate(restored)
        elif self.kind == "numpy.random.RandomState":
            g.set_state(restored)
        else:
            g.bit_generator.state = restored


class Generators:
    """The run's generators, saved and restored together: the "rng" component.

    ``Generators({"torch.cpu": torch.default_generator, "sampler": g})`` registers
    each generator under a name. Kinds: ``torch.Generator`` (the CPU one is the
    state the C++ registry saves under kind "torch.cpu"), ``random.Random`` or the
    ``random`` module itself, ``numpy.random.RandomState`` or the ``numpy.random``
    module (its global state), and ``numpy.random.Generator``. The C++ registry
    restores the torch kinds; the others are Python's own.

    The state is ``{name: {"kind": kind, "state": state}}``. A load checks the
    inventory (``rng_inventory_mismatch``) and that every state restores on a
    scratch generator (``rng_state_invalid``) before any live one changes.
    """

    def __init__(self, generators: Optional[Mapping[str, Any]] = None) -> None:
        self._sources: dict[str, _Source] = {}
        for name, generator in (generators or {}).items():
            self.add(name, generator)

    def add(self, name: str, generator: Any) -> "Generators":
        if name in self._sources:
            raise Error(f"generator '{name}' is registered twice", "invalid_argument")
        if any(source.generator is generator for source in self._sources.values()):
            raise Error(f"generator '{name}' is already registered under another name", "invalid_argument")
        self._sources[name] = _Source(name, generator)
        return self

    def __contains__(self, generator: Any) -> bool:
        return any(source.generator is generator for source in self._sources.values())

    def names(self) -> list[str]:
        return list(self._sources)

    def state_dict(self) -> dict:
        return {name: {"kind": s.kind, "state": s.get_state()} for name, s in self._sources.items()}

    def _restored_states(self, state: Any) -> dict[str, Any]:
        if not isinstance(state, Mapping):
            raise _state_error("state_type_invalid", f"rng is a {type(state).__name__}, not a dict")
        if set(state) != set(self._sources):
            missing = sorted(set(self._sources) - set(state))
            unknown = sorted(str(k) for k in set(state) - set(self._sources))
            raise _state_error("rng_inventory_mismatch", f"rng: registered but not in the file: {missing or 'none'}; "
                                                         f"in the file but not registered: {unknown or 'none'}")
        restored = {}
        for name, source in self._sources.items():
            entry = state[name]
            _require_keys(entry, ("kind", "state"), f"rng['{name}']")
            if entry["kind"] != source.kind:
                raise _state_error("rng_inventory_mismatch", f"rng['{name}'] is a {entry['kind']} generator, "
                                                             f"registered as {source.kind}")
            try:
                restored[name] = source._restored(entry["state"])
            except (TypeError, ValueError, KeyError, IndexError, RuntimeError, OverflowError) as failure:
                raise _state_error("rng_state_invalid", f"rng['{name}']['state'] cannot be restored: "
                                                        f"{failure}") from None
        return restored

    def validate_state_dict(self, state: Mapping) -> None:
        self._restored_states(state)

    def load_state_dict(self, state: Mapping) -> None:
        restored = self._restored_states(state)
        for name, source in self._sources.items():
            source.set_state(restored[name])


# ---- validation of PyTorch's own components --------------------------------------------------

def _validate_module(module: Any, state: Any) -> None:
    live = module.state_dict()
    _require_keys(state, tuple(live), "model")
    for key, tensor in live.items():
        saved = state[key]
        if not _is_tensor(saved):
            raise _state_error("state_type_invalid", f"model['{key}'] is a {type(saved).__name__}, not a tensor")
        if tuple(saved.shape) != tuple(tensor.shape):
            raise _state_error("state_shape_mismatch", f"model['{key}'] has shape {list(saved.shape)}, the live "
                                                       f"model {list(tensor.shape)}")
        if saved.dtype != tensor.dtype:
            raise _state_error("state_dtype_mismatch", f"model['{key}'] has dtype {saved.dtype}, the live model "
                                                       f"{tensor.dtype}")


def _validate_optimizer(optimizer: Any, state: Any) -> None:
    if not isinstance(state, Mapping) or set(state) != {"state", "param_groups"}:
        raise _state_error("state_structure_mismatch", "optimizer is not {'state': ..., 'param_groups': [...]}")
    groups = state["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != len(optimizer.param_groups):
        raise _state_error("state_structure_mismatch", f"optimizer has {len(groups) if isinstance(groups, list) else 0}"
                                                       f" param groups, the live one {len(optimizer.param_groups)}")
    params: list[tuple[Any, Any]] = []
    for index, (saved, live) in enumerate(zip(groups, optimizer.param_groups)):
        ids = saved.get("params") if isinstance(saved, Mapping) else None
        if not isinstance(ids, (list, tuple)) or len(ids) != len(live["params"]):
            raise _state_error("state_structure_mismatch", f"optimizer param_groups[{index}] does not list "
                                                           f"{len(live['params'])} parameters")
        params.extend(zip(ids, live["params"]))
    by_id = dict(params)
    per_param = state["state"]
    if not isinstance(per_param, Mapping):
        raise _state_error("state_type_invalid", "optimizer['state'] is not a dict")
    for key, entry in per_param.items():
        if key not in by_id:
            raise _state_error("state_structure_mismatch", f"optimizer['state'] has an entry for parameter {key!r}, "
                                                           "which no group lists")
        if not isinstance(entry, Mapping):
            raise _state_error("state_type_invalid", f"optimizer['state'][{key!r}] is not a dict")
        for field, value in entry.items():
            if _is_tensor(value) and value.dim() > 0 and tuple(value.shape) != tuple(by_id[key].shape):
                raise _state_error("state_shape_mismatch",
                                   f"optimizer['state'][{key!r}]['{field}'] has shape {list(value.shape)}, "
                                   f"its parameter {list(by_id[key].shape)}")


# Files smaller than this never resume in place under memory="automatic".
IN_PLACE_RESUME_BYTES = 256 << 20


class _InPlaceTensors(TensorFactory):
    """The tensor factory of a resume in place: a tensor the first pass left in
    the file becomes a meta tensor (shape and dtype, no memory) until fill()
    gives it its bytes."""

    def __init__(self) -> None:
        super().__init__("torch")
        # id(meta tensor) -> (tensor, record, bytes, dtype, shape, stride, offset, requires_grad, is_parameter,
        #                     conj, neg)
        self.absent: dict[int, tuple] = {}
        self.records: dict[int, Any] = {}  # record -> the tensor holding its bytes
        self.filled: set[int] = set()      # ids of the tensors fill() returned

    def __call__(self, buffer, dtype, shape, stride, offset, requires_grad, is_parameter, from_numpy,
                 conj=False, neg=False):
        if isinstance(buffer, tuple) and buffer and buffer[0] == "absent":
            torch: Any = self.torch
            torch_dtype = self.dtypes.get(dtype) or self._torch_dtype(dtype)
            meta = torch.empty_strided(shape, stride, dtype=torch_dtype, device="meta")
            self.absent[id(meta)] = (meta, buffer[1], buffer[2], torch_dtype, tuple(shape), tuple(stride), offset,
                                     requires_grad, is_parameter, conj, neg)
            return meta
        return super().__call__(buffer, dtype, shape, stride, offset, requires_grad, is_parameter, from_numpy,
                                conj, neg)

    def fill(self, value: Any, resume: Any, live: Any = None) -> Any:
        """`value` with every meta tensor replaced by one holding its bytes: the
        live tensor at the same key of `live` (a model's state dict) where it
        has the same dtype, shape and layout and the record is its alone, else
        fresh memory."""
        if _is_tensor(value):
            entry = self.absent.get(id(value))
            if entry is None:
                return value
            _, record, nbytes, dtype, shape, stride, offset, requires_grad, is_parameter, conj, neg = entry
            torch: Any = self.torch
            target = None
            # A lazy conj/neg view's bytes are the plain elements: never written into a live tensor.
            if (live is not None and _is_tensor(live) and record not in self.records and live.device.type == "cpu"
                    and not conj and not neg
                    and live.dtype == dtype and tuple(live.shape) == shape and live.is_contiguous() and offset == 0
                    and live.numel() * live.element_size() == nbytes and tuple(live.stride()) == stride):
                resume.fill(record, live.data_ptr(), nbytes, True)
                self.records[record] = live
                target = live
            else:
                holder = self.records.get(record)
                if holder is None or holder.dtype != torch.uint8:
                    holder = torch.empty(nbytes, dtype=torch.uint8)
                    resume.fill(record, holder.data_ptr(), nbytes, False)
                    self.records[record] = holder
                target = finish_tensor(torch, holder.view(dtype).as_strided(shape, stride, offset), conj, neg,
                                       requires_grad, is_parameter)
            self.filled.add(id(target))
            return target
        if isinstance(value, dict):
            out = type(value)() if type(value) is not dict else {}
            for key, item in value.items():
                out[key] = self.fill(item, resume, live.get(key) if isinstance(live, Mapping) else None)
            if hasattr(value, "_metadata"):
                out._metadata = value._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(value, list):
            return [self.fill(item, resume) for item in value]
        if isinstance(value, tuple):
            return tuple(self.fill(item, resume) for item in value)
        return value


def _apply_failed(path: Any, name: Optional[str], failure: BaseException, unrestored: list) -> Error:
    """state_apply_failed for a failure applying component ``name``, saying what was put back."""
    import os

    outcome = f"not restored: {', '.join(unrestored)}" if unrestored else "every component applied was restored"
    detail = f"applying component '{name}' failed ({type(failure).__name__}: {failure}); {outcome}"
    return Error(f"{os.fspath(path)}: {detail}", "state_apply_failed", os.fspath(path), detail)


def _owned_except(value: Any, filled: set) -> Any:
    """_owned, leaving alone the tensors a resume in place filled (live ones,
    or fresh memory nothing else holds)."""
    if _is_tensor(value):
        return value if id(value) in filled else value.clone()
    if isinstance(value, dict):
        out = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            out[key] = _owned_except(item, filled)
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(value, list):
        return [_owned_except(item, filled) for item in value]
    if isinstance(value, tuple):
        return tuple(_owned_except(item, filled) for item in value)
    return value


def _validate(component: Any, state: Any) -> None:
    torch = sys.modules.get("torch")
    if hasattr(component, "validate_state_dict"):
        component.validate_state_dict(state)
    elif torch is not None and isinstance(component, torch.nn.Module):
        _validate_module(component, state)
    elif torch is not None and isinstance(component, torch.optim.Optimizer):
        _validate_optimizer(component, state)


def _owned(value: Any) -> Any:
    """`value` with every tensor copied out of the load's snapshot, so that live
    state does not keep the whole file's memory alive."""
    if _is_tensor(value):
        return value.clone()
    if isinstance(value, dict):
        out = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            out[key] = _owned(item)
        if hasattr(value, "_metadata"):
            out._metadata = value._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(value, list):
        return [_owned(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_owned(item) for item in value)
    return value


def plain_spec(semantic_identity: str) -> dict:
    """The run description of a checkpoint written without a TrainingState: no
    profile claim, no configuration beyond the semantic identity."""
    torch = sys.modules.get("torch")
    return {"semantic_identity": semantic_identity, "profile": "unqualified", "load_bearing": {},
            "operational": {}, "code_identity": "", "data_identity": "",
            "torch_version": f"Python torch {torch.__version__}" if torch is not None else "none",
            "facts": {}, "last_resume_drift": None}


# ---- TrainingState --------------------------------------------------------------------------

class TrainingState:
    """The registry of a run's components, saved and resumed as one checkpoint.

        state = holdpoint.TrainingState("mnist-cnn-v3", profile="cpu-shuffled-singleworker-v1",
                                        config={"lr": 0.03, "batch_size": 4, "seeds": [2024, 7]})
        state.add("model", model).add("optimizer", optimizer).add("scheduler", scheduler)
        state.add("rng", holdpoint.Generators({"torch.cpu": torch.default_generator, "sampler": g}))
        state.add("sampler", sampler).add("progress", progress)
        state.save("checkpoint.pt")          # atomic, with checkpoint.pt.sha256
        report = state.load("checkpoint.pt")  # checked, then applied; or nothing changes

    ``config`` holds the load-bearing fields (a change makes a resumed run a
    different run: ``config_drift`` names each), ``operational`` the others;
    ``max_epochs`` may grow between runs, not shrink. ``profile`` is a claim whose
    preconditions are checked on save and on load (docs/resume-contract.md);
    ``loader_workers`` and ``external_randomness`` declare what the components
    cannot tell.
    """

    def __init__(self, semantic_identity: str, *, profile: str = "unqualified",
                 config: Optional[Mapping[str, Any]] = None, operational: Optional[Mapping[str, Any]] = None,
                 max_epochs: Optional[int] = None, loader_workers: int = 0, external_randomness: bool = False,
                 code_identity: str = "", data_identity: str = "") -> None:
        if profile not in PROFILES:
            raise Error(f"resume profile '{profile}' is not known ({', '.join(PROFILES)})", "profile_unknown")
        self.semantic_identity = semantic_identity
        self.profile = profile
        self.config = dict(config or {})
        self.operational = dict(operational or {})
        if max_epochs is not None:
            self.operational["max_epochs"] = max_epochs
        self.loader_workers = loader_workers
        self.external_randomness = external_randomness
        self.code_identity = code_identity
        self.data_identity = data_identity
        self._components: dict[str, Any] = {}
        self._pending_drift: Optional[dict] = None

    def add(self, name: str, component: Any) -> "TrainingState":
        """Registers ``component`` (anything with ``state_dict`` and ``load_state_dict``)."""
        if name in self._components or name == "holdpoint":
            raise Error(f"component name '{name}' is taken", "invalid_argument")
        if not hasattr(component, "state_dict") or not hasattr(component, "load_state_dict"):
            raise Error(f"component '{name}' has no state_dict/load_state_dict", "invalid_argument")
        self._components[name] = component
        return self

    def components(self) -> dict[str, Any]:
        return dict(self._components)

    def capture(self) -> dict[str, Any]:
        """Every component's state now, by name."""
        return {name: component.state_dict() for name, component in self._components.items()}

    def _facts(self) -> dict:
        torch = sys.modules.get("torch")
        facts: dict[str, Any] = {"loader_workers": self.loader_workers,
                                 "external_randomness": self.external_randomness}
        registries = [c for c in self._components.values() if isinstance(c, Generators)]
        model_on_cpu = True
        sampler_kind = ""
        sampler_generator = None
        for name, component in self._components.items():
            if torch is not None and isinstance(component, torch.nn.Module):
                model_on_cpu &= all(t.device.type == "cpu" for t in component.state_dict().values())
            if isinstance(component, _Sampler):
                sampler_kind = component.kind
                sampler_generator = getattr(component, "generator", None)
            elif name == "sampler":
                sampler_kind = "custom"
        facts["model_on_cpu"] = model_on_cpu
        facts["sampler_kind"] = sampler_kind
        facts["cpu_generator_registered"] = torch is not None and any(
            torch.default_generator in registry for registry in registries)
        facts["sampler_generator_registered"] = sampler_generator is not None and any(
            sampler_generator in registry for registry in registries)
        return facts

    def _spec(self) -> dict:
        torch = sys.modules.get("torch")
        return {"semantic_identity": self.semantic_identity, "profile": self.profile,
                "load_bearing": self.config, "operational": self.operational,
                "code_identity": self.code_identity, "data_identity": self.data_identity,
                "torch_version": f"Python torch {torch.__version__}" if torch is not None else "none",
                "facts": self._facts(), "last_resume_drift": self._pending_drift}

    def _require_components(self) -> None:
        if not self._components:
            raise Error("the training state has no components (add the model, the optimizer, ...)",
                        "invalid_argument")

    def save(self, path: Any, *, sidecar: bool = True, durable: bool = True) -> dict:
        """Writes every component, with the manifest, atomically (a crash leaves the
        previous file); ``sidecar`` also writes ``path.sha256``. The profile's
        preconditions are checked first (``profile_precondition_violated``).
        Returns ``{"sha256", "bytes", "tensors", "storages"}``."""
        import os

        self._require_components()
        return _native.save_training_state(os.fspath(path), self.capture(), self._spec(), sidecar, durable,
                                           tensor_parts)

    def commit(self, run: Any, *, step: int, epoch: int = 0, kind: str = "resume",
               metrics: Optional[Mapping[str, float]] = None) -> dict:
        """Publishes the state as generation ``step`` of a :class:`RunDirectory`."""
        self._require_components()
        return run._run.commit(self.capture(), step, epoch, kind, dict(metrics or {}), self._spec(), tensor_parts)

    def load(self, path: Any, *, expected_sha256: Optional[str] = None, limits: Optional[Mapping[str, Any]] = None,
             trust: Any = None, memory: str = "automatic", journal_directory: Any = None) -> dict:
        """Resumes from ``path``: every check first, then every component, or nothing.

        Checked in order, before anything changes: the whole-file SHA-256 against
        ``expected_sha256`` (from a source you trust: a run's index, a sidecar you
        vouch for), the restricted reader's rules, the manifest, the profile and its
        preconditions, the configuration identity, the component inventory, each
        component's digest and contract (all by the same C++ core as the C++
        TrainingState), then each component's state against the live object. Then
        components are applied, the model first and the generators last; if one
        fails, those applied are put back as they were and ``state_apply_failed`` is
        raised. Returns ``{"profile", "step", "sha256", "digest_checked", "drift",
        "restored", ...}``. ``trust`` (a :class:`holdpoint.TrustPolicy`) checks the
        file's signature before anything else.

        ``memory`` chooses how the file is held while it is checked
        (docs/resume-contract.md, "Resuming in place"): ``"private_copy"`` reads it
        whole into memory; ``"in_place"`` verifies it in a first pass that keeps only
        its small records, then reads each large tensor straight into the model's
        own tensor (its old bytes journaled in ``journal_directory``, the file's
        folder by default) or into memory the optimizer takes, checking every byte
        against a tag the first pass took; ``"automatic"`` (the default) goes in
        place when the private copy would not fit in the memory left. The report's
        ``"in_place"`` says which ran."""
        import os

        self._require_components()
        if memory not in ("automatic", "private_copy", "in_place"):
            raise Error(f"memory must be 'automatic', 'private_copy' or 'in_place', not {memory!r}", "invalid_argument")
        if self._resumes_in_place(path, memory):
            return self._load_in_place(path, expected_sha256, limits, trust, journal_directory)
        names = list(self._components)
        states, report = _native.load_training_state(os.fspath(path), expected_sha256,
                                                     dict(limits) if limits else None, self._spec(), names,
                                                     TensorFactory("torch"), native_trust(trust))
        order = self._validated_order(path, names, states)
        applied: list[tuple[str, Any]] = []
        for name in order:
            component = self._components[name]
            before = copy.deepcopy(component.state_dict())
            try:
                component.load_state_dict(_owned(states[name]))
            except Exception as failure:  # noqa: BLE001 (every failure rolls back)
                applied.append((name, before))
                raise _apply_failed(path, name, failure, self._put_back(applied)) from failure
            applied.append((name, before))
        if report["drift"] is not None:
            self._pending_drift = report["drift"]
        report["restored"] = order
        report["in_place"] = False
        return report

    def _validated_order(self, path: Any, names: list, states: dict) -> list:
        """The components in apply order, each state validated against its live object."""
        import os

        order = sorted(names, key=lambda n: (_APPLY_RANK.get(n, 100), names.index(n)))
        try:
            for name in order:
                _validate(self._components[name], states[name])
        except Error as error:
            raise Error(f"{os.fspath(path)}: {error.detail}", error.code, os.fspath(path), error.detail) from None
        return order

    def _put_back(self, applied: list) -> list:
        """Puts the applied components' saved states back, newest first (None: nothing
        to put back); returns the names of those that could not be."""
        unrestored = []
        for done, saved in reversed(applied):
            if saved is None:
                continue
            try:
                self._components[done].load_state_dict(saved)
            except Exception:  # noqa: BLE001 (the others are still put back)
                unrestored.append(done)
        return unrestored

    def _resumes_in_place(self, path: Any, memory: str) -> bool:
        import os

        if memory != "automatic":
            return memory == "in_place"
        try:
            size = os.path.getsize(path)
        except OSError:
            return False
        return (size >= IN_PLACE_RESUME_BYTES and self._facts()["model_on_cpu"]
                and size + size // 4 > _native.available_memory_bytes())

    def _load_in_place(self, path: Any, expected_sha256: Optional[str], limits: Optional[Mapping[str, Any]],
                       trust: Any, journal_directory: Any) -> dict:
        import os

        torch = sys.modules.get("torch")
        if torch is None:
            raise Error("a resume in place needs torch", "invalid_argument")
        names = list(self._components)
        folder = os.fspath(journal_directory) if journal_directory is not None else \
            os.path.dirname(os.path.abspath(os.fspath(path)))
        resume = _native.InPlaceResume(os.fspath(path), folder)
        # The models' tensors, which the second pass may write over, are
        # journaled while the first pass hashes the file.
        live_states = {name: c.state_dict() for name, c in self._components.items()
                       if isinstance(c, torch.nn.Module)}
        resume.journal_in_background([(t.data_ptr(), t.numel() * t.element_size())
                                      for state in live_states.values() for t in state.values()
                                      if _is_tensor(t) and t.device.type == "cpu" and t.is_contiguous()
                                      and t.numel() > 0])
        factory = _InPlaceTensors()
        states, report = resume.scan(expected_sha256, dict(limits) if limits else None, self._spec(), names,
                                     factory, native_trust(trust))
        order = self._validated_order(path, names, states)
        applied: list[tuple[str, Any]] = []
        current = None
        try:
            # The second pass: nothing has changed before it.
            resume.begin()
            for name in order:
                states[name] = factory.fill(states[name], resume, live_states.get(name))
            for name in order:
                current = name
                component = self._components[name]
                # A model's old bytes are in the journal; the rest are copied.
                applied.append((name, None if name in live_states else copy.deepcopy(component.state_dict())))
                component.load_state_dict(_owned_except(states[name], factory.filled))
        except Exception as failure:  # noqa: BLE001 (every failure rolls back)
            unrestored = self._put_back(applied)
            journal = resume.restore()
            if journal:
                unrestored.append("the journaled model bytes" + journal)
            if isinstance(failure, Error) and current is None:
                raise  # refused before anything was applied
            raise _apply_failed(path, current, failure, unrestored) from failure
        if report["drift"] is not None:
            self._pending_drift = report["drift"]
        report["restored"] = order
        report["in_place"] = True
        report["bytes_journaled"] = resume.bytes_journaled
        return report

    def resume(self, run: Any, generation: str = "latest") -> dict:
        """:meth:`load` of a :class:`RunDirectory`'s generation, against the SHA-256
        the run's index records for it. Under the run's ``trust``, the whole run's
        signatures are checked first (a rolled-back LATEST or a broken chain is
        refused), then the generation's own."""
        if run.trust is not None:
            run.require_signatures()
        info = run.latest() if generation == "latest" else run.best() if generation == "best" else None
        if info is None:
            info = next((g for g in run.generations() if g["name"] == generation), None)
        if info is None:
            raise Error(f"run {run.path} has no generation '{generation}'", "invalid_argument", run.path)
        return self.load(run.file_path(info["name"]), expected_sha256=info["sha256"], trust=run.trust)

    def __repr__(self) -> str:
        return (f"TrainingState({self.semantic_identity!r}, profile={self.profile!r}, "
                f"components={list(self._components)})")
