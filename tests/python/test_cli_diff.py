"""`holdpoint diff A B` end to end (docs/cli.md "diff"): exit 0 the same within tolerance, 1
different, 2 a file that cannot be read or does not verify.

Positive: identical files (no entries); each change planted in a real holdpoint checkpoint
(written by the resume-protocol example, then edited with torch) reported by path with its
figures: one model element (count 1, the exact deviation), a dtype, a shape, an optimizer step,
the torch RNG state, a load-bearing and an operational config field, a key added and one
removed; --atol/--rtol letting a small deviation pass; --json holding the same figures; run
generations (RUN@LATEST, RUN@BEST, RUN@<step>) and sharded steps, shard by shard; and a 1 GiB
pair compared with a peak RSS increase of at most 256 MiB, measured with /usr/bin/time -v.

Negative: a hostile corpus file, a corrupt file, a missing file, a directory, a generation that
is not there, an '@' suffix that names nothing, a generation whose bytes no longer match the
run's record, a sharded step with a damaged shard, a negative tolerance, and --json on error:
each exit 2 with its code.

Run by ctest with the oracle Python (torch 2.13)."""

import os
import re
import shutil
import sys
import tempfile

import torch

import harness

HOLDPOINT = harness.holdpoint_binary()
TRAINER = os.path.join(harness.BUILD_DIR, "examples", "resume-protocol", "train")
MAKE_RUN = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_run_directory")
MAKE_SHARDED = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_sharded_run")
cli = harness.cli
first_code = harness.first_code
RSS_BOUND_KIB = 256 * 1024


def diff(*args, **kwargs):
    return cli("diff", *args, **kwargs)


def diff_json(report, label, *args):
    r = diff(*args, "--json")
    body = harness.json_or_none(r)
    report.check(body is not None, f"{label}: --json is one JSON document: {r.describe()}")
    return r, body or {}


def entries_by_path(body):
    return {e["path"]: e for e in body.get("entries", [])}


def line_for(result, path):
    """The text line of the entry at `path`."""
    for line in result.stdout.splitlines():
        if re.match(rf"^[a-z ]+: {re.escape(path)} \(", line):
            return line
    return ""


def check_identical(report, tmp):
    a, b = os.path.join(tmp, "same-a.pt"), os.path.join(tmp, "same-b.pt")
    state = {"w": torch.arange(12.0).reshape(3, 4), "n": torch.tensor([1, 2, 3])}
    torch.save(state, a)
    torch.save(state, b)
    r = diff(a, b)
    report.check(r.returncode == 0 and r.stdout.startswith("same: ") and "no difference" in r.stdout,
                 f"identical files: exit 0, no difference: {r.describe()} {r.stdout[:200]}")
    r, body = diff_json(report, "identical --json", a, b)
    report.check(r.returncode == 0 and body.get("same") is True and body.get("entries") == []
                 and body["summary"]["tensors_compared"] == 2, f"identical --json: {body.get('summary')}")


def write_planted(report, tmp):
    """A real checkpoint and a copy with one change of each kind planted."""
    out = os.path.join(tmp, "trainer-run")
    r = harness.run([TRAINER, "--steps", "3", "--output", out], limit_memory=False, timeout=120)
    report.check(r.returncode == 0, f"the resume-protocol example writes a checkpoint: {r.describe()}")
    original = os.path.join(out, "checkpoint.pt")
    state = torch.load(original, weights_only=True)
    state["model"]["0.weight"][2, 1] = 0.5
    state["model"]["0.bias"] = state["model"]["0.bias"].to(torch.float32)  # dtype
    state["model"]["3.bias"] = torch.zeros(2, dtype=torch.float64)  # shape
    state["optimizer"]["state"][3]["step"] += 4  # one optimizer step count
    torch.manual_seed(1234)
    state["rng"]["torch.cpu"]["state"] = torch.get_rng_state()  # the RNG state
    state["holdpoint"]["config"]["load_bearing"]["loss"] = "l1"
    state["holdpoint"]["config"]["operational"]["max_epochs"] = 2000
    state["holdpoint"]["code_identity"] = "planted"  # the manifest
    state["progress"]["planted"] = 7  # added
    del state["sampler"]["state_dict"]["cursor"]  # removed
    planted = os.path.join(tmp, "planted.pt")
    torch.save(state, planted)
    return original, planted


