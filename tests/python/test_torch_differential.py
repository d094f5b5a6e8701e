"""A differential test against torch itself (issue 38, item 8).

A seeded generator builds random trees of what torch.load(weights_only=True) opens:
nested dicts, OrderedDicts (some with _metadata), lists and tuples; keys of every
hashable kind (str, int, float, bool, None, bytes, tuples of them); leaves of every
value kind (ints across and beyond int64, floats with NaN, infinities and -0.0,
complex, str, bytes, bytearray, sets, torch.dtype, torch.Size, torch.device,
torch.layout); NumPy arrays and scalars (beyond torch's safe loader); tensors of every
dtype torch.save writes, as views with offsets, transposed and strided, 0-d and empty,
sharing storages, conjugate and negative views, as nn.Parameters and with
requires_grad; meta tensors (plain, transposed, Parameters); sparse tensors of every
layout (COO coalesced or not and hybrid, CSR/CSC with int32 or int64 indices, batched,
BSR/BSC, Parameters); and the same container or tensor referenced from several places.

For each tree, both directions are compared strictly:
- torch.save, then holdpoint.load against torch.load(weights_only=False);
- holdpoint.save (default and, where the tree holds only what torch 1.13 reads, the
  1.13-compatible mode), then torch.load(weights_only=False) against the tree itself.

Strictly means: the same type at every level (an OrderedDict is not a dict, a
Parameter is not a Tensor, True is not 1), keys in the same order, floats bit for bit,
the same aliasing (two references to one container or tensor are two references to
one object on both sides, and tensors that share a storage share one on both sides),
and every tensor's dtype, shape, strides, storage offset, requires_grad, storage size
and storage bytes. Any difference fails, with the seed that reproduces it.

What holdpoint refuses on purpose (docs/format.md §5.4.3, §5.5, §5.6: cycles,
frozenset, keys beyond int64 or complex, tensor forms not yet read)
is left out of the generator; test_value_types.py and pickle_reader_test check those
refusals by code.

HOLDPOINT_DIFFERENTIAL_TREES (default 3000; 30000 with HOLDPOINT_LARGE_TESTS=1) sets how
many trees a run builds;
HOLDPOINT_DIFFERENTIAL_SEED the first seed (default: fixed, so a failure reproduces).
"""

import collections
import math
import os
import random
import struct
import sys
import tempfile
import time

import numpy as np
import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

TREES = int(os.environ.get("HOLDPOINT_DIFFERENTIAL_TREES",
                           "30000" if os.environ.get("HOLDPOINT_LARGE_TESTS") == "1" else "3000"))
FIRST_SEED = int(os.environ.get("HOLDPOINT_DIFFERENTIAL_SEED", "3800"))

# Every dtype torch.save writes for a dense tensor (torch 2.13). uint16/32/64 and the
# float8 family are written with _rebuild_tensor_v3 and an UntypedStorage.
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex32, torch.complex64, torch.complex128,
          torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
for _name in ("float8_e8m0fnu", "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"):
    if hasattr(torch, _name):
        DTYPES.append(getattr(torch, _name))
# What the torch-1.13-compatible mode writes (docs/format.md: 1.13 has typed storages
# for these only).
DTYPES_1_13 = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
               torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128}
LAZY_VIEW_DTYPES = {torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                    torch.int8, torch.complex64, torch.complex128}
# The dtypes torch 1.13's loader has a global for: a torch.dtype value or a meta
# tensor of another dtype leaves the 1.13 mode out.
DTYPE_GLOBALS_1_13 = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                      torch.complex32, torch.complex64, torch.complex128}
# Meta tensors: no storage, a geometry.
META_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8,
               torch.uint8, torch.bool, torch.complex64, torch.complex128]
