"""Sharded generations on the holdpoint command line, end to end: `inspect` and `verify` of a
step manifest (checkpoints/step-N.pt of kind "sharded") with its shards
(checkpoints/step-N.shards/rank-R.pt), and the run-directory commands `ls`, `verify RUN`,
`gc` (the command that opens a run read-write, so recovers it) and `export` on run
directories written by tests/tools/make_sharded_run.cpp (partition_replicated, one shard per
rank, the step manifest committed through RunDirectory::commit; no c10d).

Positive and negative cases alternate: a good generation verifies, and each way a shard can
go wrong (a flipped byte, a truncated or extended file, a missing file or directory, another
step's shard of the same rank, a symlink) is refused with its own code and the rank named.

Run by ctest with the oracle Python (torch 2.13, used to read a shard file)."""

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

import harness

HOLDPOINT = harness.holdpoint_binary()
cli = harness.cli
first_code = harness.first_code
json_or_none = harness.json_or_none
name = harness.generation_name
MAKE_SHARDED = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_sharded_run")
MAKE_RUN = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_run_directory")


def shards_dir(step):
    return f"step-{step:08d}.shards"


def shard(run, step, rank):
    return os.path.join(run, "checkpoints", shards_dir(step), f"rank-{rank:05d}.pt")


def manifest(run, step):
    return os.path.join(run, "checkpoints", name(step))


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def snapshot(directory):
    """Every path under `directory` with its bytes (and every directory): what 'nothing changed' compares."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), directory) + "/"] = None
        for f in files:
            path = os.path.join(root, f)
            if os.path.islink(path):
                out[os.path.relpath(path, directory)] = ("link", os.readlink(path))
                continue
            with open(path, "rb") as handle:
                out[os.path.relpath(path, directory)] = handle.read()
    return out


def flip_byte(path, offset=None):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    open(path, "wb").write(data)


def tree_keys(inspect_json):
    """The top-level keys of an `inspect --json` tree."""
    tree = inspect_json.get("tree", {})
    entries = tree.get("dict") or tree.get("odict") or []
    return [key.get("str") for key, _ in entries]


class Runs:
    """Pristine sharded runs, made once and copied for each destructive case."""

    def __init__(self, report, tmp):
        self.report, self.tmp, self.made = report, tmp, {}

    def pristine(self, world, steps):
        key = (world, steps)
        if key not in self.made:
            run = os.path.join(self.tmp, f"pristine-w{world}-{steps.replace(',', '-')}")
            r = harness.run([MAKE_SHARDED, run, "--world", str(world), "--steps", steps])
            self.report.check(r.returncode == 0, f"make_sharded_run --world {world} --steps {steps}: {r.describe()}")
            self.made[key] = run
        return self.made[key]

    def copy(self, label, world=2, steps="2,4"):
        run = os.path.join(self.tmp, label)
        shutil.copytree(self.pristine(world, steps), run, symlinks=True)
        return run


def check_fixture(report, runs):
    """The tool's own output: a run directory of step manifests and shard directories."""
    run = runs.copy("fixture")
    entries = sorted(os.listdir(os.path.join(run, "checkpoints")))
    report.check(entries == sorted([name(2), name(2) + ".sha256", shards_dir(2), name(4), name(4) + ".sha256", shards_dir(4)]),
                 f"the sharded run holds step manifests, sidecars and shard directories: {entries}")
    for step in (2, 4):
        files = sorted(os.listdir(os.path.join(run, "checkpoints", shards_dir(step))))
        report.check(files == ["rank-00000.pt", "rank-00001.pt"], f"{shards_dir(step)} holds one shard per rank: {files}")
    report.check(open(os.path.join(run, "LATEST")).read().startswith(name(4) + " "), "LATEST names the newest step manifest")
    # Python reads a shard file with the weights-only loader: it is an ordinary checkpoint.
    try:
        import torch
        loaded = torch.load(shard(run, 4, 1), weights_only=True)
        report.check(loaded["holdpoint"]["kind"] == "shard" and loaded["holdpoint"]["sharding"]["rank"] == 1
                     and int(loaded["sampler"]["rank"]) == 1 and int(loaded["sampler"]["cursor"]) == 9,
                     f"torch.load(weights_only=True) reads rank 1's shard: {loaded.get('sampler')}")
        step_manifest = torch.load(manifest(run, 4), weights_only=True)
        report.check(list(step_manifest) == ["holdpoint"] and step_manifest["holdpoint"]["kind"] == "sharded",
                     "the step manifest holds only the manifest")
    except ImportError:
        print("  (torch missing: the Python load of a shard is not checked)")


