"""torch.distributed.checkpoint folders, written by torch 2.13's own dcp.save, read by
holdpoint.load without executing anything:

- one process: a model, an Adam state (int-keyed), plain values, half and bfloat16
  tensors and a NumPy RNG state; what holdpoint returns equals DCP's own template-free
  load (dcp_to_torch_save, then torch.load), value for value, and dcp.load into a
  template agrees on every tensor;
- two Gloo ranks saving DTensors sharded on dim 0 and dim 1: the chunks from both
  ranks' .distcp files are assembled into the same whole tensors;
- the decoded .metadata lists the same items, files, offsets and lengths as DCP reads;
- every refusal, each with its code: a file name leaving the folder, a range past the
  file's end, a missing .distcp, an item storage_data does not list, a stream
  transform, chunks that do not tile their tensor, a chunk of the wrong shape, a
  forbidden global in .metadata, and a value DCP itself would unpickle by running
  code (weights_only=False), which holdpoint refuses.
"""

import copy
import fractions
import os
import pickle
import shutil
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: E402

import harness  # noqa: E402
import live_tree  # noqa: E402

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

METADATA = "torch.distributed.checkpoint.metadata."


def dcp_own_load(folder, tmp):
    """DCP's template-free load: dcp_to_torch_save, then a trusted torch.load of the
    file this test just wrote."""
    out = os.path.join(tmp, "dcp_to_torch_save.pt")
    dcp_to_torch_save(folder, out)
    return torch.load(out, weights_only=False)


def expect_error(report, label, code, call):
    return harness.expect_raises(report, label, code, call, holdpoint.Error)


def single_process_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "step": 7,
        "extra": {"name": "run-1", "lst": [1, 2.5, None], "nested": {"deep": torch.arange(6).reshape(2, 3)}},
        "half": torch.linspace(0, 1, 5, dtype=torch.float16),
        "bf": torch.randn(3, 4).to(torch.bfloat16),
        "numpy_rng": np.random.RandomState(3).get_state(),
    }


def check_single_process(report, tmp):
    folder = os.path.join(tmp, "single")
    state = single_process_state()
    dcp.save(state, checkpoint_id=folder)
    want = dcp_own_load(folder, tmp)
    got = holdpoint.load(folder)
    diff = live_tree.first_difference(got, want)
    report.check(diff is None, f"one process: differs from DCP's own template-free load: {diff}")
    # DCP flattens a dict's int keys to str and a list's indices to ints.
    report.check(list(got["optim"]["state"]) == ["0", "1", "2", "3"] and isinstance(got["optim"]["param_groups"], list),
                 "one process: optimizer state keyed by '0'..'3', param_groups a list, as DCP's unflatten gives them")
    report.check(got["numpy_rng"][0] == "MT19937" and isinstance(got["numpy_rng"][1], np.ndarray),
                 "one process: the NumPy RNG state comes back as data")

    # dcp.load into a template (the usual way) agrees on every tensor.
    template = copy.deepcopy(single_process_state())
    for tensor in [template["half"], template["bf"], template["extra"]["nested"]["deep"]]:
        tensor.zero_()
    dcp.load(template, checkpoint_id=folder)
    for name, tensor in template["model"].items():
        report.check(torch.equal(got["model"][name], tensor), f"one process: model.{name} differs from dcp.load")
    for name in ("half", "bf"):
        report.check(torch.equal(got[name], template[name]), f"one process: {name} differs from dcp.load")


    # The decoded .metadata lists what DCP itself reads.
    meta = holdpoint.load_distributed_checkpoint(folder, metadata_only=True)
    theirs = dcp.FileSystemReader(folder).read_metadata()
    report.check(meta["__class__"] == METADATA + "Metadata", f"metadata: root class {meta.get('__class__')}")
    report.check(list(meta["state_dict_metadata"]) == list(theirs.state_dict_metadata),
                 "metadata: the same item names in the same order")
    ours = {(key["fqn"], key.get("offset")): (info["relative_path"], info["offset"], info["length"])
            for key, info in meta["storage_data"]}
    expected = {(key.fqn, tuple(key.offset) if key.offset is not None else None):
                (info.relative_path, info.offset, info.length) for key, info in theirs.storage_data.items()}
    mismatched = sorted(set(ours.items()) ^ set(expected.items()), key=repr)[:3]
    report.check(ours == expected, f"metadata: storage_data differs: {mismatched}")
    weight = meta["state_dict_metadata"]["model.0.weight"]
    report.check(weight["__class__"] == METADATA + "TensorStorageMetadata" and weight["size"] == (3, 4) and
                 weight["properties"]["dtype"] is torch.float32 and weight["properties"]["layout"] is torch.strided and
                 isinstance(weight["size"], torch.Size) and
                 weight["properties"]["memory_format"] == "torch.contiguous_format" and
                 weight["chunks"][0]["offsets"] == (0, 0), f"metadata: model.0.weight reads as {weight}")
    return folder


