"""The Python package holdpoint (python/, docs/python.md), as built in the build tree
(<build>/python/holdpoint), against Python's torch 2.13 as the oracle:

- load: every tensor equals what torch.load(weights_only=True) gives (values, dtype,
  shape, strides, Parameter, requires_grad), storages shared in the file stay shared,
  OrderedDict and _metadata survive; tensors='numpy' gives the same as NumPy;
- NumPy and Python RNG states (a Trainer's rng_state.pth, which the weights-only
  loader refuses) are read as data, and restoring them gives the same next draws;
  ints beyond int64 (a NumPy Generator's PCG64 state) are read and written as Python
  ints;
- save: atomic, a sidecar that matches, torch.load(weights_only=True) reads it back
  equal; unsupported values refused with their code and nothing left on disk;
- refusals: every rejected file of tests/corpus with its code, digest mismatches,
  limits, a flipped byte;
- a file changed on disk after the load cannot change what was returned; views outlive
  everything else, and the snapshot's memory goes when the last view does (RSS);
- verify, inspect, RunDirectory, load_model_state, error codes, python -m holdpoint.
"""

import collections
import gc
import hashlib
import os
import random
import shutil
import subprocess
import sys
import struct
import tempfile
import time

import numpy as np
import torch

import harness
import live_tree

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def expect_error(report, what, code, call):
    return harness.expect_raises(report, what, code, call, holdpoint.Error)


def compare_trees(report, what, got, want):
    diff = live_tree.first_difference(got, want)
    report.check(diff is None, f"{what}: {diff}")


def training_checkpoint():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 4))
    model[2].weight = torch.nn.Parameter(model[0].weight.t())  # a view of another parameter's storage
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "loss": 0.25,
        "nan": float("nan"),
        "tags": ("a", b"\x00\xff", None, True),
        "param": torch.nn.Parameter(torch.arange(6.0).reshape(2, 3)),
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "u32": torch.tensor([1, 2**32 - 1], dtype=torch.uint32),
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "transposed": torch.arange(12.0).reshape(3, 4).t(),
        "complex": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
    }


