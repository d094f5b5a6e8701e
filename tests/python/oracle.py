"""An independent restricted reader for PyTorch checkpoints, used as a test oracle.

It reads `.pt` zip archives (via `zipfile`), legacy non-zip streams (the layout of
torch 1.13's `_legacy_load`) and safetensors files, and prints the canonical NODE tree
that `holdpoint inspect --json --digests` prints, so the two can be compared.

It never calls torch.load and never imports anything a file names. Unpickling uses a
`pickle.Unpickler` subclass whose `find_class` hands out only this module's own stub
callables for an exact allowlist of names; every other global raises. Persistent ids
become stub storage references. Tensors are rebuilt after unpickling as pure math on
the extracted record bytes: `torch.frombuffer(...).view(dtype).as_strided(...)`.

The canonical NODE encoding (shared with holdpoint's CLI):
  None -> null, bool -> true/false, int -> {"int": "<decimal>"},
  float -> {"float": "<16 lowercase hex digits of the big-endian IEEE-754 bits>"},
  str -> {"str": s}, bytes -> {"bytes": "<hex>"}, list -> {"list": [...]},
  tuple -> {"tuple": [...]}, dict -> {"dict": [[KEY, NODE], ...]},
  OrderedDict -> {"odict": [[KEY, NODE], ...]}, tensor -> {"tensor": {...}}.

Usage: oracle.py FILE [--no-digests]   (prints one JSON object: format + tree)
Exit status: 0 on success, 1 when the oracle refuses the file, 2 on usage errors.
"""

import collections
import hashlib
import io
import json
import pickle
import struct
import sys
import zipfile

