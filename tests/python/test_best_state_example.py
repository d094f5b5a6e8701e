"""The best-state capture example (examples/best-state/capture_routes), end to end:
every capture route's decision and storage diagnostics, the two publication negative
controls, and the published envelope loaded by Python's torch.load(weights_only=True)
into a fresh, poisoned seed-004 module with strict=True (the consumer's side of the
handoff).

Run by ctest with the oracle Python (torch 2.13)."""

import json
import os
import shutil
import sys
import tempfile

import torch

import harness

EXAMPLE = os.path.join(harness.BUILD_DIR, "examples", "best-state", "capture_routes")

EXPECTED = {
    # route: (decision, is_live_mapping, shares_storage, values after the update)
    "live_handles": ("REPAIR", True, True, {"w": 7.0, "offset": 11.0}),
    "copied_container": ("REPAIR", True, True, {"w": 7.0, "offset": 11.0}),
    "parameters_only": ("REPAIR", False, True, {"w": 7.0}),
    "detached": ("REPAIR", False, True, {"w": 7.0, "offset": 11.0}),
    "cloned": ("ACCEPT", False, False, {"w": 2.0, "offset": 1.0}),
    "module_clone": ("ACCEPT", False, False, {"w": 2.0, "offset": 1.0}),
    "snapshot": ("ACCEPT", False, False, {"w": 2.0, "offset": 1.0}),
    "serialized_before_update": ("ACCEPT", False, False, {"w": 2.0, "offset": 1.0}),
}


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([2.0]))
        self.register_buffer("offset", torch.tensor([1.0]))

    def forward(self, x):
        return self.w * x + self.offset


def check_routes(report, evidence):
    cases = {c["route"]: c for c in evidence["cases"]}
    report.check(sorted(cases) == sorted(EXPECTED), f"routes: {sorted(cases)}")
    for route, (decision, live, shares, values) in EXPECTED.items():
        case = cases.get(route)
        if not case:
            continue
        report.check(case["decision"] == decision, f"{route}: decision {case['decision']}, expected {decision}")
        report.check(case["diagnostics"]["is_live_mapping"] == live, f"{route}: is_live_mapping")
        report.check(case["diagnostics"]["shares_storage"] == shares, f"{route}: shares_storage")
        report.check(case["values_after_update"] == values, f"{route}: values {case['values_after_update']}")
        readback = case["published_readback"]
        report.check(readback is not None and readback["matches_record"] and readback["values"] == {"w": 2.0, "offset": 1.0},
                     f"{route}: the published file holds the selection: {readback}")
        gate = case["gate"]
        if decision == "REPAIR":
            report.check(not gate["candidate"]["candidate"]["matches"] and gate["faithful_copy"]["published"],
                         f"{route}: refused, then the snapshot published")
        else:
            report.check(gate["candidate"]["poisoned"] and gate["candidate"]["verified"] and gate["faithful_copy"] is None,
                         f"{route}: poisoned reload verified without a faithful copy")


def check_controls(report, evidence):
    controls = {c["control"]: c for c in evidence["controls"]}
    for name, decision, code in (("later_state_with_selected_record", "HOLD", "selection_content_mismatch"),
                                 ("failure_before_publish", "RERUN", "io_rename_failed")):
        control = controls.get(name)
        if not report.check(control is not None, f"control {name} present"):
            continue
        report.check(control["decision"] == decision, f"{name}: decision {control['decision']}")
        report.check(control["gate"]["candidate"]["failure"] == code, f"{name}: failure {control['gate']['candidate']['failure']}")
        report.check(control["previous_file_unchanged"], f"{name}: previous file unchanged")
        report.check(control["staging_files_left"] == [], f"{name}: no staging file")


def check_python_consumer(report, directory):
    envelope = torch.load(os.path.join(directory, "accepted.pt"), weights_only=True)
    report.check(sorted(envelope) == ["holdpoint", "model", "selection"], f"envelope keys: {sorted(envelope)}")
    report.check(envelope["holdpoint"]["kind"] == "selection", "manifest kind 'selection'")
    record = envelope["selection"]["record"]
    report.check(record["label"] == "synthetic-best-step-0" and record["buffers"] == ["offset"], "record label and buffers")
    fresh = Tiny()
    with torch.no_grad():
        fresh.w.fill_(float("nan"))
        fresh.offset.fill_(float("nan"))
    fresh.load_state_dict(envelope["model"], strict=True)
    fresh.eval()
    with torch.no_grad():
        output = fresh(torch.tensor([3.0])).item()
    report.check(fresh.w.item() == 2.0 and fresh.offset.item() == 1.0, "Python reload restores w=2, offset=1")
    report.check(output == 7.0, f"Python reload outputs 7 at x=3 (got {output})")
    report.check(record["probe"]["output"]["values"].tolist() == [7.0], "the record's output witness is 7")


def main():
    harness.require_executable(EXAMPLE)
    report = harness.Report("test_best_state_example")
    tmp = tempfile.mkdtemp(prefix="holdpoint-best-state-")
    try:
        evidence_path = os.path.join(tmp, "evidence.json")
        run_dir = os.path.join(tmp, "run")
        r = harness.run([EXAMPLE, "--dir", run_dir, "--json", evidence_path], timeout=120)
        report.check(r.returncode == 0, f"capture_routes: {r.describe()}")
        report.check("all_as_expected=true" in r.stdout, "stdout summary")
        with open(evidence_path, encoding="utf-8") as f:
            evidence = json.load(f)
        report.check(evidence["all_as_expected"] is True, "all_as_expected")
        report.check(evidence["live_output_after_update"] == 32.0, "the live module moved to 32")
        report.check([t["values"] for t in evidence["selection"]["tensors"]] == [[2.0], [1.0]], "selection witnesses")
        check_routes(report, evidence)
        check_controls(report, evidence)
        check_python_consumer(report, run_dir)
        r = harness.run([EXAMPLE, "--frobnicate"])
        report.check(r.returncode == 2, f"usage error exits 2: {r.describe()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
