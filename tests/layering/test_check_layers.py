#!/usr/bin/env python3
"""Self-test of scripts/check_layers.py, the include-direction checker.

    python3 tests/layering/test_check_layers.py

1. The real tree passes (exit 0).
2. A synthetic tree holding one include of every allowed kind passes (no
   false positives), and commented-out includes do not count.
3. Copies of the real tree's src/, include/, tools/ and examples/, each with
   one wrong-way include planted, fail (exit 1) and name the planted
   file:line.

Standard library only; exits non-zero on any failure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECKER = REPO / "scripts" / "check_layers.py"
TREE_PARTS = ("src", "include", "tools", "examples")


def run_checker(root: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, str(CHECKER), str(root)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
    )
    return proc.returncode, proc.stdout


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def existing_or_stub(root: Path, folder: str, wanted: str | None = None) -> str:
    """A header under root/folder (wanted if given, else the first one there),
    made as a stub when the tree has none, so that a planted include tests the
    direction, not the file's existence. Returns its path relative to folder."""
    base = root / folder
    if wanted is not None:
        if not (base / wanted).is_file():
            write(root, f"{folder}/{wanted}", "#pragma once\n")
        return wanted
    headers = sorted(p.name for p in base.glob("*.h")) if base.is_dir() else []
    if headers:
        return headers[0]
    write(root, f"{folder}/planted_stub.h", "#pragma once\n")
    return "planted_stub.h"


def planted_source(include_line: str) -> str:
    # The wrong-way include sits on line 4.
    return ("// Planted by tests/layering/test_check_layers.py.\n"
            "#include <string>\n"
            "\n"
            f"{include_line}\n"
            "\n"
            "int planted() { return 0; }\n")


PLANTED_LINE = 4


class RealTree(unittest.TestCase):
    def test_real_tree_passes(self) -> None:
        rc, out = run_checker(REPO)
        self.assertEqual(rc, 0, f"check_layers.py reports violations on the real tree:\n{out}")
        self.assertIn("all directions allowed", out)


