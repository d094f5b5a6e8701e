"""Writes Python torch.save fixtures and, beside each, `<file>.expected.json`.

The expected tree is the canonical NODE encoding of the LIVE object that was saved
(canonical.py), never something read back from the file, so a reader that disagrees
with it is wrong about what Python wrote.

Usage: make_python_fixtures.py OUTDIR        (prints the fixture paths, one a line)
"""

import collections
import json
import math
import os
import sys

import torch

import canonical

ALL_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]

# Dtypes torch 2.x writes as UntypedStorage + _rebuild_tensor_v3 (no storage class,
# so zip files only), where the running torch has them: none on torch 1.13.
TORCH2_DTYPES = [getattr(torch, name) for name in (
    "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16",
) if hasattr(torch, name)]

INT_EDGES = [0, 1, -1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40, -2**40,
             2**63 - 1, -2**63]


def sample(dtype, shape, seed):
    """Deterministic, non-trivial contents for any dtype."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dtype == torch.bool:
        return (torch.randint(0, 2, (n,), generator=g) == 1).reshape(shape)
    if dtype.is_complex:
        real = torch.randn(n, generator=g, dtype=torch.float64)
        imag = torch.randn(n, generator=g, dtype=torch.float64)
        return torch.complex(real, imag).to(dtype).reshape(shape)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(dtype).reshape(shape)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype).reshape(shape)


def bit_pattern(dtype, shape, seed):
    """Deterministic raw bytes viewed as `dtype`: bits* and float4_e2m1fn_x2 have no
    arithmetic to fill them with, and every pattern is a valid element of the others."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * itemsize,), generator=g, dtype=torch.int64).to(torch.uint8)
    return raw.view(dtype).reshape(shape)


def trained_optimizer(kind):
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    if kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-7, amsgrad=True)
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(5, 4)).pow(2).sum()
        loss.backward()
        opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 2, "loss": float(loss)}


class BasicBlock(torch.nn.Module):
    """A ResNet basic block (conv-bn-relu-conv-bn, optional 1x1 downsample)."""

    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(outputs)
        self.conv2 = torch.nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(outputs)
        if stride != 1 or inputs != outputs:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                                  torch.nn.BatchNorm2d(outputs))


class SmallResNet(torch.nn.Module):
    """torchvision's resnet18 layout (names, BatchNorm buffers, downsample
    branches) at a small width, built from torch alone: PyPI's torchvision does
    not load beside the pinned CPU torch."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        widths = [8, 16, 32, 64]
        inputs = 8
        for i, width in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", torch.nn.Sequential(BasicBlock(inputs, width, stride),
                                                              BasicBlock(width, width, 1)))
            inputs = width
        self.fc = torch.nn.Linear(64, 10)


def trained_scheduler():
    """A MultiStepLR's state: its milestones are a collections.Counter."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 5], gamma=0.5)
    for _ in range(3):
        opt.step()
        scheduler.step()
    return {"scheduler": scheduler.state_dict(), "optimizer": opt.state_dict()}


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: one Parameter under two names


