"""holdpoint.TrainingState in Python (python/holdpoint/_training.py, docs/python.md):

- every kind of generator (torch, Python's random, NumPy's RandomState and
  Generator, whose PCG64 state has 128-bit ints) is saved and restored: the next
  draws after a load equal those after the save;
- a GradScaler, a DataLoader driven by holdpoint.RandomSampler resumed mid-epoch
  (the remaining batches are the same), Progress;
- RunDirectory: commit a state as a generation, resume it against the index;
- configuration identity: max_epochs may grow (reported, and recorded in the next
  save), not shrink; a load-bearing change is config_drift;
- refusals, each with its code and the live state untouched: a profile whose
  preconditions fail (on save: nothing written), a sampler order that is no
  permutation, another sample count, a generator inventory that differs, a model
  key or shape that differs, an optimizer with other groups; and a component that
  fails while applied rolls back every component applied before it.
"""

import os
import random
import shutil
import sys
import tempfile

import numpy as np
import torch

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def expect_error(report, what, code, call):
    return harness.expect_raises(report, what, code, call, holdpoint.Error)


class Setup:
    def __init__(self, seed=0, hidden=4, max_epochs=3, profile="cpu-shuffled-singleworker-v1", register_order=True,
                 num_samples=12):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=10)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        self.order = torch.Generator().manual_seed(11)
        self.sampler = holdpoint.RandomSampler(num_samples, self.order)
        self.progress = holdpoint.Progress()
        self.python_random = random.Random(5)
        self.numpy_legacy = np.random.RandomState(6)
        self.numpy_generator = np.random.default_rng(7)
        generators = {"torch.cpu": torch.default_generator, "python": self.python_random,
                      "numpy_legacy": self.numpy_legacy, "numpy": self.numpy_generator}
        if register_order:
            generators["order"] = self.order
        self.generators = holdpoint.Generators(generators)
        self.state = holdpoint.TrainingState("python-state-test", profile=profile, config={"hidden": hidden},
                                             max_epochs=max_epochs)
        for name, component in (("model", self.model), ("optimizer", self.optimizer), ("scheduler", self.scheduler),
                                ("scaler", self.scaler), ("rng", self.generators), ("sampler", self.sampler),
                                ("progress", self.progress)):
            self.state.add(name, component)

    def step(self):
        ids = []
        while len(ids) < 3:
            index = self.sampler.next()
            if index is None:
                self.progress.epoch += 1
                self.sampler.start_epoch(self.progress.epoch)
                continue
            ids.append(index)
        x = torch.arange(9, dtype=torch.float32).reshape(3, 3) / 10 + torch.tensor(ids, dtype=torch.float32)[:, None]
        self.optimizer.zero_grad()
        loss = self.model(torch.nn.functional.dropout(x, 0.2)).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.progress.global_step += 1
        return ids

    def draws(self):
        return (torch.rand(3).tolist(), self.python_random.random(), self.numpy_legacy.random_sample(),
                self.numpy_generator.random(), torch.rand(2, generator=self.order).tolist())


def check_round_trip(report, tmp):
    a = Setup()
    for _ in range(5):
        a.step()
    path = os.path.join(tmp, "state.pt")
    saved = a.state.save(path)
    report.check(os.path.exists(path + ".sha256") and saved["tensors"] > 0, f"save: {saved}")
    after_save = a.draws()
    a_params = [p.detach().clone() for p in a.model.parameters()]

    b = Setup(seed=1)
    report.check(b.draws() != after_save, "round trip: the fresh setup already draws the same (test is void)")
    b = Setup(seed=1)
    loaded = b.state.load(path, expected_sha256=saved["sha256"])
    report.check(loaded["step"] == 5 and loaded["digest_checked"]
                 and loaded["profile"] == "cpu-shuffled-singleworker-v1", f"round trip: report {loaded}")
    report.check(b.draws() == after_save, "round trip: the next draws differ (torch, random, NumPy x2, order)")
    report.check(all(torch.equal(p, q) for p, q in zip(a_params, b.model.parameters())), "round trip: parameters")
    report.check(b.scaler.get_scale() == 1024.0 and b.progress.global_step == 5, "round trip: scaler or progress")
    report.check(b.scheduler.last_epoch == 5 and b.optimizer.state_dict()["state"][0]["step"].item() == 5,
                 "round trip: scheduler or optimizer counts")
    # Two resumes of the file continue identically (each load restores the
    # global generator that dropout draws from).
    continued = []
    for seed in (3, 4):
        c = Setup(seed=seed)
        c.state.load(path)
        continued.append(([c.step() for _ in range(6)], [p.detach().clone() for p in c.model.parameters()]))
    report.check(continued[0][0] == continued[1][0], "round trip: continued sample ids differ")
    report.check(all(torch.equal(p, q) for p, q in zip(continued[0][1], continued[1][1])),
                 "round trip: continued parameters differ")
    # torch.load(weights_only=True) opens it: the layout is a plain checkpoint.
    plain = torch.load(path, weights_only=True)
    report.check(set(plain) == {"holdpoint", "model", "optimizer", "scheduler", "scaler", "rng", "sampler",
                                "progress"}, f"torch.load sees {sorted(plain)}")
    pcg = plain["rng"]["numpy"]["state"]["state"]["state"]
    report.check(type(pcg) is int and pcg >= 2**64, f"PCG64's 128-bit state is stored as {pcg!r}, not an int")