def check_load_matches_torch(report, tmp):
    path = os.path.join(tmp, "training.pt")
    torch.save(training_checkpoint(), path)
    want = torch.load(path, weights_only=True)
    got, info = holdpoint.load_with_info(path)
    compare_trees(report, "load vs torch.load", got, want)
    # No digest to check: none is computed (the hash pass would cost more than the read).
    report.check(info["format"] == "pytorch_zip" and info["sha256"] is None and not info["digest_checked"],
                 f"load info {info}")
    hashed = holdpoint.load_with_info(path, compute_sha256=True)[1]
    report.check(hashed["sha256"] == sha256_of(path) and not hashed["digest_checked"], f"load info on request {hashed}")
    # Without the hash, damage inside a record is still refused, by its CRC-32.
    with open(path, "rb") as f:
        damaged = bytearray(f.read())
    # Flip a byte of the stored arange(6.0) of "param": only the record's CRC-32 can tell.
    at = damaged.find(struct.pack("<6f", 0, 1, 2, 3, 4, 5))
    assert at > 0, "param's bytes are not in the file"
    damaged[at + 9] ^= 0x01
    damaged_path = os.path.join(tmp, "damaged.pt")
    with open(damaged_path, "wb") as f:
        f.write(damaged)
    expect_error(report, "damaged payload without a digest", "zip_crc_mismatch", lambda: holdpoint.load(damaged_path))
    # The view shares its base's storage, as in torch.load.
    report.check(got["model"]["2.weight"].untyped_storage().data_ptr()
                 == got["model"]["0.weight"].untyped_storage().data_ptr(), "a view lost its shared storage")
    report.check(isinstance(got["param"], torch.nn.Parameter) and got["param"].requires_grad, "Parameter lost")
    report.check(not got["model"]["0.bias"]._is_view() and got["transposed"].untyped_storage().nbytes() == 48,
                 "a tensor over its whole storage is a view, or a view lost its storage")
    report.check(type(got["model"]) is collections.OrderedDict, "state dict is not an OrderedDict")

    # The digest, checked first.
    checked = holdpoint.load_with_info(path, expected_sha256=sha256_of(path))[1]
    report.check(checked["digest_checked"], "expected_sha256 was not reported as checked")
    expect_error(report, "wrong expected digest", "sha256_mismatch",
                 lambda: holdpoint.load(path, expected_sha256="0" * 64))
    expect_error(report, "malformed expected digest", "sha256_invalid",
                 lambda: holdpoint.load(path, expected_sha256="xyz"))

    # NumPy instead of torch (bfloat16 has no NumPy dtype: refused by name).
    expect_error(report, "bfloat16 as NumPy", "dtype_unsupported", lambda: holdpoint.load(path, tensors="numpy"))
    numpy_path = os.path.join(tmp, "numpy_view.pt")
    plain = {k: v for k, v in want.items() if k not in ("bf16",)}
    torch.save(plain, numpy_path)
    arrays = holdpoint.load(numpy_path, tensors="numpy")
    report.check(isinstance(arrays["model"]["0.weight"], np.ndarray)
                 and np.array_equal(arrays["model"]["0.weight"], want["model"]["0.weight"].numpy()),
                 "tensors='numpy' differs")
    report.check(np.array_equal(arrays["transposed"], want["transposed"].numpy()), "a strided view as NumPy differs")
    report.check(np.array_equal(arrays["u32"], want["u32"].numpy()) and arrays["empty"].shape == (0, 3),
                 "uint32 / empty as NumPy")
    expect_error(report, "unknown tensors kind", "invalid_argument", lambda: holdpoint.load(path, tensors="jax"))

    # Limits, by Limits field name.
    expect_error(report, "max_tensors", "tensor_count_limit", lambda: holdpoint.load(path, limits={"max_tensors": 3}))
    expect_error(report, "unknown limit", "invalid_argument", lambda: holdpoint.load(path, limits={"max_cats": 3}))
    report.check(isinstance(holdpoint.load(path, limits={"max_tensors": 1000}), dict), "generous limits refused")

    # A flipped byte in a tensor's record, with and without a digest.
    data = bytearray(open(path, "rb").read())
    flipped = os.path.join(tmp, "flipped.pt")
    offset = data.rfind(b"data/0") + 200
    data[offset] ^= 0x40
    open(flipped, "wb").write(data)
    try:
        holdpoint.load(flipped)
        report.check(False, "a flipped byte was not detected")
    except holdpoint.Error as error:
        report.check(error.code in ("zip_crc_mismatch", "zip_local_header_mismatch", "pickle_opcode_forbidden")
                     or error.code.startswith(("zip_", "pickle_")), f"flipped byte: code {error.code}")
        report.check(error.path == flipped, f"the error does not name the file: {error.path!r}")
    expect_error(report, "flipped byte with the original digest", "sha256_mismatch",
                 lambda: holdpoint.load(flipped, expected_sha256=sha256_of(path)))
    expect_error(report, "missing file", "io_open_failed", lambda: holdpoint.load(os.path.join(tmp, "absent.pt")))


