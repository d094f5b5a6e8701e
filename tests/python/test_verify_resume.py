"""`holdpoint verify-resume` end to end (docs/verification.md).

1. The protocol example (examples/resume-protocol/train.cpp) passes: every quantity of
   the full resume deviates by exactly 0, the negative control (no RNG restore) diverges
   and its weight deviation is reported; verification.json and report.svg are complete.
2. `--sweep` passes: every cut 1..N-1, each with its own resume and negative control.
3. Planted bugs, one check each, with the same program built with --plant-bug NAME
   (tests/tools: resume_protocol_planted): the verifier exits 1 and names the failing
   quantity, or exits 2 when a run crashes.
4. The verifier's own refusals, with a small Python stub trainer written here: a trainer
   without randomness (its negative control cannot diverge: exit 1), a run that times
   out, exits 0 without output or writes a summary that is not JSON (exit 2), an output
   directory that exists, a trainer that does not exist, a cut out of range (exit 2).

Run by ctest with the oracle Python (torch 2.13), which also runs the stub trainer."""

import json
import os
import re
import shutil
import stat
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

import harness

HOLDPOINT = harness.holdpoint_binary()
TRAINER = os.path.join(harness.BUILD_DIR, "examples", "resume-protocol", "train")
PLANTED = os.path.join(harness.BUILD_DIR, "tests", "tools", "resume_protocol_planted")
STEPS = 10
CUT = 5
RUN_TIMEOUT_S = 600  # the whole verification; a sweep is 28 runs of about 0.5 s

# Each planted bug (applied only when the trainer resumes), the exit code it must
# cause and the quantities of the resumed run of which at least one must fail.
PLANTED_BUGS = {
    "optimizer-not-restored": (1, {"optimizer", "model"}),
    "scheduler-rebuilt": (1, {"lr"}),
    "sampler-cursor-reset": (1, {"sample_ids"}),
    "generator-not-restored": (1, None),  # exactly one rng_next.<generator>: checked below
    "nan-in-trace": (1, None),  # a failure with code resume_value_not_finite
    "missing-trace-field": (1, {"structure"}),
    "crash": (2, None),
}


def verify_resume(out, trainer, *extra, trainer_args=()):
    args = [HOLDPOINT, "verify-resume", "--trainer", trainer, "--output", out] + list(extra)
    for arg in trainer_args:
        args += ["--trainer-arg", arg]
    # No address-space cap: it would be inherited by the LibTorch trainers.
    return harness.run(args, timeout=RUN_TIMEOUT_S, limit_memory=False)


def load_report(report, out, label):
    path = os.path.join(out, "verification.json")
    if not report.check(os.path.isfile(path), f"{label}: no verification.json"):
        return None
    with open(path) as f:
        return json.load(f)


def verdict_lines(result):
    return dict(re.findall(r"^(all_checks_passed|positive|negative_divergence_detected): (true|false)$",
                           result.stdout, re.MULTILINE))


def failed_quantities(verification, run="resumed"):
    return {f["quantity"] for f in verification["failures"] if f["run"] == run}