def check_data_loader(report, tmp):
    """A DataLoader over RandomSampler, interrupted mid-epoch, resumes the same batches."""
    data = torch.arange(20)

    def loader(sampler):
        return torch.utils.data.DataLoader(data, batch_size=3, sampler=sampler, num_workers=0)

    g = torch.Generator().manual_seed(3)
    sampler = holdpoint.RandomSampler(20, g)
    state = holdpoint.TrainingState("loader", profile="cpu-shuffled-singleworker-v1")
    state.add("rng", holdpoint.Generators({"torch.cpu": torch.default_generator, "g": g})).add("sampler", sampler)
    batches = iter(loader(sampler))
    seen = [next(batches).tolist() for _ in range(3)]
    path = os.path.join(tmp, "loader.pt")
    state.save(path)
    rest = [b.tolist() for b in batches] + [b.tolist() for b in loader(sampler)]
    g2 = torch.Generator().manual_seed(99)
    sampler2 = holdpoint.RandomSampler(20, g2)
    state2 = holdpoint.TrainingState("loader", profile="cpu-shuffled-singleworker-v1")
    state2.add("rng", holdpoint.Generators({"torch.cpu": torch.default_generator, "g": g2})).add("sampler", sampler2)
    state2.load(path)
    resumed = [b.tolist() for b in loader(sampler2)] + [b.tolist() for b in loader(sampler2)]
    report.check(resumed == rest, f"loader: resumed batches differ: {resumed[:3]} vs {rest[:3]}")
    report.check(sorted(sum(seen, []) + sum(resumed[:len(rest) - 7], [])) == list(range(20)),
                 "loader: the first epoch is not each sample once")


def check_sequential(report, tmp):
    """cpu-basic-v1: a SequentialSampler and the CPU generator; resumed mid-epoch."""
    def setup():
        sampler, progress = holdpoint.SequentialSampler(10), holdpoint.Progress()
        state = holdpoint.TrainingState("sequential", profile="cpu-basic-v1")
        state.add("rng", holdpoint.Generators({"torch.cpu": torch.default_generator}))
        state.add("sampler", sampler).add("progress", progress)
        return state, sampler, progress

    state, sampler, progress = setup()
    taken = [sampler.next() for _ in range(4)]
    progress.global_step = 2
    path = os.path.join(tmp, "sequential.pt")
    state.save(path)
    state2, sampler2, progress2 = setup()
    report.check(state2.load(path)["profile"] == "cpu-basic-v1", "sequential: profile")
    report.check(taken == [0, 1, 2, 3] and list(sampler2) == list(range(4, 10)) and progress2.global_step == 2,
                 "sequential: the resumed sampler does not continue at 4")
    report.check(list(sampler2) == list(range(10)) and sampler2.epoch == 1, "sequential: the next epoch")
    sampler.cursor = 11
    bad = os.path.join(tmp, "sequential-bad.pt")
    state.save(bad)
    state3, sampler3, _ = setup()
    expect_error(report, "sequential: a cursor past the end", "state_value_invalid", lambda: state3.load(bad))
    report.check(sampler3.cursor == 0, "sequential: a refused load moved the cursor")


def check_run_directory(report, tmp):
    run = holdpoint.RunDirectory(os.path.join(tmp, "run"))
    a = Setup()
    for step in (1, 2, 3):
        a.step()
        a.state.commit(run, step=step, metrics={"loss": 1.0 / step})
    report.check([g["step"] for g in run.generations()] == [1, 2, 3], f"run: {run.generations()}")
    after = a.draws()
    b = Setup(seed=4)
    loaded = b.state.resume(run)
    report.check(loaded["step"] == 3 and loaded["digest_checked"], f"run: resume report {loaded}")
    report.check(b.draws() == after, "run: the next draws after resume differ")
    c = Setup(seed=4)
    report.check(c.state.resume(run, "step-00000002.pt")["step"] == 2, "run: resume of a named generation")
    expect_error(report, "run: an unknown generation", "invalid_argument", lambda: c.state.resume(run, "nope"))