# dtype name -> (itemsize, legacy storage class or None)
DTYPES = {
    "float64": (8, "DoubleStorage"),
    "float32": (4, "FloatStorage"),
    "float16": (2, "HalfStorage"),
    "bfloat16": (2, "BFloat16Storage"),
    "int64": (8, "LongStorage"),
    "int32": (4, "IntStorage"),
    "int16": (2, "ShortStorage"),
    "int8": (1, "CharStorage"),
    "uint8": (1, "ByteStorage"),
    "bool": (1, "BoolStorage"),
    "complex32": (4, None),
    "complex64": (8, "ComplexFloatStorage"),
    "complex128": (16, "ComplexDoubleStorage"),
    # torch 2.x only (UntypedStorage + _rebuild_tensor_v3)
    "uint16": (2, None),
    "uint32": (4, None),
    "uint64": (8, None),
    "float8_e4m3fn": (1, None),
    "float8_e5m2": (1, None),
    "float8_e4m3fnuz": (1, None),
    "float8_e5m2fnuz": (1, None),
    # torch 2.13 writes these the same way
    "float8_e8m0fnu": (1, None),
    "float4_e2m1fn_x2": (1, None),
    "bits1x8": (1, None),
    "bits2x4": (1, None),
    "bits4x2": (1, None),
    "bits8": (1, None),
    "bits16": (2, None),
}
STORAGE_CLASS_DTYPE = {cls: name for name, (_, cls) in DTYPES.items() if cls}

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
    "BOOL": "bool", "C64": "complex64", "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn", "F6_E2M3": "float6_e2m3fn", "F6_E3M2": "float6_e3m2fn",
}
# safetensors-only dtypes whose elements are not whole bytes: no torch dtype, so
# not in DTYPES (a pickle may not name them).
SUB_BYTE_BITS = {"float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6}
JSON_WHITESPACE = b" \t\r\n"

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_NODES = 5_000_000  # canonical-tree expansion bound (shared references are re-encoded)
MAX_DEPTH = 200


class OracleError(Exception):
    """The oracle refuses the file (not a weights-only checkpoint it understands)."""


# ---------------------------------------------------------------- stub objects
class StorageType:
    """A `torch.<X>Storage` / `torch.UntypedStorage` type tag; never callable."""

    __slots__ = ("dtype",)

    def __init__(self, dtype):
        self.dtype = dtype  # None for UntypedStorage

    def __setstate__(self, state):
        raise OracleError("BUILD on a storage type tag")


class DTypeTag:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __setstate__(self, state):
        raise OracleError("BUILD on a dtype")


class StorageRef:
    """What persistent_load returns: a reference to storage bytes found later."""

    __slots__ = ("key", "dtype", "numel", "nbytes", "location")

    def __init__(self, key, dtype, numel, nbytes, location):
        self.key, self.dtype, self.numel, self.nbytes, self.location = key, dtype, numel, nbytes, location

    def __setstate__(self, state):
        raise OracleError("BUILD on a storage")


class TensorRef:
    __slots__ = ("storage", "dtype", "offset", "size", "stride", "requires_grad", "parameter")

    def __init__(self, storage, dtype, offset, size, stride, requires_grad):
        self.storage, self.dtype = storage, dtype
        self.offset, self.size, self.stride = offset, size, stride
        self.requires_grad, self.parameter = requires_grad, False

    def __setstate__(self, state):
        raise OracleError("BUILD on a tensor")


class StateDict(collections.OrderedDict):
    """collections.OrderedDict as rebuilt by the oracle; BUILD may only set _metadata."""

    def __setstate__(self, state):
        if not isinstance(state, dict) or set(state) - {"_metadata"}:
            raise OracleError("BUILD on an OrderedDict with state other than {'_metadata': ...}")
        object.__setattr__(self, "_metadata", state.get("_metadata"))

    def __reduce__(self):  # never pickled; keep the class inert
        raise OracleError("not picklable")


def _is_int(x):
    return type(x) is int


# ---------------------------------------------------------------- NumPy values, as data
# NumPy pickles an array as _reconstruct(ndarray, (0,), b'b') followed by BUILD with
# ([version,] shape, dtype, fortran, raw bytes), a dtype as dtype(code, align, copy)
# followed by BUILD with (version, byte order, subarray, names, fields, ...), and a
# scalar as scalar(dtype, raw bytes). Only plain number types are read.
NUMPY_CODES = {"b1": ("bool", "?"), "i1": ("int8", "b"), "i2": ("int16", "h"), "i4": ("int32", "i"),
               "i8": ("int64", "q"), "u1": ("uint8", "B"), "u2": ("uint16", "H"), "u4": ("uint32", "I"),
               "u8": ("uint64", "Q"), "f2": ("float16", "e"), "f4": ("float32", "f"), "f8": ("float64", "d"),
               "c8": ("complex64", None), "c16": ("complex128", None)}


class NdarrayTag:
    __slots__ = ()

    def __setstate__(self, state):
        raise OracleError("BUILD on numpy.ndarray")


class NumpyDType:
    __slots__ = ("code", "order")

    def __init__(self, code, order="="):
        self.code, self.order = code, order

    def __setstate__(self, state):
        if type(state) is not tuple or len(state) not in (8, 9) or state[0] not in (3, 4):
            raise OracleError("numpy dtype state")
        if any(x is not None for x in state[2:5]):
            raise OracleError("structured numpy dtype")
        if state[1] not in ("<", ">", "|", "="):
            raise OracleError("numpy byte order")
        self.order = state[1]


def stub_numpy_dtype(code, align, copy):
    if type(code) is not str or type(align) is not bool or type(copy) is not bool:
        raise OracleError("numpy.dtype arguments")
    return NumpyDType(code)


def _numpy_code(dtype):
    if type(dtype) is not NumpyDType or dtype.code not in NUMPY_CODES:
        raise OracleError("not a plain numpy number dtype")
    return NUMPY_CODES[dtype.code]


class NumpyArray:
    """An ndarray read as data: dtype name, shape, strides and native C-order bytes."""

    __slots__ = ("dtype", "size", "stride", "data", "built")

    def __init__(self):
        self.built = False

    def __setstate__(self, state):
        if self.built or type(state) is not tuple or len(state) not in (4, 5):
            raise OracleError("numpy array state")
        if len(state) == 5:
            if state[0] != 1:
                raise OracleError("numpy array state version")
            state = state[1:]
        shape, dtype, fortran, data = state
        shape = _int_tuple(shape, "numpy shape")
        name, _ = _numpy_code(dtype)
        if type(fortran) is not bool or type(data) is not bytes or any(d < 0 for d in shape):
            raise OracleError("numpy array state")
        itemsize = DTYPES[name][0]
        numel = 1
        for d in shape:
            numel *= d
        if numel * itemsize != len(data):
            raise OracleError("numpy array data size")
        if dtype.order == ">" and itemsize > 1:
            unit = itemsize // 2 if name.startswith("complex") else itemsize
            data = b"".join(data[i:i + unit][::-1] for i in range(0, len(data), unit))
        stride, step = [0] * len(shape), 1
        for d in (range(len(shape)) if fortran else reversed(range(len(shape)))):
            stride[d] = step
            step *= max(shape[d], 1)
        self.dtype, self.size, self.stride, self.data = name, tuple(shape), tuple(stride), data
        self.built = True


def stub_numpy_reconstruct(tag, shape, code):
    if type(tag) is not NdarrayTag or type(shape) is not tuple or type(code) not in (bytes, str):
        raise OracleError("numpy _reconstruct arguments")
    return NumpyArray()


def stub_numpy_scalar(dtype, data):
    name, fmt = _numpy_code(dtype)
    if type(data) is not bytes or fmt is None or len(data) != DTYPES[name][0]:
        raise OracleError("numpy scalar")
    # uint64 past 2^63 is a Python int, as NumPy's own unpickling gives.
    return struct.unpack((">" if dtype.order == ">" else "<") + fmt, data)[0]


def _int_tuple(x, what):
    if type(x) is not tuple or not all(_is_int(v) for v in x):
        raise OracleError(f"{what} is not a tuple of ints: {x!r}")
    return x


def _empty_hooks(h):
    if type(h) is not StateDict or len(h) != 0:
        raise OracleError("backward_hooks is not an empty OrderedDict")


def stub_ordered_dict(*args):
    if args:
        raise OracleError("collections.OrderedDict called with arguments")
    return StateDict()


def stub_counter(*args):
    """collections.Counter(counts): torch >= 2.x writes MultiStepLR's milestones
    as one; read as the plain dict of its counts."""
    if len(args) > 1 or (args and type(args[0]) is not dict):
        raise OracleError("collections.Counter takes () or one dict")
    counts = dict(args[0]) if args else {}
    if not all(_is_int(v) for v in counts.values()):
        raise OracleError("a collections.Counter count is not an int")
    return counts


def stub_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks, metadata=None):
    if type(storage) is not StorageRef or storage.dtype is None:
        raise OracleError("_rebuild_tensor_v2 on something that is not a typed storage")
    return _make_tensor(storage, storage.dtype, offset, size, stride, requires_grad, hooks, metadata)


