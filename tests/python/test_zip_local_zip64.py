"""Local zip64 blocks as Python's zipfile writes them (issue 35, point 7).

The zip reader holds a local header's zip64 block to the central directory
(docs/format.md §3.3). This test takes a torch.save checkpoint, writes its records
again with Python's zipfile in zip64 mode, once to a seekable file (local sizes
0xFFFFFFFF, the true sizes in the block) and once to an unseekable stream (a data
descriptor, zeros in the block), and checks that `holdpoint verify` accepts both and
refuses each with one local size changed (`zip_local_zip64_mismatch`).
miniz's layouts, the other writer the rule admits, are in tests/unit/zip_reader_test.cpp.

Exit status 0 when everything matches, 1 otherwise.
"""

import io
import os
import struct
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

import torch  # noqa: E402


class Unseekable(io.RawIOBase):
    """A write-only stream without tell or seek, like a pipe: zipfile then writes
    descriptors and cannot go back to patch the local headers."""

    def __init__(self, out):
        self._out = out

    def writable(self):
        return True

    def write(self, data):
        return self._out.write(data)


def rezip(source, out):
    with zipfile.ZipFile(io.BytesIO(source)) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for name in zin.namelist():
            with zout.open(name, "w", force_zip64=True) as w:
                w.write(zin.read(name))


def local_zip64_blocks(data):
    """(offset of the block's values, uncompressed, compressed) of every local header."""
    blocks = []
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            at = info.header_offset
            name_size, extra_size = struct.unpack_from("<HH", data, at + 26)
            extra = at + 30 + name_size
            block_id, length = struct.unpack_from("<HH", data, extra)
            if block_id == 1 and length == 16:
                blocks.append((extra + 4, *struct.unpack_from("<QQ", data, extra + 4)))
    return blocks


def verify_code(path):
    r = harness.run([harness.holdpoint_binary(), "verify", path, "--json"])
    if r.returncode == 0:
        return "accepted"
    try:
        return r.json().get("code")
    except ValueError:
        return r.describe()


def main():
    report = harness.Report("zip_local_zip64")
    harness.require_executable(harness.holdpoint_binary())
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(6, dtype=torch.float32), "step": 3}, buffer)
    with tempfile.TemporaryDirectory(prefix="holdpoint-zip64-") as tmp:
        for label, zeros in (("seekable", False), ("unseekable", True)):
            path = os.path.join(tmp, label + ".pt")
            with open(path, "wb") as f:
                rezip(buffer.getvalue(), f if not zeros else Unseekable(f))
            with open(path, "rb") as f:
                data = f.read()
            blocks = local_zip64_blocks(data)
            if not report.check(len(blocks) >= 3, f"{label}: zipfile wrote {len(blocks)} local zip64 blocks"):
                continue
            report.check(all((u == 0 and c == 0) == zeros for _, u, c in blocks),
                         f"{label}: local zip64 sizes {[(u, c) for _, u, c in blocks]}")
            got = verify_code(path)
            report.check(got == "accepted", f"{label}: verify says {got}")
            at, uncompressed, _ = blocks[-1]
            tampered = bytearray(data)
            struct.pack_into("<Q", tampered, at, uncompressed + 1)
            bad = os.path.join(tmp, label + "-tampered.pt")
            with open(bad, "wb") as f:
                f.write(tampered)
            got = verify_code(bad)
            report.check(got == "zip_local_zip64_mismatch", f"{label}, one local zip64 size changed: verify says {got}")
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