def check_config_identity(report, tmp):
    a = Setup(max_epochs=3)
    a.step()
    path = os.path.join(tmp, "config.pt")
    a.state.save(path)
    grown = Setup(max_epochs=5)
    report_ = grown.state.load(path)
    report.check(report_["drift"] == {"field": "max_epochs", "from": 3, "to": 5, "at_step": 1},
                 f"max_epochs growth: {report_['drift']}")
    grown.state.save(os.path.join(tmp, "grown.pt"))
    manifest = holdpoint.load(os.path.join(tmp, "grown.pt"))["holdpoint"]
    report.check(manifest["last_resume_drift"] == {"field": "max_epochs", "from": 3, "to": 5, "at_step": 1},
                 f"the next save records the drift: {manifest['last_resume_drift']}")
    shrunk = Setup(max_epochs=2)
    expect_error(report, "max_epochs shrinks", "config_drift", lambda: shrunk.state.load(path))
    other = Setup(hidden=4)
    other.state.config["hidden"] = 5
    expect_error(report, "a load-bearing field changes", "config_drift", lambda: other.state.load(path))
    renamed = Setup()
    renamed.state.semantic_identity = "another-run"
    expect_error(report, "another semantic identity", "config_drift", lambda: renamed.state.load(path))


def expect_untouched(report, what, code, setup, call):
    before = [p.detach().clone() for p in setup.model.parameters()]
    order = setup.sampler.order.clone()
    torch_state = torch.default_generator.get_state()
    python_state = setup.python_random.getstate()
    expect_error(report, what, code, call)
    report.check(all(torch.equal(p, q) for p, q in zip(before, setup.model.parameters())), f"{what}: model changed")
    report.check(torch.equal(order, setup.sampler.order) and setup.progress.global_step == 0,
                 f"{what}: sampler or progress changed")
    report.check(torch.equal(torch_state, torch.default_generator.get_state())
                 and python_state == setup.python_random.getstate(), f"{what}: a generator changed")


def check_refusals(report, tmp):
    unregistered = Setup(register_order=False)
    path = os.path.join(tmp, "refused.pt")
    expect_error(report, "save: the sampler's generator is not registered", "profile_precondition_violated",
                 lambda: unregistered.state.save(path))
    report.check(not os.path.exists(path), "save: a refused save left a file")
    expect_error(report, "an unknown profile", "profile_unknown",
                 lambda: holdpoint.TrainingState("x", profile="cpu-fast-v9"))

    good = os.path.join(tmp, "good.pt")
    saver = Setup()
    saver.step()
    saver.state.save(good)

    bad_order = Setup()
    bad_order.sampler.order = torch.zeros(12, dtype=torch.int64)
    bad_path = os.path.join(tmp, "bad-order.pt")
    bad_order.state.save(bad_path)
    target = Setup(seed=2)
    expect_untouched(report, "a sampler order that is no permutation", "state_value_invalid", target,
                     lambda: target.state.load(bad_path))
    fewer = Setup(seed=2, num_samples=10)
    expect_untouched(report, "another sample count", "state_value_invalid", fewer, lambda: fewer.state.load(good))
    wider = Setup(seed=2, hidden=6)
    wider.state.config["hidden"] = 4  # same configuration, another shape: the model's own check
    expect_untouched(report, "a model shape that differs", "state_shape_mismatch", wider,
                     lambda: wider.state.load(good))
    less_rng = Setup(seed=2)
    less_rng.generators._sources.pop("python")
    expect_untouched(report, "a generator inventory that differs", "rng_inventory_mismatch", less_rng,
                     lambda: less_rng.state.load(good))
    grouped = Setup(seed=2)
    grouped.optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})
    expect_untouched(report, "an optimizer with another group", "state_structure_mismatch", grouped,
                     lambda: grouped.state.load(good))

    class Failing:
        def state_dict(self):
            return {"value": 1}

        def load_state_dict(self, state):
            raise RuntimeError("planted failure")

    for setup in (saver,):
        setup.state.add("failing", Failing())
    with_failing = os.path.join(tmp, "failing.pt")
    saver.state.save(with_failing)
    victim = Setup(seed=2)
    victim.state.add("failing", Failing())
    expect_untouched(report, "a component that fails while applied", "state_apply_failed", victim,
                     lambda: victim.state.load(with_failing))


def main():
    report = harness.Report("python_training_state")
    tmp = tempfile.mkdtemp(prefix="holdpoint-state-")
    try:
        check_round_trip(report, tmp)
        check_data_loader(report, tmp)
        check_sequential(report, tmp)
        check_run_directory(report, tmp)
        check_config_identity(report, tmp)
        check_refusals(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
