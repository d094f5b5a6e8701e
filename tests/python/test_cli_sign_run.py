"""holdpoint sign RUN / verify RUN --trust, end to end, on run directories written by
tests/tools/make_run_directory and (sharded) tests/tools/make_sharded_run: every generation
signed in a chain over previous-sha256, then LATEST, BEST and index.json.

Positive: a signed run verifies (text and JSON), signing again keeps the chain and signs only
what is new, a sharded run's step manifests are signed and their shards then checked
against the digests a signed manifest lists.
Negative, each with its own code and exit 1, the run's files untouched by verify: an
unsigned run, another key, a revoked key, a truncated signature, a gap in the chain, a
rolled-back LATEST, an edited index, a shard changed after signing."""

import json
import os
import shutil
import sys
import tempfile

import harness

cli = harness.cli
first_code = harness.first_code
MAKE_RUN = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_run_directory")
MAKE_SHARDED = os.path.join(harness.BUILD_DIR, "tests", "tools", "make_sharded_run")


def snapshot(directory):
    out = {}
    for root, _dirs, files in os.walk(directory):
        for f in files:
            if f == ".holdpoint-lock":
                continue
            path = os.path.join(root, f)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, directory)] = handle.read()
    return out


def main():
    report = harness.Report("cli_sign_run")
    harness.require_executable(MAKE_RUN)
    harness.require_executable(MAKE_SHARDED)
    tmp = tempfile.mkdtemp(prefix="holdpoint-sign-run-")
    try:
        key, other = os.path.join(tmp, "key"), os.path.join(tmp, "other")
        for k in (key, other):
            cli("keygen", k)
        run = os.path.join(tmp, "run")
        # BEST is step 1 (the lowest loss), LATEST step 3.
        r = harness.run([MAKE_RUN, run, "--generations", "3", "--metric-sequence", "0.1,0.5,0.9"])
        report.check(r.returncode == 0, f"make_run_directory: {r.describe()}")

        def verify(path=run, *extra):
            return cli("verify", path, "--trust", key + ".pub", *extra)

        r = verify()
        report.check(r.returncode == 1 and first_code(r) == "signature_missing", f"unsigned run: {r.describe()}")
        r = verify(run, "--signature-optional")
        report.check(r.returncode == 0, f"unsigned run, optional: {r.describe()}")

        r = cli("sign", run, "--key", key)
        report.check(r.returncode == 0 and r.stdout.count("signed  ") >= 5, f"sign RUN: {r.describe()}")
        r = verify()
        report.check(r.returncode == 0 and "signature checks passed" in r.stdout, f"signed run: {r.describe()}")
        r = verify(run, "--json")
        body = harness.json_or_none(r) or {}
        names = [c["name"] for c in body.get("signatures", [])]
        report.check(r.returncode == 0 and body.get("valid") and "chain" in names and "LATEST.sig" in names
                     and "index.json.sig" in names, f"signed run, JSON: {r.describe()}")
        r = cli("sign", run, "--key", key)
        report.check(r.returncode == 0 and "checkpoints/" not in r.stdout, f"signing again re-signs no generation: "
                     f"{r.describe()}")
        r = cli("sign", run, "--key", key, "--previous", "0" * 64)
        report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"--previous on a run: {r.describe()}")

        r = cli("verify", run, "--trust", other + ".pub")
        report.check(r.returncode == 1 and first_code(r) == "signature_key_unknown", f"another key: {r.describe()}")
        revoked = os.path.join(tmp, "revoked")
        key_id = [line.split()[1] for line in open(os.path.join(run, "LATEST.sig")) if line.startswith("key-id ")][0]
        with open(revoked, "w") as f:
            f.write(f"# rotated out\n{key_id}\n")
        r = verify(run, "--revoked", revoked)
        report.check(r.returncode == 1 and first_code(r) == "signature_key_revoked", f"revoked: {r.describe()}")

        def damaged_copy(label, damage, code):
            copy = os.path.join(tmp, label)
            shutil.copytree(run, copy)
            damage(copy)
            before = snapshot(copy)
            r = verify(copy)
            report.check(r.returncode == 1 and first_code(r) == code, f"{label}: {r.describe()}")
            report.check(snapshot(copy) == before, f"{label}: verify changed the run")

        gens = sorted(g for g in os.listdir(os.path.join(run, "checkpoints")) if g.endswith(".pt"))

        def truncate(copy):
            sig = os.path.join(copy, "checkpoints", gens[0] + ".sig")
            with open(sig, "r+b") as f:
                f.truncate(os.path.getsize(sig) // 2)
        damaged_copy("truncated", truncate, "signature_malformed")

        def gap(copy):
            # The middle generation removed with its signature (and from the index,
            # as a hand-made deletion would): the last one names a digest no one signed.
            middle = gens[1]
            for suffix in ("", ".sig", ".sha256"):
                os.remove(os.path.join(copy, "checkpoints", middle + suffix))
        damaged_copy("gap", gap, "signature_chain_broken")

        # A rolled-back LATEST: put back to name the generation before the newest
        # (its own digest, as an older LATEST said), the newest still signed.
        def roll_back(copy):
            previous = gens[-2]
            digest = open(os.path.join(copy, "checkpoints", previous + ".sha256")).read().split()[0]
            with open(os.path.join(copy, "LATEST"), "w") as f:
                f.write(f"{previous} {digest}\n")
        damaged_copy("rolled-back", roll_back, "signature_rollback")

        def edit_index(copy):
            path = os.path.join(copy, "index.json")
            text = open(path).read()
            with open(path, "w") as f:
                f.write(text.replace('"kind": "resume"', '"kind": "export"', 1))
        damaged_copy("edited-index", edit_index, "signature_statement_mismatch")

        # An outside witness (--expect-head, --min-step): a whole run put back, signatures
        # included, verifies; a witness that recorded a later head refuses it.
        last_step = int(gens[-1][len("step-"):-len(".pt")])
        digest_of = {g: open(os.path.join(run, "checkpoints", g + ".sha256")).read().split()[0] for g in gens}
        for extra in (["--min-step", str(last_step)], ["--expect-head", str(last_step)],
                      ["--expect-head", digest_of[gens[-1]]]):
            r = verify(run, *extra)
            report.check(r.returncode == 0, f"witness {extra} agrees: {r.describe()}")
        for extra in (["--min-step", str(last_step + 1)], ["--expect-head", str(last_step + 1)],
                      ["--expect-head", digest_of[gens[-2]]]):
            before = snapshot(run)
            r = verify(run, *extra)
            report.check(r.returncode == 1 and first_code(r) == "signature_rollback",
                         f"witness {extra} ahead of the run: {r.describe()}")
            report.check(snapshot(run) == before, f"witness {extra}: verify changed the run")
        for extra, path in ((["--expect-head", "later"], run), (["--min-step", "3"], gens and
                            os.path.join(run, "checkpoints", gens[-1]))):
            r = verify(path, *extra)
            report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"{extra} on {path}: {r.describe()}")
        r = cli("verify", run, "--min-step", "1")
        report.check(r.returncode == 2 and first_code(r) == "invalid_argument", f"--min-step without --trust: "
                     f"{r.describe()}")

        # An export takes each generation's signature with it: the file verifies
        # under the key at DEST too.
        dest = os.path.join(tmp, "exported")
        r = cli("export", run, dest, "--all")
        copied = os.path.join(dest, "checkpoints", gens[-1])
        report.check(r.returncode == 0 and os.path.exists(copied + ".sig"), f"export keeps signatures: {r.describe()}")
        r = cli("verify", copied, "--trust", key + ".pub")
        report.check(r.returncode == 0, f"an exported generation verifies under the key: {r.describe()}")

        # Sharded: the coordinator's step manifests are signed; a shard changed after
        # signing fails against the digest the signed manifest lists.
        sharded = os.path.join(tmp, "sharded")
        r = harness.run([MAKE_SHARDED, sharded, "--world", "2", "--steps", "1,2"])
        report.check(r.returncode == 0, f"make_sharded_run: {r.describe()}")
        r = cli("sign", sharded, "--key", key)
        report.check(r.returncode == 0, f"sign a sharded run: {r.describe()}")
        r = verify(sharded)
        report.check(r.returncode == 0, f"signed sharded run: {r.describe()}")
        manifest = os.path.join(sharded, "checkpoints", harness.generation_name(2))
        r = cli("verify", manifest, "--trust", key + ".pub")
        report.check(r.returncode == 0, f"a signed step manifest, alone: {r.describe()}")
        shard = os.path.join(sharded, "checkpoints", "step-00000002.shards", "rank-00001.pt")
        with open(shard, "r+b") as f:
            f.seek(os.path.getsize(shard) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        r = verify(sharded)
        report.check(r.returncode == 1 and first_code(r) in ("sha256_mismatch", "shard_digest_mismatch"),
                     f"a shard changed after signing: {r.describe()}")
        json.dumps(body)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
