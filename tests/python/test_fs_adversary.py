"""A file-system adversary against every read entry point (issue 35): where the code expects
a file, plant something else, and expect a prompt refusal with its code.

Planted at the path the user names (for `holdpoint verify`, `inspect`, `diff`, `convert`,
`verify --trust`, and holdpoint.load / verify / inspect):
  - a FIFO, a directory, a character device (mknod, 1:5 = /dev/zero), a symlink to a
    device: io_not_regular_file, at once (a FIFO used to block open() forever);
  - a symlink to a checkpoint and a hard link to one: read (the user chose the path;
    Hugging Face's cache links snapshots to blobs);
  - a file without read permission: io_open_failed for a user other than root (root
    reads any file, so the check runs as nobody, uid 65534).
Planted at the `.sig` beside a file under `verify --trust` / trust=: a FIFO and a
directory, io_not_regular_file.
Planted inside a torch.distributed.checkpoint folder (at an item and at `.metadata`), read
through `holdpoint verify`, `holdpoint inspect` and holdpoint.load / load_with_info /
verify / inspect: a symlink leaving the folder to a real checkpoint, a symlink inside the
folder, a FIFO, a directory, a character device: io_not_regular_file, and nothing of the
checkpoint outside is returned; a folder named through a symlink reads (and so do
load_with_info, verify and inspect, which refused every DCP folder before).
Nothing outside the named paths is changed: the outside checkpoint's bytes and mtime stay.

Files that grow or shrink while read are covered where the race can be made
deterministic: scan_test, file_system_test, checkpoint_diff_test and integrity_test
(file_changed_during_read).

The whole script runs under a 120 s watchdog (faulthandler), and each CLI run under
harness.run's 20 s timeout, so a hang fails it. Run by ctest with the oracle Python."""

import faulthandler
import os
import shutil
import subprocess
import sys
import tempfile

faulthandler.dump_traceback_later(120, exit=True)

import torch  # noqa: E402

import harness  # noqa: E402

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

HOLDPOINT = harness.holdpoint_binary()
DCP_FIXTURE = os.path.join(harness.SOURCE_DIR, "tests", "unit", "fixtures", "dcp_two_ranks")
NOBODY = 65534
cli = harness.cli
first_code = harness.first_code


def plant(kind, at, target=None):
    """Puts `kind` at `at` (which must not exist)."""
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "directory":
        os.mkdir(at)
    elif kind == "char device":
        os.mknod(at, 0o644 | 0o020000, os.makedev(1, 5))
    elif kind == "symlink to a device":
        os.symlink("/dev/zero", at)
    elif kind == "symlink":
        os.symlink(target, at)
    elif kind == "hard link":
        os.link(target, at)
    else:
        raise ValueError(kind)


REFUSED_KINDS = ["fifo", "directory", "char device", "symlink to a device"]


def python_code(call):
    """The code of the holdpoint.Error `call` raises, "no error", or another exception's name."""
    try:
        call()
    except holdpoint.Error as error:
        return error.code
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"
    return "no error"


def check_named_path(report, tmp, good, key_pub):
    """Each planted kind at the path the user names, through every entry point."""
    for kind in REFUSED_KINDS:
        path = os.path.join(tmp, f"planted-{kind.replace(' ', '-')}.pt")
        plant(kind, path)
        for args in (["verify", path], ["inspect", path], ["diff", path, good], ["diff", good, path],
                     ["convert", path, os.path.join(tmp, "out.safetensors")],
                     ["verify", path, "--trust", key_pub, "--signature-optional"]):
            r = cli(*args)
            report.check(not r.timed_out and first_code(r) == "io_not_regular_file",
                         f"{kind}: holdpoint {' '.join(args[:1])} ({args}): {r.describe()}")
        for name, call in (("load", lambda: holdpoint.load(path)),
                           ("load_with_info", lambda: holdpoint.load_with_info(path)),
                           ("verify", lambda: holdpoint.verify(path)),
                           ("inspect", lambda: holdpoint.inspect(path))):
            code = python_code(call)
            report.check(code == "io_not_regular_file", f"{kind}: holdpoint.{name}: {code}")
    assert not os.path.exists(os.path.join(tmp, "out.safetensors"))

    for kind in ("symlink", "hard link"):
        path = os.path.join(tmp, f"{kind.replace(' ', '-')}.pt")
        plant(kind, path, good)
        r = cli("verify", path)
        report.check(r.returncode == 0, f"a {kind} the user names is read: {r.describe()}")
        state = holdpoint.load(path, tensors="torch")
        report.check(torch.equal(state["w"], torch.arange(8.0)), f"a {kind}: holdpoint.load reads its target")


def check_signature_plants(report, tmp, good, key_pub):
    for kind in ("fifo", "directory"):
        signed = os.path.join(tmp, f"signed-{kind}.pt")
        shutil.copy(good, signed)
        plant(kind, signed + ".sig")
        r = cli("verify", signed, "--trust", key_pub)
        report.check(not r.timed_out and first_code(r) == "io_not_regular_file", f".sig is a {kind}: {r.describe()}")
        code = python_code(lambda: holdpoint.verify(signed, trust=holdpoint.TrustPolicy(keys=[key_pub])))
        report.check(code == "io_not_regular_file", f".sig is a {kind}: holdpoint.verify(trust=): {code}")
        code = python_code(lambda: holdpoint.load(signed, trust=holdpoint.TrustPolicy(keys=[key_pub])))
        report.check(code == "io_not_regular_file", f".sig is a {kind}: holdpoint.load(trust=): {code}")