def stub_rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    if type(storage) is not StorageRef or storage.dtype is not None or type(dtype) is not DTypeTag:
        raise OracleError("_rebuild_tensor_v3 needs an UntypedStorage and a dtype")
    return _make_tensor(storage, dtype.name, offset, size, stride, requires_grad, hooks, metadata)


def _make_tensor(storage, dtype, offset, size, stride, requires_grad, hooks, metadata):
    if not _is_int(offset) or offset < 0:
        raise OracleError(f"storage offset {offset!r}")
    size, stride = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(size) != len(stride) or any(v < 0 for v in size + stride):
        raise OracleError(f"bad geometry size={size} stride={stride}")
    if type(requires_grad) is not bool:
        raise OracleError("requires_grad is not a bool")
    _empty_hooks(hooks)
    if metadata is not None and not (type(metadata) is dict and not metadata):
        raise OracleError("tensor metadata is not empty")
    return TensorRef(storage, dtype, offset, size, stride, requires_grad)


def stub_rebuild_parameter(tensor, requires_grad, hooks):
    if type(tensor) is not TensorRef or type(requires_grad) is not bool:
        raise OracleError("_rebuild_parameter arguments")
    _empty_hooks(hooks)
    p = TensorRef(tensor.storage, tensor.dtype, tensor.offset, tensor.size, tensor.stride, requires_grad)
    p.parameter = True
    return p


