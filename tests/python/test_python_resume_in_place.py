"""holdpoint.TrainingState.load(memory="in_place") (docs/resume-contract.md,
"Resuming in place"): the file is verified in a first pass that keeps only its
small records, then its large tensors are read into the model's own tensors
(journaled first) or into fresh memory the optimizer takes.

- a resume in place equals the private copy's, bit for bit, in a fresh setup
  (no optimizer state yet) and in a trained one, and training goes on the same;
- the model's parameters keep their memory (written in place, not replaced);
- automatic picks the private copy for a small file;
- refusals leave the live state bit-identical: a file changed between the passes
  (file_changed_during_read), a wrong expected digest (sha256_mismatch), a damaged
  record (zip_crc_mismatch), a journal folder that does not exist
  (io_write_failed), and a component that fails after the bytes were written
  (state_apply_failed: the journal puts the model back).
"""

import os
import shutil
import sys
import tempfile

import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


class Setup:
    """A 24 MiB weight (left in the file by the first pass) and small tensors
    (kept), AdamW over them, and a counter component."""

    def __init__(self, seed):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(4096, 1536), torch.nn.LayerNorm(1536),
                                         torch.nn.Linear(1536, 4))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.progress = holdpoint.Progress()
        self.state = holdpoint.TrainingState("in-place-test", profile="unqualified")
        self.state.add("model", self.model).add("optimizer", self.optimizer).add("progress", self.progress)

    def train(self, steps):
        for _ in range(steps):
            self.optimizer.zero_grad()
            self.model(torch.randn(8, 4096)).pow(2).sum().backward()
            self.optimizer.step()
            self.progress.global_step += 1

    def snapshot(self):
        return ({k: v.clone() for k, v in self.model.state_dict().items()},
                {k: {f: (t.clone() if torch.is_tensor(t) else t) for f, t in s.items()}
                 for k, s in self.optimizer.state_dict()["state"].items()},
                self.progress.global_step)


def same(a, b):
    model_a, opt_a, step_a = a
    model_b, opt_b, step_b = b
    if step_a != step_b or model_a.keys() != model_b.keys() or opt_a.keys() != opt_b.keys():
        return False
    if not all(torch.equal(model_a[k], model_b[k]) for k in model_a):
        return False
    for k in opt_a:
        if opt_a[k].keys() != opt_b[k].keys():
            return False
        for f in opt_a[k]:
            x, y = opt_a[k][f], opt_b[k][f]
            if torch.is_tensor(x) != torch.is_tensor(y) or (torch.is_tensor(x) and not torch.equal(x, y)):
                return False
    return True


def poke(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def check_equal_to_private_copy(report, path):
    copied = Setup(7)
    copied.state.load(path, memory="private_copy")
    fresh = Setup(8)
    weight = fresh.model[0].weight
    address = weight.data_ptr()
    loaded = fresh.state.load(path, memory="in_place")
    report.check(loaded["in_place"] and loaded["bytes_journaled"] >= 4096 * 1536 * 4,
                 f"fresh: resumed in place, the model journaled ({loaded.get('bytes_journaled')})")
    report.check(same(copied.snapshot(), fresh.snapshot()), "fresh: in place differs from the private copy")
    report.check(fresh.model[0].weight is weight and weight.data_ptr() == address,
                 "fresh: the model's weight was replaced, not written in place")
    torch.manual_seed(3)
    copied.train(2)
    torch.manual_seed(3)
    fresh.train(2)
    report.check(same(copied.snapshot(), fresh.snapshot()), "fresh: training after the resume differs")

    running = Setup(9)
    running.train(1)
    running.state.load(path, memory="in_place")
    again = Setup(9)
    again.train(1)
    again.state.load(path, memory="private_copy")
    report.check(same(again.snapshot(), running.snapshot()), "running: in place differs from the private copy")

    small = Setup(10)
    report.check(not small.state.load(path)["in_place"], "automatic: a small file took the resume in place")


def expect_untouched(report, what, code, setup, call):
    before = setup.snapshot()
    harness.expect_raises(report, what, code, call, holdpoint.Error)
    report.check(same(before, setup.snapshot()), f"{what}: the live state changed")


def check_refusals(report, tmp, path):
    changed = os.path.join(tmp, "changed.pt")
    shutil.copy(path, changed)
    victim = Setup(11)
    victim.train(1)

    class Poker:
        """Changes the file in place while it validates: between the passes."""

        def state_dict(self):
            return {"n": 1}

        def validate_state_dict(self, state):
            poke(changed, os.path.getsize(changed) // 3)

        def load_state_dict(self, state):
            pass

    saver = Setup(1)
    saver.train(2)
    saver.state.add("poker", Poker())
    saver.state.save(changed)
    victim.state.add("poker", Poker())
    expect_untouched(report, "a file changed between the passes", "file_changed_during_read", victim,
                     lambda: victim.state.load(changed, memory="in_place"))

    target = Setup(12)
    expect_untouched(report, "a wrong expected digest", "sha256_mismatch", target,
                     lambda: target.state.load(path, memory="in_place", expected_sha256="0" * 64))

    damaged = os.path.join(tmp, "damaged.pt")
    shutil.copy(path, damaged)
    poke(damaged, os.path.getsize(damaged) // 3)
    target = Setup(13)
    expect_untouched(report, "a damaged record", "zip_crc_mismatch", target,
                     lambda: target.state.load(damaged, memory="in_place"))

    target = Setup(14)
    expect_untouched(report, "a journal folder that does not exist", "io_write_failed", target,
                     lambda: target.state.load(path, memory="in_place",
                                               journal_directory=os.path.join(tmp, "missing")))

    class Failing:
        def state_dict(self):
            return {"n": 1}

        def load_state_dict(self, state):
            raise RuntimeError("planted failure after the bytes were written")

    failing_file = os.path.join(tmp, "failing.pt")
    saver = Setup(1)
    saver.train(2)
    saver.state.add("zz_failing", Failing())
    saver.state.save(failing_file)
    target = Setup(15)
    target.train(1)
    target.state.add("zz_failing", Failing())
    expect_untouched(report, "a component failing after the bytes were written", "state_apply_failed", target,
                     lambda: target.state.load(failing_file, memory="in_place"))

    harness.expect_raises(report, "an unknown memory mode", "invalid_argument",
                          lambda: Setup(16).state.load(path, memory="mmap"), holdpoint.Error)


def main():
    report = harness.Report("python_resume_in_place")
    tmp = tempfile.mkdtemp(prefix="holdpoint-in-place-")
    try:
        source = Setup(1)
        source.train(3)
        path = os.path.join(tmp, "ckpt.pt")
        source.state.save(path)
        check_equal_to_private_copy(report, path)
        check_refusals(report, tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