def read_as_nobody(report, tmp, good):
    """A file without read permission, opened by a user root is not."""
    locked = os.path.join(tmp, "locked.pt")
    shutil.copy(good, locked)
    os.chmod(locked, 0)
    os.chmod(tmp, 0o755)
    r = subprocess.run([HOLDPOINT, "verify", locked], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=20,
                       preexec_fn=lambda: os.setuid(NOBODY))
    out = r.stdout.decode() + r.stderr.decode()
    report.check(r.returncode == 2 and "io_open_failed" in out, f"an unreadable file, holdpoint verify: {out}")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import holdpoint\n"
            "try:\n    holdpoint.load(sys.argv[2])\nexcept holdpoint.Error as e:\n    print(e.code)\n")
    # The oracle Python lives under /root, which nobody cannot enter; Debian's
    # python3 is the same minor version, which the extension's ABI needs.
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    r = subprocess.run([python, "-c", code, os.path.join(harness.BUILD_DIR, "python"), locked],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, preexec_fn=lambda: os.setuid(NOBODY))
    report.check(r.stdout.decode().strip() == "io_open_failed",
                 f"an unreadable file, holdpoint.load: {r.stdout.decode()} {r.stderr.decode()[-300:]}")


def dcp_entry_points(folder):
    """(what, a call returning an error code) for every entry point reading a DCP folder."""
    def cli_code(*args):
        r = cli(*args)
        return "hang" if r.timed_out else (first_code(r) or ("no error" if r.returncode == 0 else r.describe()))
    return [
        ("holdpoint verify", lambda: cli_code("verify", folder)),
        ("holdpoint inspect", lambda: cli_code("inspect", folder)),
        ("holdpoint.load", lambda: python_code(lambda: holdpoint.load(folder))),
        ("holdpoint.load_with_info", lambda: python_code(lambda: holdpoint.load_with_info(folder))),
        ("holdpoint.verify", lambda: python_code(lambda: holdpoint.verify(folder))),
        ("holdpoint.inspect", lambda: python_code(lambda: holdpoint.inspect(folder))),
    ]


def check_dcp_folder(report, tmp):
    outside = os.path.join(tmp, "outside")
    shutil.copytree(DCP_FIXTURE, outside)
    before = {name: (open(os.path.join(outside, name), "rb").read(), os.stat(os.path.join(outside, name)).st_mtime_ns)
              for name in os.listdir(outside)}

    honest = os.path.join(tmp, "honest")
    shutil.copytree(DCP_FIXTURE, honest)
    os.symlink(honest, os.path.join(tmp, "honest-link"))
    for folder in (honest, os.path.join(tmp, "honest-link")):
        for what, call in dcp_entry_points(folder):
            code = call()
            report.check(code == "no error", f"an honest DCP folder {folder}: {what}: {code}")
    root, info = holdpoint.load_with_info(honest, tensors="torch")
    report.check(info["format"] == "torch.distributed.checkpoint" and info["sha256"] is None and root["epoch"] == 3,
                 f"load_with_info of a DCP folder: {info}")
    report.check(holdpoint.verify(honest)["valid"] is True, "holdpoint.verify of a DCP folder")
    tree = holdpoint.inspect(honest)["tree"]
    report.check(isinstance(tree["rows"], holdpoint.TensorInfo), f"holdpoint.inspect of a DCP folder: {tree}")
    r = cli("verify", honest, "--json")
    report.check(r.returncode == 0 and r.json()["format"] == "torch.distributed.checkpoint", f"verify --json: {r.describe()}")

    for name in ("__1_0.distcp", ".metadata"):
        for kind in ["symlink leaving the folder", "symlink inside the folder"] + REFUSED_KINDS:
            folder = os.path.join(tmp, f"dcp-{name}-{kind.replace(' ', '-')}")
            shutil.copytree(DCP_FIXTURE, folder)
            at = os.path.join(folder, name)
            if kind == "symlink inside the folder":
                os.rename(at, os.path.join(folder, "real"))
                os.symlink("real", at)
            else:
                os.remove(at)
                if kind == "symlink leaving the folder":
                    os.symlink(os.path.join(outside, name), at)
                else:
                    plant(kind, at)
            for what, call in dcp_entry_points(folder):
                code = call()
                report.check(code == "io_not_regular_file", f"{kind} at {name}: {what}: {code}")

    after = {name: (open(os.path.join(outside, name), "rb").read(), os.stat(os.path.join(outside, name)).st_mtime_ns)
             for name in os.listdir(outside)}
    report.check(before == after, "the checkpoint outside the folders is unchanged")


def main():
    harness.require_executable(HOLDPOINT)
    report = harness.Report("fs_adversary")
    tmp = tempfile.mkdtemp(prefix="holdpoint-fs-adversary-")
    try:
        good = os.path.join(tmp, "good.pt")
        torch.save({"w": torch.arange(8.0)}, good)
        key = os.path.join(tmp, "key")
        r = cli("keygen", key)
        if not report.check(r.returncode == 0, f"keygen: {r.describe()}"):
            return report.finish()
        check_named_path(report, tmp, good, key + ".pub")
        check_signature_plants(report, tmp, good, key + ".pub")
        read_as_nobody(report, tmp, good)
        check_dcp_folder(report, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
