"""Signatures from Python (holdpoint.TrustPolicy, holdpoint.sign, trust= on load,
load_model_state, verify, inspect, TrainingState.load/resume and RunDirectory, whose
signing_key signs each commit): the same checks as the C++ library, each refusal with its
own code, and a refused resume leaves the live model untouched.

Keys come from `holdpoint keygen` (the CLI); signing and verifying run in the package."""

import os
import shutil
import sys
import tempfile

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def expect_error(report, what, code, call):
    return harness.expect_raises(report, what, code, call, holdpoint.Error)


def make_state(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    progress = holdpoint.Progress()
    state = holdpoint.TrainingState("signatures-test", config={"hidden": 2})
    state.add("model", model)
    state.add("optimizer", optimizer)
    state.add("progress", progress)
    return state, model, optimizer, progress


def train(model, optimizer, progress, steps):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(4, 3)).pow(2).mean().backward()
        optimizer.step()
        progress.global_step += 1


def main():
    report = harness.Report("python_signatures")
    tmp = tempfile.mkdtemp(prefix="holdpoint-py-sign-")
    try:
        key, other, hmac = (os.path.join(tmp, n) for n in ("key", "other", "hmac"))
        for args in ((key,), (other,), ("--hmac", hmac)):
            r = harness.cli("keygen", *args)
            report.check(r.returncode == 0, f"keygen {args}: {r.describe()}")
        trust = holdpoint.TrustPolicy([key + ".pub"])
        stranger = holdpoint.TrustPolicy([other + ".pub"])
        optional = holdpoint.TrustPolicy([key + ".pub"], required=False)

        # One file.
        path = os.path.join(tmp, "model.pt")
        holdpoint.save(path, {"w": torch.arange(4.0)})
        expect_error(report, "unsigned, required", "signature_missing", lambda: holdpoint.load(path, trust=trust))
        report.check(torch.equal(holdpoint.load(path, trust=optional)["w"], torch.arange(4.0)), "unsigned, optional")
        signed = holdpoint.sign(path, key=key)
        report.check(os.path.exists(path + ".sig") and len(signed["key_id"]) == 32, f"sign: {signed}")
        report.check(torch.equal(holdpoint.load(path, trust=trust)["w"], torch.arange(4.0)), "signed load")
        report.check(holdpoint.verify(path, trust=trust)["digest_checked"], "verify(trust=) checks the signed digest")
        report.check("tree" in holdpoint.inspect(path, trust=trust), "inspect(trust=)")
        report.check(set(holdpoint.load_model_state(path, trust=trust)) == {"w"}, "load_model_state(trust=)")
        expect_error(report, "another key", "signature_key_unknown", lambda: holdpoint.load(path, trust=stranger))
        revoked_list = os.path.join(tmp, "revoked")
        with open(revoked_list, "w") as f:
            f.write(signed["key_id"] + "\n")
        revoked = holdpoint.TrustPolicy([key + ".pub"], revoked=[revoked_list])
        expect_error(report, "revoked", "signature_key_revoked", lambda: holdpoint.load(path, trust=revoked))
        expect_error(report, "a checkpoint as a key", "key_file_invalid",
                     lambda: holdpoint.load(path, trust=holdpoint.TrustPolicy([path])))
        holdpoint.save(path, {"w": torch.arange(4.0) + 1})  # replaced after signing, same size
        expect_error(report, "changed after signing", "sha256_mismatch", lambda: holdpoint.load(path, trust=trust))
        holdpoint.sign(path, key=hmac)
        report.check(torch.equal(holdpoint.load(path, trust=holdpoint.TrustPolicy([hmac]))["w"], torch.arange(4.0) + 1),
                     "HMAC: the same secret signs and verifies")
        try:
            holdpoint.TrustPolicy([])
            report.check(False, "a policy without keys was accepted")
        except ValueError:
            report.check(True, "a policy without keys is refused")

        # A run signed as it goes, resumed under the policy.
        run_path = os.path.join(tmp, "run")
        state, model, optimizer, progress = make_state(0)
        run = holdpoint.RunDirectory(run_path, signing_key=key)
        old_latest = None
        for step in (1, 2, 3):
            train(model, optimizer, progress, 1)
            state.commit(run, step=step)
            if step == 2:
                old_latest = open(os.path.join(run_path, "LATEST")).read()
        checks = run.verify_signatures(trust)
        report.check(all(c["ok"] for c in checks) and any(c["name"] == "chain" for c in checks),
                     f"a run signed at commit verifies: {checks}")
        del run
        final = [p.detach().clone() for p in model.parameters()]

        resumed_state, resumed_model, _, resumed_progress = make_state(1)
        report.check(resumed_state.resume(holdpoint.RunDirectory(run_path, trust=trust))["step"] == 3,
                     "resume under the policy")
        report.check(all(torch.equal(a, b) for a, b in zip(resumed_model.parameters(), final)),
                     "resume under the policy restores the model")

        # An outside witness: the head recorded elsewhere must be the run's signed head.
        head = holdpoint.RunDirectory(run_path, recover=False).latest()
        witnessed = holdpoint.TrustPolicy([key + ".pub"], min_head_step=3, expected_head=head["sha256"])
        report.check(holdpoint.RunDirectory(run_path, trust=witnessed).latest()["step"] == 3,
                     "a run whose head is the witnessed one opens")
        report.check(holdpoint.RunDirectory(run_path, trust=holdpoint.TrustPolicy([key + ".pub"], expected_head=3))
                     .latest()["step"] == 3, "expected_head as a step")
        expect_error(report, "a witness ahead of the run", "signature_rollback",
                     lambda: holdpoint.RunDirectory(run_path, trust=holdpoint.TrustPolicy([key + ".pub"],
                                                                                          min_head_step=4)))
        expect_error(report, "a witness naming another head", "signature_rollback",
                     lambda: holdpoint.RunDirectory(run_path, recover=False,
                                                    trust=holdpoint.TrustPolicy([key + ".pub"], expected_head=2))
                     .require_signatures())
        for bad in ({"min_head_step": -1}, {"expected_head": "not a digest"}, {"expected_head": True}):
            try:
                holdpoint.TrustPolicy([key + ".pub"], **bad)
                report.check(False, f"TrustPolicy accepted {bad}")
            except ValueError:
                report.check(True, f"TrustPolicy refuses {bad}")

        # Rolled back: LATEST put back to step 2. Opening under the policy refuses
        # and removes nothing; a read-only open lets resume refuse it too.
        with open(os.path.join(run_path, "LATEST"), "w") as f:
            f.write(old_latest)
        files_before = sorted(os.listdir(os.path.join(run_path, "checkpoints")))
        expect_error(report, "open a rolled-back run", "signature_rollback",
                     lambda: holdpoint.RunDirectory(run_path, trust=trust))
        report.check(sorted(os.listdir(os.path.join(run_path, "checkpoints"))) == files_before,
                     "the refused open removed nothing")
        fresh_state, fresh_model, _, _ = make_state(2)
        before = [p.detach().clone() for p in fresh_model.parameters()]
        read_only = holdpoint.RunDirectory(run_path, recover=False, trust=trust)
        expect_error(report, "resume a rolled-back run", "signature_rollback", lambda: fresh_state.resume(read_only))
        report.check(all(torch.equal(a, b) for a, b in zip(fresh_model.parameters(), before)),
                     "a refused resume left the live model untouched")
        expect_error(report, "another key's run", "signature_key_unknown",
                     lambda: holdpoint.RunDirectory(run_path, recover=False, trust=stranger).require_signatures())

        # Unsigned generation in a run: signature_missing at load; sign() mends it.
        plain = os.path.join(tmp, "plain")
        state2, model2, optimizer2, progress2 = make_state(3)
        plain_run = holdpoint.RunDirectory(plain)
        train(model2, optimizer2, progress2, 1)
        state2.commit(plain_run, step=1)
        trusting = holdpoint.RunDirectory(plain, recover=False, trust=trust)
        expect_error(report, "unsigned generation", "signature_missing", lambda: trusting.load())
        report.check(trusting.verify()["code"] == "signature_missing", "verify of an unsigned generation")
        written = plain_run.sign(key)
        report.check("checkpoints/step-00000001.pt.sig" in written, f"RunDirectory.sign: {written}")
        report.check(holdpoint.RunDirectory(plain, recover=False, trust=trust).verify()["ok"], "verify after sign")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