def fixtures():
    """(name, object, legacy?) triples. Built fresh on each call."""
    out = []

    torch.manual_seed(5)
    out.append(("resnet_state_dict", SmallResNet().state_dict(), False))
    out.append(("scheduler_multistep", trained_scheduler(), False))
    out.append(("optimizer_sgd_momentum", trained_optimizer("sgd"), False))
    out.append(("optimizer_adam", trained_optimizer("adam"), False))
    out.append(("optimizer_adam_legacy", trained_optimizer("adam"), True))

    base = sample(torch.float32, (24,), 1)
    views = {
        "base": base,
        "slice": base[2:10],
        "transposed": base.view(4, 6).t(),
        "every_third": base[1::3],
        "expanded": base[:3].unsqueeze(0).expand(4, 3),
        "column": base.view(4, 6)[:, 5],
        "other": sample(torch.int64, (2, 3), 2).t(),
    }
    out.append(("views_shared_storage", views, False))
    out.append(("views_shared_storage_legacy", dict(views), True))
    out.append(("two_views_only", {"a": base[0:12].view(3, 4), "b": base[12:24].view(4, 3).t()}, False))

    t = sample(torch.float32, (3, 2), 3)
    out.append(("tied_same_tensor", {"a": t, "b": t, "nested": {"again": t}, "in_tuple": (t, 5)}, False))
    torch.manual_seed(11)
    out.append(("tied_module_state_dict", TiedLM().state_dict(), False))
    lm = TiedLM()
    tied_params = {"embed.weight": lm.embed.weight, "proj.bias": lm.proj.bias, "head.weight": lm.head.weight}
    out.append(("tied_module_params_legacy", {"params": tied_params}, True))

    many = {f"layer{i}.weight": torch.full((2,), float(i)) for i in range(1200)}
    many["list"] = list(range(1100))
    many["ints"] = {i: i * i for i in range(1001)}
    out.append(("many_entries", many, False))

    dtypes = collections.OrderedDict()
    for i, dt in enumerate(ALL_DTYPES):
        name = canonical.dtype_name(dt)
        dtypes[name] = sample(dt, (3, 5), 100 + i)
        dtypes[name + "_0d"] = sample(dt, (), 200 + i)
        dtypes[name + "_empty"] = torch.empty((0, 3), dtype=dt)
    dtypes["rank5"] = sample(torch.float32, (2, 1, 3, 1, 2), 300)
    dtypes["rank5_permuted"] = sample(torch.float64, (2, 3, 1, 2, 2), 301).permute(4, 2, 0, 3, 1)
    dtypes["special_floats"] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.0])
    dtypes["requires_grad"] = sample(torch.float32, (4,), 302).requires_grad_()
    out.append(("all_dtypes", dtypes, False))
    out.append(("all_dtypes_legacy", collections.OrderedDict(dtypes), True))

    if TORCH2_DTYPES:
        torch2 = collections.OrderedDict()
        for i, dt in enumerate(TORCH2_DTYPES):
            name = canonical.dtype_name(dt)
            torch2[name] = bit_pattern(dt, (3, 4), 500 + i)
            torch2[name + "_0d"] = bit_pattern(dt, (), 600 + i)
            torch2[name + "_view"] = torch2[name].t()[1:]
        out.append(("torch2_dtypes", torch2, False))

    unicode = {
        "ünïcødé": torch.tensor([1.0]),
        "日本語のキー": torch.tensor([2]),
        "emoji 🙂🚀": "värde ✓",
        "": "empty key",
        "tab\tnew\nline\"quote\\": [1, 2],
        "\u00a0nbsp\u200bzwsp": None,
    }
    out.append(("unicode_keys", unicode, False))

    out.append(("int_edges", {"values": list(INT_EDGES), "as_keys": {v: str(v) for v in INT_EDGES}}, False))
    out.append(("int_edges_legacy", {"values": tuple(INT_EDGES)}, True))

    nested = {
        "list": [1, (2, 3), {"x": [None, True, False]}, [[[]]]],
        "empty_list": [],
        "empty_tuple": (),
        "empty_dict": {},
        "empty_odict": collections.OrderedDict(),
        "odict": collections.OrderedDict([("z", 1), ("a", 2), ("m", collections.OrderedDict([("q", [3])]))]),
        "tuples": ((1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5)),
        "str": "hello",
        "bool": [True, False],
        "none": None,
        "floats": [0.0, -0.0, 1.5, -2.25, math.inf, -math.inf, math.nan, 1e-310, 1e300, 0.1],
        "bytes": b"\x00\x01\xfe\xffholdpoint",
        "deep": {"a": {"b": {"c": {"d": {"e": [{"f": (torch.arange(3),)}]}}}}},
    }
    out.append(("nested_containers", nested, False))
    out.append(("nested_containers_legacy", dict(nested), True))

    param = torch.nn.Parameter(sample(torch.float32, (2, 3), 400))
    frozen = torch.nn.Parameter(sample(torch.float64, (3,), 401), requires_grad=False)
    out.append(("parameters", {"param": param, "frozen": frozen, "param_again": param}, False))
    out.append(("bare_parameter", torch.nn.Parameter(sample(torch.float32, (5,), 402)), False))
    out.append(("bare_tensor_legacy", sample(torch.int16, (2, 2), 403), True))
    out.append(("protocol4", {"x": sample(torch.float32, (3,), 404), "n": 2**40, "s": "proto"}, False))
    return out


def write_fixtures(outdir):
    os.makedirs(outdir, exist_ok=True)
    paths = []
    for name, obj, legacy in fixtures():
        path = os.path.join(outdir, name + ".pt")
        kwargs = {"_use_new_zipfile_serialization": False} if legacy else {}
        if name == "protocol4":
            kwargs["pickle_protocol"] = 4
        torch.save(obj, path, **kwargs)
        # Encode while `obj` is alive: legacy storage keys are StorageImpl addresses.
        tree = canonical.encode(obj, storage_keys="legacy" if legacy else "zip")
        with open(path + ".expected.json", "w", encoding="utf-8") as f:
            json.dump(tree, f, ensure_ascii=False, indent=1)
        paths.append(path)
    return paths


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    for p in write_fixtures(argv[1]):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