def check_protocol_passes(report, tmp):
    out = os.path.join(tmp, "protocol")
    r = verify_resume(out, TRAINER, "--steps", str(STEPS), "--cut", str(CUT))
    report.check(r.returncode == 0, f"protocol: {r.describe()}")
    report.check(verdict_lines(r) == {"all_checks_passed": "true", "positive": "true",
                                      "negative_divergence_detected": "true"}, f"protocol verdict lines: {r.stdout[-400:]}")
    report.check(r.stdout.count("started:") == 4 and len(re.findall(r": exit 0 in ", r.stdout)) == 4,
                 "a progress line as each of the 4 runs starts and finishes")
    v = load_report(report, out, "protocol")
    if not v:
        return
    report.check(v["all_checks_passed"] is True and v["exit_code"] == 0 and v["completed"] is True, "report verdict")
    report.check(v["tolerance"]["absolute"] == 1e-12 and v["tolerance"]["relative"] == 0, f"tolerance {v['tolerance']}")
    report.check(v["steps"] == STEPS and v["cuts"] == [CUT] and v["sweep"] is False, "steps and cut recorded")
    report.check(v["versions"]["holdpoint"] and v["versions"]["compiler"] and v["versions"]["trainer"].get("libtorch"),
                 f"versions {v['versions']}")
    names = [run["name"] for run in v["runs"]]
    report.check(names == ["continuous", "interrupted", "resumed", "resumed-no-rng"], f"runs {names}")
    for run in v["runs"]:
        report.check(run["exit_code"] == 0 and run["command"][0] == TRAINER and run["seconds"] > 0,
                     f"run record {run['name']}: {run}")
        report.check(os.path.isfile(os.path.join(out, run["stdout"])) and os.path.isfile(os.path.join(out, run["stderr"])),
                     f"{run['name']}: stdout and stderr captured")
    resumed = v["runs"][2]["command"]
    report.check(resumed[resumed.index("--steps") + 1] == str(STEPS - CUT) and "--resume" in resumed
                 and "--omit-rng-restore" not in resumed, f"resumed command {resumed}")
    report.check("--omit-rng-restore" in v["runs"][3]["command"], "the negative control omits the RNG restore")
    report.check(not os.path.exists(os.path.join(out, "final-diff.txt")) and "final checkpoints" not in r.stdout,
                 "a passing verification writes no diff of the final checkpoints")

    result = v["results"][0]
    positive = {c["quantity"]: c for c in result["resumed"]}
    for quantity in ["sample_ids", "lr", "loss", "model", "optimizer", "scheduler", "progress", "final.mse",
                     "final.next_lr", "trace", "protocol.resumed"]:
        report.check(quantity in positive and positive[quantity]["verdict"] == "pass", f"positive {quantity}")
    report.check(any(q.startswith("rng_next.") for q in positive), "the generators' next draws are compared")
    for c in result["resumed"]:
        report.check(c["max_abs_deviation"] in (None, 0.0), f"full resume deviation is exactly 0: {c}")
    report.check(positive["model"]["max_abs_deviation"] == 0.0 and positive["model"]["values_compared"] == 33,
                 f"33 parameters compared, deviation 0: {positive['model']}")

    negative = result["negative_max_weight_deviation"]
    report.check(isinstance(negative, float) and negative > 1e-6,
                 f"the negative control's weight deviation is reported: {negative}")
    report.check(f"max weight deviation {negative:.6g}" in r.stdout, "and printed")
    report.check(result["negative_divergence_detected"] is True and result["negative_well_formed"] is True,
                 "negative control diverged")
    diverged = {c["quantity"] for c in result["resumed_no_rng"] if c["verdict"] == "diverged"}
    report.check({"model", "loss"} <= diverged, f"the negative control diverges in weights and losses: {diverged}")
    report.check(v["failures"] == [], f"no failures: {v['failures']}")

    svg_path = os.path.join(out, "report.svg")
    if report.check(os.path.isfile(svg_path), "report.svg written"):
        with open(svg_path, encoding="utf-8") as f:
            svg = f.read()
        try:
            root = ElementTree.fromstring(svg)
            report.check(root.tag.endswith("svg"), "report.svg is an SVG document")
        except ElementTree.ParseError as error:
            report.check(False, f"report.svg is not XML: {error}")
        report.check("exact" in svg and "resumed, no RNG restore" in svg and "continuous" in svg,
                     "the picture labels the runs and the exact floor")
        report.check("http://" not in svg.replace("http://www.w3.org/2000/svg", "") and "<script" not in svg,
                     "report.svg is self-contained")

    r = verify_resume(os.path.join(tmp, "protocol-json"), TRAINER, "--json")
    report.check(r.returncode == 0, f"--json: {r.describe()}")
    try:
        report.check(json.loads(r.stdout)["all_checks_passed"] is True, "--json prints verification.json")
    except ValueError:
        report.check(False, f"--json stdout is not JSON: {r.stdout[:200]}")


def check_sweep(report, tmp):
    out = os.path.join(tmp, "sweep")
    r = verify_resume(out, TRAINER, "--steps", str(STEPS), "--sweep")
    report.check(r.returncode == 0, f"sweep: {r.describe()}")
    report.check(verdict_lines(r).get("all_checks_passed") == "true", "sweep: all_checks_passed: true")
    v = load_report(report, out, "sweep")
    if not v:
        return
    report.check(v["cuts"] == list(range(1, STEPS)), f"sweep cuts {v['cuts']}")
    report.check(len(v["runs"]) == 1 + 3 * (STEPS - 1), f"one continuous run and three per cut: {len(v['runs'])}")
    report.check([r["name"] for r in v["runs"]].count("continuous") == 1, "the continuous run runs once")
    report.check([x["cut"] for x in v["results"]] == list(range(1, STEPS)), "a result per cut")
    for result in v["results"]:
        cut = result["cut"]
        report.check(result["positive"] is True, f"cut {cut}: resume matches")
        report.check(all(c["max_abs_deviation"] in (None, 0.0) for c in result["resumed"]),
                     f"cut {cut}: deviation exactly 0")
        report.check(result["negative_divergence_detected"] is True and (result["negative_max_weight_deviation"] or 0) > 0,
                     f"cut {cut}: negative control diverges: {result['negative_max_weight_deviation']}")


