"""Shared plumbing for the Python interop tests: paths, running the CLI, reporting.

Environment (set by ctest): HOLDPOINT_BUILD_DIR (default /work/main/build) and
HOLDPOINT_SOURCE_DIR (default: the checkout this file lives in).
"""

import json
import re
import os
import subprocess
import sys

import oracle

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("HOLDPOINT_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BUILD_DIR = os.environ.get("HOLDPOINT_BUILD_DIR") or "/work/main/build"
CORPUS_DIR = os.path.join(SOURCE_DIR, "tests", "corpus")

# Address-space cap for every CLI run on a non-sanitized build (ASan reserves terabytes
# of shadow memory, so the cap cannot apply there).
ADDRESS_SPACE_LIMIT = 4_000_000_000
DEFAULT_TIMEOUT_S = 20


def holdpoint_binary():
    return os.path.join(BUILD_DIR, "holdpoint")


def require_executable(path):
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        print(f"FAIL: {path} is missing or not executable (build it first)")
        sys.exit(1)


def is_sanitized_build():
    try:
        with open(os.path.join(BUILD_DIR, "CMakeCache.txt"), encoding="utf-8", errors="replace") as f:
            cache = f.read()
    except OSError:
        return False
    for line in cache.splitlines():
        if line.startswith(("HOLDPOINT_SANITIZE:", "HOLDPOINT_FUZZ:")) and line.split("=", 1)[1].upper() in (
                "ON", "1", "TRUE", "YES"):
            return True
        if line.startswith(("CMAKE_CXX_FLAGS:", "CMAKE_CXX_FLAGS_INIT:")) and "-fsanitize" in line:
            return True
    return False


SANITIZED = is_sanitized_build()


class Result:
    def __init__(self, args, returncode, stdout, stderr, timed_out):
        self.args, self.returncode, self.stdout, self.stderr = args, returncode, stdout, stderr
        self.timed_out = timed_out

    def describe(self):
        tail = (self.stderr or self.stdout).strip().splitlines()[-3:]
        return f"exit {self.returncode}{' (timed out)' if self.timed_out else ''}: {' | '.join(tail)}"

    def json(self):
        return json.loads(self.stdout)


def run(args, timeout=DEFAULT_TIMEOUT_S, limit_memory=True):
    """Runs a command with a wall-clock timeout and (unless sanitized) an address-space cap."""
    cmd = list(args)
    if limit_memory and not SANITIZED:
        cmd = ["prlimit", f"--as={ADDRESS_SPACE_LIMIT}", "--"] + cmd
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return Result(args, None, (e.stdout or b"").decode("utf-8", "replace"),
                      (e.stderr or b"").decode("utf-8", "replace"), True)
    return Result(args, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
                  False)


def cli(*args, **kwargs):
    """The holdpoint CLI with stringified arguments."""
    return run([holdpoint_binary()] + [str(a) for a in args], **kwargs)


def first_code(result):
    """The error code in 'invalid: <code>: ...' or 'error: <code>: ...' output."""
    match = re.search(r"^(?:invalid|error): ([a-z0-9_]+):", result.stdout + result.stderr, re.MULTILINE)
    return match.group(1) if match else None


def json_or_none(result):
    try:
        return result.json()
    except ValueError:
        return None


def generation_name(step):
    """A run directory's generation file name for `step`."""
    return f"step-{step:08d}.pt"


def pickle_archive(path, pickle_bytes):
    """Writes a torch.save-shaped zip checkpoint at `path` whose data.pkl is
    `pickle_bytes`, so that a hand-made pickle reaches the pickle VM rather than
    stopping at format detection. Returns `path`."""
    import zipfile
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    return path


def raises(call):
    """Whether `call()` raises anything: for asking what another loader (torch's)
    does with a file, whatever its exception type."""
    try:
        call()
    except Exception:  # noqa: BLE001 - whatever the other loader raises
        return True
    return False


def inspect(path, digests=True):
    args = [holdpoint_binary(), "inspect", path, "--json"] + (["--digests"] if digests else [])
    return run(args)


class Report:
    """Collects failures so that one run shows all of them."""

    def __init__(self, name):
        self.name, self.failures, self.checks = name, [], 0

    def check(self, ok, what):
        self.checks += 1
        if not ok:
            self.failures.append(what)
            print(f"  FAIL {what}", flush=True)
        return ok

    def finish(self):
        if self.failures:
            print(f"{self.name}: {len(self.failures)} of {self.checks} checks failed")
            return 1
        print(f"{self.name}: all {self.checks} checks passed")
        return 0


def expect_raises(report, what, code, call, error_type):
    """Runs call() and checks that it raises `error_type` whose .code is `code`."""
    try:
        call()
    except error_type as error:
        return report.check(error.code == code, f"{what}: code {error.code}, expected {code} ({error})")
    except Exception as error:  # noqa: BLE001
        return report.check(False, f"{what}: raised {type(error).__name__}: {error}, expected {error_type.__name__} "
                                   f"{code}")
    return report.check(False, f"{what}: no error, expected {code}")


def normalize_storage_keys(tree):
    """Renumbers tensor storage keys "0", "1", ... in depth-first first-appearance order."""
    keys = {}

    def walk(node):
        if isinstance(node, dict):
            if set(node) == {"tensor"} and isinstance(node["tensor"], dict):
                t = dict(node["tensor"])
                if "storage" in t:
                    t["storage"] = keys.setdefault(t["storage"], str(len(keys)))
                return {"tensor": t}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(x) for x in node]
        return node

    return walk(tree)


def count_storages(tree):
    keys = set()

    def walk(node):
        if isinstance(node, dict):
            if set(node) == {"tensor"} and isinstance(node["tensor"], dict):
                keys.add(node["tensor"].get("storage"))
                return
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    walk(tree)
    return len(keys)

def check_records(report, label, data, fmt, records):
    """The records holdpoint lists against zipfile's view (zip: name, payload offset, size,
    CRC-32) or the oracle's layout (legacy: storage key, payload offset, size; safetensors:
    tensor name, absolute offset, size)."""
    records = records or []
    if fmt == "pytorch_zip":
        want = sorted((x["name"], x["offset"], x["size"], x["crc32"]) for x in oracle.zip_records(data))
        have = sorted((x.get("name"), x.get("offset"), x.get("size"), x.get("crc32")) for x in records)
    elif fmt == "pytorch_legacy":
        want = sorted((x["key"], x["offset"], x["size"]) for x in oracle.legacy_records(data))
        have = sorted((str(x.get("name")).rsplit("/", 1)[-1], x.get("offset"), x.get("size")) for x in records)
    elif fmt == "safetensors":
        want = sorted((x["name"], x["offset"], x["size"]) for x in oracle.safetensors_records(data))
        have = sorted((x.get("name"), x.get("offset"), x.get("size")) for x in records)
    else:
        report.check(False, f"{label}: unknown format {fmt!r}")
        return
    report.check(want == have, f"{label}: records differ: only in the reference {sorted(set(want) - set(have))[:3]}, "
                 f"only in holdpoint {sorted(set(have) - set(want))[:3]}")
