"""Python peer for bench/checkpoint_bench: times torch.save (+ fsync) and
torch.load(weights_only=True) of the same state shape with Debian's torch 1.13.

Prints one line: "save <seconds> load <seconds>" (medians)."""
import argparse
import os
import statistics
import time
from collections import OrderedDict

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tensors", type=int, required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    state = OrderedDict(
        (f"layer{i}.weight", torch.rand(args.elements)) for i in range(args.tensors))

    saves, loads = [], []
    for _ in range(args.repeat):
        if os.path.exists(args.path):
            os.remove(args.path)
        start = time.perf_counter()
        with open(args.path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        saves.append(time.perf_counter() - start)
    for _ in range(args.repeat):
        # The previous result is released before the clock starts, as the C++
        # side does.
        loaded = None
        start = time.perf_counter()
        loaded = torch.load(args.path, weights_only=True)
        loads.append(time.perf_counter() - start)
        assert len(loaded) == args.tensors
    os.remove(args.path)
    print(f"save {statistics.median(saves):.6f} load {statistics.median(loads):.6f}")


if __name__ == "__main__":
    main()