def check_rng_states(report, tmp):
    # What a Hugging Face Trainer writes as rng_state.pth (and Accelerate as random_states_0.pkl).
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    random.random(), np.random.rand(), torch.rand(1)
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    path = os.path.join(tmp, "rng_state.pth")
    torch.save(states, path)
    want = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist())
    try:
        torch.load(path, weights_only=True)
        report.check(False, "torch.load(weights_only=True) read a NumPy RNG state (the premise changed)")
    except Exception:  # noqa: BLE001 - the weights-only unpickler's refusal
        pass
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    loaded = holdpoint.load(path)
    random.setstate(loaded["python"])
    np.random.set_state(loaded["numpy"])
    torch.set_rng_state(loaded["cpu"])
    got = (random.random(), np.random.rand(3).tolist(), np.random.randn(), torch.rand(3).tolist())
    report.check(got == want, f"restored RNG draws differ: {got} != {want}")
    report.check(isinstance(loaded["numpy"][1], np.ndarray) and loaded["numpy"][1].dtype == np.uint32,
                 "the NumPy state array is not a uint32 ndarray")
    report.check(loaded["python"] == states["python"], "Python's random state differs")

    # A real Trainer's file (tests/corpus), and a NumPy scalar and big-endian array.
    real = holdpoint.load(os.path.join(harness.CORPUS_DIR, "real_pt", "hf_trainer_rng_state_2023-11.pth"))
    np.random.set_state(real["numpy"])
    report.check(np.random.get_state()[2] == real["numpy"][2], "the real Trainer RNG state did not restore")
    extras = {"scalar": np.float32(1.25), "big": np.arange(4, dtype=">i4"), "fortran": np.asfortranarray(
        np.arange(6, dtype=np.float64).reshape(2, 3)), "int": np.int64(-5)}
    extras_path = os.path.join(tmp, "numpy_values.pt")
    torch.save(extras, extras_path)
    got = holdpoint.load(extras_path)
    # NumPy scalars come back as NumPy scalars of their dtype, as torch.load gives them.
    report.check(got["scalar"] == 1.25 and type(got["scalar"]) is np.float32 and got["int"] == -5
                 and type(got["int"]) is np.int64, f"NumPy scalars: {got}")
    report.check(np.array_equal(got["big"], np.arange(4)) and got["big"].dtype == np.int32, "big-endian array")
    report.check(np.array_equal(got["fortran"], extras["fortran"]), "Fortran-ordered array")
    # uint64 across its whole range, as NumPy's own unpickling gives it.
    seeds = {"top": np.uint64(2 ** 64 - 1), "half": np.uint64(2 ** 63), "below": np.uint64(2 ** 63 - 1)}
    seeds_path = os.path.join(tmp, "uint64.pt")
    torch.save(seeds, seeds_path)
    got = holdpoint.load(seeds_path)
    report.check(got == seeds and all(type(v) is np.uint64 for v in got.values()), f"NumPy uint64 scalars: {got}")
    # Empty arrays: pickle protocol 2 writes their b'' data as bytes().
    empties = {"rows": np.zeros((0, 3), dtype=np.float32), "none": np.array([], dtype=np.int64)}
    empties_path = os.path.join(tmp, "empty_arrays.pt")
    torch.save(empties, empties_path)
    got = holdpoint.load(empties_path)
    report.check(all(got[k].shape == v.shape and got[k].dtype == v.dtype for k, v in empties.items()),
                 f"empty NumPy arrays: {got}")
    # Object arrays stay refused: they would need pickled Python objects.
    objects_path = os.path.join(tmp, "objects.pt")
    torch.save({"objects": np.array([1, "a"], dtype=object)}, objects_path)
    expect_error(report, "a NumPy object array", "numpy_dtype_unsupported", lambda: holdpoint.load(objects_path))


def check_big_integers(report, tmp):
    # Python ints are unbounded and the weights-only loader reads them all: a NumPy
    # Generator's PCG64 state holds 128-bit ints, a 64-bit unsigned seed needs 65 bits.
    generator = np.random.default_rng(2024)
    generator.random(3)
    values = {"pcg64": generator.bit_generator.state, "seed": 2**64 - 1, "negative": -2**100, "edge": -2**63,
              "beyond": 2**63, "list": [2**200, -(2**200)]}
    path = os.path.join(tmp, "big_ints.pt")
    torch.save(values, path)
    want = torch.load(path, weights_only=True)
    got = holdpoint.load(path)
    compare_trees(report, "ints beyond int64", got, want)
    report.check(type(got["edge"]) is int and got["edge"] == -2**63, "int64's minimum stays an int")
    draws = generator.random(4).tolist()
    resumed = np.random.default_rng()
    resumed.bit_generator.state = got["pcg64"]
    report.check(resumed.random(4).tolist() == draws, "a NumPy Generator restored from holdpoint's state draws alike")
    # Written back by holdpoint.save, torch's weights-only loader reads them equal.
    saved = os.path.join(tmp, "big_ints_saved.pt")
    holdpoint.save(saved, values)
    compare_trees(report, "ints beyond int64 saved by holdpoint", torch.load(saved, weights_only=True), want)
    expect_error(report, "an int beyond pickle's LONG1 (255 bytes)", "write_value_unsupported",
                 lambda: holdpoint.save(os.path.join(tmp, "huge_int.pt"), {"huge": 2**2100}))
    report.check(not os.path.exists(os.path.join(tmp, "huge_int.pt")), "a refused save leaves no file")