def check_planted(report, tmp):
    original, planted = write_planted(report, tmp)
    weight_before = float(torch.load(original, weights_only=True)["model"]["0.weight"][2, 1])
    deviation_text = repr(abs(weight_before - 0.5))
    r = diff(original, planted)
    report.check(r.returncode == 1 and r.stdout.splitlines()[-1].startswith("different: "),
                 f"planted changes: exit 1: {r.describe()}")
    text_expectations = {
        "model/0.weight": r"^value changed: model/0\.weight \(model\) float64 \[8, 2\]: 1 of 16 elements differ, "
                          rf"first at \[2, 1\], max abs {re.escape(deviation_text)} at \[2, 1\]",
        "model/0.bias": r"^dtype changed: model/0\.bias \(model\) float64 \[8\] -> float32 \[8\]$",
        "model/3.bias": r"^shape changed: model/3\.bias \(model\) float64 \[1\] -> float64 \[2\]$",
        "optimizer/state/3/step": r"^value changed: optimizer/state/3/step \(optimizer\) float32 \[\] = 3\.0 -> "
                                  r"float32 \[\] = 7\.0: max abs 4\.0",
        "rng/torch.cpu/state": r"^value changed: rng/torch\.cpu/state \(rng\) uint8 \[5056\]: "
                               r"\d+ of 5056 elements differ",
        "holdpoint/config/load_bearing/loss": r"^value changed: holdpoint/config/load_bearing/loss "
                                              r"\(config, load-bearing\) 'mse' -> 'l1'$",
        "holdpoint/config/operational/max_epochs": r"^value changed: holdpoint/config/operational/max_epochs "
                                                   r"\(config, operational\) 1000 -> 2000: max abs 1000\.0",
        "progress/planted": r"^added: progress/planted \(progress\) 7$",
        "sampler/state_dict/cursor": r"^removed: sampler/state_dict/cursor \(sampler\) 12$",
    }
    for path, pattern in text_expectations.items():
        line = line_for(r, path)
        report.check(re.match(pattern, line) is not None, f"planted {path}: line {line!r} matches {pattern!r}")
    report.check(line_for(r, "model/0.weight") and "(within tolerance)" not in r.stdout,
                 "nothing is within a zero tolerance")

    r, body = diff_json(report, "planted --json", original, planted)
    by_path = entries_by_path(body)
    weight = by_path.get("model/0.weight", {})
    deviation = weight.get("deviation") or {}
    report.check(weight.get("change") == "value changed" and weight.get("section") == "model"
                 and deviation.get("numel") == 16 and deviation.get("differing") == 1
                 and deviation.get("max_abs_deviation") == abs(weight_before - 0.5)
                 and deviation.get("max_abs_index") == [2, 1]
                 and weight.get("within_tolerance") is False, f"--json model/0.weight: {weight}")
    expected_rel = abs(weight_before - 0.5) / 0.5
    report.check(abs(deviation.get("max_rel_deviation", 0) - expected_rel) < 1e-12,
                 f"--json max_rel_deviation is |a - b| / |b|: {deviation.get('max_rel_deviation')} vs {expected_rel}")
    step = by_path.get("optimizer/state/3/step", {})
    report.check(step.get("section") == "optimizer" and (step.get("deviation") or {}).get("max_abs_deviation") == 4.0,
                 f"--json optimizer step: {step}")
    report.check(by_path.get("model/0.bias", {}).get("change") == "dtype changed"
                 and by_path.get("model/3.bias", {}).get("change") == "shape changed", "--json dtype and shape changes")
    report.check(by_path.get("rng/torch.cpu/state", {}).get("section") == "rng", "--json the RNG state, section rng")
    lb = by_path.get("holdpoint/config/load_bearing/loss", {})
    op = by_path.get("holdpoint/config/operational/max_epochs", {})
    report.check(lb.get("section") == "config" and lb.get("config_field") == "load-bearing"
                 and lb.get("a") == "'mse'" and lb.get("b") == "'l1'", f"--json load-bearing field: {lb}")
    report.check(op.get("config_field") == "operational", f"--json operational field: {op}")
    report.check(by_path.get("progress/planted", {}).get("change") == "added"
                 and by_path.get("progress/planted", {}).get("a") is None
                 and by_path.get("sampler/state_dict/cursor", {}).get("change") == "removed",
                 "--json added and removed keys")
    # torch.save keeps the manifest as it was, so its only change is the planted one.
    manifest = [(e["path"], e["change"]) for e in body.get("entries", []) if e["section"] == "manifest"]
    report.check(manifest == [("holdpoint/code_identity", "value changed")], f"the manifest's change: {manifest}")
    summary = body.get("summary", {})
    report.check(summary.get("beyond_tolerance") == len(body.get("entries", [])) and body.get("same") is False,
                 f"--json summary: {body.get('summary')}")


