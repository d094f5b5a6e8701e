"""`holdpoint doctor`: what it says about this build and the Python torch installations
around it, checked against what the build actually used.

- the LibTorch version it was built against and runs with is the one in the build's
  CMakeCache.txt (Torch_DIR's TorchConfigVersion.cmake), and for a build against the
  pinned wheel also the version of the .venv's torch;
- c10d support (holdpoint_dist, make_gloo_process_group) matches what the build configured;
- every untrusted-OK load entry point is marked as never reaching LibTorch's unpickler,
  and only the trusted ones reach it;
- the project's .venv with torch 2.13 is listed with weights_only on by default and able
  to read holdpoint's default files; a torch 1.x (Debian's python3-torch) is listed as
  needing SaveOptions::torch_1_13_compatible;
- negative: HOLDPOINT_PYTHON naming a file that does not exist is reported as "not
  found", and an interpreter that never answers is killed and reported as "timed out":
  either way the doctor exits 0 with the rest of its report.

Run by ctest with the oracle Python (the .venv's)."""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import harness

HOLDPOINT = harness.holdpoint_binary()
DOCTOR = os.path.join(harness.BUILD_DIR, "holdpoint-doctor")
# The doctor imports torch in every Python it finds (concurrently, at most 20 s each).
DOCTOR_TIMEOUT_S = 120

UNTRUSTED_OK = ["load_checkpoint_mapping", "TrainingState::load_model_state", "TrainingState::load_checkpoint",
                "CheckpointManager::resume", "DistributedCheckpointer::load_checkpoint / resume"]
TRUSTED_ONLY = ["load_trusted_mapping", "TrainingState::load_trusted_checkpoint"]


