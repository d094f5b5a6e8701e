"""Tensors between holdpoint's core and torch or NumPy, without copying.

The core hands each storage of a load's private snapshot over as a buffer
object that owns it; the factories here wrap it with ``torch.frombuffer`` or a
NumPy array. The snapshot's memory is released when the last view of it dies.
"""

from __future__ import annotations

import sys
from typing import Any

from ._errors import Error

TENSOR_KINDS = ("auto", "torch", "numpy")


def _numpy():
    import numpy

    return numpy


def _torch_module(required: bool):
    if sys.modules.get("torch") is not None:
        return sys.modules["torch"]
    try:
        import torch
    except ImportError:
        if required:
            raise Error("tensors='torch' needs torch installed (pip install torch)", "invalid_argument") from None
        return None
    return torch


def _numpy_dtype(np, name: str):
    try:
        return np.dtype(name)
    except TypeError:
        raise Error(f"a {name} tensor has no NumPy dtype: load it with tensors='torch'", "dtype_unsupported") from None


def _numpy_array(buffer, dtype: str, shape, stride, offset):
    np = _numpy()
    np_dtype = _numpy_dtype(np, dtype)
    itemsize = np_dtype.itemsize
    if buffer is None or len(buffer) == 0:
        if buffer is not None and 0 in shape:
            # Empty: the strides it was pickled with, as NumPy's own unpickling keeps them.
            return np.ndarray(shape, dtype=np_dtype, buffer=bytearray(), strides=tuple(s * itemsize for s in stride))
        return np.zeros(shape, dtype=np_dtype)
    return np.ndarray(shape, dtype=np_dtype, buffer=buffer, offset=offset * itemsize,
                      strides=tuple(s * itemsize for s in stride))


class TensorFactory:
    """Called by the core once per tensor, with its storage's buffer."""

    def __init__(self, tensors: str) -> None:
        if tensors not in TENSOR_KINDS:
            raise Error(f"tensors must be one of {TENSOR_KINDS}, not {tensors!r}", "invalid_argument")
        # "auto": torch when it is installed, NumPy otherwise.
        self.torch = _torch_module(required=tensors == "torch") if tensors != "numpy" else None
        self.bases: dict[tuple[int, str], Any] = {}
        self.dtypes: dict[str, Any] = {}

    def _torch_dtype(self, name: str):
        torch: Any = self.torch
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise Error(f"this torch {torch.__version__} has no dtype {name}", "dtype_unsupported")
        self.dtypes[name] = dtype
        return dtype

    def __call__(self, buffer, dtype, shape, stride, offset, requires_grad, is_parameter, from_numpy,
                 conj=False, neg=False):
        torch = self.torch
        if isinstance(buffer, str) and buffer == "meta":
            return self._meta_tensor(dtype, shape, stride, requires_grad, is_parameter)
        if torch is None or from_numpy:
            # What NumPy pickled comes back as NumPy, as the framework's own load gives it.
            array = _numpy_array(buffer, dtype, shape, stride, offset)
            # NumPy has no lazy views: a conjugate or negative view is resolved into a copy.
            if conj:
                array = array.conj()
            if neg:
                array = -array
            return array
        torch_dtype = self.dtypes.get(dtype) or self._torch_dtype(dtype)
        if buffer is None or len(buffer) == 0:
            # An empty storage: the view keeps its strides and offset, as torch.load's does.
            tensor = torch.empty(0, dtype=torch_dtype).as_strided(shape, stride, offset)
        else:
            key = (id(buffer), dtype)
            base = self.bases.get(key)
            if base is None:
                base = torch.frombuffer(buffer, dtype=torch_dtype)
                self.bases[key] = base
                # The commonest case, a 1-d tensor over its whole storage, is the
                # storage's tensor itself: no view, as torch.load gives it.
                if (offset == 0 and len(shape) == 1 and shape[0] == base.shape[0] and stride == (1,)
                        and not requires_grad and not is_parameter and not conj and not neg):
                    return base
            tensor = base.as_strided(shape, stride, offset)  # a view of its own, never the shared base
        return finish_tensor(torch, tensor, conj, neg, requires_grad, is_parameter)

    def _meta_tensor(self, dtype, shape, stride, requires_grad, is_parameter):
        """A tensor on the meta device, as torch's _rebuild_meta_tensor_no_storage
        makes it; without torch (NumPy has no such thing), its description."""
        torch = self.torch
        if torch is None:
            return describe_tensor("meta", dtype, shape, stride, 0, requires_grad, is_parameter, False)
        torch_dtype = self.dtypes.get(dtype) or self._torch_dtype(dtype)
        tensor = torch.empty_strided(shape, stride, dtype=torch_dtype, device="meta")
        return finish_tensor(torch, tensor, False, False, requires_grad, is_parameter)


