"""A whole holdpoint training state, opened by Python's torch and put to work there.

tests/tools/train_steps.cpp trains a 2-8-1 float64 network (Adam + StepLR, an
explicit sampler generator) for 7 updates and saves its TrainingState. With the
running Python's torch (2.13, the oracle; test_compat_training_state_interop.py
runs this with Debian's torch 1.13 on a --torch-1-13-compatible file) this test
checks that
  - torch.load(weights_only=True) opens the checkpoint and sees every component;
  - every tensor equals what holdpoint's own reader reports (`holdpoint inspect
    --json --digests`, compared through the canonical encoding);
  - the model loads into the equivalent torch.nn.Sequential, the optimizer state
    into torch.optim.Adam and the scheduler state into StepLR with
    load_state_dict, and the restored objects report the saved values back
    (Adam's step counts, StepLR's last_epoch and last lr, the parameters);
  - Python continues the run: one Adam step with a fixed batch from the restored
    state changes every parameter and advances Adam's step count by one, exactly
    as the same update written out in PyTorch's documented formula predicts.
Negative control: a file with one flipped tensor byte is refused by holdpoint
(`verify`) while torch, which checks nothing, still loads it.
"""

import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import canonical  # noqa: E402
import harness  # noqa: E402

import torch  # noqa: E402

TRAINER = os.path.join(harness.BUILD_DIR, "tests", "tools", "train_steps")
COMPONENTS = ["holdpoint", "model", "optimizer", "scheduler", "rng", "sampler", "progress"]


def train(report, out, compatible):
    args = [TRAINER, "--steps", "7", "--output", out]
    if compatible:
        args.append("--torch-1-13-compatible")
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    report.check(r.returncode == 0, f"train_steps: exit {r.returncode}: {r.stderr.decode()[-300:]}")
    return os.path.join(out, "checkpoint.pt")


def plain(value):
    """Compatibility mode stores floats as 0-d float64 tensors; Python objects want floats."""
    if torch.is_tensor(value) and value.dim() == 0 and value.dtype == torch.float64:
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def check_file(report, checkpoint, label):
    loaded = torch.load(checkpoint, weights_only=True)
    for name in COMPONENTS:
        report.check(name in loaded, f"{label}: torch.load sees the '{name}' component")

    # Python's view of every tensor and value equals holdpoint's own reader's.
    r = harness.inspect(checkpoint, digests=True)
    if report.check(r.returncode == 0, f"{label}: inspect {r.describe()}"):
        expected = harness.normalize_storage_keys(r.json()["tree"])
        got = harness.normalize_storage_keys(canonical.encode(loaded, storage_keys="zip"))
        diff = canonical.first_difference(expected, got)
        report.check(diff is None, f"{label}: torch.load and holdpoint read different trees: {diff}")

    # Put the state to work in the equivalent Python objects.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Dropout(0.25),
                                torch.nn.Linear(8, 1)).double()
    model.load_state_dict(loaded["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0)
    optimizer.load_state_dict(plain(loaded["optimizer"]))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    scheduler.load_state_dict(plain(loaded["scheduler"]))
    for name, param in model.state_dict().items():
        report.check(torch.equal(param, loaded["model"][name]), f"{label}: model.{name} restored")
    steps = [float(state["step"]) for state in optimizer.state.values()]
    report.check(len(steps) == 4 and all(s == 7 for s in steps), f"{label}: Adam step counts {steps}")
    report.check(scheduler.last_epoch == 7, f"{label}: StepLR last_epoch {scheduler.last_epoch}")
    # 7 updates with step_size 3: the lr was halved twice, 0.03 -> 0.0075.
    report.check(scheduler.get_last_lr() == [0.0075] and optimizer.param_groups[0]["lr"] == 0.0075,
                 f"{label}: lr {scheduler.get_last_lr()} / {optimizer.param_groups[0]['lr']}")

    # Continue the run in Python: one Adam update from the restored moments.
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    moments = {name: (optimizer.state[p]["exp_avg"].clone(), optimizer.state[p]["exp_avg_sq"].clone())
               for name, p in model.named_parameters()}
    model.eval()
    x = torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(4, 2)
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    optimizer.step()
    beta1, beta2 = optimizer.param_groups[0]["betas"]
    eps, lr = optimizer.param_groups[0]["eps"], optimizer.param_groups[0]["lr"]
    for name, p in model.named_parameters():
        m = beta1 * moments[name][0] + (1 - beta1) * grads[name]
        v = beta2 * moments[name][1] + (1 - beta2) * grads[name] * grads[name]
        m_hat, v_hat = m / (1 - beta1 ** 8), v / (1 - beta2 ** 8)
        predicted = before[name] - lr * m_hat / (v_hat.sqrt() + eps)
        report.check(torch.allclose(p.detach(), predicted, rtol=1e-12, atol=1e-15),
                     f"{label}: {name} after the 8th Adam step follows from the restored moments")
        report.check(not torch.equal(p.detach(), before[name]), f"{label}: {name} moved")
    steps = [float(state["step"]) for state in optimizer.state.values()]
    report.check(all(s == 8 for s in steps), f"{label}: Adam step counts after one more step {steps}")
    return loaded


def check_negative_control(report, checkpoint, tmp, label):
    # Flip one byte of the first tensor record: torch loads it, holdpoint refuses it.
    tampered = os.path.join(tmp, "tampered.pt")
    shutil.copyfile(checkpoint, tampered)
    with open(tampered, "r+b") as f:
        data = f.read()
        at = data.find(b"/data/0")
        report.check(at > 0, f"{label}: found the first tensor record")
        # The payload starts after the local header, the name and the extra field; a byte
        # 128 past the name lies inside the 64-byte-aligned payload.
        f.seek(at + 128)
        byte = f.read(1)
        f.seek(at + 128)
        f.write(bytes([byte[0] ^ 0x01]))
    r = harness.cli("verify", tampered, "--sidecar")
    report.check(r.returncode == 1, f"{label}: holdpoint verify refuses the tampered copy ({r.describe()})")


def main(compatible=int(torch.__version__.split(".")[0]) < 2):
    report = harness.Report(f"training_state_interop (torch {torch.__version__})")
    harness.require_executable(TRAINER)
    tmp = tempfile.mkdtemp(prefix="holdpoint-state-interop-")
    try:
        label = "torch-1.13-compatible file" if compatible else "default file"
        checkpoint = train(report, os.path.join(tmp, "run"), compatible)
        if os.path.isfile(checkpoint):
            check_file(report, checkpoint, label)
            shutil.copyfile(checkpoint + ".sha256", os.path.join(tmp, "tampered.pt.sha256"))
            with open(os.path.join(tmp, "tampered.pt.sha256"), "r+") as f:
                line = f.read().replace("checkpoint.pt", "tampered.pt")
                f.seek(0)
                f.write(line)
                f.truncate()
            check_negative_control(report, checkpoint, tmp, label)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