def check_tolerance(report, tmp):
    a, b = os.path.join(tmp, "tol-a.pt"), os.path.join(tmp, "tol-b.pt")
    w = torch.linspace(1.0, 2.0, 100, dtype=torch.float64)
    torch.save({"w": w}, a)
    w2 = w.clone()
    w2[10] += 1e-6
    torch.save({"w": w2}, b)
    r = diff(a, b)
    report.check(r.returncode == 1, f"a 1e-6 deviation differs at zero tolerance: {r.describe()}")
    r = diff(a, b, "--atol", "1e-5")
    last = r.stdout.splitlines()[-1] if r.stdout else ""
    report.check(r.returncode == 0 and "(within tolerance)" in r.stdout and last.startswith("same: "),
                 f"--atol 1e-5 lets it pass, marked within tolerance: {r.describe()} {r.stdout[:300]}")
    r = diff(a, b, "--rtol", "1e-5")
    report.check(r.returncode == 0, f"--rtol 1e-5 lets it pass: {r.describe()}")
    r = diff(a, b, "--atol", "1e-7")
    report.check(r.returncode == 1, f"--atol 1e-7 does not: {r.describe()}")
    r, body = diff_json(report, "tolerance --json", a, b, "--atol", "1e-5")
    entry = (body.get("entries") or [{}])[0]
    report.check(r.returncode == 0 and body.get("same") is True and entry.get("within_tolerance") is True
                 and entry["deviation"]["differing"] == 0 and entry["deviation"]["unequal"] == 1,
                 f"--json within tolerance: {entry}")
    r = diff(a, b, "--atol", "-1")
    report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"a negative tolerance: {r.describe()}")


def check_errors(report, tmp):
    good = os.path.join(tmp, "good.pt")
    torch.save({"w": torch.arange(64.0)}, good)
    hostile = os.path.join(harness.CORPUS_DIR, "malicious", "modelscan__unsafe_zip_pytorch.pt")
    r = diff(good, hostile)
    report.check(r.returncode == 2 and first_code(r) == "pickle_global_forbidden",
                 f"a hostile file: exit 2, its code: {r.describe()}")
    r = diff(hostile, good, "--json")
    body = harness.json_or_none(r) or {}
    report.check(r.returncode == 2 and (body.get("error") or {}).get("code") == "pickle_global_forbidden",
                 f"--json on error: one document naming the code: {r.describe()}")
    corrupt = os.path.join(tmp, "corrupt.pt")
    shutil.copyfile(good, corrupt)
    data = bytearray(open(corrupt, "rb").read())
    offset = data.index(torch.arange(64.0).numpy().tobytes()[:16])
    data[offset + 20] ^= 0x10
    open(corrupt, "wb").write(data)
    r = diff(good, corrupt)
    report.check(r.returncode == 2 and first_code(r) == "zip_crc_mismatch", f"a corrupt file: {r.describe()}")
    r = diff(good, os.path.join(tmp, "missing.pt"))
    report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"a missing file: {r.describe()}")
    r = diff(tmp, good)
    report.check(r.returncode == 2 and first_code(r) == "io_not_regular_file", f"a directory: {r.describe()}")


def check_run_generations(report, tmp):
    run = os.path.join(tmp, "run")
    r = harness.run([MAKE_RUN, run, "--generations", "3", "--metric-sequence", "3,1,2"])
    if not report.check(r.returncode == 0, f"make_run_directory: {r.describe()}"):
        return
    r = diff(f"{run}@LATEST", f"{run}@3")
    report.check(r.returncode == 0, f"RUN@LATEST is RUN@3: {r.describe()}")
    r = diff(f"{run}@BEST", f"{run}@{harness.generation_name(2)}")
    report.check(r.returncode == 0, f"RUN@BEST is RUN@step-00000002.pt: {r.describe()}")
    r, body = diff_json(report, "RUN@1 RUN@2", f"{run}@1", f"{run}@2")
    tensors = [e for e in body.get("entries", []) if e["section"] != "manifest" and e["deviation"]]
    report.check(r.returncode == 1 and tensors,
                 f"RUN@1 and RUN@2 differ in a tensor: {r.describe()} {body.get('entries')}")
    report.check(body.get("a", {}).get("path", "").endswith(os.path.join("checkpoints", harness.generation_name(1))),
                 f"the generation's file is named: {body.get('a')}")
    r = diff(f"{run}@9", f"{run}@1")
    report.check(r.returncode == 2 and first_code(r) == "run_generation_missing", f"RUN@9: {r.describe()}")
    r = diff(f"{run}@newest", f"{run}@1")
    report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"RUN@newest: {r.describe()}")
    # The run's record pins the bytes: a generation changed behind its back is refused.
    path = os.path.join(run, "checkpoints", harness.generation_name(1))
    data = bytearray(open(path, "rb").read())
    data[-30] ^= 0x01  # in the zip end records: the digest check comes first
    open(path, "wb").write(data)
    r = diff(f"{run}@1", f"{run}@2")
    report.check(r.returncode == 2 and first_code(r) == "sha256_mismatch", f"a changed generation: {r.describe()}")


