"""Checkpoints written by real frameworks (pinned in scripts/requirements.txt), read by
the Python package holdpoint as built in <build>/python:

- a Hugging Face transformers Trainer checkpoint-N/ directory (tiny GPT-2 from a config,
  no download);
- an Accelerate save_state directory;
- a Lightning .ckpt with hyper_parameters;
- a torchdata StatefulDataLoader state, saved with torch.save.

For each file: every value holdpoint returns equals what the framework's own trusted
load (torch.load(weights_only=False) of a file this test just wrote, or safetensors)
gives, NumPy arrays included. Restoring the RNG states from holdpoint's result gives the
same next draws (Python random, NumPy, torch) as the framework's own resume; the data
loader resumed from holdpoint's state yields the same batches. Pickled objects
(TrainingArguments) stay refused with pickle_global_forbidden. torch.distributed.checkpoint
folders have their own test, test_python_dcp.py.
"""

import os
import random
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import harness  # noqa: E402
import live_tree  # noqa: E402

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402


def check_file(report, label, path, trusted):
    try:
        got = holdpoint.load(path)
    except holdpoint.Error as error:
        report.check(False, f"{label}: holdpoint refused it: {error.code}: {error}")
        return None
    diff = live_tree.first_difference(got, trusted)
    report.check(diff is None, f"{label}: differs from the framework's own load: {diff}")
    report.check(holdpoint.verify(path)["valid"], f"{label}: verify")
    return got


def check_framework_files(report, label, folder, safetensors_name, pickled_names):
    """check_file for a framework's output folder: the safetensors model against
    safetensors' own load, each pickled file against torch's trusted load. Returns
    holdpoint's results of the pickled files, by name."""
    from safetensors.torch import load_file

    model = os.path.join(folder, safetensors_name)
    check_file(report, f"{label} {safetensors_name}", model, load_file(model))
    return {name: check_file(report, f"{label} {name}", os.path.join(folder, name),
                             trusted_load(os.path.join(folder, name))) for name in pickled_names}


def trusted_load(path):
    # The test wrote this file a moment ago: the trusted path is legitimate here.
    return torch.load(path, weights_only=False)


def draws():
    return (random.random(), np.random.rand(3).tolist(), float(np.random.randn()), torch.rand(3).tolist())


def scramble():
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)


def check_rng_restore(report, label, states, keys, want):
    """Restored from holdpoint's result by hand (under the framework's `keys` for Python,
    NumPy and torch) and by restore_rng_states, the generators draw `want`, what they drew
    after the framework's own resume."""
    python_key, numpy_key, torch_key = keys
    scramble()
    random.setstate(states[python_key])
    np.random.set_state(states[numpy_key])
    torch.random.set_rng_state(states[torch_key])
    report.check(draws() == want, f"{label} RNG: holdpoint's restore draws differently from the framework's")
    scramble()
    restored = holdpoint.restore_rng_states(states)
    report.check(restored == ["python", "numpy", "torch"] and draws() == want,
                 f"{label} RNG through holdpoint.restore_rng_states ({restored}) draws differently")


def refused(report, label, path, code):
    try:
        holdpoint.load(path)
    except holdpoint.Error as error:
        report.check(error.code == code, f"{label}: refused with {error.code}, expected {code}")
        return
    report.check(False, f"{label}: read, expected a refusal with {code}")


# ---- Hugging Face transformers --------------------------------------------------------------

def check_transformers(report, tmp):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            ids = torch.tensor([(i * 3 + k) % 32 for k in range(8)])
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=os.path.join(tmp, "hf"), max_steps=2, save_steps=2,
                             per_device_train_batch_size=2, report_to=[], use_cpu=True, save_strategy="steps",
                             logging_strategy="no", disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.train()
    ckpt = os.path.join(tmp, "hf", "checkpoint-2")
    files = sorted(os.listdir(ckpt))
    report.check({"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"}
                 <= set(files), f"Trainer checkpoint files: {files}")

    loaded = check_framework_files(report, "Trainer", ckpt, "model.safetensors",
                                   ("optimizer.pt", "scheduler.pt", "rng_state.pth"))
    state = holdpoint.load_model_state(os.path.join(ckpt, "model.safetensors"))
    fresh = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    report.check(not unexpected and all("lm_head" in k for k in missing),
                 f"Trainer model into a fresh model: missing {missing}, unexpected {unexpected}")
    rng = loaded["rng_state.pth"]
    # The framework's own resume of the generators, then holdpoint's.
    scramble()
    trainer._load_rng_state(ckpt)
    want = draws()
    if rng is not None:
        check_rng_restore(report, "Trainer", rng, ("python", "numpy", "cpu"), want)
    refused(report, "Trainer training_args.bin", os.path.join(ckpt, "training_args.bin"), "pickle_global_forbidden")


