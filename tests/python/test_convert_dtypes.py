"""`holdpoint convert` and `inspect` on the newer element types, against the reference:
files written by torch 2.13's `torch.save` and by the safetensors package's own writer,
converted in both directions and checked with `torch.load(weights_only=True)`,
`safetensors.torch.load_file` and `safetensors.deserialize` (the reference's parser).

Dtypes: float8_e4m3fn / e5m2 / e4m3fnuz / e5m2fnuz / e8m0fnu (F8_*), float4_e2m1fn_x2 (F4
with the last dimension counted in elements, as the reference maps it), the safetensors-only
F6_E2M3 / F6_E3M2, and torch's bits* dtypes, which safetensors cannot name. Every refusal
is checked by its error code, and a refused conversion writes nothing.

Run by ctest with the oracle Python (torch 2.13, safetensors from scripts/requirements.txt)."""

import json
import os
import shutil
import struct
import sys
import tempfile

import torch

import harness
import oracle

try:
    import safetensors
    import safetensors.torch
except ImportError:
    print("FAIL: the safetensors package is missing (scripts/requirements.txt pins it)")
    sys.exit(1)

cli = harness.cli
first_code = harness.first_code

# torch dtype -> the safetensors name its bytes are stored under.
TORCH_TO_SAFETENSORS = {
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
}
BITS_DTYPES = ["bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"]


def patterned(dtype_name, shape, seed):
    """A tensor of `dtype_name` whose bytes are a fixed pseudo-random pattern."""
    dtype = getattr(torch, dtype_name)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = 1
    for s in shape:
        numel *= s
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (numel * itemsize,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape)


def same_bytes(a, b):
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            and torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)))


def safetensors_file(path, tensors, header_prefix=b"", header_suffix=b""):
    """Writes a safetensors file by hand: tensors is [(name, dtype, shape, data)]. The
    reference's own parser must accept it (checked), so the test is about holdpoint."""
    header, offset, blob = {}, 0, b""
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blob += data
    text = header_prefix + json.dumps(header).encode() + header_suffix
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


def reference_view(path):
    """{name: (dtype, shape, bytes)} as the safetensors package's parser reads the file."""
    with open(path, "rb") as f:
        return {name: (info["dtype"], list(info["shape"]), bytes(info["data"]))
                for name, info in safetensors.deserialize(f.read())}


def normalized_tree(tree):
    """dict vs OrderedDict for a safetensors root is a representation choice (as in
    test_corpus); storage keys are renumbered."""
    tree = harness.normalize_storage_keys(tree)
    if isinstance(tree, dict) and len(tree) == 1 and next(iter(tree)) in ("dict", "odict"):
        return {"dict": next(iter(tree.values()))}
    return tree


def check_inspect_agrees_with_oracle(report, label, path):
    r = harness.inspect(path)
    if not report.check(r.returncode == 0, f"{label}: inspect {r.describe()}"):
        return
    want = oracle.load(path)
    have = r.json()
    report.check(have["format"] == want["format"], f"{label}: format {have['format']} vs {want['format']}")
    report.check(normalized_tree(have["tree"]) == normalized_tree(want["tree"]),
                 f"{label}: inspect tree differs from the oracle's")


def check_refused(report, label, r, code, output, words):
    report.check(r.returncode == 1 and first_code(r) == code, f"{label}: expected {code}, got {r.describe()}")
    report.check(all(w in r.stderr for w in words), f"{label}: message names {words}: {r.stderr.strip()}")
    report.check(not os.path.exists(output), f"{label}: a refused conversion writes nothing")


# ---- .pt written by torch.save --------------------------------------------------------------


def check_torch_save_files(report, tmp):
    """inspect reads every dtype torch 2.13 saves (views included) as the oracle does, and
    .pt -> .pt keeps each byte, dtype and shape as torch.load sees them."""
    for index, name in enumerate(list(TORCH_TO_SAFETENSORS) + BITS_DTYPES):
        base = patterned(name, (4, 6), index)
        saved = {"w": base, "view": base.t()[1:, ::2], "scalar": base[0, 0].clone()}
        source = os.path.join(tmp, f"{name}.pt")
        torch.save(saved, source)
        check_inspect_agrees_with_oracle(report, f"torch.save {name}", source)
        out = os.path.join(tmp, f"{name}.again.pt")
        r = cli("convert", source, out)
        if report.check(r.returncode == 0, f"{name}: .pt -> .pt {r.describe()}"):
            loaded = torch.load(out, weights_only=True)
            report.check(all(same_bytes(saved[k], loaded[k]) for k in saved), f"{name}: .pt -> .pt keeps the tensors")