def check_planted_bug(report, tmp, bug):
    expected_exit, quantities = PLANTED_BUGS[bug]
    out = os.path.join(tmp, "planted-" + bug)
    r = verify_resume(out, PLANTED, trainer_args=["--plant-bug", bug])
    label = f"planted {bug}"
    report.check(r.returncode == expected_exit, f"{label}: exit {expected_exit} expected: {r.describe()}")
    report.check(verdict_lines(r).get("all_checks_passed") == "false", f"{label}: all_checks_passed: false")
    v = load_report(report, out, label)
    if not v:
        return
    if bug == "crash":
        report.check(v["completed"] is False and v["error"] and v["error"]["code"] == "resume_run_failed",
                     f"{label}: error {v['error']}")
        crashed = [run for run in v["runs"] if run["name"] == "resumed"]
        report.check(crashed and (crashed[0]["signal"] is not None or crashed[0]["exit_code"] != 0),
                     f"{label}: the resumed run's end is recorded: {crashed}")
        report.check("error: resume_run_failed" in r.stdout, f"{label}: printed: {r.stdout[-300:]}")
        return
    report.check(v["completed"] is True and v["positive"] is False, f"{label}: compared and failed")
    check_final_diff(report, out, r, bug)
    failing = failed_quantities(v)
    if bug == "generator-not-restored":
        generators = {q for q in failing if q.startswith("rng_next.")}
        report.check(len(generators) == 1, f"{label}: exactly one generator's draws fail: {sorted(failing)}")
    elif bug == "nan-in-trace":
        codes = {f["code"] for f in v["failures"] if f["run"] == "resumed"}
        report.check("resume_value_not_finite" in codes, f"{label}: non-finite value reported: {v['failures']}")
    else:
        report.check(failing & quantities, f"{label}: one of {sorted(quantities)} fails: {sorted(failing)}")
    if bug == "missing-trace-field":
        codes = {f["code"] for f in v["failures"] if f["quantity"] == "structure"}
        report.check(codes == {"resume_summary_field_missing"}, f"{label}: structure code {codes}")


def check_final_diff(report, out, result, bug):
    """A failed comparison leaves the diff of the continuous and resumed final checkpoints
    (holdpoint diff) in DIR/final-diff.txt and .json, and the CLI prints it."""
    label = f"planted {bug}: final diff"
    text_path, json_path = os.path.join(out, "final-diff.txt"), os.path.join(out, "final-diff.json")
    if not report.check(os.path.isfile(text_path) and os.path.isfile(json_path), f"{label}: both files written"):
        return
    text = open(text_path).read()
    with open(json_path) as f:
        diff = json.load(f)
    report.check(f"final checkpoints, continuous vs resumed ({text_path})" in result.stdout
                 and text.splitlines()[-1] in result.stdout,
                 f"{label}: printed with its summary: {result.stdout[-600:]}")
    final = os.path.join("output", "checkpoint.pt")
    report.check(diff["atol"] == 1e-12 and diff["a"]["path"].endswith(os.path.join("continuous", final))
                 and diff["b"]["path"].endswith(os.path.join("resumed", final)),
                 f"{label}: continuous against resumed, under the verification's tolerance: {diff['a']}, {diff['b']}")
    if bug == "optimizer-not-restored":
        # The optimizer starts over on resume: its state and so the weights diverge.
        sections = {e["section"] for e in diff["entries"] if not e["within_tolerance"]}
        report.check(diff["same"] is False and {"optimizer", "model"} <= sections
                     and text.splitlines()[-1].startswith("different: "),
                     f"{label}: the optimizer and model entries beyond tolerance: {sorted(sections)}")


# A trainer honouring the contract without any randomness, and with modes that break it.
STUB_TRAINER = r'''#!PYTHON
import argparse, hashlib, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--output", required=True)
p.add_argument("--resume")
p.add_argument("--omit-rng-restore", action="store_true")
p.add_argument("--mode", default="deterministic")
a = p.parse_args()
if os.path.exists(a.output):
    sys.exit(2)
if a.mode == "sleep":
    time.sleep(120)
if a.mode == "no-output":
    os.makedirs(a.output)
    sys.exit(0)
import torch
w, step = torch.zeros(3, dtype=torch.float64), 0
if a.resume:
    state = torch.load(a.resume, weights_only=True)
    w, step = state["model"]["w"], int(state["progress"]["global_step"])
trace = []
for _ in range(a.steps):
    step += 1
    lr = 0.1 / step
    w = w - lr * (w - torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    loss = float(((w - 1.5) ** 2).mean())
    trace.append({"step": step, "epoch": (step - 1) // 6, "sample_ids": [(4 * step + k) % 24 for k in range(4)],
                  "lr": lr, "loss": loss, "rng_next": {}})
os.makedirs(a.output)
checkpoint = os.path.join(a.output, "checkpoint.pt")
torch.save({"model": {"w": w}, "progress": {"global_step": step}}, checkpoint)
with open(checkpoint, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
with open(checkpoint + ".sha256", "w") as f:
    f.write(digest + "  checkpoint.pt\n")
summary = {"schema": "holdpoint.resume-summary", "schema_version": 1, "trainer": "stub", "steps_run": a.steps,
           "global_step": step, "resumed_from": a.resume, "rng_restored": not a.omit_rng_restore,
           "versions": {"torch": torch.__version__},
           "final": {"loss": trace[-1]["loss"], "mse": trace[-1]["loss"], "next_lr": 0.1 / (step + 1)},
           "generators": [], "trace": trace}
with open(os.path.join(a.output, "summary.json"), "w") as f:
    if a.mode == "bad-json":
        f.write("{\"schema\": NaN")
    else:
        json.dump(summary, f, allow_nan=False)
'''