def check_good_file(report, runs):
    run = runs.copy("good-file")
    step_manifest = manifest(run, 4)
    r = cli("inspect", step_manifest, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0, f"inspect a step manifest: {r.describe()}")
    sharding = out.get("sharding", {})
    report.check(sharding.get("world_size") == 2 and sharding.get("step") == 4, f"inspect --json world size and step: {sharding}")
    report.check(sharding.get("replicated") == ["model", "progress"] and sharding.get("rank_local") == ["sampler"],
                 f"inspect --json component names: {sharding.get('replicated')} {sharding.get('rank_local')}")
    shards = sharding.get("shards", [])
    report.check([s.get("rank") for s in shards] == [0, 1], f"inspect --json lists each rank's shard: {shards}")
    for s in shards:
        path = shard(run, 4, s.get("rank", 0))
        report.check(s.get("sha256") == sha256_of(path) and s.get("size") == os.path.getsize(path),
                     f"inspect --json: shard {s.get('rank')}'s digest and size are the file's")
        report.check(os.path.realpath(s.get("file", "")) == os.path.realpath(path)
                     and s.get("name") == f"{shards_dir(4)}/rank-{s.get('rank'):05d}.pt", f"inspect --json names the file: {s}")
    report.check(sharding.get("total_bytes") == os.path.getsize(step_manifest) + sum(
        os.path.getsize(shard(run, 4, r_)) for r_ in (0, 1)), f"total_bytes: {sharding.get('total_bytes')}")
    report.check(out.get("sha256") == sha256_of(step_manifest) and out.get("bytes") == os.path.getsize(step_manifest),
                 "inspect --json: the header is the step manifest file's")
    report.check(tree_keys(out) == ["holdpoint", "model", "progress", "sampler@rank0", "sampler@rank1"],
                 f"inspect --json tree: the manifest and the combined view: {tree_keys(out)}")
    report.check(out.get("summary", {}).get("tensors", 0) >= 3, f"the merged model's tensors are counted: {out.get('summary')}")
    r = cli("inspect", step_manifest)
    report.check(r.returncode == 0 and "world size 2" in r.stdout and f"{shards_dir(4)}/rank-00001.pt" in r.stdout
                 and "replicated: model, progress" in r.stdout and "rank-local: sampler" in r.stdout
                 and "sampler@rank1" in r.stdout, f"inspect text shows the sharding: {r.describe()}")

    r = cli("verify", step_manifest)
    lines = r.stdout.strip().splitlines()
    report.check(r.returncode == 0 and lines and lines[-1].startswith("valid:") and "world size 2" in lines[-1],
                 f"verify a step manifest: {r.describe()}")
    report.check(sum(1 for line in lines if line.strip().startswith("ok") and "rank " in line) == 2,
                 f"verify reports each shard: {lines}")
    r = cli("verify", step_manifest, "--json", "--sidecar")
    out = json_or_none(r) or {}
    shards = out.get("sharding", {}).get("shards", [])
    report.check(r.returncode == 0 and out.get("valid") is True and out.get("digest_checked") is True
                 and "code" not in out, f"verify --json --sidecar: {r.describe()}")
    report.check([(s.get("rank"), s.get("ok"), s.get("code")) for s in shards] == [(0, True, None), (1, True, None)],
                 f"verify --json per shard: {shards}")
    report.check(all(s.get("sha256") == sha256_of(shard(run, 4, s.get("rank"))) for s in shards),
                 "verify --json: the recorded digests are the shard files'")
    r = cli("verify", step_manifest, "--sha256", "0" * 64)
    report.check(r.returncode == 1 and first_code(r) == "sha256_mismatch", f"--sha256 applies to the step manifest: {r.describe()}")

    # A shard file on its own is an ordinary checkpoint of kind shard.
    r = cli("verify", shard(run, 4, 0))
    report.check(r.returncode == 0 and r.stdout.startswith("valid:"), f"verify a shard file on its own: {r.describe()}")
    r = cli("inspect", shard(run, 4, 0), "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and "sharding" not in out, f"inspect a shard file on its own: {r.describe()}")

    # A world of one and of three.
    for world, steps in ((1, "3"), (3, "5")):
        run_w = runs.copy(f"good-file-w{world}", world, steps)
        r = cli("verify", manifest(run_w, int(steps)), "--json")
        out = json_or_none(r) or {}
        report.check(r.returncode == 0 and out.get("sharding", {}).get("world_size") == world
                     and len(out.get("sharding", {}).get("shards", [])) == world, f"verify a world of {world}: {r.describe()}")


def expect_shard_failure(report, label, step_manifest, code, rank, ok_ranks=()):
    """verify (text and JSON) and inspect refuse the step manifest with `code`, naming `rank`."""
    r = cli("verify", step_manifest)
    report.check(r.returncode == 1 and first_code(r) == code, f"{label}: verify exits 1 with {code}: {r.describe()}")
    verdict = (r.stdout.strip().splitlines() or [""])[-1]
    report.check(f"rank {rank}" in verdict and f"rank-{rank:05d}.pt" in verdict, f"{label}: the verdict names rank {rank}: {verdict}")
    report.check(any(line.strip().startswith("FAILED") and f"rank {rank} " in line for line in r.stdout.splitlines()),
                 f"{label}: the failing shard's line: {r.stdout}")
    r = cli("verify", step_manifest, "--json")
    out = json_or_none(r) or {}
    by_rank = {s.get("rank"): s for s in out.get("sharding", {}).get("shards", [])}
    report.check(r.returncode == 1 and out.get("valid") is False and out.get("code") == code
                 and f"rank {rank}" in out.get("message", ""), f"{label}: verify --json: {r.describe()}")
    report.check(by_rank.get(rank, {}).get("ok") is False and by_rank.get(rank, {}).get("code") == code,
                 f"{label}: verify --json marks rank {rank}: {by_rank.get(rank)}")
    for ok_rank in ok_ranks:
        report.check(by_rank.get(ok_rank, {}).get("ok") is True, f"{label}: rank {ok_rank} still verifies: {by_rank.get(ok_rank)}")
    r = cli("inspect", step_manifest)
    report.check(r.returncode == 1 and first_code(r) == code, f"{label}: inspect refuses with {code}: {r.describe()}")
    r = cli("inspect", step_manifest, "--json")
    report.check(r.returncode == 1 and first_code(r) == code and not r.stdout.strip(),
                 f"{label}: inspect --json prints no report for a rejected file: {r.describe()}")


def check_damaged_file(report, runs):
    run = runs.copy("flip")
    flip_byte(shard(run, 4, 1))
    expect_shard_failure(report, "a flipped byte in rank 1's shard", manifest(run, 4), "shard_digest_mismatch", 1, ok_ranks=(0,))

    run = runs.copy("flip-rank0")
    flip_byte(shard(run, 4, 0), offset=100)
    expect_shard_failure(report, "a flipped byte in rank 0's shard", manifest(run, 4), "shard_digest_mismatch", 0, ok_ranks=(1,))

    run = runs.copy("truncated")
    path = shard(run, 4, 1)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-10])
    expect_shard_failure(report, "a truncated shard", manifest(run, 4), "shard_size_mismatch", 1, ok_ranks=(0,))

    run = runs.copy("extended")
    with open(shard(run, 4, 0), "ab") as f:
        f.write(b"\0" * 7)
    expect_shard_failure(report, "an extended shard", manifest(run, 4), "shard_size_mismatch", 0, ok_ranks=(1,))

    run = runs.copy("missing-file")
    os.unlink(shard(run, 4, 1))
    expect_shard_failure(report, "a missing shard file", manifest(run, 4), "run_shards_invalid", 1, ok_ranks=(0,))

    run = runs.copy("missing-dir")
    shutil.rmtree(os.path.join(run, "checkpoints", shards_dir(4)))
    expect_shard_failure(report, "a missing shard directory", manifest(run, 4), "run_shards_invalid", 0)
    r = cli("verify", manifest(run, 4), "--json")
    out = json_or_none(r) or {}
    report.check([s.get("code") for s in out.get("sharding", {}).get("shards", [])] == ["run_shards_invalid"] * 2,
                 f"without the shard directory every shard fails: {out.get('sharding')}")

    # Another step's shard of the same rank (same size, other content): the digest chain catches it.
    run = runs.copy("swapped")
    here, other = shard(run, 4, 0), shard(run, 2, 0)
    report.check(os.path.getsize(here) == os.path.getsize(other), "precondition: rank 0's shards of steps 2 and 4 have one size")
    shutil.copyfile(other, here)
    expect_shard_failure(report, "step 2's shard in step 4's place", manifest(run, 4), "shard_digest_mismatch", 0, ok_ranks=(1,))

    # A symlink in a shard's place is not followed, even to the right bytes.
    run = runs.copy("symlink")
    path = shard(run, 4, 1)
    real = os.path.join(run, "elsewhere.pt")
    shutil.move(path, real)
    os.symlink(real, path)
    expect_shard_failure(report, "a symlinked shard", manifest(run, 4), "run_shards_invalid", 1, ok_ranks=(0,))

    # The other generation of a damaged run is unaffected.
    run = runs.copy("damaged-other-ok")
    flip_byte(shard(run, 4, 1))
    r = cli("verify", manifest(run, 2))
    report.check(r.returncode == 0, f"step 2 verifies when step 4's shard is damaged: {r.describe()}")