LAYOUTS = [torch.strided, torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc]
DEVICES = [torch.device("cpu"), torch.device("cuda"), torch.device("cuda", 3), torch.device("meta")]
SPECIAL_FLOATS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-310, 1.5, -2.25e300]
NUMPY_DTYPES = ["?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16"]
TEXTS = ["", "a", "lr", "state", "ß∂ƒ", "emoji 🎉", "with\nnewline", "x" * 40]


class Generator:
    """One random tree per seed; every choice comes from the seed's Random."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.torch_rng = torch.Generator().manual_seed(seed)
        self.containers = []  # mutable containers made so far: candidates to reference again
        self.tensors = []     # tensors made so far: candidates to reference again or to view
        self.metas = []       # meta tensors made so far: candidates to reference again
        self.sparse = []      # sparse tensors made so far: candidates to reference again
        self.arrays = []      # NumPy arrays made so far
        self.v1_13 = True     # whether torch 1.13 could read the tree
        self.numpy = False    # whether the tree holds NumPy arrays

    # ---- leaves ----
    def integer(self):
        r = self.rng
        return r.choice([0, 1, -1, 255, 2**31, -2**31, 2**63 - 1, -2**63, 2**63, 2**64 + 5, -2**70,
                         r.randrange(-1000, 1000), r.getrandbits(64), -r.getrandbits(100)])

    def floating(self):
        # The 1.13 mode writes a float as a 0-d float64 tensor (torch 1.13's safe
        # loader has no BINFLOAT; docs/format.md §6): not the same type back.
        self.v1_13 = False
        r = self.rng
        return r.choice(SPECIAL_FLOATS + [r.uniform(-1e6, 1e6), r.random()])

    def text(self):
        return self.rng.choice(TEXTS + [f"k{self.rng.randrange(1000)}"])

    def key(self, depth=0):
        r = self.rng
        kind = r.randrange(10)
        if kind < 4:
            return self.text()
        if kind == 4:
            return r.randrange(-5, 50)
        if kind == 5:
            self.v1_13 = False
            return r.choice([0.5, 2.5, float("inf"), 1e100])  # never 1.0: 1 == 1.0 is one key
        if kind == 6:
            return r.choice([None, False])  # never True: True == 1
        if kind == 7:
            self.v1_13 = False
            return r.choice([b"", b"k", b"\x00\xff"])
        if depth < 2:
            return tuple(self.key(depth + 1) for _ in range(r.randrange(3)))
        return self.text()

    def hashable(self):
        r = self.rng
        kind = r.randrange(6)
        if kind == 0:
            return self.integer()
        if kind == 1:
            f = self.floating()
            return 0.25 if f != f else f  # a NaN in a set never equals itself
        if kind == 2:
            return self.text()
        if kind == 3:
            self.v1_13 = False
            return r.choice([b"", b"ab"])
        if kind == 4:
            return r.choice([None, torch.float16, torch.int8, torch.strided])
        return (self.text(), r.randrange(10))

    def scalar(self):
        r = self.rng
        kind = r.randrange(16)
        if kind == 0:
            return None
        if kind == 1:
            return r.choice([True, False])
        if kind == 2:
            return self.integer()
        if kind == 3:
            return self.floating()
        if kind == 4:
            return self.text()
        if kind == 5:
            self.v1_13 = False  # the 1.13 mode writes bytes as a uint8 tensor
            return bytes(r.getrandbits(8) for _ in range(r.randrange(6)))
        if kind == 6:
            self.v1_13 = False
            return complex(self.floating(), self.floating())
        if kind == 7:
            self.v1_13 = False
            value = bytearray(r.getrandbits(8) for _ in range(r.randrange(5)))
            self.containers.append(value)
            return value
        if kind == 8:
            self.v1_13 = False
            value = {self.hashable() for _ in range(r.randrange(4))}
            self.containers.append(value)
            return value
        if kind == 9:
            dtype = r.choice(DTYPES[:13])
            if dtype not in DTYPE_GLOBALS_1_13:
                self.v1_13 = False
            return dtype
        if kind == 10:
            return torch.Size([r.randrange(5) for _ in range(r.randrange(4))])
        if kind == 11:
            self.v1_13 = False
            return r.choice(DEVICES)
        if kind == 12:
            return r.choice(LAYOUTS)
        if kind == 13 and r.random() < 0.2:
            return self.numpy_array()
        if kind == 13 and r.random() < 0.3:
            return self.numpy_scalar()
        return self.tensor()

    def numpy_scalar(self):
        # numpy.float32(...), numpy.uint64(...), numpy.bool_ ...: read back as their
        # own types; holdpoint.save writes their plain values (one way only).
        r = self.rng
        self.numpy = True
        dtype = np.dtype(r.choice(NUMPY_DTYPES))
        if dtype.kind == "b":
            return np.bool_(r.random() < 0.5)
        value = np.frombuffer(bytes(r.getrandbits(8) for _ in range(dtype.itemsize)), dtype=dtype)[0]
        if dtype.kind == "u" and dtype.itemsize == 8 and r.random() < 0.5:
            value = dtype.type(r.choice([2**63, 2**64 - 1, 2**63 - 1]))
        return value

    def numpy_array(self):
        # Beyond torch's safe loader (which refuses NumPy globals unless allowed):
        # holdpoint reads plain-number arrays as NumPy arrays. holdpoint.save writes
        # them as tensors (docs/format.md §5.4.1), so the tree is checked one way.
        r = self.rng
        self.numpy = True
        if self.arrays and r.random() < 0.3:
            return r.choice(self.arrays)
        dtype = np.dtype(r.choice(NUMPY_DTYPES))
        if r.random() < 0.2 and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        shape = tuple(r.randrange(4) for _ in range(r.randrange(4)))
        data = bytes(r.getrandbits(8) for _ in range(math.prod(shape) * dtype.itemsize))
        array = np.frombuffer(data, dtype=dtype).reshape(shape).copy()
        if dtype.kind == "b":
            array = array.astype(bool)
        if r.random() < 0.3 and array.ndim >= 2:
            array = np.asfortranarray(array)
        self.arrays.append(array)
        return array

    # ---- tensors ----
    def tensor(self):
        r = self.rng
        if r.random() < 0.05:
            return self.meta_tensor()
        if r.random() < 0.04:
            return self.sparse_tensor()
        if self.tensors and r.random() < 0.25:
            base = r.choice(self.tensors)
            if r.random() < 0.5:
                return base  # the same tensor object again
            return self.view_of(base)  # a second view of its storage
        dtype = r.choice(DTYPES)
        if dtype not in DTYPES_1_13:
            self.v1_13 = False
        shape = [r.randrange(4) for _ in range(r.randrange(4))]
        if r.random() < 0.1:
            shape = [0] + shape
        numel = math.prod(shape)
        raw = torch.randint(0, 256, (numel * dtype.itemsize + r.randrange(3) * dtype.itemsize,),
                            dtype=torch.uint8, generator=self.torch_rng)
        storage = raw.view(dtype) if raw.numel() else torch.empty(0, dtype=dtype)
        tensor = storage
        if r.random() < 0.4 and storage.numel() >= numel:
            offset = r.randrange(storage.numel() - numel + 1)
            tensor = storage[offset:offset + numel].view(shape)
        else:
            tensor = storage[:numel].view(shape)
        if r.random() < 0.3 and tensor.dim() >= 2:
            tensor = tensor.transpose(0, tensor.dim() - 1)
        if r.random() < 0.2 and tensor.dim() >= 1 and tensor.shape[0] > 1:
            tensor = tensor[::2]
        if dtype in LAZY_VIEW_DTYPES and r.random() < 0.15:
            # torch's lazy views: torch.save keeps their conj/neg bits (not in torch 1.13).
            self.v1_13 = False
            if dtype.is_complex and r.random() < 0.7:
                tensor = tensor.conj()
            if not tensor.is_conj() or r.random() < 0.5:
                tensor = tensor._neg_view()
            self.tensors.append(tensor)
            return tensor
        if dtype.is_floating_point or dtype.is_complex:
            choice = r.random()
            if choice < 0.15:
                tensor = torch.nn.Parameter(tensor, requires_grad=r.random() < 0.7)
            elif choice < 0.25 and dtype not in torch.storage._new_dtypes():
                # (torch's own _rebuild_tensor_v3 cannot load a requires_grad tensor of these)
                tensor = tensor.detach().requires_grad_(True)
        self.tensors.append(tensor)
        return tensor

    def sparse_tensor(self):
        """A sparse tensor of a random layout, made from a random dense one with
        zeros in it (torch 1.13's loader has no form holdpoint writes for it)."""
        r = self.rng
        if self.sparse and r.random() < 0.3:
            return r.choice(self.sparse)
        self.v1_13 = False
        dtype = r.choice([torch.float32, torch.float64, torch.float16, torch.int64, torch.complex64])
        layout = r.choice(LAYOUTS[1:])
        batch = [r.randrange(1, 3)] if layout != torch.sparse_coo and r.random() < 0.2 else []
        block = (r.choice([1, 2]), r.choice([1, 2])) if layout in (torch.sparse_bsr, torch.sparse_bsc) else (1, 1)
        low = 0 if layout == torch.sparse_coo else 1  # (torch cannot compress an empty matrix into blocks)
        shape = batch + [block[0] * r.randrange(low, 4), block[1] * r.randrange(low, 4)]
        # One pattern of nonzeros for every batch (torch needs the same nnz in each).
        pattern = torch.randint(0, 2, shape[len(batch):], generator=self.torch_rng)
        dense = (pattern * torch.randint(1, 9, shape, generator=self.torch_rng)).to(dtype)
        if layout == torch.sparse_coo:
            tensor = dense.to_sparse(r.choice([1, 2])) if dense.dim() == 2 else dense.to_sparse()
            if r.random() < 0.3 and tensor._nnz() > 1:
                # Uncoalesced: the indices in reverse order, the flag off.
                tensor = torch.sparse_coo_tensor(tensor._indices().flip(1), tensor._values().flip(0), tensor.shape)
        elif layout in (torch.sparse_bsr, torch.sparse_bsc):
            tensor = dense.to_sparse(layout=layout, blocksize=block)
        else:
            tensor = dense.to_sparse(layout=layout)
            if r.random() < 0.3:
                compressed, plain = ((tensor.crow_indices(), tensor.col_indices()) if layout == torch.sparse_csr
                                     else (tensor.ccol_indices(), tensor.row_indices()))
                tensor = torch.sparse_compressed_tensor(compressed.int(), plain.int(), tensor.values(), tensor.shape,
                                                        layout=layout)
        if (dtype.is_floating_point or dtype.is_complex) and r.random() < 0.25:
            tensor = torch.nn.Parameter(tensor, requires_grad=r.random() < 0.7)
        self.sparse.append(tensor)
        return tensor

    def meta_tensor(self):
        """A tensor on the meta device: a geometry and no storage (torch.save keeps
        no offset, so none is made)."""
        r = self.rng
        if self.metas and r.random() < 0.3:
            return r.choice(self.metas)
        dtype = r.choice(META_DTYPES)
        if dtype not in DTYPE_GLOBALS_1_13:
            self.v1_13 = False
        shape = [r.randrange(5) for _ in range(r.randrange(4))]
        tensor = torch.empty(shape, dtype=dtype, device="meta")
        if r.random() < 0.3 and tensor.dim() >= 2:
            tensor = tensor.transpose(0, tensor.dim() - 1)
        if dtype.is_floating_point or dtype.is_complex:
            choice = r.random()
            if choice < 0.25:
                tensor = torch.nn.Parameter(tensor, requires_grad=r.random() < 0.7)
            elif choice < 0.4:
                tensor = tensor.requires_grad_(True)
        self.metas.append(tensor)
        return tensor

    def view_of(self, base):
        if isinstance(base, torch.nn.Parameter) or base.requires_grad:
            base = base.detach()
        flat = base.as_strided((base.untyped_storage().nbytes() // base.element_size(),), (1,), 0)
        if flat.numel() == 0:
            return flat
        start = self.rng.randrange(flat.numel())
        return flat[start:start + self.rng.randrange(1, flat.numel() - start + 1)]

    # ---- containers ----
    def value(self, depth):
        r = self.rng
        if depth >= 4 or r.random() < 0.35:
            return self.scalar()
        if self.containers and r.random() < 0.1:
            return r.choice(self.containers)  # shared: the same container again
        kind = r.randrange(4)
        size = r.randrange(5)
        if kind == 0:
            out = [self.value(depth + 1) for _ in range(size)]
        elif kind == 1:
            return tuple(self.value(depth + 1) for _ in range(size))
        else:
            out = collections.OrderedDict() if kind == 3 else {}
            for _ in range(size):
                out[self.key()] = self.value(depth + 1)
            if kind == 3 and r.random() < 0.5:
                out._metadata = {"": {"version": r.randrange(3)}}
        self.containers.append(out)
        return out

    def tree(self):
        root = {}
        for _ in range(self.rng.randrange(1, 6)):
            root[self.text()] = self.value(1)
        return root


# ---- strict comparison ----
def float_bits(x):
    return struct.pack("<d", x)


class Mismatch(Exception):
    pass


class Comparer:
    """got against want, recursively; aliasing checked both ways."""

    MUTABLE = (list, dict, collections.OrderedDict, set, bytearray, np.ndarray)

    def __init__(self):
        self.got_to_want = {}
        self.want_to_got = {}
        self.storages = {}
        self.storages_back = {}
        self.keep = []  # objects whose ids are in the maps stay alive

    def fail(self, where, what):
        raise Mismatch(f"{where or 'root'}: {what}")

    def alias(self, got, want, where):
        self.keep.append((got, want))
        g, w = id(got), id(want)
        if self.got_to_want.get(g, w) != w or self.want_to_got.get(w, g) != g:
            self.fail(where, "aliasing differs (an object shared on one side is not on the other)")
        seen = w in self.want_to_got
        self.got_to_want[g], self.want_to_got[w] = w, g
        return seen

    def compare(self, got, want, where=""):
        if type(got) is not type(want):
            self.fail(where, f"type {type(got).__name__}, want {type(want).__name__} ({got!r} vs {want!r})")
        if isinstance(want, torch.Tensor):
            if self.alias(got, want, where):
                return
            self.tensor(got, want, where)
        elif isinstance(want, self.MUTABLE):
            if self.alias(got, want, where):
                return
            if isinstance(want, dict):
                self.dict(got, want, where)
            elif isinstance(want, list):
                self.sequence(got, want, where)
            elif isinstance(want, np.ndarray):
                for what in ("dtype", "shape", "strides"):
                    if getattr(got, what) != getattr(want, what):
                        self.fail(where, f"array {what} {getattr(got, what)}, want {getattr(want, what)}")
                if got.dtype.str != want.dtype.str or got.tobytes() != want.tobytes():
                    self.fail(where, f"array {got!r} ({got.dtype.str}), want {want!r} ({want.dtype.str})")
                if got.flags.writeable != want.flags.writeable:
                    self.fail(where, f"array writeable {got.flags.writeable}, want {want.flags.writeable}")
            elif isinstance(want, set):
                if self.set_key(got) != self.set_key(want):
                    self.fail(where, f"set {got!r}, want {want!r}")
            elif got != want:
                self.fail(where, f"bytearray {got!r}, want {want!r}")
        elif isinstance(want, np.generic):
            if got.dtype != want.dtype or got.tobytes() != want.tobytes():
                self.fail(where, f"NumPy scalar {got!r} ({got.dtype}), want {want!r} ({want.dtype})")
        elif isinstance(want, tuple) and not isinstance(want, torch.Size):
            self.sequence(got, want, where)
        elif isinstance(want, float):
            if float_bits(got) != float_bits(want):
                self.fail(where, f"float {got!r}, want {want!r}")
        elif isinstance(want, complex):
            if (float_bits(got.real), float_bits(got.imag)) != (float_bits(want.real), float_bits(want.imag)):
                self.fail(where, f"complex {got!r}, want {want!r}")
        elif got != want:
            self.fail(where, f"{got!r}, want {want!r}")

    @staticmethod
    def set_key(s):
        return sorted((type(x).__name__, repr(x)) for x in s)

    def sequence(self, got, want, where):
        if len(got) != len(want):
            self.fail(where, f"{len(got)} items, want {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            self.compare(g, w, f"{where}[{i}]")

    def dict(self, got, want, where):
        got_keys, want_keys = list(got), list(want)
        if len(got_keys) != len(want_keys):
            self.fail(where, f"keys {got_keys!r}, want {want_keys!r}")
        for g, w in zip(got_keys, want_keys):
            self.compare(g, w, f"{where}.keys()")  # same keys, same order, same types
        for k in want_keys:
            self.compare(got[k], want[k], f"{where}[{k!r}]")
        if hasattr(want, "_metadata") != hasattr(got, "_metadata"):
            self.fail(where, "_metadata present on one side only")
        if hasattr(want, "_metadata"):
            self.compare(got._metadata, want._metadata, f"{where}._metadata")

    def tensor(self, got, want, where):
        for what in ("dtype", "layout", "device", "requires_grad"):
            if getattr(got, what) != getattr(want, what):
                self.fail(where, f"tensor {what} {getattr(got, what)}, want {getattr(want, what)}")
        if want.layout != torch.strided:
            # Sparse: the shape and coalesced flag, then each part as a dense tensor.
            if tuple(got.shape) != tuple(want.shape):
                self.fail(where, f"sparse shape {tuple(got.shape)}, want {tuple(want.shape)}")
            if want.layout == torch.sparse_coo and got.is_coalesced() != want.is_coalesced():
                self.fail(where, f"is_coalesced {got.is_coalesced()}, want {want.is_coalesced()}")
            for i, (g, w) in enumerate(zip(sparse_parts(got), sparse_parts(want))):
                self.tensor(g, w, f"{where}.part{i}")
            return
        for what in ("shape", "stride", "storage_offset", "is_conj", "is_neg"):
            g, w = getattr(got, what), getattr(want, what)
            g, w = (g(), w()) if callable(g) else (g, w)
            if g != w:
                self.fail(where, f"tensor {what} {g}, want {w}")
        if want.device.type == "meta":
            return  # no storage: the geometry is the whole tensor
        gs, ws = got.untyped_storage(), want.untyped_storage()
        if gs.nbytes() != ws.nbytes():
            self.fail(where, f"storage of {gs.nbytes()} bytes, want {ws.nbytes()}")
        if ws.nbytes():
            g, w = gs.data_ptr(), ws.data_ptr()
            if self.storages.get(g, w) != w or self.storages_back.get(w, g) != g:
                self.fail(where, "storage sharing differs")
            self.storages[g], self.storages_back[w] = w, g
            if bytes(gs) != bytes(ws):
                self.fail(where, "storage bytes differ")


def sparse_parts(t):
    t = t.detach()
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]


def strict_compare(got, want):
    Comparer().compare(got, want)


def check_trees(report, tmp):
    counts = collections.Counter()
    path = os.path.join(tmp, "tree.pt")
    mine = os.path.join(tmp, "mine.pt")
    started = time.monotonic()
    for seed in range(FIRST_SEED, FIRST_SEED + TREES):
        gen = Generator(seed)
        tree = gen.tree()
        counts["trees"] += 1
        # torch writes, holdpoint reads.
        torch.save(tree, path)
        want = torch.load(path, weights_only=False)
        try:
            if not gen.numpy:  # NumPy's own unpickling gives native byte order and its own empty strides
                strict_compare(want, tree)
        except Mismatch as error:  # the generator made something torch itself does not round-trip
            report.check(False, f"seed {seed}: torch's own round trip differs ({error}): fix the generator")
            continue
        try:
            got = holdpoint.load(path)
            strict_compare(got, want)
            counts["torch -> holdpoint"] += 1
            report.check(True, "")
        except (Mismatch, holdpoint.Error) as error:
            report.check(False, f"seed {seed}: holdpoint.load of torch.save differs from torch.load: {error}")
            continue
        # holdpoint writes, torch reads: the same tree back, aliasing included.
        for compat in () if gen.numpy else (False, True) if gen.v1_13 else (False,):
            try:
                holdpoint.save(mine, tree, torch_1_13_compatible=compat)
                back = torch.load(mine, weights_only=False)
                strict_compare(back, tree)
                counts["holdpoint (1.13 mode) -> torch" if compat else "holdpoint -> torch"] += 1
                report.check(True, "")
            except (Mismatch, holdpoint.Error) as error:
                report.check(False, f"seed {seed}: torch.load of holdpoint.save"
                                    f"{'(torch_1_13_compatible=True)' if compat else ''} differs: {error}")
        if len(report.failures) >= 20:
            print("stopping after 20 failures")
            break
    elapsed = time.monotonic() - started
    print(f"{counts['trees']} trees from seed {FIRST_SEED} in {elapsed:.1f} s: "
          + ", ".join(f"{k}: {v}" for k, v in counts.items() if k != "trees"))
    report.check(counts["torch -> holdpoint"] == TREES, "not every tree was compared")
    report.check(counts["holdpoint (1.13 mode) -> torch"] > TREES // 20, "too few trees took the 1.13 mode")


def check_the_comparer_fails(report):
    """The comparison must be able to fail: each of these differences is caught."""
    t = torch.arange(4.0)
    shared = [1]
    od = collections.OrderedDict(a=1)
    od._metadata = {"": {"version": 1}}
    cases = {
        "int vs bool": (1, True),
        "dict vs OrderedDict": ({"a": 1}, collections.OrderedDict(a=1)),
        "key order": ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        "-0.0 vs 0.0": (-0.0, 0.0),
        "NaN payload": (float("nan"), struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]),
        "tuple vs torch.Size": ((2,), torch.Size([2])),
        "lost sharing": ([shared, shared], [[1], [1]]),
        "Parameter vs Tensor": (torch.nn.Parameter(t.clone()), t.clone()),
        "stride": (t.view(2, 2).t().contiguous(), t.view(2, 2).t()),
        "storage offset": (t[1:3].clone(), t[1:3]),
        "storage bytes": (t.clone().index_fill_(0, torch.tensor([3]), 9.0)[:2], t[:2]),
        "shared storage": ([t[:2], t[:2]], [t.clone()[:2], t.clone()[:2]]),
        "_metadata": (collections.OrderedDict(a=1), od),
        "requires_grad": (t.clone().requires_grad_(), t.clone()),
        "meta vs cpu": (torch.empty(4, device="meta"), t.clone()),
        "meta stride": (torch.empty(2, 3, device="meta"), torch.empty(3, 2, device="meta").t()),
    }
    for name, (got, want) in cases.items():
        try:
            strict_compare(got, want)
            report.check(False, f"the comparer missed a difference: {name}")
        except Mismatch:
            pass
    strict_compare([t, t, od], [t, t, od])  # and passes what is the same


def main():
    report = harness.Report("torch_differential")
    check_the_comparer_fails(report)
    with tempfile.TemporaryDirectory(prefix="holdpoint-differential-") as tmp:
        check_trees(report, tmp)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