def finish_tensor(torch, tensor, conj, neg, requires_grad, is_parameter):
    """torch.load's last steps on a rebuilt view: the lazy conj/neg bits (as its
    set_tensor_metadata sets them, over the same storage), then nn.Parameter or
    requires_grad."""
    if conj:
        tensor = tensor.conj()
    if neg:
        tensor = tensor._neg_view()
    if is_parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def describe_tensor(buffer, dtype, shape, stride, offset, requires_grad, is_parameter, from_numpy,
                    conj=False, neg=False):
    """What inspect shows of a tensor: no bytes are read."""
    out = {"dtype": dtype, "shape": list(shape), "stride": list(stride), "offset": offset}
    if isinstance(buffer, str) and buffer == "meta":
        out["device"] = "meta"  # no storage, no elements
    if conj:
        out["conj"] = True
    if neg:
        out["neg"] = True
    if requires_grad:
        out["requires_grad"] = True
    if is_parameter:
        out["parameter"] = True
    if from_numpy:
        out["numpy"] = True
    return TensorInfo(out)


def sparse_tensor(layout, parts, size, coalesced, requires_grad, is_parameter):
    """A sparse tensor from its parts, as torch's _rebuild_sparse_tensor builds it.
    holdpoint's reader has checked torch's invariants on the parts already (always,
    where torch checks them only under torch.sparse.check_sparse_tensor_invariants).
    Without torch, or in an inspect tree, a TensorInfo with the layout, shape and
    the parts (NumPy arrays or TensorInfos): COO's indices and values; CSR/BSR's
    crow/col indices and values; CSC/BSC's ccol/row indices and values."""
    torch = sys.modules.get("torch")
    name = layout.removeprefix("torch.")
    if torch is not None and all(isinstance(part, torch.Tensor) for part in parts):
        kind = getattr(torch, name)
        if kind is torch.sparse_coo:
            try:
                tensor = torch.sparse_coo_tensor(parts[0], parts[1], size, check_invariants=False,
                                                 is_coalesced=coalesced)
            except TypeError:  # a torch before is_coalesced= (1.13)
                tensor = torch.sparse_coo_tensor(parts[0], parts[1], size)
                if coalesced:
                    tensor = tensor._coalesced_(True)
        else:
            tensor = torch.sparse_compressed_tensor(parts[0], parts[1], parts[2], size, layout=kind,
                                                    check_invariants=False)
        if is_parameter:
            return torch.nn.Parameter(tensor, requires_grad=requires_grad)
        return tensor
    values = parts[-1]
    dtype = values["dtype"] if isinstance(values, dict) else str(values.dtype)
    out = {"dtype": dtype, "shape": list(size), "layout": name, "parts": list(parts)}
    if coalesced is not None:
        out["coalesced"] = coalesced
    if requires_grad:
        out["requires_grad"] = True
    if is_parameter:
        out["parameter"] = True
    return TensorInfo(out)


def _sparse_parts(torch, t):
    """What the writer needs of a sparse tensor: ("sparse", layout, parts, size,
    is_coalesced or None, requires_grad, is_parameter). As torch.save, it keeps
    requires_grad only for an nn.Parameter."""
    if t.layout == torch.sparse_coo:
        parts, coalesced = (t._indices(), t._values()), bool(t.is_coalesced())
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts, coalesced = (t.crow_indices(), t.col_indices(), t.values()), None
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts, coalesced = (t.ccol_indices(), t.row_indices(), t.values()), None
    else:
        raise Error(f"save: a {t.layout} tensor; holdpoint writes strided and sparse tensors",
                    "write_value_unsupported")
    is_parameter = isinstance(t, torch.nn.Parameter)
    if t.device.type != "cpu":
        parts = tuple(part.cpu() for part in parts)
    return ("sparse", str(t.layout), tuple(part.detach() for part in parts), tuple(t.shape), coalesced,
            bool(t.requires_grad) and is_parameter, is_parameter)


