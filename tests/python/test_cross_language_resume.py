"""Resume across languages: Python's torch and C++'s LibTorch continue each other's runs.

The same program runs in both languages: tests/tools/cross_language_train.cpp in
C++ and `train` below in Python (holdpoint.TrainingState): a 2-8-1 float64
network with dropout, 24 fixed rows in batches of 4 shuffled by an explicit
generator (holdpoint's RandomSampler, whose draws are the same in both),
StepLR, profile cpu-shuffled-singleworker-v1, one thread.

Proofs, for SGD with momentum and for Adam:
  1. Python trains to step 5 and saves; C++ resumes that file to step 10. Its
     final state equals Python's uninterrupted run to step 10.
  2. The reverse: C++ saves at step 5, Python resumes to step 10, equal to C++'s
     uninterrupted run.
"Equal" is bit-exact for SGD: both languages run the same ATen kernels for the
forward and backward passes and the same operations in the update (the sample
ids, the losses' bits, every tensor of the final state). For Adam it is not:
Python's Adam updates the first moment with lerp_(grad, 1 - beta1), LibTorch's
C++ Adam with mul_(beta1).add_(grad, 1 - beta1), which round differently; the
test measures the deviation (docs/python.md reports it) and requires the same
sample ids and a relative deviation below 1e-9.
Negative controls: a drifted configuration, a flipped byte, an unregistered
component and a missing one are refused, with live state untouched.
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

TOOL = os.path.join(harness.BUILD_DIR, "tests", "tools", "cross_language_train")
ROWS, BATCH = 24, 4
CONFIG = {
    "sgd": {"optimizer": "SGD lr=0.05 momentum=0.9"},
    "adam": {"optimizer": "Adam lr=0.03"},
}


def config_of(optimizer):
    # The same fields, with the same values, as the C++ program's.
    return {"model": "2-8-1 tanh dropout(0.25) float64", "scheduler": "StepLR step_size=3 gamma=0.5",
            "batch_size": BATCH, "data": "linspace(-1, 1, 48) as 24x2", **CONFIG[optimizer]}


def bits(value):
    return "%016x" % struct.unpack("<Q", struct.pack("<d", value))[0]


class Run:
    """The Python program: the same setup, components and loop as the C++ one."""

    def __init__(self, optimizer, config=None):
        torch.set_num_threads(1)
        torch.manual_seed(2024)
        self.x = torch.linspace(-1.0, 1.0, ROWS * 2, dtype=torch.float64).reshape(ROWS, 2)
        self.y = (self.x[:, 0] * 0.7 - self.x[:, 1] * 0.3).unsqueeze(1)
        self.model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Dropout(0.25),
                                         torch.nn.Linear(8, 1)).double()
        if optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        else:
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.03)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.order = torch.Generator().manual_seed(7)
        self.sampler = holdpoint.RandomSampler(ROWS, self.order)
        self.progress = holdpoint.Progress()
        self.state = holdpoint.TrainingState("cross-language-2-8-1", profile="cpu-shuffled-singleworker-v1",
                                             config=config or config_of(optimizer))
        self.state.add("model", self.model).add("optimizer", self.optimizer).add("scheduler", self.scheduler)
        self.state.add("rng", holdpoint.Generators({"torch.cpu": torch.default_generator, "sampler": self.order}))
        self.state.add("sampler", self.sampler).add("progress", self.progress)

    def train(self, until, output, save_at=None):
        os.makedirs(output, exist_ok=True)
        records = []
        self.model.train()
        while self.progress.global_step < until:
            ids = []
            while len(ids) < BATCH:
                index = self.sampler.next()
                if index is None:
                    self.progress.epoch += 1
                    self.progress.batch_in_epoch = 0
                    self.sampler.start_epoch(self.progress.epoch)
                    continue
                ids.append(index)
            index = torch.tensor(ids, dtype=torch.int64)
            self.optimizer.zero_grad()
            out = self.model(self.x.index_select(0, index))
            loss = torch.nn.functional.mse_loss(out, self.y.index_select(0, index))
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            self.progress.global_step += 1
            self.progress.batch_in_epoch += 1
            self.progress.samples_seen += BATCH
            records.append({"step": self.progress.global_step, "ids": ids, "loss": bits(loss.item())})
            if self.progress.global_step == save_at:
                self.state.save(os.path.join(output, f"step-{save_at}.pt"))
        self.state.save(os.path.join(output, "final.pt"))
        return records


def cpp(report, optimizer, until, output, resume=None, save_at=None):
    args = [TOOL, "--optimizer", optimizer, "--until", str(until), "--output", output]
    if resume:
        args += ["--resume", resume]
    if save_at is not None:
        args += ["--save-at", str(save_at)]
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if not report.check(r.returncode == 0, f"cross_language_train {' '.join(args[1:])}: exit {r.returncode}: "
                                           f"{r.stderr.decode()[-400:]}"):
        return None
    import json

    with open(os.path.join(output, "trace.json")) as f:
        return json.load(f)


# ---- comparing final states written by either language -------------------------------------

def as_number(value):
    return value.item() if torch.is_tensor(value) and value.dim() == 0 else value


def tensors_of(tree, prefix=""):
    """Every tensor of a loaded component tree by path, and the other leaves."""
    out = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(tensors_of(value, f"{prefix}[{key!r}]"))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            out.update(tensors_of(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = tree
    return out


def comparable(name, component):
    """What both languages' files must agree on for one component. The
    optimizer's param groups carry each side's own flags (foreach, fused, ...),
    and Adam's step count is a float32 tensor in Python and an int in C++: the
    hyperparameters and counts are compared as numbers."""
    if name == "optimizer":
        groups = [{k: as_number(g[k]) for k in ("lr", "initial_lr", "params") if k in g}
                  for g in component["param_groups"]]
        state = {key: {field: (as_number(v) if field == "step" else v) for field, v in entry.items()}
                 for key, entry in component["state"].items()}
        return {"param_groups": groups, "state": state}
    if name == "scheduler":
        return {k: component[k] for k in ("last_epoch", "base_lrs", "_last_lr", "step_size", "gamma")}
    return component


def deviations(a, b):
    """(paths that differ in kind, structure or non-tensor value; max relative
    deviation over float tensors; whether every tensor is bit-identical)."""
    left, right = tensors_of(a), tensors_of(b)
    problems = sorted(set(left) ^ set(right))
    worst, identical = 0.0, True
    for path in sorted(set(left) & set(right)):
        x, y = left[path], right[path]
        if torch.is_tensor(x) and torch.is_tensor(y):
            if x.dtype != y.dtype or x.shape != y.shape:
                problems.append(f"{path}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
                continue
            if x.dtype.is_floating_point:
                same = torch.equal(x.view(torch.int64) if x.dtype == torch.float64 else x, y.view(torch.int64)
                                   if y.dtype == torch.float64 else y)
                if not same:
                    identical = False
                    scale = max(y.abs().max().item(), 1e-300)
                    worst = max(worst, (x - y).abs().max().item() / scale)
            elif not torch.equal(x, y):
                problems.append(f"{path}: differs")
        elif x != y:
            if isinstance(x, float) and isinstance(y, float):
                identical = False
                worst = max(worst, abs(x - y) / max(abs(y), 1e-300))
            else:
                problems.append(f"{path}: {x!r} vs {y!r}")
    return problems, worst, identical


def compare_finals(report, label, got_path, want_path, optimizer):
    got, want = holdpoint.load(got_path), holdpoint.load(want_path)
    worst_of_all, all_identical = 0.0, True
    for name in ("model", "optimizer", "scheduler", "rng", "sampler", "progress"):
        problems, worst, identical = deviations(comparable(name, got[name]), comparable(name, want[name]))
        report.check(not problems, f"{label}: component {name}: {problems[:4]}")
        worst_of_all, all_identical = max(worst_of_all, worst), all_identical and identical
        if optimizer == "sgd":
            report.check(identical, f"{label}: component {name} is not bit-identical (max relative deviation "
                                    f"{worst:.3g})")
    if optimizer == "adam":
        report.check(worst_of_all < 1e-9, f"{label}: Adam's final state deviates by {worst_of_all:.3g} (bound 1e-9)")
    print(f"  {label}: {'bit-identical' if all_identical else f'max relative deviation {worst_of_all:.3g}'}")
    return worst_of_all


def compare_traces(report, label, got, want, optimizer):
    report.check([r["ids"] for r in got] == [r["ids"] for r in want], f"{label}: the sample ids differ")
    if optimizer == "sgd":
        report.check([r["loss"] for r in got] == [r["loss"] for r in want], f"{label}: the losses' bits differ")
    else:
        loss = [struct.unpack(">d", bytes.fromhex(r["loss"]))[0] for r in got]
        ref = [struct.unpack(">d", bytes.fromhex(r["loss"]))[0] for r in want]
        worst = max(abs(a - b) / abs(b) for a, b in zip(loss, ref))
        report.check(worst < 1e-9, f"{label}: losses deviate by {worst:.3g} (bound 1e-9)")


def check_python_to_cpp(report, tmp, optimizer):
    label = f"{optimizer}: Python to step 5, C++ to 10"
    reference = Run(optimizer).train(10, os.path.join(tmp, f"{optimizer}-py-10"))
    Run(optimizer).train(5, os.path.join(tmp, f"{optimizer}-py-5"), save_at=5)
    resumed = cpp(report, optimizer, 10, os.path.join(tmp, f"{optimizer}-cpp-resumed"),
                  resume=os.path.join(tmp, f"{optimizer}-py-5", "step-5.pt"))
    if resumed is None:
        return
    report.check(resumed.get("resumed_at_step") == 5 and resumed.get("profile") == "cpu-shuffled-singleworker-v1",
                 f"{label}: C++ resumed at {resumed.get('resumed_at_step')} under {resumed.get('profile')}")
    compare_traces(report, label, resumed["steps"], reference[5:], optimizer)
    compare_finals(report, label, os.path.join(tmp, f"{optimizer}-cpp-resumed", "final.pt"),
                   os.path.join(tmp, f"{optimizer}-py-10", "final.pt"), optimizer)


def check_cpp_to_python(report, tmp, optimizer):
    label = f"{optimizer}: C++ to step 5, Python to 10"
    reference = cpp(report, optimizer, 10, os.path.join(tmp, f"{optimizer}-cpp-10"))
    first = cpp(report, optimizer, 5, os.path.join(tmp, f"{optimizer}-cpp-5"), save_at=5)
    if reference is None or first is None:
        return
    run = Run(optimizer)
    checkpoint = os.path.join(tmp, f"{optimizer}-cpp-5", "step-5.pt")
    with open(checkpoint + ".sha256") as f:
        digest = f.read().split()[0]
    loaded = run.state.load(checkpoint, expected_sha256=digest)
    report.check(loaded["step"] == 5 and run.progress.global_step == 5 and loaded["digest_checked"],
                 f"{label}: Python resumed at {run.progress.global_step}: {loaded}")
    report.check(loaded["restored"] == ["model", "scheduler", "optimizer", "progress", "sampler", "rng"],
                 f"{label}: apply order {loaded['restored']}")
    resumed = run.train(10, os.path.join(tmp, f"{optimizer}-py-resumed"))
    compare_traces(report, label, resumed, reference["steps"][5:], optimizer)
    compare_finals(report, label, os.path.join(tmp, f"{optimizer}-py-resumed", "final.pt"),
                   os.path.join(tmp, f"{optimizer}-cpp-10", "final.pt"), optimizer)


def expect_refused(report, what, code, call, run):
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    rng_before = torch.default_generator.get_state()
    try:
        call()
        report.check(False, f"{what}: accepted, expected {code}")
    except holdpoint.Error as error:
        report.check(error.code == code, f"{what}: code {error.code}, expected {code} ({error})")
    after = run.model.state_dict()
    report.check(all(torch.equal(before[k], after[k]) for k in before), f"{what}: the live model changed")
    report.check(torch.equal(rng_before, torch.default_generator.get_state()), f"{what}: the live generator changed")
    report.check(run.progress.global_step == 0, f"{what}: the live progress changed")


def check_refusals(report, tmp):
    """What either language refuses of the other's files, with nothing changed."""
    checkpoint = os.path.join(tmp, "sgd-cpp-5", "step-5.pt")
    if not os.path.exists(checkpoint):
        return report.check(False, "refusals: no C++ checkpoint")
    drifted = Run("sgd", config={**config_of("sgd"), "optimizer": "SGD lr=0.1 momentum=0.9"})
    expect_refused(report, "a drifted optimizer field", "config_drift", lambda: drifted.state.load(checkpoint), drifted)
    run = Run("sgd")
    flipped = os.path.join(tmp, "flipped.pt")
    data = bytearray(open(checkpoint, "rb").read())
    record = next(r for r in holdpoint.inspect(checkpoint)["records"] if r["name"] == "data/0")
    data[record["offset"] + record["size"] // 2] ^= 0x01  # inside the first tensor record
    open(flipped, "wb").write(bytes(data))
    digest = open(checkpoint + ".sha256").read().split()[0]
    expect_refused(report, "a flipped byte, against the sidecar's digest", "sha256_mismatch",
                   lambda: run.state.load(flipped, expected_sha256=digest), run)
    expect_refused(report, "a flipped byte, no digest given", "zip_crc_mismatch", lambda: run.state.load(flipped), run)
    extra = Run("sgd")
    extra.state.add("scaler", torch.amp.GradScaler("cpu"))
    expect_refused(report, "a registered component the file lacks", "component_missing",
                   lambda: extra.state.load(checkpoint), extra)
    fewer = Run("sgd")
    fewer.state._components.pop("progress")
    expect_refused(report, "a component the run does not register", "component_unknown",
                   lambda: fewer.state.load(checkpoint), fewer)
    # C++ refuses a Python file whose configuration drifted.
    python_file = os.path.join(tmp, "sgd-py-5", "step-5.pt")
    r = subprocess.run([TOOL, "--optimizer", "adam", "--until", "6", "--output", os.path.join(tmp, "drift"),
                        "--resume", python_file], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    report.check(r.returncode == 1 and b"config_drift" in r.stderr and b"optimizer" in r.stderr,
                 f"C++ resuming a Python SGD file as Adam: exit {r.returncode}, {r.stderr.decode()[-300:]}")


def main():
    report = harness.Report("cross_language_resume")
    harness.require_executable(TOOL)
    tmp = tempfile.mkdtemp(prefix="holdpoint-cross-")
    try:
        for optimizer in ("sgd", "adam"):
            check_python_to_cpp(report, tmp, optimizer)
            check_cpp_to_python(report, tmp, optimizer)
        check_refusals(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