def check_ls(report, runs, tmp):
    run = runs.copy("ls")
    r = cli("ls", run, "--json")
    out = json_or_none(r) or {}
    gens = out.get("generations", [])
    report.check(r.returncode == 0 and [(g.get("name"), g.get("world_size")) for g in gens] == [(name(2), 2), (name(4), 2)],
                 f"ls --json shows world_size: {r.describe()} {gens}")
    report.check(all(g.get("sha256") == sha256_of(manifest(run, g.get("step"))) for g in gens),
                 "ls --json: size and sha256 are the step manifest's")
    report.check(out.get("recovery", {}).get("clean") is True, f"a fresh sharded run needs no recovery: {out.get('recovery')}")
    r = cli("ls", run)
    report.check(r.returncode == 0 and r.stdout.count("sharded x2") == 2, f"ls text marks sharded generations: {r.stdout}")
    r = cli("ls", run, "--verify", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and all(g.get("verified") is True for g in out.get("generations", [])),
                 f"ls --verify on a good sharded run: {r.describe()}")

    # A single-file run says world_size 0 and no "sharded".
    if os.access(MAKE_RUN, os.X_OK):
        plain = os.path.join(tmp, "ls-plain")
        harness.run([MAKE_RUN, plain, "--generations", "2"])
        r = cli("ls", plain, "--json")
        out = json_or_none(r) or {}
        report.check(r.returncode == 0 and [g.get("world_size") for g in out.get("generations", [])] == [0, 0],
                     f"ls --json of single-file generations: world_size 0: {r.describe()}")
        r = cli("ls", plain)
        report.check(r.returncode == 0 and "sharded x" not in r.stdout, f"ls text of single-file generations says nothing about shards: {r.stdout}")

    # A leftover shard directory of an interrupted save: reported as would-be-removed, kept.
    leftover = os.path.join(run, "checkpoints", shards_dir(9))
    os.makedirs(leftover)
    shutil.copyfile(shard(run, 4, 0), os.path.join(leftover, "rank-00000.pt"))
    before = snapshot(run)
    r = cli("ls", run, "--json")
    out = json_or_none(r) or {}
    recovery = out.get("recovery", {})
    report.check(r.returncode == 0 and recovery.get("removed_uncommitted") == [shards_dir(9) + "/"] and recovery.get("clean") is False,
                 f"ls --json reports the leftover shard directory: {recovery}")
    report.check(f"would remove shard directory {shards_dir(9)}/ (no committed step manifest)" in recovery.get("lines", []),
                 f"ls --json recovery line: {recovery.get('lines')}")
    report.check([g.get("name") for g in out.get("generations", [])] == [name(2), name(4)], "the leftover is no generation")
    r = cli("ls", run)
    report.check(f"would remove shard directory {shards_dir(9)}/" in r.stdout, f"ls text names it: {r.stdout}")
    r = cli("verify", run)
    report.check(r.returncode == 0, f"verify RUN: a leftover shard directory does not fail the run: {r.describe()}")
    report.check(snapshot(run) == before and os.path.isdir(leftover), "ls and verify RUN removed nothing")
    # Opening read-write (gc) removes it; the committed generations stay.
    r = cli("gc", run, "--keep", "10")
    report.check(r.returncode == 0 and f"recovery: removed shard directory {shards_dir(9)}/" in r.stdout,
                 f"gc's recovery removes the leftover: {r.describe()}")
    report.check(not os.path.exists(leftover) and os.path.isdir(os.path.join(run, "checkpoints", shards_dir(4))),
                 "the leftover is gone, the committed shards are not")