def check_pt_to_safetensors(report, tmp):
    """Each torch dtype safetensors has a name for converts to it; safetensors' loader
    reads back what torch.save wrote (float4_e2m1fn_x2 with the last dimension doubled in
    the header and halved again by the loader)."""
    for index, (name, st_name) in enumerate(TORCH_TO_SAFETENSORS.items()):
        saved = {"w": patterned(name, (3, 4), 10 + index), "empty": patterned(name, (2, 0), 0),
                 "view": patterned(name, (4, 4), 20 + index)[::2, 1:]}
        source = os.path.join(tmp, f"{name}.to-st.pt")
        torch.save(saved, source)
        out = os.path.join(tmp, f"{name}.safetensors")
        r = cli("convert", source, out)
        if not report.check(r.returncode == 0, f"{name}: .pt -> safetensors {r.describe()}"):
            continue
        loaded = safetensors.torch.load_file(out)
        report.check(set(loaded) == set(saved), f"{name}: keys {list(loaded)}")
        report.check(all(same_bytes(saved[k], loaded[k]) for k in saved), f"{name}: safetensors' loader disagrees")
        view = reference_view(out)
        report.check(view["w"][0] == st_name, f"{name}: stored as {view['w'][0]}, expected {st_name}")
        expected_shape = [3, 8] if st_name == "F4" else [3, 4]
        report.check(view["w"][1] == expected_shape, f"{name}: header shape {view['w'][1]}")
        # The same tensors through safetensors' own writer give the same header entries.
        reference = os.path.join(tmp, f"{name}.reference.safetensors")
        safetensors.torch.save_file({k: v.contiguous() for k, v in saved.items()}, reference)
        theirs = reference_view(reference)
        report.check(theirs == view, f"{name}: differs from safetensors' save_file")


def check_safetensors_to_pt(report, tmp):
    """Files written by safetensors' save_file convert to .pt; torch.load(weights_only=True)
    gives what safetensors' load_file gives."""
    for index, name in enumerate(TORCH_TO_SAFETENSORS):
        tensors = {"a": patterned(name, (2, 5), 30 + index), "b": patterned(name, (7,), 40 + index),
                   "empty": patterned(name, (0, 3), 0)}
        source = os.path.join(tmp, f"{name}.from-st.safetensors")
        safetensors.torch.save_file(tensors, source)
        check_inspect_agrees_with_oracle(report, f"save_file {name}", source)
        expected = safetensors.torch.load_file(source)
        out = os.path.join(tmp, f"{name}.from-st.pt")
        r = cli("convert", source, out)
        if report.check(r.returncode == 0, f"{name}: safetensors -> .pt {r.describe()}"):
            loaded = torch.load(out, weights_only=True)
            report.check(set(loaded) == set(expected), f"{name}: keys {list(loaded)}")
            report.check(all(same_bytes(expected[k], loaded[k]) for k in expected),
                         f"{name}: torch.load disagrees with safetensors' load_file")
        back = os.path.join(tmp, f"{name}.back.safetensors")
        r = cli("convert", out, back)
        if report.check(r.returncode == 0, f"{name}: and back to safetensors {r.describe()}"):
            report.check(reference_view(back) == reference_view(source), f"{name}: safetensors -> .pt -> safetensors")


def check_safetensors_to_safetensors(report, tmp):
    """Every safetensors dtype, the sub-byte ones included, survives safetensors ->
    safetensors byte for byte, as the reference's parser sees both files."""
    entries = [
        ("f4", "F4", [2, 3], bytes(range(3))),
        ("f4_odd_last", "F4", [3, 2, 1], bytes([0x21, 0x43, 0x65])),
        ("f6_e2m3", "F6_E2M3", [4], bytes([0xAB, 0xCD, 0xEF])),
        ("f6_e3m2", "F6_E3M2", [2, 4], bytes(range(6))),
        ("f8_e8m0", "F8_E8M0", [3], bytes([1, 127, 254])),
        ("f8_e4m3", "F8_E4M3", [2], bytes([0x38, 0xB8])),
        ("f8_e5m2fnuz", "F8_E5M2FNUZ", [1], bytes([0x40])),
        ("f6_empty", "F6_E2M3", [0, 5], b""),
    ]
    source = os.path.join(tmp, "every.safetensors")
    safetensors_file(source, entries)
    check_inspect_agrees_with_oracle(report, "every safetensors dtype", source)
    out = os.path.join(tmp, "every.again.safetensors")
    r = cli("convert", source, out)
    if report.check(r.returncode == 0, f"safetensors -> safetensors {r.describe()}"):
        report.check(reference_view(out) == reference_view(source), "safetensors -> safetensors keeps every tensor")


# ---- refusals ---------------------------------------------------------------------------------


