"""holdpoint.dcp: holdpoint as the storage layer of torch.distributed.checkpoint.

Spawned Gloo worlds on this host (the two-host world is test_dcp_hosts.py):
- 4 ranks: an FSDP2 (fully_shard) model and its Adam state through
  get_state_dict, a DTensor sharded on dim 0, plain values; dcp.save and
  dcp.async_save (thread) through StorageWriter, the first signed; dcp.load through
  StorageReader into a fresh FSDP2 model equals what was saved, bit for bit;
  then one byte of rank 3's file flipped after commit: every rank refuses the load
  and no rank's live state changed;
- 2 and 3 ranks: the 4-rank generation resharded (the model under FSDP2 and the
  DTensor); the stock FileSystemReader loads the same folder (no lock-in);
  dcp.async_save's process variant saves through StorageWriter and loads back.
In this process: the generation's records (kind dcp, the step manifest listing
every file and range), `holdpoint ls` and `verify`, and each refusal with its code:
a flipped and a truncated .distcp, an edited .metadata, a file added to the folder,
a .metadata whose items the manifest does not list, an unsigned generation under
a trust policy, a value that is not plain data at save, a non-dcp generation.
"""

import json
import os
import shutil
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import harness  # noqa: E402

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402
import holdpoint.dcp  # noqa: E402