# ---- two ranks --------------------------------------------------------------------------------

def _rank_main(rank, world, folder, init_file):
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(1)
        rows = torch.randn(6, 5)
        cols = torch.arange(4 * 7, dtype=torch.float64).reshape(4, 7)
        state = {"rows": distribute_tensor(rows, mesh, [Shard(0)]),
                 "layer": {"cols": distribute_tensor(cols, mesh, [Shard(1)])},
                 "replicated": torch.ones(3) * 2, "epoch": 3}
        dcp.save(state, checkpoint_id=folder)
    finally:
        dist.destroy_process_group()


def check_two_ranks(report, tmp):
    import torch.multiprocessing as mp

    folder = os.path.join(tmp, "two_ranks")
    init_file = os.path.join(tmp, "gloo_init")
    mp.start_processes(_rank_main, args=(2, folder, init_file), nprocs=2, join=True, start_method="spawn")
    files = sorted(name for name in os.listdir(folder) if name.endswith(".distcp"))
    report.check(len(files) == 2, f"two ranks: one .distcp file per rank, found {files}")
    meta = holdpoint.load_distributed_checkpoint(folder, metadata_only=True)
    chunks = meta["state_dict_metadata"]["layer.cols"]["chunks"]
    report.check(len(chunks) == 2 and chunks[1]["offsets"] == (0, 4) and chunks[1]["sizes"] == (4, 3),
                 f"two ranks: layer.cols is saved as two column blocks: {chunks}")
    want = dcp_own_load(folder, tmp)
    got = holdpoint.load(folder)
    diff = live_tree.first_difference(got, want)
    report.check(diff is None, f"two ranks: differs from DCP's own load: {diff}")
    torch.manual_seed(1)
    rows = torch.randn(6, 5)
    report.check(torch.equal(got["rows"], rows), "two ranks: the dim-0 shards assemble into the saved tensor")
    report.check(torch.equal(got["layer"]["cols"], torch.arange(28, dtype=torch.float64).reshape(4, 7)),
                 "two ranks: the dim-1 shards assemble into the saved tensor")
    # NumPy alone: the same tensors as arrays.
    arrays = holdpoint.load_distributed_checkpoint(folder, tensors="numpy")
    report.check(isinstance(arrays["layer"]["cols"], np.ndarray) and
                 np.array_equal(arrays["layer"]["cols"], got["layer"]["cols"].numpy()),
                 "two ranks: tensors='numpy' gives the assembled NumPy arrays")
    return folder


# ---- refusals ---------------------------------------------------------------------------------

def rewrite_metadata(folder, tmp, name, change):
    """A copy of `folder` whose .metadata is DCP's own, changed by `change` and pickled
    again (by this test: the Metadata object is the one it just wrote)."""
    copy_dir = os.path.join(tmp, name)
    shutil.copytree(folder, copy_dir)
    with open(os.path.join(copy_dir, ".metadata"), "rb") as f:
        metadata = pickle.load(f)  # noqa: S301 - written by this test a moment ago
    change(metadata, copy_dir)
    with open(os.path.join(copy_dir, ".metadata"), "wb") as f:
        pickle.dump(metadata, f)
    return copy_dir


