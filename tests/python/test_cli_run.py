"""The run-directory commands of the holdpoint command line, end to end: `ls`, `verify RUN`,
`gc` and `export`, on run directories with real generations written by
tests/tools/make_run_directory.cpp through RunDirectory::commit. Exit codes (0 ok, 1 a check
failed, 2 usage or the run cannot be opened), the error code of each refusal, the JSON
shapes of docs/cli.md, and what is (and is not) left on disk.

Run by ctest with the oracle Python (torch 2.13, used to load an exported file)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import harness

HOLDPOINT = harness.holdpoint_binary()
cli = harness.cli
first_code = harness.first_code
json_or_none = harness.json_or_none
name = harness.generation_name
MAKE_RUN = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_run_directory")

# BEST is the oldest generation (lowest loss), LATEST the newest: retention must keep both.
METRICS = "0.3,0.9,0.8,0.7,0.6"


def make_run(report, tmp, label, generations=5, metrics=METRICS):
    run = os.path.join(tmp, label)
    args = [MAKE_RUN, run, "--generations", str(generations)]
    if metrics:
        args += ["--metric-sequence", metrics]
    r = harness.run(args)
    report.check(r.returncode == 0, f"make_run_directory {label}: {r.describe()}")
    return run


def snapshot(directory):
    """Every path under `directory` with its bytes: what 'nothing changed' compares."""
    out = {}
    for root, _, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, directory)] = handle.read()
    return out


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def flip_byte(path, offset=None):
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    open(path, "wb").write(data)


def check_ls(report, tmp):
    run = make_run(report, tmp, "ls")
    r = cli("ls", run)
    report.check(r.returncode == 0, f"ls fresh run: {r.describe()}")
    report.check(f"LATEST: {name(5)}" in r.stdout and f"BEST:   {name(1)}" in r.stdout, f"ls names LATEST/BEST: {r.stdout}")
    report.check("recovery: nothing to do" in r.stdout, "ls on a clean run has no findings")

    r = cli("ls", run, "--json")
    report.check(r.returncode == 0, f"ls --json: {r.describe()}")
    out = json_or_none(r) or {}
    gens = out.get("generations", [])
    report.check([g.get("name") for g in gens] == [name(s) for s in range(1, 6)], f"ls --json lists 5 generations: {gens}")
    expected_loss = [float(x) for x in METRICS.split(",")]
    for i, g in enumerate(gens):
        step = i + 1
        path = os.path.join(run, "checkpoints", name(step))
        report.check(set(g) >= {"name", "step", "epoch", "kind", "size", "sha256", "saved_at", "metrics", "latest", "best"},
                     f"ls --json fields of {g.get('name')}: {sorted(g)}")
        report.check(g.get("step") == step and g.get("epoch") == i and g.get("kind") == "resume",
                     f"ls --json step/epoch/kind of {g.get('name')}")
        report.check(g.get("size") == os.path.getsize(path) and g.get("sha256") == sha256_of(path),
                     f"ls --json size and sha256 of {g.get('name')} are the file's")
        report.check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", g.get("saved_at", "")) is not None,
                     f"saved_at is UTC ISO 8601: {g.get('saved_at')}")
        report.check(g.get("metrics") == {"loss": expected_loss[i]}, f"metrics of {g.get('name')}: {g.get('metrics')}")
        report.check(g.get("latest") == (step == 5) and g.get("best") == (step == 1), f"latest/best flags of {g.get('name')}")
    report.check(out.get("latest") == name(5) and out.get("best") == name(1), f"ls --json latest/best: {out.get('latest')}")
    recovery = out.get("recovery", {})
    report.check(recovery.get("read_only") is True and recovery.get("clean") is True and recovery.get("lines") == [],
                 f"ls --json recovery of a clean run: {recovery}")
    report.check("verification" not in out, "ls without --verify verifies nothing")

    r = cli("ls", run, "--verify", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("verification", {}).get("ok") is True
                 and all(g.get("verified") is True and g.get("code") is None for g in out.get("generations", [])),
                 f"ls --verify on a clean run: {r.describe()}")

    # A stale staging file (a crash between create and rename): reported, never removed.
    staging = [os.path.join(run, ".LATEST.staging-4242-1"), os.path.join(run, "checkpoints", ".step-00000006.pt.staging-4242-2")]
    for path in staging:
        open(path, "wb").write(b"partial")
    before = snapshot(run)
    r = cli("ls", run, "--json")
    out = json_or_none(r) or {}
    recovery = out.get("recovery", {})
    report.check(r.returncode == 0, f"ls with staging files exits 0: {r.describe()}")
    report.check(sorted(recovery.get("removed_staging", [])) == sorted([".LATEST.staging-4242-1",
                                                                        "checkpoints/.step-00000006.pt.staging-4242-2"]),
                 f"ls --json reports the staging files: {recovery.get('removed_staging')}")
    report.check(recovery.get("clean") is False and any(line.startswith("would remove stale staging file")
                                                        for line in recovery.get("lines", [])),
                 f"ls says what recovery would do: {recovery.get('lines')}")
    r = cli("ls", run)
    report.check("would remove stale staging file .LATEST.staging-4242-1" in r.stdout, f"ls text names it: {r.stdout}")
    report.check(all(os.path.exists(p) for p in staging) and snapshot(run) == before, "ls removed or changed nothing")

    # --verify turns a damaged generation into exit 1, with its code.
    flip_byte(os.path.join(run, "checkpoints", name(2)))
    r = cli("ls", run, "--verify", "--json")
    out = json_or_none(r) or {}
    damaged = [g for g in out.get("generations", []) if g.get("name") == name(2)]
    report.check(r.returncode == 1 and damaged and damaged[0].get("verified") is False
                 and damaged[0].get("code") == "sha256_mismatch", f"ls --verify with a damaged generation: {r.describe()}")
    r = cli("ls", run)
    report.check(r.returncode == 0, f"ls without --verify still exits 0: {r.describe()}")


def check_verify(report, tmp):
    run = make_run(report, tmp, "verify")
    r = cli("verify", run)
    report.check(r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("valid:"), f"verify RUN: {r.describe()}")
    r = cli("verify", run, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("valid") is True, f"verify RUN --json: {r.describe()}")
    report.check([(g.get("name"), g.get("ok"), g.get("code")) for g in out.get("generations", [])]
                 == [(name(s), True, None) for s in range(1, 6)], f"verify RUN --json generations: {out.get('generations')}")
    report.check(all(set(g) == {"name", "ok", "code", "detail"} for g in out.get("generations", [])),
                 "each generation is {name, ok, code, detail}")
    report.check(out.get("latest", {}).get("name") == name(5) and out.get("latest", {}).get("ok") is True
                 and out.get("best", {}).get("name") == name(1), f"verify RUN --json pointers: {out.get('latest')} {out.get('best')}")

    # The file form is unchanged: one generation, checked against its sha256sum sidecar.
    r = cli("verify", os.path.join(run, "checkpoints", name(3)), "--sidecar")
    report.check(r.returncode == 0 and r.stdout.startswith("valid:"), f"verify FILE --sidecar in a run: {r.describe()}")
    r = cli("verify", run, "--sidecar")
    report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"verify RUN --sidecar: {r.describe()}")
    plain = os.path.join(tmp, "plain-directory")
    os.makedirs(plain)
    r = cli("verify", plain)
    report.check(r.returncode == 2 and first_code(r) == "io_not_regular_file",
                 f"a directory that is not a run directory is still not a file: {r.describe()}")

    # One flipped byte in an older generation: that generation fails with sha256_mismatch.
    damaged = make_run(report, tmp, "verify-damaged")
    flip_byte(os.path.join(damaged, "checkpoints", name(3)))
    before = snapshot(damaged)
    r = cli("verify", damaged)
    report.check(r.returncode == 1 and first_code(r) == "sha256_mismatch", f"verify RUN with a damaged generation: {r.describe()}")
    r = cli("verify", damaged, "--json")
    out = json_or_none(r) or {}
    by_name = {g.get("name"): g for g in out.get("generations", [])}
    report.check(r.returncode == 1 and out.get("valid") is False and out.get("code") == "sha256_mismatch",
                 f"verify RUN --json damaged: {r.describe()}")
    report.check(by_name.get(name(3), {}).get("ok") is False and by_name.get(name(3), {}).get("code") == "sha256_mismatch",
                 f"the damaged generation is named with its code: {by_name.get(name(3))}")
    report.check(all(by_name.get(name(s), {}).get("ok") is True for s in (1, 2, 4, 5)), "the others verify")
    report.check(snapshot(damaged) == before, "verify RUN changed nothing")

    # LATEST's own file damaged: LATEST does not verify.
    latest_damaged = make_run(report, tmp, "verify-latest-damaged")
    flip_byte(os.path.join(latest_damaged, "checkpoints", name(5)))
    r = cli("verify", latest_damaged, "--json")
    out = json_or_none(r) or {}
    by_name = {g.get("name"): g for g in out.get("generations", [])}
    report.check(r.returncode == 1 and by_name.get(name(5), {}).get("code") == "sha256_mismatch"
                 and out.get("latest", {}).get("ok") is False, f"verify RUN with LATEST's file damaged: {r.describe()}")

    # LATEST deleted: every generation verifies, but the run has no commit record.
    no_latest = make_run(report, tmp, "verify-no-latest")
    os.unlink(os.path.join(no_latest, "LATEST"))
    r = cli("verify", no_latest)
    report.check(r.returncode == 1 and first_code(r) == "run_pointer_invalid", f"verify RUN without LATEST: {r.describe()}")
    r = cli("verify", no_latest, "--json")
    out = json_or_none(r) or {}
    report.check(out.get("valid") is False and out.get("latest", {}).get("ok") is False
                 and out.get("latest", {}).get("problem") == "missing", f"verify --json names the missing LATEST: {out.get('latest')}")
    report.check(not os.path.exists(os.path.join(no_latest, "LATEST")), "verify did not rewrite LATEST")

    # A BEST naming another digest: BEST does not verify.
    bad_best = make_run(report, tmp, "verify-bad-best")
    with open(os.path.join(bad_best, "BEST"), "w") as f:
        f.write(f"{name(1)} {'0' * 64}\n")
    r = cli("verify", bad_best, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 1 and out.get("code") == "run_pointer_invalid" and out.get("best", {}).get("ok") is False,
                 f"verify RUN with a wrong BEST: {r.describe()}")


def check_gc(report, tmp):
    run = make_run(report, tmp, "gc")
    before = snapshot(run)
    r = cli("gc", run, "--keep", "2", "--dry-run", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0, f"gc --dry-run: {r.describe()}")
    keep = {k.get("name"): k.get("reasons") for k in out.get("keep", [])}
    report.check(keep == {name(1): ["BEST"], name(4): ["newest"], name(5): ["LATEST", "newest"]},
                 f"gc --dry-run keeps LATEST, BEST and the newest 2, with reasons: {keep}")
    report.check(out.get("remove") == [name(2), name(3)] and out.get("removed") == [] and out.get("dry_run") is True,
                 f"gc --dry-run plan: {out.get('remove')} {out.get('removed')}")
    report.check(snapshot(run) == before, "gc --dry-run changed nothing")
    r = cli("gc", run, "--keep", "2", "--dry-run")
    report.check(r.returncode == 0 and f"remove  {name(2)}" in r.stdout and "nothing was changed" in r.stdout,
                 f"gc --dry-run text: {r.stdout}")

    r = cli("gc", run, "--keep", "2", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("removed") == [name(2), name(3)], f"gc --keep 2: {r.describe()}")
    left = sorted(os.listdir(os.path.join(run, "checkpoints")))
    report.check(left == sorted([name(s) for s in (1, 4, 5)] + [name(s) + ".sha256" for s in (1, 4, 5)]),
                 f"gc removed the generations and their sidecars, kept LATEST and BEST: {left}")
    report.check(before["LATEST"] == open(os.path.join(run, "LATEST"), "rb").read()
                 and before["BEST"] == open(os.path.join(run, "BEST"), "rb").read(), "gc left LATEST and BEST as they were")
    index = json.load(open(os.path.join(run, "index.json")))
    report.check([g["name"] for g in index["generations"]] == [name(s) for s in (1, 4, 5)], "index.json forgot them")
    r = cli("verify", run)
    report.check(r.returncode == 0, f"the run verifies after gc: {r.describe()}")

    # Down to one: LATEST and BEST still stay.
    r = cli("gc", run, "--keep", "1", "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 0 and out.get("removed") == [name(4)], f"gc --keep 1: {r.describe()}")
    report.check(os.path.exists(os.path.join(run, "checkpoints", name(1))) and
                 os.path.exists(os.path.join(run, "checkpoints", name(5))), "gc --keep 1 kept BEST and LATEST")

    # Refusals: --keep 0 would delete everything; --keep-best needs a metric.
    other = make_run(report, tmp, "gc-refusals")
    before = snapshot(other)
    r = cli("gc", other, "--keep", "0")
    report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"gc --keep 0: {r.describe()}")
    r = cli("gc", other, "--keep", "0", "--json")
    report.check(r.returncode == 2 and (json_or_none(r) or {}).get("code") == "invalid_argument", f"gc --keep 0 --json: {r.describe()}")
    r = cli("gc", other, "--keep", "1", "--keep-best", "1")
    report.check(r.returncode == 2, f"gc --keep-best without --metric: {r.describe()}")
    r = cli("gc", other)
    report.check(r.returncode == 2, f"gc without --keep: {r.describe()}")
    report.check(snapshot(other) == before, "refused gc runs changed nothing")

    # --keep-every and --keep-best add reasons.
    r = cli("gc", other, "--keep", "1", "--keep-every", "2", "--dry-run", "--json")
    out = json_or_none(r) or {}
    keep = {k.get("name"): k.get("reasons") for k in out.get("keep", [])}
    report.check(r.returncode == 0 and "every" in keep.get(name(2), []) and "every" in keep.get(name(4), [])
                 and out.get("remove") == [name(3)], f"gc --keep-every 2: {keep} remove {out.get('remove')}")
    r = cli("gc", other, "--keep", "1", "--keep-best", "2", "--metric", "loss", "--dry-run", "--json")
    out = json_or_none(r) or {}
    keep = {k.get("name"): k.get("reasons") for k in out.get("keep", [])}
    report.check(r.returncode == 0 and keep == {name(1): ["BEST", "best"], name(5): ["LATEST", "newest", "best"]}
                 and out.get("remove") == [name(2), name(3), name(4)], f"gc --keep-best 2 --metric loss: {keep} {r.describe()}")
    # A metric that ranks another generation than BEST (here: the wrong direction) would
    # move BEST on opening and let gc delete the real best generation: refused.
    before = snapshot(other)
    for extra in ([], ["--dry-run"]):
        r = cli("gc", other, "--keep", "1", "--keep-best", "1", "--metric", "loss", "--higher-is-better", *extra)
        report.check(r.returncode == 2 and first_code(r) == "invalid_argument" and "BEST" in r.stderr,
                     f"gc with a metric contradicting BEST {extra}: {r.describe()}")
    report.check(snapshot(other) == before, "the refused gc left BEST and every generation alone")

    # gc recovers first, and says so: a stale staging file goes before the plan.
    staging = os.path.join(other, ".index.json.staging-77-1")
    open(staging, "wb").write(b"{")
    r = cli("gc", other, "--keep", "3")
    report.check(r.returncode == 0 and "recovery: removed stale staging file .index.json.staging-77-1" in r.stdout
                 and not os.path.exists(staging), f"gc runs recovery first: {r.stdout}")


def check_export(report, tmp):
    run = make_run(report, tmp, "export")
    source_before = snapshot(run)
    dest = os.path.join(tmp, "export-latest")
    r = cli("export", run, dest, "--json")
    report.check(r.returncode == 0, f"export --latest: {r.describe()}")
    proof = json_or_none(r) or {}
    ckpt = os.path.join(dest, "checkpoints", name(5))
    expected_files = {"LATEST", "index.json", "LOADING.md", "RECOVERY-PROOF.json",
                      f"checkpoints/{name(5)}", f"checkpoints/{name(5)}.sha256"}
    report.check(set(snapshot(dest)) == expected_files, f"export --latest wrote exactly {sorted(expected_files)}: "
                 f"{sorted(snapshot(dest)) if os.path.isdir(dest) else None}")
    if os.path.exists(ckpt):
        source_file = os.path.join(run, "checkpoints", name(5))
        report.check(open(ckpt, "rb").read() == open(source_file, "rb").read(), "the copy is byte for byte the source")
        digest = sha256_of(ckpt)
        report.check(open(ckpt + ".sha256").read() == f"{digest}  {name(5)}\n", "the sidecar is in sha256sum format")
        if shutil.which("sha256sum"):
            p = subprocess.run(["sha256sum", "-c", name(5) + ".sha256"], cwd=os.path.dirname(ckpt),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            report.check(p.returncode == 0, f"sha256sum -c accepts the sidecar: {p.stdout!r} {p.stderr!r}")
        report.check(open(os.path.join(dest, "LATEST")).read() == f"{name(5)} {digest}\n", "DEST/LATEST names the copy")
    on_disk = json.load(open(os.path.join(dest, "RECOVERY-PROOF.json"))) if os.path.exists(
        os.path.join(dest, "RECOVERY-PROOF.json")) else None
    report.check(on_disk == proof, "--json prints the proof RECOVERY-PROOF.json holds")
    report.check(proof.get("schema") == "holdpoint.export-proof" and proof.get("selection") == "latest"
                 and proof.get("command", [None])[1:] == ["export", run, dest, "--json"]
                 and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", proof.get("created_at", "")) is not None,
                 f"proof header: {dict((k, proof.get(k)) for k in ('schema', 'selection', 'command', 'created_at'))}")
    report.check(proof.get("source", {}).get("run") == os.path.abspath(run), f"proof names the source: {proof.get('source')}")
    report.check([(g.get("name"), g.get("sha256")) for g in proof.get("generations", [])]
                 == [(name(5), sha256_of(os.path.join(run, "checkpoints", name(5))))], "proof lists the generation and digest")
    recovered = proof.get("recovered", {})
    report.check(recovered.get("generation") == name(5) and recovered.get("step") == 5, f"proof: recovered step: {recovered}")
    checks = {(c.get("check"), c.get("subject")) for c in proof.get("checks", [])}
    for check in ("source_sha256_matches_record", "copy_verified_before_publish", "copy_size_matches_source",
                  "copy_sha256_matches_source", "load_back", "manifest_reads"):
        report.check((check, name(5)) in checks, f"proof check {check} passed: {sorted(checks)}")
    report.check(("destination_opens_clean", dest) in checks, "proof check destination_opens_clean")
    loading = open(os.path.join(dest, "LOADING.md")).read() if os.path.exists(os.path.join(dest, "LOADING.md")) else ""
    report.check("weights_only=True" in loading and "sha256sum -c" in loading and "RunDirectory" in loading
                 and "expected_sha256" in loading, "LOADING.md explains C++, Python and sha256sum loading")
    report.check(snapshot(run) == source_before, "export changed nothing in the source run")
    r = cli("verify", dest)
    report.check(r.returncode == 0, f"the export verifies as a run directory: {r.describe()}")
    r = cli("ls", dest, "--json")
    report.check(r.returncode == 0 and (json_or_none(r) or {}).get("recovery", {}).get("clean") is True,
                 f"the export needs no recovery: {r.describe()}")
    try:
        import torch
        loaded = torch.load(ckpt, weights_only=True)
        report.check(int(loaded["step"]) == 5 and "holdpoint" in loaded, "Python torch.load(weights_only=True) reads the copy")
    except ImportError:
        print("  (torch missing: the Python load of the export is not checked)")

    # A DEST that is in use is refused before anything is written.
    busy = os.path.join(tmp, "export-busy")
    os.makedirs(busy)
    open(os.path.join(busy, "notes.txt"), "w").write("mine")
    r = cli("export", run, busy)
    report.check(r.returncode == 2 and first_code(r) == "export_destination_invalid", f"export to a non-empty DEST: {r.describe()}")
    report.check(os.listdir(busy) == ["notes.txt"], f"the refused export wrote nothing: {os.listdir(busy)}")
    r = cli("export", run, busy, "--json")
    report.check(r.returncode == 2 and (json_or_none(r) or {}).get("code") == "export_destination_invalid",
                 f"export to a non-empty DEST --json: {r.describe()}")
    a_file = os.path.join(tmp, "export-file")
    open(a_file, "w").write("x")
    r = cli("export", run, a_file)
    report.check(r.returncode == 2 and first_code(r) == "export_destination_invalid", f"export to a file: {r.describe()}")
    empty = os.path.join(tmp, "export-empty")
    os.makedirs(empty)
    link = os.path.join(tmp, "export-link")
    os.symlink(empty, link)
    r = cli("export", run, link)
    report.check(r.returncode == 2 and first_code(r) == "export_destination_invalid" and os.listdir(empty) == [],
                 f"export through a symlinked DEST: {r.describe()}")
    r = cli("export", run, empty)
    report.check(r.returncode == 0 and os.path.exists(os.path.join(empty, "RECOVERY-PROOF.json")),
                 f"export into an empty directory: {r.describe()}")
    r = cli("export", run, os.path.join(tmp, "export-usage"), "--latest", "--all")
    report.check(r.returncode == 2 and not os.path.exists(os.path.join(tmp, "export-usage")), f"--latest with --all: {r.describe()}")

    # --all: every generation, both pointers.
    dest_all = os.path.join(tmp, "export-all")
    r = cli("export", run, dest_all, "--all", "--json")
    proof = json_or_none(r) or {}
    report.check(r.returncode == 0, f"export --all: {r.describe()}")
    report.check(sorted(os.listdir(os.path.join(dest_all, "checkpoints"))) ==
                 sorted([name(s) for s in range(1, 6)] + [name(s) + ".sha256" for s in range(1, 6)]),
                 "export --all copies every generation and sidecar")
    for s in range(1, 6):
        report.check(sha256_of(os.path.join(dest_all, "checkpoints", name(s))) ==
                     sha256_of(os.path.join(run, "checkpoints", name(s))), f"export --all: {name(s)} is the source's")
    report.check(proof.get("pointers") == {"LATEST": name(5), "BEST": name(1)} and proof.get("skipped") == [],
                 f"export --all pointers: {proof.get('pointers')}")
    report.check(open(os.path.join(dest_all, "BEST")).read() == open(os.path.join(run, "BEST")).read(),
                 "export --all copies BEST")
    r = cli("verify", dest_all)
    report.check(r.returncode == 0, f"export --all verifies: {r.describe()}")

    # --best: the BEST generation, which DEST's LATEST names too.
    dest_best = os.path.join(tmp, "export-best")
    r = cli("export", run, dest_best, "--best", "--json")
    proof = json_or_none(r) or {}
    report.check(r.returncode == 0 and proof.get("pointers") == {"LATEST": name(1), "BEST": name(1)}
                 and proof.get("recovered", {}).get("step") == 1, f"export --best: {r.describe()}")

    # A damaged LATEST: refused, explained, nothing written, the source untouched.
    damaged = make_run(report, tmp, "export-damaged")
    flip_byte(os.path.join(damaged, "checkpoints", name(5)))
    before = snapshot(damaged)
    dest_damaged = os.path.join(tmp, "export-damaged-dest")
    r = cli("export", damaged, dest_damaged)
    report.check(r.returncode == 1 and first_code(r) == "run_pointer_invalid", f"export with LATEST damaged: {r.describe()}")
    report.check("does not verify" in r.stderr and "sha256_mismatch" in r.stderr, f"the refusal explains: {r.stderr}")
    report.check(not os.path.exists(dest_damaged), "nothing was written for the refused export")
    report.check(snapshot(damaged) == before, "the damaged source was not changed")
    r = cli("export", damaged, dest_damaged, "--all", "--json")
    report.check(r.returncode == 1 and (json_or_none(r) or {}).get("code") == "run_pointer_invalid",
                 f"export --all with LATEST damaged: {r.describe()}")

    # An older generation damaged (found while copying: read-only opening verifies only
    # LATEST): --all exports the others and lists it as skipped, with its code.
    old_damaged = make_run(report, tmp, "export-old-damaged")
    flip_byte(os.path.join(old_damaged, "checkpoints", name(1)))
    dest_skip = os.path.join(tmp, "export-skip")
    r = cli("export", old_damaged, dest_skip, "--all", "--json")
    proof = json_or_none(r) or {}
    names = [g.get("name") for g in proof.get("generations", [])]
    skipped = [(s.get("name"), s.get("code")) for s in proof.get("skipped", [])]
    report.check(r.returncode == 0 and names == [name(s) for s in range(2, 6)], f"export --all skips the damaged one: {r.describe()}")
    report.check(skipped == [(name(1), "sha256_mismatch")], f"the proof lists it as skipped: {skipped}")
    report.check(not os.path.exists(os.path.join(dest_skip, "checkpoints", name(1))), "a damaged generation is never copied")
    report.check(proof.get("pointers") == {"LATEST": name(5), "BEST": None} and not os.path.exists(os.path.join(dest_skip, "BEST")),
                 f"BEST (the damaged generation) is not exported: {proof.get('pointers')}")
    r = cli("verify", dest_skip)
    report.check(r.returncode == 0, f"the partial --all export verifies: {r.describe()}")


def check_unopenable(report, tmp):
    run = make_run(report, tmp, "real")
    link = os.path.join(tmp, "run-link")
    os.symlink(run, link)
    before = snapshot(run)
    for args in (["ls", link], ["verify", link], ["gc", link, "--keep", "1"], ["export", link, os.path.join(tmp, "x")]):
        r = cli(*args)
        report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"{args[0]} on a symlinked run: {r.describe()}")
    report.check(snapshot(run) == before and not os.path.exists(os.path.join(tmp, "x")), "nothing changed through the symlink")
    r = cli("ls", link, "--json")
    out = json_or_none(r) or {}
    report.check(r.returncode == 2 and out.get("code") == "io_open_failed" and out.get("run") == link,
                 f"ls --json on a symlinked run: {r.describe()}")
    r = cli("ls", os.path.join(tmp, "missing-run"))
    report.check(r.returncode == 2 and first_code(r) == "io_open_failed", f"ls on a missing run: {r.describe()}")
    r = cli("gc", os.path.join(tmp, "missing-run"), "--keep", "1")
    report.check(r.returncode == 2 and not os.path.exists(os.path.join(tmp, "missing-run")), "gc creates no run directory")


def main():
    harness.require_executable(HOLDPOINT)
    harness.require_executable(MAKE_RUN)
    report = harness.Report("test_cli_run")
    tmp = tempfile.mkdtemp(prefix="holdpoint-cli-run-")
    try:
        check_ls(report, tmp)
        check_verify(report, tmp)
        check_gc(report, tmp)
        check_export(report, tmp)
        check_unopenable(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