def check_refusals(report, tmp):
    out_pt = os.path.join(tmp, "refused.pt")
    out_st = os.path.join(tmp, "refused.safetensors")

    for st_name, dtype in (("F6_E2M3", "float6_e2m3fn"), ("F6_E3M2", "float6_e3m2fn")):
        source = os.path.join(tmp, f"{st_name}.safetensors")
        safetensors_file(source, [("ok", "F32", [1], bytes(4)), ("six", st_name, [4], bytes(3))])
        r = cli("convert", source, out_pt)
        check_refused(report, f"{st_name} -> .pt", r, "convert_dtype_unsupported", out_pt,
                      [source, "'six'", dtype, st_name])

    # F4 pairs up along the last dimension only when it is even; safetensors' own torch
    # loader refuses the same shapes.
    for label, shape, data in (("odd last dimension", [2, 3], bytes(3)), ("empty, odd last", [0, 3], b"")):
        source = os.path.join(tmp, f"f4 {label}.safetensors")
        safetensors_file(source, [("fp4", "F4", shape, data)])
        try:
            safetensors.torch.load_file(source)
            report.check(False, f"F4 {label}: safetensors' torch loader accepted {shape}")
        except Exception:  # noqa: BLE001 - any refusal by the reference will do
            pass
        r = cli("convert", source, out_pt)
        check_refused(report, f"F4 {label} -> .pt", r, "convert_float4_shape_invalid", out_pt,
                      [source, "'fp4'", "F4", "[" + ", ".join(str(s) for s in shape) + "]"])

    # A 0-d float4_e2m1fn_x2 is one byte, two elements: no F4 shape (the reference's
    # save_file refuses it too).
    source = os.path.join(tmp, "x2-scalar.pt")
    scalar = patterned("float4_e2m1fn_x2", (), 1)
    torch.save({"s": scalar}, source)
    try:
        safetensors.torch.save_file({"s": scalar}, os.path.join(tmp, "reference-x2-scalar.safetensors"))
        report.check(False, "safetensors' save_file accepted a 0-d float4_e2m1fn_x2")
    except Exception:  # noqa: BLE001
        pass
    r = cli("convert", source, out_st)
    check_refused(report, "0-d float4_e2m1fn_x2 -> safetensors", r, "convert_float4_shape_invalid", out_st,
                  [source, "'s'", "float4_e2m1fn_x2"])

    # torch dtypes safetensors has no name for.
    for index, name in enumerate(BITS_DTYPES + ["complex32", "complex128"]):
        source = os.path.join(tmp, f"{name}.nost.pt")
        tensor = patterned(name, (2,), 50 + index) if name.startswith("bits") else torch.zeros(2, dtype=getattr(
            torch, name))
        torch.save({"fine": torch.ones(1), "odd": tensor}, source)
        r = cli("convert", source, out_st)
        check_refused(report, f"{name} -> safetensors", r, "convert_dtype_unsupported", out_st,
                      [source, "'odd'", name])

    # Sub-byte size rules, as the reference applies them.
    for label, dtype, shape, data, code in (
            ("F4 ending inside a byte", "F4", [3], bytes(2), "safetensors_misaligned_slice"),
            ("F6 ending inside a byte", "F6_E3M2", [2, 3], bytes(5), "safetensors_misaligned_slice"),
            ("F6 rounded up", "F6_E2M3", [5], bytes(4), "safetensors_misaligned_slice"),
            ("F6 with a byte too many", "F6_E2M3", [4], bytes(4), "safetensors_tensor_info_invalid"),
            ("F4 counted as bytes", "F4", [4], bytes(4), "safetensors_tensor_info_invalid")):
        header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, len(data)]}}).encode()
        raw = struct.pack("<Q", len(header)) + header + data
        try:
            safetensors.deserialize(raw)
            report.check(False, f"{label}: the reference accepted it")
        except Exception:  # noqa: BLE001
            pass
        path = os.path.join(tmp, f"{label}.safetensors")
        with open(path, "wb") as f:
            f.write(raw)
        r = cli("inspect", path)
        report.check(r.returncode == 1 and first_code(r) == code, f"{label}: expected {code}, got {r.describe()}")
        r = cli("convert", path, out_st)
        report.check(first_code(r) == code and not os.path.exists(out_st), f"{label}: convert {r.describe()}")

    leftovers = [n for n in os.listdir(tmp) if ".staging-" in n]
    report.check(not leftovers, f"no staging files left: {leftovers}")


def main():
    harness.require_executable(harness.holdpoint_binary())
    report = harness.Report("test_convert_dtypes")
    tmp = tempfile.mkdtemp(prefix="holdpoint-dtypes-")
    try:
        check_torch_save_files(report, tmp)
        check_pt_to_safetensors(report, tmp)
        check_safetensors_to_pt(report, tmp)
        check_safetensors_to_safetensors(report, tmp)
        check_refusals(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