def check_save(report, tmp):
    state = training_checkpoint()
    path = os.path.join(tmp, "saved.pt")
    result = holdpoint.save(path, state)
    report.check(result["sha256"] == sha256_of(path), "save's digest differs from the file's")
    sidecar = open(path + ".sha256").read()
    report.check(sidecar.split()[0] == result["sha256"] and sidecar.split()[1].endswith("saved.pt"),
                 f"sidecar {sidecar!r}")
    back = torch.load(path, weights_only=True)
    compare_trees(report, "torch.load of holdpoint.save", back, state)
    report.check(back["model"]["2.weight"].untyped_storage().data_ptr()
                 == back["model"]["0.weight"].untyped_storage().data_ptr(), "save did not keep a shared storage")
    compare_trees(report, "holdpoint round trip", holdpoint.load(path), back)

    # NumPy values are written as tensors and plain values.
    numpy_path = os.path.join(tmp, "numpy.pt")
    holdpoint.save(numpy_path, {"a": np.arange(6, dtype=np.int16).reshape(2, 3).T, "s": np.float64(0.5),
                                "big": np.arange(3, dtype=">f4")}, sidecar=False)
    back = torch.load(numpy_path, weights_only=True)
    report.check(torch.equal(back["a"], torch.arange(6, dtype=torch.int16).reshape(2, 3).T) and back["s"] == 0.5
                 and torch.equal(back["big"], torch.arange(3, dtype=torch.float32)), f"NumPy values saved: {back}")
    report.check(not os.path.exists(numpy_path + ".sha256"), "sidecar=False wrote a sidecar")

    # Memory reached two ways: a NumPy array over part of a tensor's storage.
    base = torch.arange(10.0)
    mixed = os.path.join(tmp, "mixed.pt")
    for order in (("a", "t"), ("t", "a")):
        values = {"a": base[:5].numpy(), "t": base}
        holdpoint.save(mixed, {k: values[k] for k in order})
        back = torch.load(mixed, weights_only=True)
        report.check(torch.equal(back["t"], base) and torch.equal(back["a"], base[:5]),
                     f"a NumPy view of a tensor's storage, saved in order {order}")

    # Refused values leave nothing behind, not even a staging file.
    for what, value, code in [
        ("a frozenset", {"x": frozenset({1, 2})}, "write_value_unsupported"),
        ("a set of tensors", {"x": {torch.zeros(1)}}, "write_value_unsupported"),
        ("an object", {"x": object()}, "write_value_unsupported"),
        ("a complex key", {1j: 1}, "write_value_unsupported"),
        ("an int past pickle's 255-byte LONG1", {"x": 2**2100}, "write_value_unsupported"),
        ("a sparse tensor whose index lies outside it",
         {"x": torch.sparse_coo_tensor([[0, 5]], [1.0, 2.0], (3,), check_invariants=False)},
         "sparse_index_out_of_bounds"),
        ("a NumPy string array", {"x": np.array(["a"])}, "write_value_unsupported"),
    ]:
        target = os.path.join(tmp, "refused", "file.pt")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        expect_error(report, f"save of {what}", code, lambda t=target, v=value: holdpoint.save(t, v))
        left = os.listdir(os.path.dirname(target))
        report.check(left == [], f"save of {what} left {left}")
    # An existing file is replaced whole or not at all.
    holdpoint.save(path, {"x": torch.ones(3)})
    expect_error(report, "failed overwrite", "write_value_unsupported",
                 lambda: holdpoint.save(path, {"x": frozenset({1})}))
    report.check(torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(3)),
                 "a failed save damaged the existing file")