class SyntheticTree(unittest.TestCase):
    """Every allowed direction, once: the checker must accept all of it."""

    def test_allowed_directions_pass(self) -> None:
        with tempfile.TemporaryDirectory(prefix="check_layers_") as tmp:
            root = Path(tmp)
            units = {
                "base": "src/core/base", "format/value": "src/core/format/value",
                "format/zip": "src/core/format/zip", "format/pickle": "src/core/format/pickle",
                "format/safetensors": "src/core/format/safetensors", "format": "src/core/format",
                "schema": "src/core/schema", "run": "src/core/run", "verify": "src/core/verify",
                "tensor": "src/torch/tensor", "state": "src/torch/state",
                "checkpoint": "src/torch/checkpoint", "trainer": "src/torch/trainer", "dist": "src/torch/dist",
            }
            for unit, folder in units.items():
                write(root, f"{folder}/{unit.replace('/', '_')}.h", "#pragma once\n")
            for layer in ("base", "format", "schema", "run", "verify", "tensor", "state", "checkpoint", "trainer", "dist"):
                write(root, f"include/holdpoint/{layer}/{layer}_api.h", "#pragma once\n#include <cstdint>\n")
            write(root, "src/core/base/version.h.in", '#define HOLDPOINT_VERSION "@PROJECT_VERSION@"\n')
            write(root, "src/core/base/base.cpp",
                  '#include "base/base.h"\n#include "base.h"\n#include "holdpoint/base/base_api.h"\n'
                  '#include <holdpoint/base/base_api.h>\n#include "holdpoint_version.h"\n#include <sys/stat.h>\n'
                  '// #include "state/state.h"\n/* #include <ATen/ATen.h>\n#include "run/run.h" */\n'
                  'const char* s = "/* not a comment";\n#include <vector>\n'
                  'const char* r = R"x(#include "state/state.h")x";\nint n = 1\'000;\n')
            write(root, "src/core/format/value/value.cpp",
                  '#include "format/value/format_value.h"\n#include "base/base.h"\n#include "holdpoint/format/format_api.h"\n')
            for sibling in ("zip", "pickle", "safetensors"):
                write(root, f"src/core/format/{sibling}/{sibling}.cpp",
                      f'#include "format/{sibling}/format_{sibling}.h"\n#include "format/value/format_value.h"\n'
                      '#include "base/base.h"\n#include "holdpoint/format/format_api.h"\n#include "holdpoint/base/base_api.h"\n')
            write(root, "src/core/format/pt.cpp",
                  '#include "format/format.h"\n#include "format/zip/format_zip.h"\n#include "format/pickle/format_pickle.h"\n'
                  '#include "format/safetensors/format_safetensors.h"\n#include "format/value/format_value.h"\n'
                  '#include "pickle/format_pickle.h"\n#include "base/base.h"\n')
            write(root, "src/core/schema/schema.cpp", '#include "format/format.h"\n#include "holdpoint/format/format_api.h"\n')
            write(root, "src/core/run/run.cpp", '#include "schema/schema.h"\n#include "format/zip/format_zip.h"\n')
            write(root, "src/core/verify/verify.cpp", '#include "run/run.h"\n#include "holdpoint/run/run_api.h"\n')
            write(root, "src/torch/tensor/tensor.cpp",
                  '#include "verify/verify.h"\n#include "base/base.h"\n#include <ATen/core/Tensor.h>\n#include <torch/version.h>\n'
                  '#include <c10/util/Exception.h>\n#include "holdpoint/verify/verify_api.h"\n')
            write(root, "src/torch/state/state.cpp", '#include "tensor/tensor.h"\n#include "run/run.h"\n#include "holdpoint/tensor/tensor_api.h"\n')
            write(root, "src/torch/checkpoint/checkpoint.cpp", '#include "state/state.h"\n#include "run/run.h"\n#include "holdpoint/state/state_api.h"\n')
            write(root, "src/torch/trainer/trainer.cpp", '#include "checkpoint/checkpoint.h"\n#include "holdpoint/checkpoint/checkpoint_api.h"\n')
            write(root, "src/torch/dist/dist.cpp",
                  '#include "checkpoint/checkpoint.h"\n#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>\n')
            write(root, "include/holdpoint/format/format_value.h", '#include "holdpoint/base/base_api.h"\n#include "format_api.h"\n')
            write(root, "include/holdpoint/state/state_more.h",
                  '#include "holdpoint/tensor/tensor_api.h"\n#include "holdpoint/run/run_api.h"\n#include <ATen/core/Tensor.h>\n')
            write(root, "include/holdpoint/dist/dist_more.h", '#include "holdpoint/checkpoint/checkpoint_api.h"\n')
            write(root, "tools/holdpoint/commands.h", "#pragma once\n")
            write(root, "tools/holdpoint/main.cpp",
                  '#include "commands.h"\n#include "holdpoint_version.h"\n#include "holdpoint/verify/verify_api.h"\n'
                  '#include "holdpoint/format/format_api.h"\n#include <nlohmann/json.hpp>\n')
            write(root, "tools/holdpoint-doctor/probe.h", "#pragma once\n")
            write(root, "tools/holdpoint-doctor/doctor.cpp",
                  '#include "probe.h"\n#include "holdpoint/dist/dist_api.h"\n#include "holdpoint/trainer/trainer_api.h"\n'
                  '#include <torch/version.h>\n#include "holdpoint_version.h"\n')
            write(root, "examples/one/helper.h", '#include <ATen/ATen.h>\n#include "holdpoint/state/state_api.h"\n')
            write(root, "examples/one/train.cpp", '#include "helper.h"\n#include "holdpoint/trainer/trainer_api.h"\n#include "holdpoint_version.h"\n')
            write(root, "examples/small.cpp", '#include <holdpoint/checkpoint/checkpoint_api.h>\n')
            # tests/, bench/ and fuzz/ are unrestricted (and not scanned).
            write(root, "tests/unit/x_test.cpp", '#include "state/state.h"\n#include "nope/nope.h"\n')
            write(root, "bench/b.cpp", '#include "format/zip/format_zip.h"\n')
            rc, out = run_checker(root)
            self.assertEqual(rc, 0, f"allowed includes reported as violations:\n{out}")
            self.assertRegex(out, r"^\d+ files, \d+ includes, all directions allowed$")


