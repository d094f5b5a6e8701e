"""The Python package's load against Python's peers, in the same run (issues 14 and 38):

    python bench/python_load_bench.py [--repeat R] [--mib M] [--small-mib S] [--tensors N] [--dir DIR]

Three states, each saved once with torch.save (and once with safetensors):
  * N small tensors (default 20,000 of 1000 float32);
  * S MiB in 64 float32 tensors (default 64);
  * M MiB in 64 float32 tensors (default 1024).
Timed, each the median of R runs, in two ways:
  * fresh: every run in a fresh process (the child imports torch, safetensors and
    holdpoint before its clock starts: the first load in a process, as a user meets it);
  * warm: R runs in one process after an untimed first one (a load inside a loop).
What is timed:
  * holdpoint.load(path, expected_sha256=...): hashes every byte and checks the digest;
  * holdpoint.load(path): no expected digest: every CRC-32 and bound, no SHA-256;
  * torch.load(path, weights_only=True): no digest;
  * safetensors.torch.load_file(path.safetensors): no digest; the result is touched
    (one byte per page) so that a lazily mapped file is really read;
  * floors: reading the file into fresh memory, and one SHA-256 pass (hashlib).
Targets (issue 38): holdpoint.load without a digest <= 1.0 x torch.load(weights_only=True)
for every state, fresh and warm; with the digest <= 1.15 x max(raw read, SHA-256);
at N tensors, holdpoint.load without a digest <= 2 x the raw read, and torch.load /
holdpoint.load(digest) >= 5 (issue 14). Each figure is checked (the loaded values equal
the saved ones) outside the clock. Prints Markdown; the page cache holds the files, as
after a save.
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


def child(kind, path, digest, runs):
    """`runs` timed loads in this (fresh) process; prints their seconds. With more
    than one, an untimed load goes first (warm)."""
    import numpy  # noqa: F401
    import torch

    sys.path.insert(0, os.environ["HOLDPOINT_PYTHON_PATH"])
    import holdpoint  # noqa: F401

    torch.set_num_threads(1)
    if runs > 1:
        one_load(kind, path, digest)
    print(json.dumps({"seconds": [one_load(kind, path, digest) for _ in range(runs)]}))


def one_load(kind, path, digest):
    import torch
    from safetensors.torch import load_file

    import holdpoint

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
    del result
    return seconds


def run_child(kind, path, digest, runs, python_path):
    env = dict(os.environ, HOLDPOINT_PYTHON_PATH=python_path)
    out = subprocess.run([sys.executable, __file__, "--child", kind, path, digest or "-", str(runs)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def timed(kinds, path_of, digest, repeat, python_path):
    """Per kind: (median of `repeat` fresh processes, their slowest, median of `repeat`
    warm runs in one process). The fresh runs alternate kind by kind, so that a slow
    spell of the machine falls on all of them alike."""
    fresh = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for kind in kinds:
            fresh[kind].append(run_child(kind, path_of(kind), digest, 1, python_path)[0])
    warm = {kind: run_child(kind, path_of(kind), digest, repeat, python_path) for kind in kinds}
    return {kind: (statistics.median(fresh[kind]), max(fresh[kind]), statistics.median(warm[kind])) for kind in kinds}


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
    kinds = ("holdpoint_digest", "holdpoint", "torch", "safetensors", "raw_read", "sha256")
    timings = timed(kinds, lambda kind: path if kind != "safetensors" else path + ".safetensors", digest, repeat,
                    python_path)
    figures = {kind: t[0] for kind, t in timings.items()}
    warm = {kind: t[2] for kind, t in timings.items()}
    floor = max(figures["raw_read"], figures["sha256"])
    print(f"\n### {label}: file {size / (1 << 20):.1f} MiB, median of {repeat}\n")
    print("| load | fresh process (s) | slowest fresh (s) | warm, in one process (s) | digest checked | "
          "fresh / torch.load |")
    print("|---|---|---|---|---|---|")
    rows = [("holdpoint.load(path, expected_sha256=...)", "holdpoint_digest", "yes"),
            ("holdpoint.load(path)", "holdpoint", "no (CRC-32s only)"),
            ("torch.load(path, weights_only=True)", "torch", "no"),
            ("safetensors.torch.load_file (pages touched)", "safetensors", "no"),
            ("floor: read the file into fresh memory", "raw_read", "-"),
            ("floor: one SHA-256 pass (hashlib)", "sha256", "-")]
    for name, kind, checked in rows:
        fresh, slowest, in_process = timings[kind]
        print(f"| {name} | {fresh:.3f} | {slowest:.3f} | {in_process:.3f} | {checked} | "
              f"{fresh / figures['torch']:.2f} |")
    os.remove(path)
    os.remove(path + ".safetensors")
    return figures, warm, floor


def target(name, value, bound, lower_is_better):
    met = value <= bound if lower_is_better else value >= bound
    print(f"| {name} | {value:.3f} | {'<=' if lower_is_better else '>='} {bound} | {'met' if met else 'NOT MET'} |")
    return met


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--small-mib", type=int, default=64)
    parser.add_argument("--tensors", type=int, default=20000)
    parser.add_argument("--dir")
    parser.add_argument("--build-dir", default=os.environ.get("HOLDPOINT_BUILD_DIR",
                                                              os.path.join(os.path.dirname(HERE), "build")))
    args = parser.parse_args()
    if args.child:
        kind, path, digest, runs = args.child
        child(kind, path, None if digest == "-" else digest, int(runs))
        return 0
    python_path = os.path.join(args.build_dir, "python")
    directory = args.dir or tempfile.mkdtemp(prefix="holdpoint-pybench-")
    print("### holdpoint for Python: load against Python's peers (issues 14 and 38)\n")
    print(f"command: python {' '.join(sys.argv)}")
    states = [(f"{args.tensors:,} tensors", args.tensors, 1000)]
    for mib in (args.small_mib, args.mib):
        states.append((f"{mib} MiB", 64, (mib << 20) // 4 // 64))
    results = []
    for label, count, elements in states:
        what = f"{label} of 1000 float32" if count == args.tensors else f"{label} in 64 float32 tensors"
        results.append((label, *case(what, count, elements, args.repeat, directory, python_path)))
    print("\n| target | ratio | bound | |\n|---|---|---|---|")
    ok = True
    for label, fresh, warm, floor in results:
        ok &= target(f"{label}: holdpoint.load (no digest) / torch.load(weights_only=True), fresh processes",
                     fresh["holdpoint"] / fresh["torch"], 1.0, True)
        ok &= target(f"{label}: holdpoint.load (no digest) / torch.load(weights_only=True), warm",
                     warm["holdpoint"] / warm["torch"], 1.0, True)
        ok &= target(f"{label}: holdpoint.load (digest checked) / max(raw read, SHA-256)",
                     fresh["holdpoint_digest"] / floor, 1.15, True)
    tensors_fresh = results[0][1]
    ok &= target(f"{args.tensors:,} tensors: holdpoint.load (no digest) / raw read",
                 tensors_fresh["holdpoint"] / tensors_fresh["raw_read"], 2.0, True)
    ok &= target(f"{args.tensors:,} tensors: torch.load(weights_only=True) / holdpoint.load (digest checked)",
                 tensors_fresh["torch"] / tensors_fresh["holdpoint_digest"], 5, False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
