"""The Python package's load against Python's peers, in the same run (issue 14):

    python bench/python_load_bench.py [--repeat R] [--mib M] [--tensors N] [--dir DIR]

Two states, each saved once with torch.save (and once with safetensors):
  * N small tensors (default 20,000 of 1000 float32);
  * M MiB in 64 float32 tensors (default 1024).
Timed, each the median of R runs, every one in a fresh process (the child imports
torch, safetensors and holdpoint before its clock starts: the figure is the first load
in a process, as a user meets it):
  * holdpoint.load(path, expected_sha256=...): hashes every byte and checks the digest;
  * holdpoint.load(path): no expected digest (still every CRC-32 and bound);
  * torch.load(path, weights_only=True): no digest;
  * safetensors.torch.load_file(path.safetensors): no digest; the result is touched
    (one byte per page) so that a lazily mapped file is really read;
  * floors: reading the file into fresh memory, and one SHA-256 pass (hashlib).
Targets: at N tensors, torch.load / holdpoint.load >= 5; at M MiB,
holdpoint.load with the digest <= 1.15 x max(raw read, SHA-256). Each figure is
checked (the loaded values equal the saved ones) outside the clock.
Prints Markdown; the page cache holds the files (warm), as after a save.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(kind, path, digest):
    """One timed load in this (fresh) process; prints the seconds."""
    import numpy  # noqa: F401
    import torch
    from safetensors.torch import load_file

    sys.path.insert(0, os.environ["HOLDPOINT_PYTHON_PATH"])
    import holdpoint

    torch.set_num_threads(1)
    start = time.perf_counter()
    if kind == "holdpoint_digest":
        result = holdpoint.load(path, expected_sha256=digest)
    elif kind == "holdpoint":
        result = holdpoint.load(path)
    elif kind == "torch":
        result = torch.load(path, weights_only=True)
    elif kind == "safetensors":
        result = load_file(path)
        for t in result.values():  # a mapped file is read only when touched
            flat = t.view(-1).view(torch.uint8)
            flat[::4096].sum()
    elif kind == "raw_read":
        size = os.path.getsize(path)
        buffer = bytearray(size)
        with open(path, "rb", buffering=0) as f:
            view = memoryview(buffer)
            done = 0
            while done < size:
                done += f.readinto(view[done:])
        result = buffer
    elif kind == "sha256":
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        result = h.hexdigest()
    else:
        raise SystemExit(f"unknown kind {kind}")
    seconds = time.perf_counter() - start
    if kind.startswith("holdpoint") or kind in ("torch", "safetensors"):
        # Outside the clock: the values are the saved ones.
        last = result[f"w{len(result) - 1}"]
        expected = float(len(result) - 1)
        assert float(last.reshape(-1)[-1]) == expected, f"{kind}: wrong value"
    print(json.dumps({"seconds": seconds}))


def timed(kind, path, digest, repeat, python_path):
    figures = []
    env = dict(os.environ, HOLDPOINT_PYTHON_PATH=python_path)
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--child", kind, path, digest or "-"], env=env,
                             capture_output=True, text=True, check=True)
        figures.append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
    return statistics.median(figures)


def make_state(tensors, elements):
    import torch

    # Each tensor holds its index, so the check needs no copy of the state.
    return {f"w{i}": torch.full((elements,), float(i)) for i in range(tensors)}


def case(label, tensors, elements, repeat, directory, python_path):
    import torch
    from safetensors.torch import save_file

    state = make_state(tensors, elements)
    path = os.path.join(directory, "state.pt")
    torch.save(state, path)
    save_file(state, path + ".safetensors")
    del state
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    size = os.path.getsize(path)
    figures = {kind: timed(kind, path if kind != "safetensors" else path + ".safetensors", digest, repeat, python_path)
               for kind in ("holdpoint_digest", "holdpoint", "torch", "safetensors", "raw_read", "sha256")}
    floor = max(figures["raw_read"], figures["sha256"])
    print(f"\n### {label}: file {size / (1 << 20):.1f} MiB, median of {repeat} fresh processes\n")
    print("| load | seconds | digest checked | holdpoint.load(digest) is faster by |")
    print("|---|---|---|---|")
    rows = [("holdpoint.load(path, expected_sha256=...)", "holdpoint_digest", "yes"),
            ("holdpoint.load(path)", "holdpoint", "no (CRC-32s only)"),
            ("torch.load(path, weights_only=True)", "torch", "no"),
            ("safetensors.torch.load_file (pages touched)", "safetensors", "no"),
            ("floor: read the file into fresh memory", "raw_read", "-"),
            ("floor: one SHA-256 pass (hashlib)", "sha256", "-")]
    for name, kind, checked in rows:
        print(f"| {name} | {figures[kind]:.3f} | {checked} | {figures[kind] / figures['holdpoint_digest']:.2f}x |")
    os.remove(path)
    os.remove(path + ".safetensors")
    return figures, floor


def target(name, value, bound, lower_is_better):
    met = value <= bound if lower_is_better else value >= bound
    print(f"| {name} | {value:.3f} | {'<=' if lower_is_better else '>='} {bound} | {'met' if met else 'NOT MET'} |")
    return met


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--tensors", type=int, default=20000)
    parser.add_argument("--dir")
    parser.add_argument("--build-dir", default=os.environ.get("HOLDPOINT_BUILD_DIR",
                                                              os.path.join(os.path.dirname(HERE), "build")))
    args = parser.parse_args()
    if args.child:
        kind, path, digest = args.child
        child(kind, path, None if digest == "-" else digest)
        return 0
    python_path = os.path.join(args.build_dir, "python")
    directory = args.dir or tempfile.mkdtemp(prefix="holdpoint-pybench-")
    print("### holdpoint for Python: load against Python's peers (issue 14)\n")
    print(f"command: python {' '.join(sys.argv)}")
    small, _ = case(f"{args.tensors:,} tensors of 1000 float32", args.tensors, 1000, args.repeat, directory,
                    python_path)
    elements = (args.mib << 20) // 4 // 64
    big, big_floor = case(f"{args.mib} MiB in 64 float32 tensors", 64, elements, args.repeat, directory, python_path)
    print("\n| target | ratio | bound | |\n|---|---|---|---|")
    ok = target(f"{args.tensors:,} tensors: torch.load(weights_only=True) / holdpoint.load (digest checked)",
                small["torch"] / small["holdpoint_digest"], 5, False)
    ok &= target(f"{args.mib} MiB: holdpoint.load (digest checked) / max(raw read, SHA-256)",
                 big["holdpoint_digest"] / big_floor, 1.15, True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
