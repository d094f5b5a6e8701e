"""Writes tests/unit/fixtures/dcp_two_ranks: a torch.distributed.checkpoint folder that two
Gloo ranks of torch 2.13 saved with dcp.save, for the C++ test of
load_distributed_checkpoint (tests/unit/distributed_checkpoint_test.cpp), which runs on
both LibTorch configurations without Python.

Its values are arithmetic, so that the C++ test can state them:
  rows         float32 arange(30).reshape(6, 5), sharded on dim 0 (rank 0: rows 0-2)
  layer.cols   float64 arange(28).reshape(4, 7) / 4, sharded on dim 1 (rank 0: columns 0-3)
  replicated   int64 [7, 8, 9], saved once
  epoch        3 (a non-tensor item: a torch.save archive of the int)
  names        ["a", "b"]

Usage: make_dcp_fixture.py [OUTDIR]   (run by hand; the folder is committed)
"""

import os
import shutil
import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def rank_main(rank, world, folder, init_file):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        rows = torch.arange(30, dtype=torch.float32).reshape(6, 5)
        cols = torch.arange(28, dtype=torch.float64).reshape(4, 7) / 4
        state = {"rows": distribute_tensor(rows, mesh, [Shard(0)]),
                 "layer": {"cols": distribute_tensor(cols, mesh, [Shard(1)])},
                 "replicated": torch.tensor([7, 8, 9]), "epoch": 3, "names": ["a", "b"]}
        dcp.save(state, checkpoint_id=folder)
    finally:
        dist.destroy_process_group()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "unit", "fixtures", "dcp_two_ranks")
    tmp = tempfile.mkdtemp()
    try:
        folder = os.path.join(tmp, "dcp")
        mp.start_processes(rank_main, args=(2, folder, os.path.join(tmp, "init")), nprocs=2, join=True,
                           start_method="spawn")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(folder, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(out)


if __name__ == "__main__":
    main()
