"""Compares two trees of live Python objects as loads return them (dicts, OrderedDicts
with _metadata, lists, tuples, scalars, torch tensors and Parameters, NumPy arrays),
strictly: types, key order, tensor dtype, shape, strides, requires_grad and values
(NaN equal to NaN). Used by the Python package's tests."""

import numpy as np
import torch


def _same_values(got, want):
    if got.is_floating_point() or got.is_complex():
        return torch.allclose(got, want, rtol=0, atol=0, equal_nan=True)
    return torch.equal(got, want)


def first_difference(got, want, path="root"):
    """None when `got` equals `want`, else a description of the first difference."""
    if isinstance(want, torch.Tensor):
        if type(got) is not type(want):
            return f"{path}: {type(got).__name__}, expected {type(want).__name__}"
        if (got.dtype, got.shape, got.stride(), got.requires_grad) != (want.dtype, want.shape, want.stride(),
                                                                         want.requires_grad):
            return (f"{path}: tensor {got.dtype} {tuple(got.shape)} stride {got.stride()} grad {got.requires_grad}, "
                    f"expected {want.dtype} {tuple(want.shape)} stride {want.stride()} grad {want.requires_grad}")
        if not _same_values(got.detach(), want.detach()):
            return f"{path}: tensor values differ"
        return None
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
            return f"{path}: {type(got).__name__} {getattr(got, 'dtype', '')}, expected NumPy {want.dtype} {want.shape}"
        if not np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"):
            return f"{path}: NumPy values differ"
        return None
    if type(got) is not type(want):
        return f"{path}: {type(got).__name__}, expected {type(want).__name__}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"{path}: keys {list(got)[:6]} != {list(want)[:6]}"
        if getattr(got, "_metadata", None) != getattr(want, "_metadata", None):
            return f"{path}: _metadata differs"
        for key in want:
            diff = first_difference(got[key], want[key], f"{path}[{key!r}]")
            if diff:
                return diff
        return None
    if isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            diff = first_difference(g, w, f"{path}[{i}]")
            if diff:
                return diff
        return None
    if isinstance(want, float) and want != want:
        return None if got != got else f"{path}: NaN lost"
    return None if got == want else f"{path}: {got!r:.60} != {want!r:.60}"