def check_verify_run(report, runs):
    run = runs.copy("verify-run")
    r = cli("verify", run)
    report.check(r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("valid:"), f"verify RUN (sharded): {r.describe()}")
    r = cli("verify", run, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("valid") is True
                 and [(g.get("name"), g.get("ok")) for g in out.get("generations", [])] == [(name(2), True), (name(4), True)],
                 f"verify RUN --json (sharded): {r.describe()}")

    # An older generation's shard damaged: that generation fails, named with the shard and code.
    run = runs.copy("verify-run-old")
    flip_byte(shard(run, 2, 1))
    before = snapshot(run)
    r = cli("verify", run)
    report.check(r.returncode == 1 and first_code(r) == "shard_digest_mismatch", f"verify RUN, step 2's shard damaged: {r.describe()}")
    verdict = r.stdout.strip().splitlines()[-1]
    report.check(name(2) in verdict and f"{shards_dir(2)}/rank-00001.pt" in verdict, f"the verdict names generation and shard: {verdict}")
    r = cli("verify", run, "--json")
    out = json_or_none(r) or {}
    by_name = {g.get("name"): g for g in out.get("generations", [])}
    report.check(r.returncode == 1 and out.get("code") == "shard_digest_mismatch"
                 and by_name.get(name(2), {}).get("code") == "shard_digest_mismatch"
                 and "rank-00001.pt" in by_name.get(name(2), {}).get("detail", "")
                 and by_name.get(name(4), {}).get("ok") is True, f"verify RUN --json names the damaged generation: {by_name}")
    r = cli("ls", run, "--verify", "--json")
    out = json_or_none(r) or {}
    marks = {g.get("name"): (g.get("verified"), g.get("code")) for g in out.get("generations", [])}
    report.check(r.returncode == 1 and marks.get(name(2)) == (False, "shard_digest_mismatch") and marks.get(name(4)) == (True, None),
                 f"ls --verify marks the damaged sharded generation: {marks}")
    report.check(snapshot(run) == before, "verify RUN and ls changed nothing")

    # LATEST's shard missing: LATEST does not verify, the run is invalid.
    run = runs.copy("verify-run-latest")
    os.unlink(shard(run, 4, 0))
    r = cli("verify", run, "--json")
    out = json_or_none(r) or {}
    by_name = {g.get("name"): g for g in out.get("generations", [])}
    report.check(r.returncode == 1 and out.get("code") == "run_shards_invalid" and out.get("latest", {}).get("ok") is False
                 and by_name.get(name(4), {}).get("code") == "run_shards_invalid", f"verify RUN, LATEST's shard missing: {r.describe()}")