def check_refusals(report, tmp):
    stub = os.path.join(tmp, "stub_trainer.py")
    with open(stub, "w") as f:
        f.write(STUB_TRAINER.replace("#!PYTHON", "#!" + sys.executable, 1))
    os.chmod(stub, os.stat(stub).st_mode | stat.S_IXUSR)

    # No randomness, so omitting the RNG restore changes nothing: the check has not
    # shown it could detect an incomplete resume.
    out = os.path.join(tmp, "deterministic")
    r = verify_resume(out, stub, "--steps", "4", "--cut", "2")
    report.check(r.returncode == 1, f"deterministic trainer: exit 1 expected: {r.describe()}")
    report.check(verdict_lines(r) == {"all_checks_passed": "false", "positive": "true",
                                      "negative_divergence_detected": "false"}, f"deterministic verdict: {r.stdout[-300:]}")
    v = load_report(report, out, "deterministic")
    if v:
        report.check([f["code"] for f in v["failures"]] == ["resume_negative_control_matched"],
                     f"deterministic: the negative control is the failure: {v['failures']}")

    cases = [
        ("sleep", ["--timeout", "1"], "resume_run_timed_out"),
        ("no-output", [], "resume_run_output_missing"),
        ("bad-json", [], "resume_summary_unreadable"),
    ]
    for mode, extra, code in cases:
        out = os.path.join(tmp, "stub-" + mode)
        r = verify_resume(out, stub, "--steps", "2", "--cut", "1", *extra, trainer_args=["--mode", mode])
        report.check(r.returncode == 2, f"stub {mode}: exit 2 expected: {r.describe()}")
        v = load_report(report, out, "stub " + mode)
        if v:
            report.check(v["completed"] is False and v["error"]["code"] == code, f"stub {mode}: {v['error']}")
            report.check(not os.path.exists(os.path.join(out, "report.svg")), f"stub {mode}: no picture of nothing")

    existing = os.path.join(tmp, "existing")
    os.makedirs(existing)
    r = verify_resume(existing, stub)
    report.check(r.returncode == 2 and "resume_output_exists" in r.stderr, f"existing output: {r.describe()}")
    report.check(os.listdir(existing) == [], "an existing output directory is left alone")
    r = verify_resume(os.path.join(tmp, "nothing"), os.path.join(tmp, "no-such-trainer"))
    report.check(r.returncode == 2 and "resume_trainer_unavailable" in r.stderr, f"missing trainer: {r.describe()}")
    for steps, cut in (("10", "0"), ("10", "10"), ("1", "1")):
        r = verify_resume(os.path.join(tmp, "bad-cut"), stub, "--steps", steps, "--cut", cut)
        report.check(r.returncode == 2 and "invalid_argument" in r.stderr, f"--steps {steps} --cut {cut}: {r.describe()}")
    report.check(not os.path.exists(os.path.join(tmp, "bad-cut")), "refused arguments create nothing")
    r = verify_resume(os.path.join(tmp, "bad-atol"), stub, "--atol", "-1")
    report.check(r.returncode == 2, f"negative --atol: {r.describe()}")


def main():
    harness.require_executable(HOLDPOINT)
    report = harness.Report("test_verify_resume")
    tmp = tempfile.mkdtemp(prefix="holdpoint-verify-resume-")
    try:
        if report.check(os.access(TRAINER, os.X_OK), f"{TRAINER} is missing: build the resume_protocol_train target"):
            check_protocol_passes(report, tmp)
            check_sweep(report, tmp)
        if report.check(os.access(PLANTED, os.X_OK),
                        f"{PLANTED} is missing: build the resume_protocol_planted target (the example with --plant-bug)"):
            for bug in PLANTED_BUGS:
                check_planted_bug(report, tmp, bug)
        check_refusals(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