def stub_codecs_encode(text, encoding):
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise OracleError("_codecs.encode arguments")
    return text.encode("latin1")


def stub_empty_bytes(*args):
    # Pickle protocol 2 writes b'' as bytes(); any argument would make data.
    if args:
        raise OracleError("bytes() with arguments")
    return b""


ALLOWED = {
    ("builtins", "bytes"): stub_empty_bytes,
    ("__builtin__", "bytes"): stub_empty_bytes,
    ("collections", "OrderedDict"): stub_ordered_dict,
    ("collections", "Counter"): stub_counter,
    ("torch._utils", "_rebuild_tensor_v2"): stub_rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): stub_rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): stub_rebuild_parameter,
    ("_codecs", "encode"): stub_codecs_encode,
    ("torch", "UntypedStorage"): StorageType(None),
    ("torch.storage", "UntypedStorage"): StorageType(None),
    ("numpy", "ndarray"): NdarrayTag(),
    ("numpy", "dtype"): stub_numpy_dtype,
}
for _module in ("numpy.core.multiarray", "numpy._core.multiarray"):
    ALLOWED[(_module, "_reconstruct")] = stub_numpy_reconstruct
    ALLOWED[(_module, "scalar")] = stub_numpy_scalar
for _cls, _dtype in STORAGE_CLASS_DTYPE.items():
    ALLOWED[("torch", _cls)] = StorageType(_dtype)
for _dtype in DTYPES:
    if _dtype != "bool":
        ALLOWED[("torch", _dtype)] = DTypeTag(_dtype)
ALLOWED[("torch", "bool")] = DTypeTag("bool")


class RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, persistent_load):
        super().__init__(file, encoding="ASCII", errors="strict")
        self._persistent = persistent_load

    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise OracleError(f"global {module}.{name} is not allowed") from None

    def persistent_load(self, pid):
        return self._persistent(pid)


def _check_location(location):
    if type(location) is not str:
        raise OracleError("storage location is not a str")
    return location


# ---------------------------------------------------------------- formats
def zip_records(data):
    """[{name, offset, size, crc32}] for every zip entry: name without the archive folder,
    offset of the payload (after the local header's name and extra field)."""
    out = []
    zf = zipfile.ZipFile(io.BytesIO(data))
    for info in zf.infolist():
        lho = info.header_offset
        sig, name_len, extra_len = struct.unpack_from("<I22xHH", data, lho)
        if sig != 0x04034B50:
            raise OracleError(f"no local header at {lho}")
        name = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
        out.append({"name": name, "offset": lho + 30 + name_len + extra_len, "size": info.file_size,
                    "crc32": info.CRC})
    return out


def read_zip(data):
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError) as e:
        raise OracleError(f"bad zip: {e}") from None
    if not infos or "/" not in infos[0].filename:
        raise OracleError("zip without an archive folder")
    prefix = infos[0].filename.split("/", 1)[0] + "/"
    records = {}
    for info in infos:
        if not info.filename.startswith(prefix):
            raise OracleError(f"entry {info.filename!r} outside the archive folder")
        name = info.filename[len(prefix):]
        if name in records:
            raise OracleError(f"duplicate record {name}")
        records[name] = info
    if "constants.pkl" in records:
        raise OracleError("TorchScript archive")
    if "data.pkl" not in records:
        raise OracleError("no data.pkl")
    if "byteorder" in records and zf.read(records["byteorder"]) != b"little":
        raise OracleError("byteorder is not little")

    def persistent_load(pid):
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            raise OracleError(f"persistent id {pid!r}")
        stype, key, location, numel = pid[1:]
        if type(stype) is not StorageType or type(key) is not str or not _is_int(numel) or numel < 0:
            raise OracleError(f"persistent id {pid!r}")
        itemsize = 1 if stype.dtype is None else DTYPES[stype.dtype][0]
        return StorageRef(key, stype.dtype, numel, numel * itemsize, _check_location(location))

    try:
        root = RestrictedUnpickler(io.BytesIO(zf.read(records["data.pkl"])), persistent_load).load()
    except OracleError:
        raise
    except Exception as e:  # malformed pickle: refuse, never crash
        raise OracleError(f"unpickling failed: {type(e).__name__}: {e}") from None

    cache = {}

    def storage_bytes(ref):
        if ref.key not in cache:
            info = records.get("data/" + ref.key)
            if info is None:
                raise OracleError(f"no record data/{ref.key}")
            cache[ref.key] = zf.read(info)
        return cache[ref.key]

    return root, storage_bytes