def check_corpus(report):
    rows = {}
    with open(os.path.join(harness.SOURCE_DIR, "tests", "corpus_verdicts.tsv")) as f:
        for line in f:
            if line.startswith(("#", "path\t")) or not line.strip():
                continue
            path, verdict, code, _ = line.rstrip("\n").split("\t", 3)
            rows[path] = (verdict, code)
    refused = accepted = 0
    for rel, (verdict, code) in sorted(rows.items()):
        path = os.path.join(harness.CORPUS_DIR, rel)
        if verdict == "reject":
            if code == "?":
                continue
            refused += 1
            expect_error(report, f"corpus {rel}: load", code, lambda p=path: holdpoint.load(p, tensors="numpy"))
            expect_error(report, f"corpus {rel}: verify", code, lambda p=path: holdpoint.verify(p))
        else:
            accepted += 1
            try:
                holdpoint.verify(path)
                holdpoint.load(path)
            except holdpoint.Error as error:
                report.check(False, f"corpus {rel}: refused from Python ({error.code}: {error})")
    report.check(refused >= 50 and accepted >= 20, f"corpus rows: {refused} refused, {accepted} accepted")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def check_lifetime(report, tmp):
    # 32 tensors of 4 MiB: a file of 128 MiB.
    path = os.path.join(tmp, "big.pt")
    torch.save({f"w{i}": torch.full((1 << 20,), float(i)) for i in range(32)}, path)
    file_bytes = os.path.getsize(path)
    gc.collect()
    before = rss_bytes()
    loaded = holdpoint.load(path)
    loaded_rss = rss_bytes()
    report.check(loaded_rss - before > file_bytes * 0.8, f"the load did not take its snapshot ({loaded_rss - before})")
    # The file changes on disk after the load: what was returned does not.
    with open(path, "r+b") as f:
        f.seek(file_bytes // 2)
        f.write(b"\xff" * 4096)
        f.flush()
        os.fsync(f.fileno())
    report.check(all(float(loaded[f"w{i}"][12345]) == float(i) for i in range(32)),
                 "a change on disk reached tensors already returned")
    # One view outlives the mapping and everything else.
    keep = loaded["w7"][10:20]
    del loaded
    gc.collect()
    report.check(torch.equal(keep, torch.full((10,), 7.0)), "a view did not outlive the rest of the load")
    keep += 1  # the load's private memory is writable, as torch.load's tensors are
    report.check(float(keep[0]) == 8.0, "a returned tensor is not writable")
    del keep
    gc.collect()
    after = rss_bytes()
    report.check(after - before < file_bytes * 0.2,
                 f"the snapshot was not released with the last view: {(after - before) >> 20} MiB left of "
                 f"{file_bytes >> 20} MiB")
    # NumPy views hold it the same way (the file was damaged above: write it again).
    torch.save({f"w{i}": torch.full((1 << 20,), float(i)) for i in range(32)}, path)
    gc.collect()
    before = rss_bytes()
    arrays = holdpoint.load(path, tensors="numpy")
    one = arrays["w3"]
    del arrays
    gc.collect()
    report.check(float(one[100]) == 3.0 and rss_bytes() - before > file_bytes * 0.8,
                 "a NumPy view did not keep the snapshot")
    del one
    gc.collect()
    report.check(rss_bytes() - before < file_bytes * 0.2, "NumPy views did not release the snapshot")


def check_overwritten_while_loading(report, tmp):
    """Bytes changed on disk while a load with an expected digest reads the file: the
    load either returns exactly the saved values (the change came after its read) or
    refuses; it never returns the changed bytes."""
    import random as rnd
    import threading

    path = os.path.join(tmp, "racing.pt")
    torch.save({f"w{i}": torch.full((1 << 18,), float(i)) for i in range(64)}, path)
    digest = sha256_of(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        original = f.read()
    outcomes = {"returned": 0, "refused": 0}
    rng = rnd.Random(5)
    for _ in range(8):
        offset = rng.randrange(size // 8, size - 8192)
        delay = rng.uniform(0, 0.1)

        def overwrite(offset=offset, delay=delay):
            time.sleep(delay)
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(b"\xa5" * 4096)

        writer = threading.Thread(target=overwrite)
        writer.start()
        try:
            loaded = holdpoint.load(path, expected_sha256=digest)
            outcomes["returned"] += 1
            report.check(all(bool((loaded[f"w{i}"] == float(i)).all()) for i in range(64)),
                         "a load returned bytes changed on disk while it read them")
        except holdpoint.Error as error:
            outcomes["refused"] += 1
            report.check(error.code in ("sha256_mismatch", "zip_crc_mismatch"),
                         f"an overwritten file was refused with {error.code}")
        writer.join()
        with open(path, "wb") as f:
            f.write(original)
    report.check(sum(outcomes.values()) == 8, f"overwrite outcomes {outcomes}")
    print(f"  overwritten while loading: {outcomes}")


def check_verify_inspect(report, tmp):
    path = os.path.join(tmp, "v.pt")
    holdpoint.save(path, {"w": torch.ones(2, 3), "step": 4})
    report.check(holdpoint.verify(path)["valid"], "verify")
    report.check(holdpoint.verify(path, sidecar=True)["digest_checked"], "verify with the sidecar")
    info = holdpoint.inspect(path)
    tensor = info["tree"]["w"]
    report.check(isinstance(tensor, holdpoint.TensorInfo) and tensor["shape"] == [2, 3]
                 and tensor["dtype"] == "float32",
                 f"inspect tree {info['tree']}")
    report.check(any(r["name"] == "data.pkl" for r in info["records"]), "inspect records")
    with open(path + ".sha256", "w") as f:
        f.write("0" * 64 + "  v.pt\n")
    expect_error(report, "verify against a wrong sidecar", "sha256_mismatch",
                 lambda: holdpoint.verify(path, sidecar=True))
    expect_error(report, "verify with both digests", "invalid_argument",
                 lambda: holdpoint.verify(path, sidecar=True, expected_sha256="0" * 64))
    text_path = os.path.join(tmp, "t.pt")
    with open(text_path, "w") as f:
        f.write("hello")
    expect_error(report, "verify of text", "unknown_format", lambda: holdpoint.verify(text_path))

    # Without torch (blocked in a child): NumPy arrays by default, a clear refusal for tensors="torch".
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy, holdpoint\n"
            f"r = holdpoint.load({path!r})\n"
            "assert isinstance(r['w'], numpy.ndarray) and r['w'].shape == (2, 3), r\n"
            "try:\n"
            f"    holdpoint.load({path!r}, tensors='torch')\n"
            "except holdpoint.Error as e:\n"
            "    print(e.code)\n")
    env_no_torch = dict(os.environ, PYTHONPATH=os.path.join(harness.BUILD_DIR, "python"))
    no_torch = subprocess.run([sys.executable, "-c", code], env=env_no_torch, capture_output=True, text=True)
    report.check(no_torch.returncode == 0 and no_torch.stdout.strip() == "invalid_argument",
                 f"without torch: {no_torch.stdout} {no_torch.stderr[-300:]}")

    # python -m holdpoint mirrors the CLI's exit codes.
    env = dict(os.environ, PYTHONPATH=os.path.join(harness.BUILD_DIR, "python"))
    ok = subprocess.run([sys.executable, "-m", "holdpoint", "verify", path], env=env, capture_output=True, text=True)
    report.check(ok.returncode == 0 and ok.stdout.startswith("valid: "), f"python -m holdpoint verify: {ok}")
    bad = subprocess.run([sys.executable, "-m", "holdpoint", "verify", path, "--sidecar"], env=env,
                         capture_output=True, text=True)
    report.check(bad.returncode == 1 and "sha256_mismatch" in bad.stdout, f"python -m holdpoint verify bad: {bad}")
    missing = subprocess.run([sys.executable, "-m", "holdpoint", "inspect", os.path.join(tmp, "none.pt")], env=env,
                             capture_output=True, text=True)
    report.check(missing.returncode == 2 and "io_open_failed" in missing.stdout,
                 f"inspect of a missing file: {missing}")
    shown = subprocess.run([sys.executable, "-m", "holdpoint", "inspect", path], env=env, capture_output=True,
                           text=True)
    report.check(shown.returncode == 0 and "Tensor float32 [2, 3]" in shown.stdout, f"inspect output: {shown.stdout}")


def check_load_model_state(report, tmp):
    weights = {"layer.weight": torch.ones(2), "layer.bias": torch.zeros(2)}
    for layout in ({"state_dict": weights, "epoch": 1}, {"model_state_dict": weights, "optimizer_state_dict": {}},
                   {"model": weights}, weights):
        path = os.path.join(tmp, "layout.pt")
        torch.save(layout, path)
        got = holdpoint.load_model_state(path)
        report.check(list(got) == list(weights), f"load_model_state of {list(layout)}: {list(got)}")
    torch.save({"weights_here": weights}, path)
    report.check(list(holdpoint.load_model_state(path, key="weights_here")) == list(weights), "load_model_state key=")
    expect_error(report, "load_model_state without a model", "legacy_layout_unrecognized",
                 lambda: holdpoint.load_model_state(path))


def check_run_directory(report, tmp):
    run_path = os.path.join(tmp, "run")
    run = holdpoint.RunDirectory(run_path, best_metric="loss")
    for step, loss in ((5, 0.5), (10, 0.7)):
        run.commit({"model": {"w": torch.full((3,), float(step))}, "progress": {"step": step}}, step=step,
                   metrics={"loss": loss})
    report.check([g["step"] for g in run.generations()] == [5, 10], f"generations {run.generations()}")
    report.check(run.latest()["step"] == 10 and run.best()["step"] == 5, "latest/best")
    report.check(torch.equal(run.load()["model"]["w"], torch.full((3,), 10.0)), "load latest")
    report.check(torch.equal(run.load("best")["model"]["w"], torch.full((3,), 5.0)), "load best")
    report.check(run.verify()["ok"], "verify latest")
    expect_error(report, "commit of a list", "invalid_argument", lambda: run.commit([1], step=20))
    expect_error(report, "commit naming the manifest", "invalid_argument",
                 lambda: run.commit({"holdpoint": {"x": 1}}, step=20))
    report.check(run.latest()["step"] == 10, "a refused commit moved LATEST")
    cli = harness.run([harness.holdpoint_binary(), "verify", run_path])
    report.check(cli.returncode == 0, f"the C++ CLI refuses a run written from Python: {cli.describe()}")
    # A generation damaged on disk is refused by its recorded digest.
    latest = run.file_path("latest")
    with open(latest, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 1]))
    expect_error(report, "load of a damaged generation", "sha256_mismatch", lambda: run.load())
    report.check(run.verify()["code"] == "sha256_mismatch", f"verify of a damaged generation: {run.verify()}")
    expect_error(report, "unknown generation", "invalid_argument", lambda: run.load("step-99.pt"))
    reopened = holdpoint.RunDirectory(run_path, recover=False)
    report.check(reopened.latest() is not None, "a read-only open lost LATEST")