class PlantedViolations(unittest.TestCase):
    """Each test plants one wrong-way include into a copy of the real tree."""

    def setUp(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="check_layers_")
        self.root = Path(self._tmp.name)
        for part in TREE_PARTS:
            if (REPO / part).is_dir():
                shutil.copytree(REPO / part, self.root / part,
                                ignore=shutil.ignore_patterns(".*", "__pycache__"))

    def tearDown(self) -> None:
        self._tmp.cleanup()

    def expect_violation(self, rel: str, line: int, what: str, *, must_contain: tuple[str, ...] = (),
                         direction: bool = True) -> None:
        rc, out = run_checker(self.root)
        self.assertEqual(rc, 1, f"{what}: check_layers.py exited {rc}, expected 1\n{out}")
        prefix = f"{rel}:{line}: "
        hits = [l for l in out.splitlines() if l.startswith(prefix)]
        self.assertTrue(hits, f"{what}: output does not name {rel}:{line}\n{out}")
        for text in must_contain:
            self.assertTrue(any(text in h for h in hits),
                            f"{what}: the line for {rel}:{line} does not mention {text!r}\n" + "\n".join(hits))
        if direction:
            # The target exists: the report must be about the direction, not a missing file.
            self.assertTrue(any("must not include" in h and "(no such file)" not in h for h in hits),
                            f"{what}: reported as a missing file instead of a wrong direction\n" + "\n".join(hits))

    def plant(self, rel: str, include: str) -> None:
        self.assertFalse((self.root / rel).exists(), f"planted file {rel} already exists in the tree")
        write(self.root, rel, planted_source(include))

    def test_format_includes_private_schema(self) -> None:
        header = existing_or_stub(self.root, "src/core/schema")
        self.plant("src/core/format/planted_up.cpp", f'#include "schema/{header}"')
        self.expect_violation("src/core/format/planted_up.cpp", PLANTED_LINE, "format including a private schema header",
                              must_contain=("format must not include", "schema"))

    def test_format_includes_public_schema(self) -> None:
        header = existing_or_stub(self.root, "include/holdpoint/schema")
        self.plant("src/core/format/planted_up_public.cpp", f'#include "holdpoint/schema/{header}"')
        self.expect_violation("src/core/format/planted_up_public.cpp", PLANTED_LINE,
                              "format including a public schema header", must_contain=("schema",))

    def test_core_includes_torch_state(self) -> None:
        existing_or_stub(self.root, "src/torch/state", "state_fields.h")
        self.plant("src/core/run/planted_torch.cpp", '#include "state/state_fields.h"')
        self.expect_violation("src/core/run/planted_torch.cpp", PLANTED_LINE, "core tier including a torch-tier header",
                              must_contain=("state", "LibTorch-free"))

    def test_core_includes_aten(self) -> None:
        self.plant("src/core/base/planted_aten.cpp", "#include <ATen/core/Tensor.h>")
        self.expect_violation("src/core/base/planted_aten.cpp", PLANTED_LINE, "core tier including <ATen/...>",
                              must_contain=("LibTorch",))

    def test_cli_includes_private_base(self) -> None:
        existing_or_stub(self.root, "src/core/base", "file_system.h")
        self.plant("tools/holdpoint/x.cpp", '#include "base/file_system.h"')
        self.expect_violation("tools/holdpoint/x.cpp", PLANTED_LINE, "CLI including a private header",
                              must_contain=("private",))

    def test_cli_includes_torch_public(self) -> None:
        existing_or_stub(self.root, "include/holdpoint/checkpoint", "training_state.h")
        self.plant("tools/holdpoint/x.cpp", '#include "holdpoint/checkpoint/training_state.h"')
        self.expect_violation("tools/holdpoint/x.cpp", PLANTED_LINE, "CLI including a torch-tier public header",
                              must_contain=("LibTorch-free",))

    def test_zip_includes_pickle(self) -> None:
        existing_or_stub(self.root, "src/core/format/pickle", "pickle_reader.h")
        self.plant("src/core/format/zip/planted_sibling.cpp", '#include "format/pickle/pickle_reader.h"')
        self.expect_violation("src/core/format/zip/planted_sibling.cpp", PLANTED_LINE, "zip including pickle",
                              must_contain=("format/zip must not include", "format/pickle"))

    def test_public_core_header_includes_private(self) -> None:
        existing_or_stub(self.root, "src/core/base", "fail.h")
        self.plant("include/holdpoint/base/planted_public.h", '#include "base/fail.h"')
        self.expect_violation("include/holdpoint/base/planted_public.h", PLANTED_LINE,
                              "public core header including a private header", must_contain=("public",))

    def test_public_core_header_includes_libtorch(self) -> None:
        self.plant("include/holdpoint/format/planted_public_torch.h", "#include <c10/util/Exception.h>")
        self.expect_violation("include/holdpoint/format/planted_public_torch.h", PLANTED_LINE,
                              "public core header including LibTorch", must_contain=("LibTorch",))

    def test_example_includes_private(self) -> None:
        existing_or_stub(self.root, "src/core/base", "publish.h")
        self.plant("examples/planted_example.cpp", '#include "base/publish.h"')
        self.expect_violation("examples/planted_example.cpp", PLANTED_LINE, "example including a private header",
                              must_contain=("private",))

    def test_nonexistent_include(self) -> None:
        self.assertFalse((self.root / "src/core/run/nope.h").exists())
        self.plant("src/core/run/planted_typo.cpp", '#include "run/nope.h"')
        self.expect_violation("src/core/run/planted_typo.cpp", PLANTED_LINE, "include of a file that does not exist",
                              must_contain=("run/nope.h", "no such file"), direction=False)

    def test_file_in_unknown_folder(self) -> None:
        self.plant("src/core/misc/planted.cpp", "#include <vector>")
        self.expect_violation("src/core/misc/planted.cpp", 1, "a source file outside the layer folders",
                              must_contain=("not inside a known layer folder",), direction=False)

    def test_trainer_includes_public_dist(self) -> None:
        header = existing_or_stub(self.root, "include/holdpoint/dist")
        self.plant("src/torch/trainer/planted_upward.cpp", f'#include "holdpoint/dist/{header}"')
        self.expect_violation("src/torch/trainer/planted_upward.cpp", PLANTED_LINE, "trainer including dist",
                              must_contain=("trainer must not include", "dist"))

    def test_dist_may_include_trainer(self) -> None:
        header = existing_or_stub(self.root, "include/holdpoint/trainer")
        self.plant("src/torch/dist/planted_above.cpp", f'#include "holdpoint/trainer/{header}"')
        rc, out = run_checker(self.root)
        self.assertEqual(rc, 0, f"dist including trainer reported as a violation:\n{out}")

    def test_trainer_includes_private_dist(self) -> None:
        write(self.root, "src/torch/dist/planted_dist.h", "#pragma once\n")
        self.plant("src/torch/trainer/planted_sibling.cpp", '#include "dist/planted_dist.h"')
        self.expect_violation("src/torch/trainer/planted_sibling.cpp", PLANTED_LINE, "trainer including dist",
                              must_contain=("trainer must not include", "dist"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