def check_recovery(report, runs):
    """Only gc opens read-write: it quarantines a sharded generation whose shards fail."""
    run = runs.copy("quarantine")
    flip_byte(shard(run, 4, 1))
    before = snapshot(run)
    r = cli("gc", run, "--keep", "10", "--dry-run", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and name(4) + ".damaged" in out.get("recovery", {}).get("quarantined", [])
                 and shards_dir(4) + ".damaged" in out.get("recovery", {}).get("quarantined", []),
                 f"gc --dry-run says the generation and its shards would go aside: {r.describe()}")
    report.check(snapshot(run) == before, "gc --dry-run changed nothing")
    r = cli("gc", run, "--keep", "10", "--json")
    out = json_or_none(r) or {}
    recovery = out.get("recovery", {})
    report.check(r.returncode == 0 and recovery.get("read_only") is False
                 and sorted(recovery.get("quarantined", [])) == sorted([name(4) + ".damaged", shards_dir(4) + ".damaged"]),
                 f"gc quarantines the sharded generation with its shards: {r.describe()} {recovery.get('quarantined')}")
    report.check([(d.get("name"), d.get("code")) for d in recovery.get("damaged", [])] == [(name(4), "shard_digest_mismatch")],
                 f"recovery names the generation and code: {recovery.get('damaged')}")
    ckpt = os.path.join(run, "checkpoints")
    report.check(os.path.isfile(os.path.join(ckpt, name(4) + ".damaged"))
                 and os.path.isdir(os.path.join(ckpt, shards_dir(4) + ".damaged"))
                 and not os.path.exists(os.path.join(ckpt, name(4))) and not os.path.exists(os.path.join(ckpt, shards_dir(4))),
                 f"on disk: {sorted(os.listdir(ckpt))}")
    report.check(open(os.path.join(ckpt, shards_dir(4) + ".damaged", "rank-00001.pt"), "rb").read()
                 == before[os.path.join("checkpoints", shards_dir(4), "rank-00001.pt")], "the damaged shard is kept, not deleted")
    report.check(open(os.path.join(run, "LATEST")).read().startswith(name(2) + " "), "LATEST falls back to step 2")
    r = cli("verify", run)
    report.check(r.returncode == 0, f"the recovered run verifies: {r.describe()}")
    r = cli("verify", manifest(run, 2))
    report.check(r.returncode == 0, f"its sharded LATEST verifies as a file: {r.describe()}")

    # Retention removes a sharded generation's shards with its manifest.
    run = runs.copy("retention", 2, "2,4,6")
    r = cli("gc", run, "--keep", "1", "--json")
    out = json_or_none(r) or {}
    left = sorted(os.listdir(os.path.join(run, "checkpoints")))
    report.check(r.returncode == 0 and out.get("removed") == [name(2), name(4)], f"gc --keep 1 on a sharded run: {r.describe()}")
    report.check(left == sorted([name(6), name(6) + ".sha256", shards_dir(6)]), f"the shards went with their manifests: {left}")
    r = cli("verify", run)
    report.check(r.returncode == 0, f"the pruned sharded run verifies: {r.describe()}")