def check_error_codes(report):
    codes = holdpoint.error_codes()
    header = open(os.path.join(harness.SOURCE_DIR, "include", "holdpoint", "base", "error.h")).read()
    import re

    listed = re.findall(r"^\s*X\((\w+),", header, re.M)
    report.check(list(codes) == listed, "error_codes() differs from include/holdpoint/base/error.h")
    report.check(issubclass(holdpoint.Error, Exception), "holdpoint.Error is not an Exception")
    import pickle

    error = holdpoint.Error("m", "sha256_mismatch", "/p", "d")
    copy = pickle.loads(pickle.dumps(error))
    report.check((copy.code, copy.path, copy.detail) == ("sha256_mismatch", "/p", "d"), "Error does not pickle")


def main():
    report = harness.Report("python_package")
    tmp = tempfile.mkdtemp(prefix="holdpoint-python-")
    try:
        check_load_matches_torch(report, tmp)
        check_rng_states(report, tmp)
        check_big_integers(report, tmp)
        check_save(report, tmp)
        check_corpus(report)
        check_lifetime(report, tmp)
        check_overwritten_while_loading(report, tmp)
        check_verify_inspect(report, tmp)
        check_load_model_state(report, tmp)
        check_run_directory(report, tmp)
        check_error_codes(report)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