def _load_one(stream, persistent_load):
    try:
        return RestrictedUnpickler(stream, persistent_load).load()
    except OracleError:
        raise
    except Exception as e:
        raise OracleError(f"unpickling failed: {type(e).__name__}: {e}") from None


def legacy_records(data):
    """[{key, offset, size}] of the storages of a legacy stream (offset: after the count)."""
    out = []
    read_legacy(data, out)
    return out


def read_legacy(data, records_out=None):
    stream = io.BytesIO(data)

    def no_persistent(pid):
        raise OracleError("persistent id in a legacy header pickle")

    if _load_one(stream, no_persistent) != LEGACY_MAGIC:
        raise OracleError("legacy magic number")
    if _load_one(stream, no_persistent) != LEGACY_PROTOCOL:
        raise OracleError("legacy protocol version")
    sys_info = _load_one(stream, no_persistent)
    if type(sys_info) is not dict or sys_info.get("little_endian") is not True:
        raise OracleError("legacy sys_info")

    declared = {}

    def persistent_load(pid):
        if type(pid) is not tuple or len(pid) != 6 or pid[0] != "storage":
            raise OracleError(f"legacy persistent id {pid!r}")
        stype, key, location, numel, view = pid[1:]
        if type(stype) is not StorageType or stype.dtype is None or type(key) is not str:
            raise OracleError(f"legacy persistent id {pid!r}")
        if not _is_int(numel) or numel < 0 or view is not None:
            raise OracleError(f"legacy persistent id {pid!r}")
        prev = declared.setdefault(key, (stype.dtype, numel))
        if prev != (stype.dtype, numel):
            raise OracleError(f"storage {key} redeclared")
        return StorageRef(key, stype.dtype, numel, numel * DTYPES[stype.dtype][0], _check_location(location))

    root = _load_one(stream, persistent_load)
    keys = _load_one(stream, no_persistent)
    if type(keys) is not list or sorted(keys) != sorted(declared) or len(set(keys)) != len(keys):
        raise OracleError("legacy storage key list disagrees with the pickle")
    blobs = {}
    pos = stream.tell()
    for key in keys:
        dtype, numel = declared[key]
        if pos + 8 > len(data):
            raise OracleError("legacy storage header truncated")
        (count,) = struct.unpack_from("<q", data, pos)
        if count != numel:
            raise OracleError(f"legacy storage {key}: header says {count}, pickle says {numel}")
        nbytes = numel * DTYPES[dtype][0]
        pos += 8
        if pos + nbytes > len(data):
            raise OracleError("legacy storage truncated")
        blobs[key] = data[pos:pos + nbytes]
        if records_out is not None:
            records_out.append({"key": key, "offset": pos, "size": nbytes})
        pos += nbytes
    if pos != len(data):
        raise OracleError("bytes after the last legacy storage")
    return root, lambda ref: blobs[ref.key]


def safetensors_records(data):
    """[{name, offset, size}] of the tensors of a safetensors file (absolute offsets)."""
    out = []
    read_safetensors(data, digests=False, records_out=out)
    return out