def check_export(report, runs, tmp):
    run = runs.copy("export")
    source_before = snapshot(run)
    dest = os.path.join(tmp, "export-dest")
    r = cli("export", run, dest, "--json")
    proof = json_or_none(r) or {}
    report.check(r.returncode == 0, f"export a sharded run: {r.describe()}")
    for rank in (0, 1):
        copy, original = shard(dest, 4, rank), shard(run, 4, rank)
        report.check(os.path.isfile(copy) and open(copy, "rb").read() == open(original, "rb").read(),
                     f"export copied rank {rank}'s shard byte for byte")
    report.check(sorted(os.listdir(os.path.join(dest, "checkpoints"))) == sorted([name(4), name(4) + ".sha256", shards_dir(4)]),
                 f"export --latest copies the step manifest and its shards only: {os.listdir(os.path.join(dest, 'checkpoints'))}")
    recovered = proof.get("recovered", {})
    report.check(recovered.get("manifest_kind") == "sharded" and recovered.get("world_size") == 2
                 and [s.get("sha256") for s in recovered.get("shards", [])] == [sha256_of(shard(run, 4, i)) for i in (0, 1)],
                 f"the proof records the sharded load-back: {recovered}")
    checks = {(c.get("check"), c.get("subject")) for c in proof.get("checks", [])}
    for check in ("source_shards_verify", "shards_copied", "shard_copies_match", "sharded_load_back", "load_back"):
        report.check((check, name(4)) in checks, f"proof check {check}: {sorted(checks)}")
    report.check([g.get("world_size") for g in proof.get("generations", [])] == [2], "the proof's generation has world_size 2")
    loading = open(os.path.join(dest, "LOADING.md")).read() if os.path.exists(os.path.join(dest, "LOADING.md")) else ""
    report.check(shards_dir(4) in loading, "LOADING.md names the shard directory")
    index = json.load(open(os.path.join(dest, "index.json"))) if os.path.exists(os.path.join(dest, "index.json")) else {}
    report.check([g.get("world_size") for g in index.get("generations", [])] == [2], f"DEST's index records the world size: {index}")
    r = cli("verify", dest)
    report.check(r.returncode == 0, f"the export verifies as a run directory: {r.describe()}")
    r = cli("verify", manifest(dest, 4))
    report.check(r.returncode == 0, f"the exported step manifest verifies with its shards: {r.describe()}")
    r = cli("ls", dest, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("recovery", {}).get("clean") is True
                 and [g.get("world_size") for g in out.get("generations", [])] == [2], f"the export needs no recovery: {r.describe()}")
    report.check(snapshot(run) == source_before, "export changed nothing in the source")

    dest_all = os.path.join(tmp, "export-all")
    r = cli("export", run, dest_all, "--all")
    report.check(r.returncode == 0 and all(os.path.isfile(shard(dest_all, s, i)) for s in (2, 4) for i in (0, 1)),
                 f"export --all copies every generation's shards: {r.describe()}")
    r = cli("verify", dest_all)
    report.check(r.returncode == 0, f"export --all verifies: {r.describe()}")

    # LATEST's shard damaged: refused (the read-only open already finds LATEST damaged), nothing written.
    damaged = runs.copy("export-damaged")
    flip_byte(shard(damaged, 4, 0))
    before = snapshot(damaged)
    dest_damaged = os.path.join(tmp, "export-damaged-dest")
    r = cli("export", damaged, dest_damaged)
    report.check(r.returncode == 1 and first_code(r) == "run_pointer_invalid" and "shard_digest_mismatch" in r.stderr,
                 f"export with LATEST's shard damaged: {r.describe()}")
    report.check(not os.path.exists(dest_damaged) and snapshot(damaged) == before, "nothing written, the source untouched")

    # An older generation's shard missing: --all skips it, and writes none of its shards.
    old = runs.copy("export-old", 2, "2,4,6")
    os.unlink(shard(old, 2, 1))
    dest_skip = os.path.join(tmp, "export-skip")
    r = cli("export", old, dest_skip, "--all", "--json")
    proof = json_or_none(r) or {}
    report.check(r.returncode == 0 and [g.get("name") for g in proof.get("generations", [])] == [name(4), name(6)]
                 and [(s.get("name"), s.get("code")) for s in proof.get("skipped", [])] == [(name(2), "run_shards_invalid")],
                 f"export --all skips a generation whose shard is missing: {r.describe()}")
    report.check(not os.path.exists(os.path.join(dest_skip, "checkpoints", shards_dir(2)))
                 and not os.path.exists(manifest(dest_skip, 2)), "nothing of the skipped generation was written")
    r = cli("verify", dest_skip)
    report.check(r.returncode == 0, f"the partial export verifies: {r.describe()}")


def main():
    harness.require_executable(HOLDPOINT)
    harness.require_executable(MAKE_SHARDED)
    report = harness.Report("test_cli_sharded")
    tmp = tempfile.mkdtemp(prefix="holdpoint-cli-sharded-")
    try:
        runs = Runs(report, tmp)
        check_fixture(report, runs)
        check_good_file(report, runs)
        check_damaged_file(report, runs)
        check_ls(report, runs, tmp)
        check_verify_run(report, runs)
        check_recovery(report, runs)
        check_export(report, runs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