def _init(rank, world, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def _fsdp_model(mesh, seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.ReLU(), torch.nn.Linear(12, 6))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(100 + seed)
    for _ in range(2):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def _table(mesh):
    from torch.distributed.tensor import Shard, distribute_tensor

    return distribute_tensor(torch.arange(60, dtype=torch.float64).reshape(12, 5), mesh, [Shard(0)])


def _full(state):
    """Every DTensor made whole, every tensor cloned (collectives: all ranks call it)."""
    from torch.distributed.tensor import DTensor

    if isinstance(state, dict):
        return {k: _full(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_full(v) for v in state]
    if isinstance(state, DTensor):
        return state.full_tensor().clone()
    if isinstance(state, torch.Tensor):
        return state.clone()
    return state


def _same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return a == b


def _state(model, optimizer, mesh):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "table": _table(mesh),
            "extra": {"epoch": 3, "note": "fsdp2", "lrs": [0.01, 0.001]}}


def _four_ranks(rank, world, init_file, run, key, out):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    mesh = _init(rank, world, init_file)
    results = {}
    model, optimizer = _fsdp_model(mesh, seed=0)
    state = _state(model, optimizer, mesh)
    expected = _full(state)
    dcp.save(state, storage_writer=holdpoint.dcp.StorageWriter(run, step=10, signing_key=key, epoch=1))
    future = dcp.async_save(state, storage_writer=holdpoint.dcp.StorageWriter(run, step=20, signing_key=key))
    future.result()
    if rank == 0:
        torch.save(expected, os.path.join(out, "expected.pt"))

    # A fresh model with other weights, loaded from each generation.
    for step in (10, 20):
        fresh, fresh_optimizer = _fsdp_model(mesh, seed=1)
        target = _state(fresh, fresh_optimizer, mesh)
        target["table"] = _table(mesh) * 0
        target["extra"] = {"epoch": 0, "note": "", "lrs": [0.0, 0.0]}
        reader = holdpoint.dcp.StorageReader(run, generation=step)
        dcp.load(target, storage_reader=reader)
        set_state_dict(fresh, fresh_optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        results[f"load {step}"] = _same(_full(target), expected)
        results[f"load {step}: reader names the generation"] = reader.loaded["step"] == step

    # One flipped byte in rank 3's file, after commit: rank 3 finds it, and every
    # rank refuses (items no rank loads, such as rank 3's empty chunks of the
    # second layer, are not read at all: holdpoint verify finds damage there).
    dist.barrier()
    if rank == 0:
        path = os.path.join(run, "checkpoints", "step-00000020.shards", "__3_0.distcp")
        with open(path, "r+b") as f:
            # In the last item of the file: a chunk that only rank 3 loads.
            f.seek(os.path.getsize(path) - 100)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x55]))
    dist.barrier()
    victim, victim_optimizer = _fsdp_model(mesh, seed=2)
    target = _state(victim, victim_optimizer, mesh)
    before = _full(target)
    try:
        dcp.load(target, storage_reader=holdpoint.dcp.StorageReader(run, generation=20))
        results["tampered load refused"] = False
    except BaseException as error:  # noqa: BLE001 - DCP wraps each rank's error in a CheckpointException
        text = str(error)
        results["tampered load refused"] = True
        wanted = "[shard_digest_mismatch]" if rank == 3 else "[distributed_rank_failed]"
        results[f"tampered load: {wanted} on rank {rank}"] = wanted in text
    results["tampered load: live state unchanged"] = _same(_full(target), before)
    with open(os.path.join(out, f"four-{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _resharded(rank, world, init_file, run, out):
    from torch.distributed.checkpoint.state_dict import set_state_dict

    mesh = _init(rank, world, init_file)
    expected = torch.load(os.path.join(out, "expected.pt"), weights_only=True)
    results = {}
    model, optimizer = _fsdp_model(mesh, seed=3)
    target = _state(model, optimizer, mesh)
    target["table"] = _table(mesh) * 0
    dcp.load(target, storage_reader=holdpoint.dcp.StorageReader(run, generation=10))
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    full = _full(target)
    results["model"] = _same(full["model"], expected["model"])
    results["optimizer"] = _same(full["optim"], expected["optim"])
    results["table"] = _same(full["table"], expected["table"])
    results["values"] = full["extra"] == expected["extra"]
    # Stock DCP reads the same folder.
    stock = {"table": _table(mesh) * 0, "extra": {"epoch": 0, "note": "", "lrs": [0.0, 0.0]}}
    folder = os.path.join(run, "checkpoints", "step-00000010.shards")
    dcp.load(stock, storage_reader=dcp.FileSystemReader(folder))
    results["stock FileSystemReader"] = _same(_full(stock)["table"], expected["table"]) and \
        stock["extra"] == expected["extra"]
    # dcp.async_save's process variant: the writer travels to a background process.
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    own = os.path.join(out, f"process-variant-{world}")
    saved = {"table": _table(mesh), "extra": {"epoch": 9, "note": "process", "lrs": [1.0, 2.0]}}
    dcp.async_save(saved, storage_writer=holdpoint.dcp.StorageWriter(own, step=30),
                   async_checkpointer_type=AsyncCheckpointerType.PROCESS).result()
    dist.barrier()
    back = {"table": _table(mesh) * 0, "extra": {"epoch": 0, "note": "", "lrs": [0.0, 0.0]}}
    reader = holdpoint.dcp.StorageReader(own)
    dcp.load(back, storage_reader=reader)
    results["async_save, process variant"] = reader.loaded["step"] == 30 and \
        _same(_full(back)["table"], expected["table"]) and back["extra"] == saved["extra"]
    with open(os.path.join(out, f"world{world}-{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _spawn(report, label, fn, world, args, out, prefix):
    init_file = os.path.join(out, f"init-{prefix}")
    try:
        mp.start_processes(fn, args=(world, init_file, *args), nprocs=world, join=True, start_method="spawn")
    except Exception as error:  # noqa: BLE001
        report.check(False, f"{label}: a rank failed: {error}")
        return
    for rank in range(world):
        path = os.path.join(out, f"{prefix}-{rank}.json")
        if not report.check(os.path.exists(path), f"{label}: rank {rank} reported"):
            continue
        with open(path) as f:
            for what, ok in json.load(f).items():
                report.check(ok, f"{label}, rank {rank}: {what}")


def expect_error(report, label, code, call):
    """DCP hands a rank's refusal back inside its CheckpointException (or an
    AssertionError for read_metadata); holdpoint puts "[code]" in the text."""
    try:
        call()
    except holdpoint.Error as error:
        return report.check(error.code == code, f"{label}: code {error.code}, expected {code} ({error})")
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as error:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        return report.check(f"[{code}]" in str(error), f"{label}: expected [{code}] in {type(error).__name__}: {error}")
    return report.check(False, f"{label}: no error, expected {code}")


def damage(run, name):
    """The code a read-only open finds generation `name` damaged with, or None."""
    for check in holdpoint.RunDirectory(run, recover=False)._run.damaged():
        if check["name"] == name:
            return check["code"]
    return None


def _single_process_checks(report, tmp, key):
    """Refusals, each with its code, on one-process generations."""
    plain = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3, dtype=torch.bfloat16),
             "n": 7, "tags": {"a": "x", "t": (1, 2)}}

    def fresh():
        return {"w": torch.zeros(3, 4), "b": torch.zeros(3, dtype=torch.bfloat16), "n": 0,
                "tags": {"a": "", "t": None}}

    def save(run, **kwargs):
        dcp.save(plain, storage_writer=holdpoint.dcp.StorageWriter(run, **kwargs))

    def load(run, **kwargs):
        target = fresh()
        dcp.load(target, storage_reader=holdpoint.dcp.StorageReader(run, **kwargs))
        return target

    run = os.path.join(tmp, "single")
    save(run)
    save(run)
    generations = holdpoint.RunDirectory(run, recover=False).generations()
    report.check([(g["step"], g["kind"], g["world_size"]) for g in generations] == [(0, "dcp", 1), (1, "dcp", 1)],
                 f"steps 0 and 1 committed as kind dcp: {generations}")
    loaded = load(run)
    report.check(torch.equal(loaded["w"], plain["w"]) and torch.equal(loaded["b"], plain["b"]) and
                 loaded["n"] == 7 and loaded["tags"] == {"a": "x", "t": (1, 2)}, f"one-process round trip: {loaded}")
    root, _ = holdpoint.RunDirectory(run, recover=False)._run.load("latest", holdpoint.TensorFactory("torch"))
    layout = root["holdpoint"]["dcp"]
    names = [f["name"] for f in layout["files"]]
    report.check(names == [".metadata", "__0_0.distcp"], f"the step manifest lists the folder's files: {names}")
    data = layout["files"][1]
    report.check(len(data["ranges"]) == 5 and sum(r[1] for r in data["ranges"]) == data["size"],
                 f"one digested range per item, tiling the file: {data['ranges']}")
    ls = harness.cli("ls", run, "--json")
    report.check(ls.returncode == 0 and '"kind":"dcp"' in ls.stdout.replace(" ", ""), f"holdpoint ls: {ls.describe()}")
    verify = harness.cli("verify", run)
    report.check(verify.returncode == 0, f"holdpoint verify RUN: {verify.describe()}")
    verify = harness.cli("verify", os.path.join(run, "checkpoints", "step-00000001.pt"))
    report.check(verify.returncode == 0 and "DCP step manifest" in verify.stdout and "6 items verified" in verify.stdout,
                 f"holdpoint verify STEP_MANIFEST checks its folder: {verify.describe()}")

    folder = os.path.join(run, "checkpoints", "step-00000001.shards")
    data_file = os.path.join(folder, "__0_0.distcp")
    pristine = open(data_file, "rb").read()

    def restore():
        with open(data_file, "wb") as f:
            f.write(pristine)

    flipped = bytearray(pristine)
    flipped[len(flipped) - 40] ^= 1
    with open(data_file, "wb") as f:
        f.write(flipped)
    # Data bytes are checked as they are read, and by a full verify.
    expect_error(report, "a flipped byte in a .distcp", "shard_digest_mismatch", lambda: load(run))
    report.check(holdpoint.RunDirectory(run, recover=False).verify("step-00000001.pt")["code"] ==
                 "shard_digest_mismatch", "verify finds the flipped byte")
    verify = harness.cli("verify", run)
    report.check(verify.returncode != 0 and "shard_digest_mismatch" in verify.stdout + verify.stderr,
                 f"holdpoint verify RUN finds the flipped byte: {verify.describe()}")
    manifest_file = os.path.join(run, "checkpoints", "step-00000001.pt")
    verify = harness.cli("verify", manifest_file)
    report.check(verify.returncode != 0 and "shard_digest_mismatch" in verify.stdout + verify.stderr,
                 f"holdpoint verify STEP_MANIFEST finds the flipped byte: {verify.describe()}")
    # A truncated file is seen when the run is opened: "latest" is then the newest
    # generation that verifies, as a resume takes it, with a warning.
    with open(data_file, "wb") as f:
        f.write(pristine[:-10])
    report.check(damage(run, "step-00000001.pt") == "shard_size_mismatch", "an open finds the truncated file")
    expect_error(report, "a truncated .distcp, asked for by step", "shard_size_mismatch",
                 lambda: load(run, generation=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = holdpoint.dcp.StorageReader(run)
        dcp.load(fresh(), storage_reader=reader)
    report.check(reader.loaded["step"] == 0 and any("does not verify" in str(w.message) for w in caught),
                 f"latest falls back past the damaged generation, with a warning: {reader.loaded} {reader.recovery}")
    restore()
    report.check(torch.equal(load(run)["w"], plain["w"]), "restored, it loads again")

    with open(os.path.join(folder, "extra.distcp"), "wb") as f:
        f.write(b"planted")
    check = damage(run, "step-00000001.pt")
    report.check(check == "dcp_file_unlisted", f"a file added to the folder: {check}")
    os.remove(os.path.join(folder, "extra.distcp"))

    metadata_file = os.path.join(folder, ".metadata")
    metadata = open(metadata_file, "rb").read()
    with open(metadata_file, "wb") as f:
        f.write(metadata.replace(b"__0_0.distcp", b"__0_1.distcp"))
    expect_error(report, "an edited .metadata", "shard_digest_mismatch", lambda: load(run, generation=1))
    with open(metadata_file, "wb") as f:
        f.write(metadata)
    os.symlink(data_file, os.path.join(folder, "link.distcp"))
    check = damage(run, "step-00000001.pt")
    report.check(check == "dcp_file_unlisted", f"a symlink added to the folder: {check}")
    os.remove(os.path.join(folder, "link.distcp"))

    # A step manifest whose ranges are not the items .metadata places (a writer
    # that lies): the folder's digests match, the cross-check refuses.
    liar = os.path.join(tmp, "liar")
    save(liar, step=3)
    native = holdpoint.dcp._coordinator_run(liar, None)[0]
    shutil.copytree(os.path.join(liar, "checkpoints", "step-00000003.shards"),
                    os.path.join(liar, "checkpoints", "copy"))
    folder4 = str(native.prepare_dcp_folder(4))
    files = []
    for name in (".metadata", "__0_0.distcp"):
        body = open(os.path.join(liar, "checkpoints", "copy", name), "rb").read()
        chunks = [body] if name == ".metadata" else [body[:100], body[100:]]
        files.append(holdpoint._native.write_dcp_file(folder4, name, chunks, False, holdpoint.tensor_parts))
    shutil.rmtree(os.path.join(liar, "checkpoints", "copy"))
    native.commit_dcp(4, 0, 1, files, {}, holdpoint._training.plain_spec("liar"))
    check = damage(liar, "step-00000004.pt")
    report.check(check == "dcp_range_unlisted", f"ranges the .metadata does not use: {check}")
    expect_error(report, "loading ranges the manifest does not list", "dcp_range_unlisted",
                 lambda: load(liar, generation=4))

    # Signatures: a signed run loads under trust; an unsigned one is refused.
    trust = holdpoint.TrustPolicy([key + ".pub"])
    signed = os.path.join(tmp, "signed")
    save(signed, signing_key=key)
    save(signed, signing_key=key)
    report.check(torch.equal(load(signed, trust=trust)["w"], plain["w"]), "a signed generation loads under trust")
    checks = holdpoint.RunDirectory(signed, recover=False).verify_signatures(trust)
    report.check(all(c["ok"] for c in checks), f"the run's signatures verify: {checks}")
    expect_error(report, "an unsigned generation under trust", "signature_missing", lambda: load(run, trust=trust))
    # export copies the folders; gc removes them with their manifests.
    holdpoint.dcp.close_runs()  # the CLI takes the run's lock
    exported = os.path.join(tmp, "exported")
    r = harness.cli("export", signed, exported, "--all")
    report.check(r.returncode == 0, f"holdpoint export --all of a DCP run: {r.describe()}")
    back = fresh()
    dcp.load(back, storage_reader=holdpoint.dcp.StorageReader(exported, generation=0, trust=trust))
    report.check(torch.equal(back["w"], plain["w"]) and back["n"] == 7, "the exported generation loads under trust")
    report.check(holdpoint.RunDirectory(exported, recover=False).verify("step-00000000.pt")["ok"],
                 "the exported generation verifies in full")
    r = harness.cli("gc", run, "--keep", "1")
    report.check(r.returncode == 0, f"holdpoint gc --keep 1: {r.describe()}")
    left = sorted(os.listdir(os.path.join(run, "checkpoints")))
    report.check("step-00000000.shards" not in left and "step-00000000.pt" not in left and
                 "step-00000001.shards" in left, f"gc removed step 0's manifest and folder: {left}")

    sig = os.path.join(signed, "checkpoints", "step-00000001.pt.sig")
    os.remove(sig)
    expect_error(report, "a removed signature under trust", "signature_missing", lambda: load(signed, trust=trust))

    # Writes: what the restricted reader could not read back is refused at save.
    odd = os.path.join(tmp, "odd")
    expect_error(report, "a value that is not plain data", "write_value_unsupported",
                 lambda: dcp.save({"w": torch.ones(2), "odd": {"f": __import__("fractions").Fraction(1, 3)}},
                                  storage_writer=holdpoint.dcp.StorageWriter(odd)))
    report.check(holdpoint.RunDirectory(odd, recover=False).latest() is None, "the refused save committed nothing")
    # A run whose LATEST is not a DCP generation.
    other = os.path.join(tmp, "other")
    holdpoint.RunDirectory(other).commit({"model": {"w": torch.ones(2)}}, step=1)
    expect_error(report, "a generation of another kind", "checkpoint_kind_mismatch", lambda: load(other))


def main():
    report = harness.Report("dcp_storage")
    tmp = tempfile.mkdtemp(prefix="holdpoint-dcp-storage-")
    try:
        key = os.path.join(tmp, "key")
        r = harness.cli("keygen", key)
        report.check(r.returncode == 0, f"keygen: {r.describe()}")
        _single_process_checks(report, tmp, key)
        run = os.path.join(tmp, "fsdp-run")
        _spawn(report, "4 ranks", _four_ranks, 4, (run, key, tmp), tmp, "four")
        for world in (2, 3):
            _spawn(report, f"{world} ranks", _resharded, world, (run, tmp), tmp, f"world{world}")
        trust = holdpoint.TrustPolicy([key + ".pub"])
        generation = holdpoint.RunDirectory(run, recover=False).generations()[0]
        report.check(generation["world_size"] == 4 and generation["kind"] == "dcp", f"step 10: {generation}")
        report.check(holdpoint.RunDirectory(run, recover=False).verify("step-00000010.pt")["ok"],
                     "the 4-rank generation verifies")
        report.check(os.path.exists(os.path.join(run, "checkpoints", "step-00000010.pt.sig")),
                     "the signed save left a signature")
        checks = holdpoint.RunDirectory(run, recover=False).verify_signatures(
            holdpoint.TrustPolicy([key + ".pub"], required=False))
        report.check(all(c["ok"] for c in checks), f"signatures of the 4-rank run: {checks}")
        del trust
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