def read_safetensors(data, digests=True, records_out=None):
    if len(data) < 8:
        raise OracleError("safetensors: too small")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > 100_000_000 or 8 + n > len(data):
        raise OracleError("safetensors: header length")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise OracleError("safetensors: duplicate key")
        return collections.OrderedDict(pairs)

    try:
        header = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=no_dups)
    except (UnicodeDecodeError, ValueError) as e:
        raise OracleError(f"safetensors: header JSON: {e}") from None
    if type(header) is not collections.OrderedDict:
        raise OracleError("safetensors: header is not an object")
    buf = data[8 + n:]
    entries, extents = [], []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        shape, offs = info.get("shape"), info.get("data_offsets")
        if dtype is None or type(shape) is not list or type(offs) is not list or len(offs) != 2:
            raise OracleError(f"safetensors: entry {name}")
        if not all(_is_int(v) and v >= 0 for v in shape + offs) or offs[1] < offs[0]:
            raise OracleError(f"safetensors: entry {name}")
        numel = 1
        for s in shape:
            numel *= s
        bits = numel * (SUB_BYTE_BITS[dtype] if dtype in SUB_BYTE_BITS else 8 * DTYPES[dtype][0])
        if bits % 8 or bits // 8 != offs[1] - offs[0]:
            raise OracleError(f"safetensors: entry {name} size")
        extents.append(tuple(offs))
        if records_out is not None:
            records_out.append({"name": name, "offset": 8 + n + offs[0], "size": offs[1] - offs[0]})
        blob = buf[offs[0]:offs[1]]
        stride, acc = [], 1
        for s in reversed(shape):
            stride.append(acc)
            acc *= s
        t = {"dtype": dtype, "shape": list(shape), "stride": stride[::-1], "offset": 0,
             "requires_grad": False, "parameter": False, "storage": name}
        if digests:
            t["sha256"] = hashlib.sha256(blob).hexdigest()
        entries.append([{"str": name}, {"tensor": t}])
    end = 0
    for b, e in sorted(extents):
        if b != end:
            raise OracleError("safetensors: extents are not contiguous")
        end = e
    if end != len(buf):
        raise OracleError("safetensors: buffer does not end at the last tensor")
    return {"dict": entries}


# ---------------------------------------------------------------- tensors
def _torch():
    import torch  # imported lazily: safetensors and tree-only uses do not need it
    return torch


def check_view(t, blob):
    """Raises unless the record holds the declared storage and the view lies inside it.
    Returns the tensor's element count."""
    itemsize = DTYPES[t.dtype][0]
    if len(blob) != t.storage.nbytes:
        raise OracleError(f"storage {t.storage.key}: record has {len(blob)} bytes, "
                          f"declared {t.storage.nbytes}")
    storage_elems = len(blob) // itemsize
    numel = 1
    for s in t.size:
        numel *= s
    if numel == 0:
        return 0
    extent = t.offset + sum((s - 1) * st for s, st in zip(t.size, t.stride)) + 1
    if extent > storage_elems:
        raise OracleError(f"tensor view reaches element {extent} of a {storage_elems}-element storage")
    return numel


def tensor_c_order_bytes(t, blob):
    """The tensor's elements in C order, little-endian, from its storage bytes."""
    itemsize = DTYPES[t.dtype][0]
    if check_view(t, blob) == 0:
        return b""
    torch = _torch()
    tdtype = getattr(torch, t.dtype, None) if t.dtype != "complex32" else getattr(torch, "complex32", None)
    if isinstance(tdtype, torch.dtype):
        base = torch.frombuffer(bytearray(blob), dtype=torch.uint8).view(tdtype)
        view = base.as_strided(t.size, t.stride, t.offset).contiguous()
        return view.reshape(-1).view(torch.uint8).numpy().tobytes()
    import numpy as np  # dtypes torch 1.13 lacks: gather whole elements as opaque bytes
    base = np.frombuffer(blob, dtype=f"V{itemsize}")
    view = np.lib.stride_tricks.as_strided(
        base[t.offset:], shape=t.size, strides=[st * itemsize for st in t.stride])
    return np.ascontiguousarray(view).tobytes()


# ---------------------------------------------------------------- canonical tree
def float_hex(x):
    return struct.pack(">d", x).hex()


