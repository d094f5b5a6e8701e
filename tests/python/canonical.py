"""Canonical NODE encoding of LIVE Python objects (what was saved, or what torch.load returned).

This is the Python side of the encoding `holdpoint inspect --json --digests` prints (see
oracle.py for the grammar). It works on real torch tensors, so it is independent of the
oracle, which rebuilds tensors from stub objects.

Storage keys: torch.save names each distinct storage as it meets it while pickling
(depth-first, in container order). `storage_key_zip` reproduces the zip writer's
"0", "1", ... numbering; the legacy writer uses the StorageImpl address instead.
"""

import collections
import hashlib
import struct

import torch


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def tensor_bytes(t):
    """Elements in C order, little-endian."""
    t = t.detach()
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def storage_identity(t):
    """The StorageImpl address: what torch.save's legacy format uses as the storage key."""
    if hasattr(t, "untyped_storage"):  # torch 2.x
        return t.untyped_storage()._cdata
    return t.storage()._storage._cdata  # torch 1.13


class LiveEncoder:
    """storage_keys: "zip" (first-reference numbering), "legacy" (StorageImpl address),
    or None (omit the storage field, for comparisons that do not care)."""

    def __init__(self, storage_keys="zip", digests=True):
        self.storage_keys, self.digests = storage_keys, digests
        self.zip_keys = {}
        self.seen_tensors = set()

    def key(self, k):
        if type(k) is str:
            return {"str": k}
        if type(k) is int:
            return {"int": str(k)}
        raise TypeError(f"dict key of type {type(k).__name__}")

    def storage_key(self, t):
        ident = storage_identity(t)
        if self.storage_keys == "legacy":
            return str(ident)
        return self.zip_keys.setdefault(ident, str(len(self.zip_keys)))

    def tensor(self, t):
        if t.layout != torch.strided or t.device.type != "cpu":
            raise TypeError("only dense CPU tensors")
        node = {
            "dtype": dtype_name(t.dtype),
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "offset": t.storage_offset(),
            "requires_grad": bool(t.requires_grad),
            "parameter": isinstance(t, torch.nn.Parameter),
        }
        if self.storage_keys is not None:
            node["storage"] = self.storage_key(t)
        if self.digests:
            node["sha256"] = hashlib.sha256(tensor_bytes(t)).hexdigest()
        return {"tensor": node}

    def encode(self, v):
        if v is None or type(v) is bool:
            return v
        if type(v) is int:
            return {"int": str(v)}
        if type(v) is float:
            return {"float": struct.pack(">d", v).hex()}
        if type(v) is str:
            return {"str": v}
        if type(v) is bytes:
            return {"bytes": v.hex()}
        if isinstance(v, torch.Tensor):
            return self.tensor(v)
        if type(v) is list:
            return {"list": [self.encode(x) for x in v]}
        if type(v) is tuple:
            return {"tuple": [self.encode(x) for x in v]}
        if type(v) in (dict, collections.Counter):  # a Counter reads as the dict of its counts
            return {"dict": [[self.key(k), self.encode(x)] for k, x in v.items()]}
        if type(v) is collections.OrderedDict:
            return {"odict": [[self.key(k), self.encode(x)] for k, x in v.items()]}
        raise TypeError(f"no canonical encoding for {type(v).__name__}")


def encode(obj, storage_keys="zip", digests=True):
    return LiveEncoder(storage_keys, digests).encode(obj)


def first_difference(a, b, path="$"):
    """A readable path to the first place two NODE trees differ, or None."""
    if type(a) is not type(b):
        return f"{path}: {_short(a)} != {_short(b)}"
    if isinstance(a, dict):
        if list(a) != list(b) and set(a) != set(b):
            return f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            extra = a[len(b):] if len(a) > len(b) else b[len(a):]
            return f"{path}: length {len(a)} != {len(b)} (first extra: {_short(extra[0])})"
        for i, (x, y) in enumerate(zip(a, b)):
            label = _entry_label(x)
            d = first_difference(x, y, f"{path}[{i}]{label}")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {_short(a)} != {_short(b)}"


def _entry_label(x):
    # Name dict entries by their key so that paths read like "['model']['w']".
    if isinstance(x, list) and len(x) == 2 and isinstance(x[0], dict) and len(x[0]) == 1:
        (kind, val), = x[0].items()
        if kind in ("str", "int"):
            return f"<{val!r}>"
    return ""


def _short(x, limit=160):
    s = repr(x)
    return s if len(s) <= limit else s[:limit] + "..."