def first_tensor_item(metadata, fqn="model.0.weight"):
    for key, info in metadata.storage_data.items():
        if key.fqn == fqn:
            return key, info
    raise AssertionError(fqn)


def check_refusals(report, tmp, single, two_ranks):
    def escape(metadata, _):
        first_tensor_item(metadata)[1].relative_path = "../outside.distcp"

    def past_end(metadata, folder):
        info = first_tensor_item(metadata)[1]
        info.length = os.path.getsize(os.path.join(folder, info.relative_path)) + 1

    def unlisted(metadata, _):
        del metadata.storage_data[first_tensor_item(metadata)[0]]

    def transformed(metadata, _):
        first_tensor_item(metadata)[1].transform_descriptors = ["zstd"]

    def gap(metadata, _):
        chunk = metadata.state_dict_metadata["model.0.weight"].chunks[0]
        chunk.sizes = torch.Size([2, 4])

    def wrong_chunk(metadata, _):
        # The metadata claims one dtype, the archive holds another.
        metadata.state_dict_metadata["model.0.weight"].properties.dtype = torch.float64

    def forbidden(metadata, _):
        metadata.planner_data = fractions.Fraction(1, 3)

    def not_a_record(metadata, _):
        metadata.state_dict_metadata["step"] = {"kind": "bytes"}

    cases = [
        ("a file name leaving the folder", escape, "dcp_range_invalid"),
        ("a range past the file's end", past_end, "dcp_range_invalid"),
        ("an item storage_data does not list", unlisted, "dcp_item_missing"),
        ("a stream transform", transformed, "dcp_transform_unsupported"),
        ("chunks that leave a gap", gap, "dcp_metadata_invalid"),
        ("a chunk whose archive holds another dtype", wrong_chunk, "dcp_metadata_invalid"),
        ("a forbidden global in .metadata", forbidden, "pickle_global_forbidden"),
        ("an item that is no DCP record", not_a_record, "dcp_metadata_invalid"),
    ]
    for label, change, code in cases:
        folder = rewrite_metadata(single, tmp, label.replace(" ", "_").replace("'", ""), change)
        expect_error(report, label, code, lambda folder=folder: holdpoint.load(folder))

    missing = os.path.join(tmp, "missing_file")
    shutil.copytree(two_ranks, missing)
    os.remove(os.path.join(missing, "__1_0.distcp"))
    expect_error(report, "a missing .distcp file", "dcp_item_missing", lambda: holdpoint.load(missing))

    overlap = rewrite_metadata(two_ranks, tmp, "overlap", lambda metadata, _: setattr(
        metadata.state_dict_metadata["rows"].chunks[1], "offsets", torch.Size([2, 0])))
    expect_error(report, "overlapping chunks", "dcp_metadata_invalid", lambda: holdpoint.load(overlap))

    # A value DCP's own loader would unpickle with weights_only=False, running whatever
    # its pickle names: holdpoint reads it as the untrusted archive it is.
    hostile = os.path.join(tmp, "object_value")
    dcp.save({"w": torch.ones(2), "ratio": fractions.Fraction(1, 3)}, checkpoint_id=hostile)
    expect_error(report, "an object value DCP unpickles by running code", "pickle_global_forbidden",
                 lambda: holdpoint.load(hostile))
    expect_error(report, "an expected digest for a folder", "invalid_argument",
                 lambda: holdpoint.load(single, expected_sha256="0" * 64))


def main():
    report = harness.Report("python_dcp")
    tmp = tempfile.mkdtemp(prefix="holdpoint-dcp-")
    try:
        single = check_single_process(report, tmp)
        two_ranks = check_two_ranks(report, tmp)
        check_refusals(report, tmp, single, two_ranks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