class Encoder:
    """Canonical NODE encoding of an oracle result (stub objects)."""

    def __init__(self, storage_bytes, digests):
        self.storage_bytes, self.digests = storage_bytes, digests
        self.nodes = 0
        self.active = set()
        self.digest_cache = {}

    def key(self, k):
        if type(k) is str:
            return {"str": k}
        if type(k) is int:
            return {"int": str(k)}
        raise OracleError(f"dict key of type {type(k).__name__}")

    def tensor(self, t):
        node = {"dtype": t.dtype, "shape": list(t.size), "stride": list(t.stride), "offset": t.offset,
                "requires_grad": t.requires_grad, "parameter": t.parameter, "storage": t.storage.key}
        if t.storage.dtype is not None and t.storage.dtype != t.dtype:
            raise OracleError("tensor dtype differs from its storage dtype")
        blob = self.storage_bytes(t.storage)
        if not self.digests:
            check_view(t, blob)
            return {"tensor": node}
        ident = (t.storage.key, t.dtype, t.offset, t.size, t.stride)
        if ident not in self.digest_cache:
            self.digest_cache[ident] = hashlib.sha256(tensor_c_order_bytes(t, blob)).hexdigest()
        node["sha256"] = self.digest_cache[ident]
        return {"tensor": node}

    @staticmethod
    def numpy_c_order(v):
        itemsize = DTYPES[v.dtype][0]
        if len(v.size) < 2 or v.stride == tuple(sorted(v.stride, reverse=True)):
            return v.data
        import numpy as np
        base = np.frombuffer(v.data, dtype=f"V{itemsize}")
        view = np.lib.stride_tricks.as_strided(base, shape=v.size, strides=[s * itemsize for s in v.stride])
        return np.ascontiguousarray(view).tobytes()

    def encode(self, v, depth=0):
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise OracleError("tree too large or too deep")
        if v is None or type(v) is bool:
            return v
        if type(v) is int:
            return {"int": str(v)}
        if type(v) is float:
            return {"float": float_hex(v)}
        if type(v) is str:
            return {"str": v}
        if type(v) is bytes:
            return {"bytes": v.hex()}
        if type(v) is TensorRef:
            return self.tensor(v)
        if type(v) is NumpyArray:
            if not v.built:
                raise OracleError("numpy array without its state")
            node = {"dtype": v.dtype, "shape": list(v.size), "stride": list(v.stride), "offset": 0,
                    "requires_grad": False, "parameter": False, "numpy": True, "storage": f"numpy-{id(v)}"}
            if self.digests:
                # C-order bytes: a Fortran-ordered array's elements are gathered first.
                node["sha256"] = hashlib.sha256(self.numpy_c_order(v)).hexdigest()
            return {"tensor": node}
        if type(v) in (list, tuple, dict, StateDict):
            if id(v) in self.active:
                raise OracleError("reference cycle")
            self.active.add(id(v))
            try:
                if type(v) is list:
                    return {"list": [self.encode(x, depth + 1) for x in v]}
                if type(v) is tuple:
                    return {"tuple": [self.encode(x, depth + 1) for x in v]}
                kind = "dict" if type(v) is dict else "odict"
                return {kind: [[self.key(k), self.encode(x, depth + 1)] for k, x in v.items()]}
            finally:
                self.active.discard(id(v))
        raise OracleError(f"value of type {type(v).__name__} in the tree")


def load(path, digests=True):
    """Returns {"format": ..., "tree": NODE} for the file, or raises OracleError."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] == b"PK\x03\x04":
        fmt = "pytorch_zip"
        root, storage_bytes = read_zip(data)
    elif (len(data) >= 9 and struct.unpack_from("<Q", data, 0)[0] + 8 <= len(data)
          and data[8:8 + struct.unpack_from("<Q", data, 0)[0]].lstrip(JSON_WHITESPACE)[:1] == b"{"):
        return {"format": "safetensors", "tree": read_safetensors(data, digests)}
    else:
        if len(data) > 512 and data[257:262] == b"ustar":
            raise OracleError("legacy tar checkpoint")
        fmt = "pytorch_legacy"
        root, storage_bytes = read_legacy(data)
    return {"format": fmt, "tree": Encoder(storage_bytes, digests).encode(root)}


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) != 1 or any(a not in ("--no-digests",) for a in argv[1:] if a.startswith("--")):
        print("usage: oracle.py FILE [--no-digests]", file=sys.stderr)
        return 2
    try:
        result = load(args[0], digests="--no-digests" not in argv)
    except OracleError as e:
        print(json.dumps({"refused": str(e)}))
        return 1
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