class TensorInfo(dict):
    """A tensor in an inspect tree: dtype, shape, stride, offset (no data)."""

    def __repr__(self) -> str:
        layout = f", {self['layout']}" if "layout" in self else ""
        return f"Tensor({self['dtype']}, {self['shape']}{layout})"


def tensor_parts(value):
    """What the writer needs of a tensor or array: (buffer, dtype, shape, stride,
    offset, requires_grad, is_parameter, storage identity); the plain value of a
    NumPy scalar; None for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch_parts(torch, value)
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            return _numpy_parts(np, value)
        if isinstance(value, np.generic):
            return value.item()
    return None


def _torch_parts(torch, t):
    if t.layout != torch.strided:
        return _sparse_parts(torch, t)
    name = str(t.dtype).removeprefix("torch.")
    if t.device.type == "meta":
        # No storage and no elements: written as torch.save writes it, by its geometry.
        return ("meta", name, tuple(t.shape), tuple(t.stride()), 0, bool(t.requires_grad),
                isinstance(t, torch.nn.Parameter), 0)
    if t.device.type != "cpu":
        t = t.detach().cpu()
    # A lazy conj/neg view is written as itself: its storage and its bits, as torch.save does.
    conj, neg = bool(t.is_conj()), bool(t.is_neg())
    is_parameter = isinstance(t, torch.nn.Parameter)
    requires_grad = bool(t.requires_grad)
    t = t.detach()
    storage = t.untyped_storage()
    # A uint8 view of the whole storage: tensors sharing it share it in the file.
    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
    buffer = whole.numpy() if storage.nbytes() else bytearray()
    return (buffer, name, tuple(t.shape), tuple(t.stride()), t.storage_offset(), requires_grad, is_parameter,
            storage.data_ptr() or id(storage), conj, neg)


def _numpy_parts(np, a):
    if a.dtype.kind not in "biufc" or a.dtype.fields is not None:
        raise Error(f"save: a NumPy array of dtype {a.dtype}; only numbers are written", "write_value_unsupported")
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    a = np.ascontiguousarray(a)
    itemsize = a.dtype.itemsize
    stride = tuple(s // itemsize for s in a.strides)
    buffer = a.reshape(-1).view(np.uint8) if a.size else bytearray()
    return (buffer, a.dtype.name, tuple(a.shape), stride, 0, False, False, a.__array_interface__["data"][0] or id(a))


COMPAT_MODES = (None, "data")


def as_plain_data(value):
    """``compat="data"``: the plain forms of torch's and NumPy's value types, as
    holdpoint returned them before it returned the types themselves: a
    ``torch.dtype``, ``torch.device`` or ``torch.layout`` as its str
    (``"torch.float16"``, ``"cuda:1"``, ``"torch.strided"``), a ``torch.Size`` as a
    tuple of ints, a NumPy scalar as the Python scalar ``.item()`` gives. Containers
    keep their type (an OrderedDict its ``_metadata``) and their sharing; tensors
    and arrays are returned as they are."""
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    done: dict[int, Any] = {}

    def plain(item):
        if torch is not None:
            if isinstance(item, torch.Size):
                return tuple(int(d) for d in item)
            if isinstance(item, (torch.dtype, torch.device, torch.layout)):
                return str(item)
            if isinstance(item, torch.Tensor):
                return item
        if np is not None:
            if isinstance(item, np.ndarray):
                return item
            if isinstance(item, np.generic):
                return item.item()
        if not isinstance(item, (dict, list, tuple, set)):
            return item
        if id(item) in done:
            return done[id(item)]
        if isinstance(item, dict):
            out = type(item)()
            done[id(item)] = out
            for key, entry in item.items():
                out[plain(key)] = plain(entry)
            if hasattr(item, "_metadata"):
                out._metadata = plain(item._metadata)
        elif isinstance(item, list):
            out = []
            done[id(item)] = out
            out.extend(plain(entry) for entry in item)
        elif isinstance(item, set):
            out = {plain(entry) for entry in item}
            done[id(item)] = out
        else:  # a tuple: immutable, so its items are converted before it exists
            out = tuple(plain(entry) for entry in item)
            done[id(item)] = out
        return out

    return plain(value)