def check_sharded(report, tmp):
    run = os.path.join(tmp, "sharded")
    r = harness.run([MAKE_SHARDED, run, "--world", "2", "--steps", "2,4"])
    if not report.check(r.returncode == 0, f"make_sharded_run: {r.describe()}"):
        return
    r = diff(f"{run}@LATEST", f"{run}@4")
    report.check(r.returncode == 0 and "in 6 files" in r.stdout,
                 f"a sharded step against itself: same, the step manifest and 2 shards each: {r.describe()} {r.stdout}")
    r, body = diff_json(report, "sharded 2 vs 4", f"{run}@2", f"{run}@4")
    paths = [e["path"] for e in body.get("entries", [])]
    report.check(r.returncode == 1 and body.get("sharded") is True and body["summary"]["files_compared"] == 6
                 and any(p.startswith("shards/0/") for p in paths) and any(p.startswith("shards/1/") for p in paths),
                 f"steps 2 and 4 differ shard by shard: {r.describe()} {paths}")
    cursor = [e for e in body.get("entries", []) if e["path"] == "shards/1/sampler/cursor"]
    report.check(len(cursor) == 1 and cursor[0]["section"] == "sampler" and cursor[0]["b"] == "9",
                 f"rank 1's sampler cursor, in section sampler: {cursor}")
    shard = os.path.join(run, "checkpoints", "step-00000002.shards", "rank-00001.pt")
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0x01
    open(shard, "wb").write(data)
    r = diff(f"{run}@2", f"{run}@4")
    report.check(r.returncode == 2 and first_code(r) == "sha256_mismatch" and "rank-00001.pt" in r.stderr,
                 f"a damaged shard: exit 2, pinned to the step manifest's digest: {r.describe()}")


def max_rss_kib(result):
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    return int(match.group(1)) if match else None


def check_bounded_memory(report, tmp):
    """Two 1 GiB files (4 float32 tensors of 256 MiB), one element apart."""
    a, b = os.path.join(tmp, "big-a.pt"), os.path.join(tmp, "big-b.pt")
    tensors = {f"layer{i}.weight": torch.full((64 * 1024 * 1024,), float(i), dtype=torch.float32) for i in range(4)}
    torch.save(tensors, a)
    tensors["layer2.weight"][123_456_789 % (64 * 1024 * 1024)] += 0.5
    torch.save(tensors, b)
    del tensors
    small_a, small_b = os.path.join(tmp, "small-a.pt"), os.path.join(tmp, "small-b.pt")
    torch.save({"w": torch.zeros(4)}, small_a)
    torch.save({"w": torch.ones(4)}, small_b)
    try:
        base = harness.run(["/usr/bin/time", "-v", HOLDPOINT, "diff", small_a, small_b])
        big = harness.run(["/usr/bin/time", "-v", HOLDPOINT, "diff", a, b, "--json"], timeout=120)
    finally:
        for path in (a, b):
            os.remove(path)
    base_kib, big_kib = max_rss_kib(base), max_rss_kib(big)
    report.check(base.returncode == 1 and base_kib, f"a small diff, for the baseline RSS: {base.describe()}")
    body = harness.json_or_none(big) or {}
    entry = (body.get("entries") or [{}])[0]
    report.check(big.returncode == 1 and len(body.get("entries", [])) == 1 and entry.get("path") == "layer2.weight"
                 and entry["deviation"]["differing"] == 1 and entry["deviation"]["max_abs_deviation"] == 0.5
                 and entry["deviation"]["first_index"] == [123_456_789 % (64 * 1024 * 1024)]
                 and body["summary"]["bytes_compared"] == 2 * 4 * 256 * 1024 * 1024,
                 f"1 GiB pair: the one element found: {big.describe()} {entry}")
    if base_kib and big_kib:
        extra = big_kib - base_kib
        print(f"  1 GiB pair: peak RSS {big_kib / 1024:.1f} MiB, baseline {base_kib / 1024:.1f} MiB, "
              f"extra {extra / 1024:.1f} MiB (bound {RSS_BOUND_KIB / 1024:.0f} MiB)")
        report.check(extra <= RSS_BOUND_KIB, f"1 GiB pair: extra peak RSS {extra} KiB <= {RSS_BOUND_KIB} KiB")
    else:
        report.check(False, f"/usr/bin/time -v reported no maximum RSS: {big.stderr[-300:]}")


def main():
    for tool in (TRAINER, MAKE_RUN, MAKE_SHARDED):
        harness.require_executable(tool)
    report = harness.Report("cli_diff")
    tmp = tempfile.mkdtemp(prefix="holdpoint-diff-")
    try:
        check_identical(report, tmp)
        check_planted(report, tmp)
        check_tolerance(report, tmp)
        check_errors(report, tmp)
        check_run_generations(report, tmp)
        check_sharded(report, tmp)
        check_bounded_memory(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