# ---- Accelerate -----------------------------------------------------------------------------

def check_accelerate(report, tmp):
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(1)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2, shuffle=True)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for batch in loader:
        accelerator.backward(model(batch).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        break
    out = os.path.join(tmp, "accelerate")
    accelerator.save_state(out)
    files = sorted(os.listdir(out))
    report.check({"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= set(files),
                 f"Accelerate files: {files}")
    states = check_framework_files(report, "Accelerate", out, "model.safetensors",
                                   ("optimizer.bin", "scheduler.bin", "random_states_0.pkl"))["random_states_0.pkl"]
    scramble()
    accelerator.load_state(out)
    want = draws()
    if states is not None:
        check_rng_restore(report, "Accelerate", states, ("random_state", "numpy_random_seed", "torch_manual_seed"),
                          want)
        scramble()
        untouched = draws()
        scramble()
        try:
            holdpoint.restore_rng_states({"step": 3})
            report.check(False, "restore_rng_states accepted a mapping without RNG states")
        except holdpoint.Error as error:
            report.check(error.code == "invalid_argument" and draws() == untouched,
                         f"restore_rng_states without states: {error.code}, or it changed a generator")


# ---- Lightning ------------------------------------------------------------------------------

def check_lightning(report, tmp):
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self, lr=0.1, name="tiny", dims=(4, 2)):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(*dims)

        def training_step(self, batch, index):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]

    torch.manual_seed(2)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=os.path.join(tmp, "lightning"))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=2))
    folder = os.path.join(tmp, "lightning", "checkpoints")
    ckpts = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if not report.check(len(ckpts) == 1, f"Lightning checkpoints: {ckpts}"):
        return
    path = os.path.join(folder, ckpts[0])
    got = check_file(report, "Lightning .ckpt", path, trusted_load(path))
    if got is not None:
        report.check(got["hyper_parameters"] == {"lr": 0.1, "name": "tiny", "dims": (4, 2)},
                     f"Lightning hyper_parameters: {got.get('hyper_parameters')}")
        model = Tiny()
        model.load_state_dict(holdpoint.load_model_state(path))
        report.check(torch.equal(model.layer.weight, got["state_dict"]["layer.weight"]), "Lightning weights")


# ---- torchdata ------------------------------------------------------------------------------

def check_torchdata(report, tmp):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader():
        generator = torch.Generator()
        generator.manual_seed(3)
        return StatefulDataLoader(list(range(20)), batch_size=2, shuffle=True, generator=generator)

    original = loader()
    batches = iter(original)
    next(batches), next(batches)
    path = os.path.join(tmp, "dataloader.pt")
    torch.save(original.state_dict(), path)
    want = [next(batches).tolist() for _ in range(3)]
    state = check_file(report, "torchdata StatefulDataLoader state", path, trusted_load(path))
    if state is not None:
        resumed = loader()
        resumed.load_state_dict(state)
        again = iter(resumed)
        got = [next(again).tolist() for _ in range(3)]
        report.check(got == want, f"StatefulDataLoader resumed from holdpoint's state: {got} != {want}")


def main():
    report = harness.Report("python_frameworks")
    tmp = tempfile.mkdtemp(prefix="holdpoint-frameworks-")
    cwd = os.getcwd()
    try:
        os.chdir(tmp)  # frameworks write stray files (lightning_logs, ...) to the working directory
        for check in (check_transformers, check_accelerate, check_lightning, check_torchdata):
            try:
                check(report, tmp)
            except Exception as error:  # noqa: BLE001 - one framework's failure must not hide the others
                import traceback

                traceback.print_exc()
                report.check(False, f"{check.__name__}: {type(error).__name__}: {error}")
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
