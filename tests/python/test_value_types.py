"""Python's and torch's own value types through holdpoint (issue 38, items 2 and 4):
complex, set, bytearray, torch.device, torch.dtype, torch.Size and torch.layout, dict
keys other than str and int (tuples, floats, bools, None, bytes), and NumPy complex
scalars.

Both directions, against torch itself:
- what torch.save writes, holdpoint.load returns as torch.load(weights_only=False)
  does: the same types (type(x) is type(y)) and equal values, alone and nested;
- what holdpoint.save writes, torch.load(weights_only=True) reads back the same.
Refusals, each by its code: frozenset (torch's safe loader refuses it too), a set
holding something Python could not hash or a file could not name, and malformed calls
in hand-made pickles.
"""

import collections
import os
import sys
import tempfile

import numpy as np
import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

VALUES = {
    "complex": 1.5 - 2j,
    "complex_special": complex(float("inf"), -0.0),
    "set": {1, "a", (2, None), 2.5, b"x"},
    "empty_set": set(),
    "bytearray": bytearray(b"\x00\xff\x80ab"),
    "empty_bytearray": bytearray(),
    "device_cuda": torch.device("cuda", 1),
    "device_cpu": torch.device("cpu"),
    "device_meta": torch.device("meta"),
    "dtype": torch.float16,
    "dtype_bf16": torch.bfloat16,
    "dtype_complex": torch.complex64,
    "size": torch.Size([2, 3]),
    "empty_size": torch.Size([]),
    "layout": torch.sparse_coo,
    "strided": torch.strided,
    "set_of_dtypes": {torch.float32, torch.int8},
    # Keys Python allows and torch's safe loader opens, in insertion order.
    "keys": {(1, 2): "tuple", 1.5: "float", True: "bool", None: "none", b"k": "bytes", (): "empty tuple",
             (1, (2.5, None)): "nested", "a": "str", 9: "int", -0.5: "negative float"},
    "int_keys_beside_floats": {2: "two", 2.5: "two and a half"},
}