def cache_entries():
    entries = {}
    with open(os.path.join(harness.BUILD_DIR, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
        for line in f:
            match = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line.rstrip("\n"))
            if match:
                entries[match.group(1)] = match.group(2)
    return entries


def configured_torch_version(cache):
    """PACKAGE_VERSION of the TorchConfigVersion.cmake the build found."""
    torch_dir = cache.get("Torch_DIR", "")
    try:
        with open(os.path.join(torch_dir, "TorchConfigVersion.cmake"), encoding="utf-8") as f:
            match = re.search(r'set\(PACKAGE_VERSION "([^"]+)"\)', f.read())
    except OSError:
        return None
    return match.group(1) if match else None


def venv_python():
    return os.path.join(harness.SOURCE_DIR, ".venv", "bin", "python")


def venv_torch_dir():
    """The .venv's torch package folder and version, or (None, None)."""
    try:
        out = subprocess.run([venv_python(), "-c", "import os, torch; print(os.path.dirname(torch.__file__)); "
                              "print(torch.__version__)"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=60, check=True).stdout.decode().split("\n")
    except (OSError, subprocess.SubprocessError):
        return None, None
    return os.path.realpath(out[0]), out[1]


def doctor(*args, python=None):
    saved = os.environ.get("HOLDPOINT_PYTHON")
    if python is None:
        os.environ.pop("HOLDPOINT_PYTHON", None)
    else:
        os.environ["HOLDPOINT_PYTHON"] = python
    try:
        # LibTorch and the Python probes need more address space than the CLI's cap.
        return harness.cli("doctor", *args, timeout=DOCTOR_TIMEOUT_S, limit_memory=False)
    finally:
        if saved is None:
            os.environ.pop("HOLDPOINT_PYTHON", None)
        else:
            os.environ["HOLDPOINT_PYTHON"] = saved


def found_as(report, pythons, label):
    entries = [p for p in pythons if label in p.get("found_as", [])]
    report.check(len(entries) == 1, f"exactly one interpreter is listed as {label!r}: {pythons}")
    return entries[0] if entries else {}


def check_libtorch(report, out, cache):
    built = configured_torch_version(cache)
    report.check(built is not None, f"the build's TorchConfigVersion.cmake (Torch_DIR={cache.get('Torch_DIR')}) names a version")
    report.check(out.get("libtorch") == built, f"built against LibTorch {out.get('libtorch')!r}, CMake found {built!r}")
    runtime = out.get("libtorch_runtime", {})
    report.check(runtime.get("version") == built, f"runs with LibTorch {runtime!r}, CMake found {built!r}")

    torch_dir, torch_version = venv_torch_dir()
    torch_cmake_dir = os.path.realpath(cache.get("Torch_DIR", ""))
    if torch_dir and torch_cmake_dir.startswith(torch_dir + os.sep):
        # The wheel build: the C++ library is the .venv's torch.
        report.check(torch_version.split("+")[0] == out.get("libtorch"),
                     f"the wheel build's LibTorch {out.get('libtorch')!r} is the .venv's torch {torch_version!r}")
        report.check(runtime.get("library", "").startswith(torch_dir + os.sep),
                     f"the LibTorch loaded at run time ({runtime.get('library')!r}) is the .venv's ({torch_dir})")
    else:
        print(f"  (not the wheel build: Torch_DIR {torch_cmake_dir})")


def check_distributed(report, out, cache):
    distributed = out.get("distributed", {})
    have_dist = os.path.isfile(os.path.join(harness.BUILD_DIR, "libholdpoint_dist.a"))
    have_gloo = cache.get("HOLDPOINT_HAVE_GLOO_PROCESS_GROUP") == "1"
    report.check(distributed.get("holdpoint_dist") is have_dist,
                 f"holdpoint_dist reported {distributed.get('holdpoint_dist')}, built: {have_dist}")
    report.check(distributed.get("gloo_process_group") is have_gloo,
                 f"make_gloo_process_group reported {distributed.get('gloo_process_group')}, configured: {have_gloo}")


def check_load_apis(report, out):
    apis = {a.get("name"): a for a in out.get("load_apis", [])}
    report.check(set(apis) == set(UNTRUSTED_OK + TRUSTED_ONLY), f"the load entry points listed: {sorted(apis)}")
    for name in UNTRUSTED_OK:
        api = apis.get(name, {})
        report.check(api.get("untrusted_ok") is True and api.get("reaches_libtorch_unpickler") is False,
                     f"{name} is untrusted-OK and never reaches LibTorch's unpickler: {api}")
    for name in TRUSTED_ONLY:
        api = apis.get(name, {})
        report.check(api.get("untrusted_ok") is False and api.get("reaches_libtorch_unpickler") is True,
                     f"{name} needs trust and reaches LibTorch's unpickler: {api}")


def check_pythons(report, out):
    pythons = out.get("python_torch", [])
    venv = found_as(report, pythons, "project .venv")
    report.check(venv.get("status") == "ok" and str(venv.get("torch", "")).startswith("2.13.0"),
                 f"the .venv's torch 2.13.0 is found: {venv}")
    report.check(os.path.realpath(venv.get("path", "")) == os.path.realpath(venv_python()),
                 f"the .venv found is the project's ({venv_python()}): {venv.get('path')}")
    report.check(venv.get("weights_only_default") is True and venv.get("reads_default_files") is True
                 and venv.get("reads_torch_1_13_compatible_files") is True,
                 f"torch 2.13 defaults to weights_only and reads holdpoint's files: {venv}")

    system = found_as(report, pythons, "/usr/bin/python3")
    if system.get("status") == "ok" and str(system.get("torch", "")).startswith("1.13"):
        report.check(system.get("weights_only_default") is False and system.get("reads_default_files") is False
                     and system.get("reads_torch_1_13_compatible_files") is True,
                     f"torch 1.13 needs SaveOptions::torch_1_13_compatible: {system}")
    report.check(found_as(report, pythons, "python3 on PATH").get("status") is not None,
                 "python3 on PATH is reported (found or not)")

    paths = [os.path.realpath(p["path"]) for p in pythons if p.get("path") and p.get("status") == "ok"]
    prefixes = [(p.get("executable"), p.get("prefix")) for p in pythons if p.get("status") == "ok"]
    report.check(len(prefixes) == len(set(prefixes)), f"no interpreter is listed twice: {paths}")


def check_missing_python(report, tmp):
    missing = os.path.join(tmp, "no-such-python")
    r = doctor("--json", python=missing)
    out = harness.json_or_none(r) or {}
    report.check(r.returncode == 0 and out, f"doctor with HOLDPOINT_PYTHON={missing} still reports: {r.describe()}")
    entry = found_as(report, out.get("python_torch", []), "HOLDPOINT_PYTHON")
    report.check(entry.get("status") == "not found" and entry.get("path") == missing and entry.get("torch") is None,
                 f"a nonexistent HOLDPOINT_PYTHON is 'not found': {entry}")
    venv = found_as(report, out.get("python_torch", []), "project .venv")
    report.check(venv.get("status") == "ok", f"the other interpreters are still probed: {venv}")


def check_hanging_python(report, tmp):
    hanging = os.path.join(tmp, "hanging-python")
    with open(hanging, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\nexec sleep 600\n")
    os.chmod(hanging, stat.S_IRWXU)
    r = doctor("--json", python=hanging)
    out = harness.json_or_none(r) or {}
    report.check(r.returncode == 0 and not r.timed_out and out,
                 f"doctor with an interpreter that never answers still finishes: {r.describe()}")
    entry = found_as(report, out.get("python_torch", []), "HOLDPOINT_PYTHON")
    report.check(entry.get("status") == "timed out", f"an interpreter that never answers is 'timed out': {entry}")


def check_text(report):
    r = doctor()
    report.check(r.returncode == 0, f"doctor (text) runs: {r.describe()}")
    for needle in ("LibTorch  built with", "runs with", "[untrusted OK] load_checkpoint_mapping",
                   "[trusted only] TrainingState::load_trusted_checkpoint", "Python torch", "(project .venv): torch 2.13.0"):
        report.check(needle in r.stdout, f"the text report has {needle!r}:\n{r.stdout}")


def main():
    harness.require_executable(HOLDPOINT)
    harness.require_executable(DOCTOR)
    report = harness.Report("test_doctor")
    cache = cache_entries()
    r = doctor("--json")
    out = harness.json_or_none(r) or {}
    report.check(r.returncode == 0 and out, f"doctor --json: {r.describe()}")
    check_libtorch(report, out, cache)
    check_distributed(report, out, cache)
    check_load_apis(report, out)
    check_pythons(report, out)
    tmp = tempfile.mkdtemp(prefix="holdpoint-doctor-")
    try:
        check_missing_python(report, tmp)
        check_hanging_python(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    check_text(report)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