def same(a, b):
    """Strict: the same type at every level, equal values (NaN-free here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, complex):
        return repr(a) == repr(b)  # -0.0 and inf by their text
    return a == b


def saved_by_torch(tmp, name, value):
    path = os.path.join(tmp, f"{name}.pt")
    torch.save(value, path)
    return path


def code_of(call):
    try:
        call()
    except holdpoint.Error as error:
        return error.code
    return None


def check_torch_to_holdpoint(report, tmp):
    for name, value in VALUES.items():
        path = saved_by_torch(tmp, name, value)
        want = torch.load(path, weights_only=False)
        got = holdpoint.load(path)
        report.check(same(got, want), f"{name}: holdpoint.load gave {got!r} ({type(got).__name__}), torch.load "
                                      f"{want!r} ({type(want).__name__})")
        report.check(same(torch.load(path, weights_only=True), want), f"{name}: torch's safe loader disagrees")
    # All of them nested, with a tensor beside them.
    nested = {"config": dict(VALUES), "list": list(VALUES.values()), "w": torch.arange(3.0)}
    path = saved_by_torch(tmp, "nested", nested)
    want = torch.load(path, weights_only=False)
    got = holdpoint.load(path)
    report.check(same(got["config"], want["config"]) and same(got["list"], want["list"])
                 and torch.equal(got["w"], want["w"]), "nested values differ from torch.load's")
    # The point of returning torch's own types: code that uses them works.
    report.check(torch.zeros(2, dtype=got["config"]["dtype"]).dtype == torch.float16, "dtype is not usable as one")
    report.check(torch.zeros(got["config"]["size"]).shape == (2, 3), "torch.Size is not usable as one")


def check_compat_data(report, tmp):
    """compat="data": the plain forms, everything else (types of containers, sharing,
    tensors) as the default load gives it; an unknown mode is refused."""
    shared = [torch.float16]
    od = collections.OrderedDict(dtype=torch.int8)
    od._metadata = {"": {"version": 1}}
    value = {"dtype": torch.bfloat16, "size": torch.Size([2, 3]), "device": torch.device("cuda", 1),
             "layout": torch.sparse_csr, "np": np.float32(1.5), "np_big": np.uint64(2**64 - 1),
             "shared": shared, "again": shared, "od": od,
             "set": {torch.float32, 3}, "w": torch.arange(3.0), "plain": 1.25}
    path = saved_by_torch(tmp, "compat", value)
    got = holdpoint.load(path, compat="data")
    want = {"dtype": "torch.bfloat16", "size": (2, 3), "device": "cuda:1", "layout": "torch.sparse_csr",
            "np": 1.5, "np_big": 2**64 - 1, "shared": ["torch.float16"], "again": ["torch.float16"],
            "od": collections.OrderedDict(dtype="torch.int8"),
            "set": {"torch.float32", 3}, "plain": 1.25}
    for key, expected in want.items():
        report.check(same(got[key], expected), f"compat='data': {key} is {got[key]!r} ({type(got[key]).__name__}), "
                                               f"want {expected!r}")
    report.check(got["shared"] is got["again"], "compat='data': a shared list stays one object")
    report.check(getattr(got["od"], "_metadata", None) == {"": {"version": 1}}, "compat='data': _metadata kept")
    report.check(torch.equal(got["w"], value["w"]) and isinstance(got["w"], torch.Tensor),
                 "compat='data': tensors are unchanged")
    info_root, info = holdpoint.load_with_info(path, compat="data")
    report.check(info_root["dtype"] == "torch.bfloat16" and info["format"] == "pytorch_zip",
                 f"load_with_info(compat='data'): {info_root['dtype']!r}, {info['format']!r}")
    default = holdpoint.load(path)
    report.check(default["dtype"] is torch.bfloat16, "the default load still returns torch.dtype")
    report.check(code_of(lambda: holdpoint.load(path, compat="strings")) == "invalid_argument",
                 "compat='strings' is not refused with invalid_argument")


def check_shared_and_cyclic(report, tmp):
    """A container referenced twice is one object referenced twice, both ways; a
    cycle is refused with its own code (torch's safe loader reads one)."""
    shared_list, shared_dict = [1, 2], {"lr": 0.1}
    state = {"a": shared_list, "b": shared_list, "groups": [shared_dict, shared_dict], "t": (shared_list,)}
    path = saved_by_torch(tmp, "shared", state)
    got = holdpoint.load(path)
    want = torch.load(path, weights_only=False)
    report.check(got["a"] is got["b"] and got["groups"][0] is got["groups"][1] and got["t"][0] is got["a"],
                 "a container torch.save shared came back as copies")
    report.check(same(got, want), "shared containers: values differ from torch.load's")
    mine = os.path.join(tmp, "shared_by_holdpoint.pt")
    holdpoint.save(mine, state)
    back = torch.load(mine, weights_only=True)
    report.check(back["a"] is back["b"] and back["groups"][0] is back["groups"][1] and back["t"][0] is back["a"],
                 "holdpoint.save lost the sharing torch.load sees")
    again = holdpoint.load(mine)
    report.check(again["a"] is again["b"] and same(again, want), "holdpoint.load of holdpoint.save lost the sharing")
    # A list that holds itself: torch reads it; holdpoint refuses it, reading and writing.
    cyclic = [1]
    cyclic.append(cyclic)
    path = saved_by_torch(tmp, "cyclic", {"c": cyclic})
    loaded = torch.load(path, weights_only=True)
    report.check(loaded["c"][1] is loaded["c"], "torch's safe loader no longer reads a cycle: read it too")
    report.check(code_of(lambda: holdpoint.load(path)) == "pickle_cycle", "a cyclic list was not refused as pickle_cycle")
    report.check(code_of(lambda: holdpoint.save(os.path.join(tmp, "cyclic_by_holdpoint.pt"), {"c": cyclic}))
                 == "write_value_unsupported", "holdpoint.save wrote a cycle")


def check_numpy_complex(report, tmp):
    for value in (np.complex64(1.5 - 2j), np.complex128(0.1 + 3e300j)):
        path = saved_by_torch(tmp, "numpy_complex", {"z": value})
        got = holdpoint.load(path)["z"]
        report.check(type(got) is type(value) and got == value,
                     f"NumPy {type(value).__name__}: holdpoint.load gave {got!r} ({type(got).__name__})")


def check_holdpoint_to_torch(report, tmp):
    for name, value in VALUES.items():
        path = os.path.join(tmp, f"hp_{name}.pt")
        holdpoint.save(path, {"v": value})
        back = torch.load(path, weights_only=True)["v"]
        report.check(same(back, value), f"{name}: torch.load(weights_only=True) of holdpoint.save gave {back!r}")
        again = holdpoint.load(path)["v"]
        report.check(same(again, value), f"{name}: holdpoint.load of holdpoint.save gave {again!r}")


def check_refusals(report, tmp):
    path = os.path.join(tmp, "refused.pt")
    # frozenset: torch's safe loader refuses it, and so does holdpoint, both ways.
    torch.save(frozenset([1]), path)
    report.check(code_of(lambda: holdpoint.load(path)) == "pickle_global_forbidden", "a frozenset file was read")
    try:
        torch.load(path, weights_only=True)
        report.check(False, "torch's safe loader now reads frozenset: read it too (docs/format.md §5.4.3)")
    except Exception:  # noqa: BLE001 - any refusal of torch's
        pass
    report.check(code_of(lambda: holdpoint.save(path, {"f": frozenset()})) == "write_value_unsupported",
                 "holdpoint.save wrote a frozenset")
    # A set of tensors: Python hashes tensors by identity, which a file cannot carry.
    report.check(code_of(lambda: holdpoint.save(path, {"s": {torch.zeros(1)}})) == "write_value_unsupported",
                 "holdpoint.save wrote a set of tensors")
    # Keys holdpoint keeps out (docs/format.md §5.5): an int beyond int64, a complex, a frozenset.
    for what, key in (("2**64", 2**64), ("complex", 1j), ("frozenset", frozenset())):
        report.check(code_of(lambda: holdpoint.save(path, {key: 1})) == "write_value_unsupported",
                     f"holdpoint.save wrote a {what} key")
    # Hand-made pickles that torch.save never writes.
    cases = {
        # set([[1]]): an unhashable item
        "set of a list": b"\x80\x02c__builtin__\nset\n]](K\x01ea\x85R.",
        # complex(1): one argument
        "complex of one": b"\x80\x02c__builtin__\ncomplex\nK\x01\x85R.",
        # bytearray('ab'): text, not bytes
        "bytearray of str": b"\x80\x02c__builtin__\nbytearray\nX\x02\x00\x00\x00ab\x85R.",
        # torch.device('cuda', -1)
        "device index -1": b"\x80\x02ctorch\ndevice\nX\x04\x00\x00\x00cudaJ\xff\xff\xff\xff\x86R.",
        # torch.device('Evil Device')
        "device name": b"\x80\x02ctorch\ndevice\nX\x0b\x00\x00\x00Evil Device\x85R.",
    }
    for what, data, code in (
            # {[]: 1}: an unhashable key
            ("list key", b"\x80\x02}]K\x01s.", "pickle_dict_key_invalid"),
            # {1: 1, True: 2}: one key in Python; holdpoint refuses the second
            ("1 and True", b"\x80\x02}(K\x01K\x01\x88K\x02u.", "pickle_duplicate_key")):
        harness.pickle_archive(path, data)
        report.check(code_of(lambda: holdpoint.load(path)) == code, f"{what}: not refused with {code}")
    for what, data in cases.items():
        harness.pickle_archive(path, data)
        report.check(code_of(lambda: holdpoint.load(path)) == "pickle_call_args_invalid",
                     f"{what}: not refused with pickle_call_args_invalid")


def main():
    report = harness.Report("value_types")
    with tempfile.TemporaryDirectory(prefix="holdpoint-types-") as tmp:
        check_torch_to_holdpoint(report, tmp)
        check_compat_data(report, tmp)
        check_shared_and_cyclic(report, tmp)
        check_numpy_complex(report, tmp)
        check_holdpoint_to_torch(report, tmp)
        check_refusals(report, tmp)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
