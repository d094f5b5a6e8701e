#!/usr/bin/env python3
"""Checks that every #include in holdpoint's source tree points in an allowed
direction (docs/architecture.md has the layers and the reasons for them).

    python3 scripts/check_layers.py [REPO_ROOT]

Walks *.h, *.cpp and *.h.in under src/, include/, tools/, examples/, docs/examples/ and python/native/ (tests/,
bench/ and fuzz/ may include anything), resolves each "..." and <...> include
the way the build's include paths do, and prints one line per violation:

    path:line: <file's layer> must not include <target> (<target's layer>): <reason>

Exit status 1 when there is any violation, 0 (with a one-line summary) when
there is none. Python 3.11, standard library only.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------
# The layer table. Keep it in step with docs/architecture.md.
#
# Each unit is one static library: name -> (tier, source folder, units it sits
# directly on). A unit may include its own headers and those of every unit
# below it (the transitive closure of "sits on"), never anything above it nor a
# sibling. The torch tier sits on the whole core tier; the core tier never
# includes the torch tier or LibTorch.
# ---------------------------------------------------------------------------
UNITS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    # core tier (LibTorch-free): base < format < schema < run < verify;
    # inside format: value < {zip, pickle, safetensors} < format (files directly in src/core/format/)
    "base":               ("core",  "src/core/base",               ()),
    "format/value":       ("core",  "src/core/format/value",       ("base",)),
    "format/zip":         ("core",  "src/core/format/zip",         ("format/value",)),
    "format/pickle":      ("core",  "src/core/format/pickle",      ("format/value",)),
    "format/safetensors": ("core",  "src/core/format/safetensors", ("format/value",)),
    "format":             ("core",  "src/core/format",             ("format/zip", "format/pickle", "format/safetensors")),
    "schema":             ("core",  "src/core/schema",             ("format",)),
    "run":                ("core",  "src/core/run",                ("schema",)),
    "verify":             ("core",  "src/core/verify",             ("run",)),
    # torch tier: tensor < state < checkpoint < trainer < dist
    "tensor":             ("torch", "src/torch/tensor",            ("verify",)),
    "state":              ("torch", "src/torch/state",             ("tensor",)),
    "checkpoint":         ("torch", "src/torch/checkpoint",        ("state",)),
    "trainer":            ("torch", "src/torch/trainer",           ("checkpoint",)),
    "dist":               ("torch", "src/torch/dist",              ("trainer",)),
}

# How messages state each tier's order.
ORDER_TEXT = {
    "core": "base < format < schema < run < verify",
    "torch": "tensor < state < checkpoint < trainer < dist",
}

# Private headers are included relative to these roots ("base/publish.h").
TIER_ROOTS = {"core": "src/core", "torch": "src/torch"}

# Public headers: include/holdpoint/<layer>/<name>.h, included as
# "holdpoint/<layer>/<name>.h". An include of one counts as an include of
# that layer (for format: the whole format layer, sub-libraries included).
PUBLIC_ROOT = "include"
PUBLIC_PREFIX = "holdpoint/"

# Generated into the build tree; allowed everywhere.
GENERATED_HEADERS = {"holdpoint_version.h"}

# LibTorch's include roots. Never from the core tier, its public headers or
# the CLI.
LIBTORCH_PREFIXES = ("torch/", "ATen/", "c10/", "caffe2/")

# Programs outside the library: what each may include besides system and
# third-party <...> headers, the generated headers and its own local headers
# (files under its own folder, included by a relative path).
#   folder -> (label, may include private headers, may include torch-tier
#              public headers and LibTorch)
PROGRAMS: dict[str, tuple[str, bool, bool]] = {
    "tools/holdpoint":        ("CLI tools/holdpoint", False, False),
    "tools/holdpoint-doctor": ("tools/holdpoint-doctor", False, True),
    "examples":               ("examples", False, True),
    "docs/examples":          ("docs/examples (docs/api.md)", False, True),
    # The Python package's extension: the library's own binding, built in this
    # tree, so it may use the core's private headers (the .pt writer); never
    # LibTorch: one build serves any torch (docs/python.md).
    "python/native":          ("the Python extension python/native", True, False),
}
# Any other folder under tools/ gets this (public headers of any layer).
OTHER_TOOL = (False, True)

SCANNED_ROOTS = ("src", "include", "tools", "examples", "docs/examples", "python/native")
SCANNED_SUFFIXES = (".h", ".cpp", ".h.in")

# ---------------------------------------------------------------------------

LAYER_OF_UNIT = {unit: unit.split("/")[0] for unit in UNITS}
LAYERS = sorted(set(LAYER_OF_UNIT.values()))
TIER_OF_LAYER = {LAYER_OF_UNIT[u]: tier for u, (tier, _, _) in UNITS.items()}
UNIT_OF_FOLDER = {folder: unit for unit, (_, folder, _) in UNITS.items()}


def _closure() -> dict[str, set[str]]:
    below: dict[str, set[str]] = {}

    def visit(unit: str, seen: tuple[str, ...]) -> set[str]:
        if unit in below:
            return below[unit]
        if unit in seen:
            raise SystemExit(f"check_layers.py: layer table has a cycle through {unit}")
        result: set[str] = set()
        for lower in UNITS[unit][2]:
            result |= {lower} | visit(lower, seen + (unit,))
        below[unit] = result
        return result

    for unit in UNITS:
        visit(unit, ())
    return below


BELOW = _closure()
# Layers (first path component) each unit may include public headers of.
PUBLIC_LAYERS_BELOW = {
    unit: {LAYER_OF_UNIT[u] for u in BELOW[unit]} - {LAYER_OF_UNIT[unit]}
    for unit in UNITS
}


# ---------------------------------------------------------------------------
# Reading includes


def scrub_comments(text: str) -> str:
    """Blanks comments (keeping newlines) so that commented-out includes do not count."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c == "R" and nxt == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i + m.end())
                end = n if end < 0 else end + len(m.group(1)) + 2
                out.append(text[i:end])
                i = end
            else:
                out.append(c)
                i += 1
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            # string or character literal (a ' after a digit is a digit separator)
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)


def read_includes(path: Path) -> list[tuple[int, str, str]]:
    """(line, '<' or '"', target) for every #include in the file."""
    text = path.read_text(encoding="utf-8", errors="replace")
    scrubbed = scrub_comments(text)
    result = []
    for m in INCLUDE_RE.finditer(scrubbed):
        line = scrubbed.count("\n", 0, m.start()) + 1
        result.append((line, m.group(1), m.group(2).strip()))
    return result


# ---------------------------------------------------------------------------
# Where files are


@dataclass(frozen=True)
class Place:
    kind: str        # "unit", "public", "program", "misplaced"
    name: str        # unit name, public layer, program folder
    label: str       # how messages name it


def unit_of_src_path(rel: str) -> str | None:
    """The unit a file under src/ belongs to: it must sit directly in a unit's folder."""
    return UNIT_OF_FOLDER.get(os.path.dirname(rel))


def public_layer_of(rel: str) -> str | None:
    parts = rel.split("/")
    if len(parts) == 4 and parts[0] == PUBLIC_ROOT and parts[1] == "holdpoint" and parts[2] in TIER_OF_LAYER:
        return parts[2]
    return None


def program_of(rel: str) -> tuple[str, str, bool, bool] | None:
    """(folder, label, private allowed, torch allowed) for a file under tools/ or examples/."""
    for folder, (label, private, torch) in PROGRAMS.items():
        if rel.startswith(folder + "/"):
            return folder, label, private, torch
    parts = rel.split("/")
    if parts[0] == "tools" and len(parts) > 2:
        folder = "/".join(parts[:2])
        return folder, folder, *OTHER_TOOL
    return None


def place_of(rel: str) -> Place:
    if rel.startswith("src/"):
        unit = unit_of_src_path(rel)
        if unit is not None:
            return Place("unit", unit, unit)
        return Place("misplaced", "", "(no layer)")
    if rel.startswith(PUBLIC_ROOT + "/"):
        layer = public_layer_of(rel)
        if layer is not None:
            return Place("public", layer, f"public {layer} header")
        return Place("misplaced", "", "(no layer)")
    program = program_of(rel)
    if program is not None:
        return Place("program", program[0], program[1])
    return Place("misplaced", "", "(no layer)")


# ---------------------------------------------------------------------------
# What an include points to


@dataclass(frozen=True)
class Target:
    kind: str        # "private", "public", "generated", "libtorch", "local", "system", "unresolved", "elsewhere"
    name: str        # unit (private), layer (public), "" otherwise
    path: str        # resolved repo-relative path, "" when none
    note: str = ""   # for "unresolved": where it looked

    def label(self) -> str:
        return {
            "private": f"{self.name}, private",
            "public": f"{self.name}, public",
            "generated": "generated",
            "libtorch": "LibTorch",
            "local": "local",
            "system": "system/third-party",
            "unresolved": "no such file",
            "elsewhere": f"{self.path}",
        }[self.kind]


class Tree:
    def __init__(self, root: Path):
        self.root = root
        self.files: set[str] = set()
        for top in SCANNED_ROOTS:
            base = root / top
            if not base.is_dir():
                continue
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in filenames:
                    self.files.add((Path(dirpath) / name).relative_to(root).as_posix())

    def exists(self, rel: str) -> bool:
        return rel in self.files

    def resolve(self, including: str, bracket: str, spec: str) -> Target:
        # LibTorch first: "torch/..." must not be taken for src/torch/.
        if spec.startswith(LIBTORCH_PREFIXES):
            return Target("libtorch", "", "")
        if spec in GENERATED_HEADERS:
            return Target("generated", "", "")
        if bracket == '"':
            local = os.path.normpath(os.path.join(os.path.dirname(including), spec)).replace(os.sep, "/")
            if not local.startswith("../") and self.exists(local):
                return self.classify(local)
        if spec.startswith(PUBLIC_PREFIX):
            path = f"{PUBLIC_ROOT}/{spec}"
            if self.exists(path):
                return self.classify(path)
            return Target("unresolved", "", "", f"no {path}")
        first = spec.split("/", 1)[0]
        if first in TIER_OF_LAYER and "/" in spec:
            path = f"{TIER_ROOTS[TIER_OF_LAYER[first]]}/{spec}"
            if self.exists(path):
                return self.classify(path)
            if bracket == '"':
                return Target("unresolved", "", "", f"no {path}")
        if bracket == "<":
            return Target("system", "", "")
        looked = os.path.normpath(os.path.join(os.path.dirname(including), spec)).replace(os.sep, "/")
        return Target("unresolved", "", "", f"not a public, private or generated header, and no {looked}")

    def classify(self, rel: str) -> Target:
        if rel.startswith("src/"):
            unit = unit_of_src_path(rel)
            if unit is not None:
                return Target("private", unit, rel)
            return Target("elsewhere", "", rel)
        if rel.startswith(PUBLIC_ROOT + "/"):
            layer = public_layer_of(rel)
            if layer is not None:
                return Target("public", layer, rel)
            return Target("elsewhere", "", rel)
        return Target("local", "", rel)


# ---------------------------------------------------------------------------
# The rules


def unit_may_include(unit: str, target: Target) -> str | None:
    """None when a file of `unit` may include `target`, else the reason it may not."""
    tier = UNITS[unit][0]
    if target.kind in ("generated", "system"):
        return None
    if target.kind == "libtorch":
        if tier == "core":
            return "the core tier is LibTorch-free and never includes LibTorch headers"
        return None
    if target.kind == "private":
        other = target.name
        if other == unit or other in BELOW[unit]:
            return None
        return direction_reason(unit, other)
    if target.kind == "public":
        layer = target.name
        if layer == LAYER_OF_UNIT[unit] or layer in PUBLIC_LAYERS_BELOW[unit]:
            return None
        return direction_reason(unit, layer)
    if target.kind in ("elsewhere", "local"):
        return "library sources include only headers of the layers (src/core, src/torch, include/holdpoint)"
    return None


def direction_reason(unit: str, other: str) -> str:
    """Why `unit` may not include `other` (a unit name or, for public headers, a layer)."""
    tier = UNITS[unit][0]
    other_tier = UNITS[other][0] if other in UNITS else TIER_OF_LAYER[other]
    if tier == "core" and other_tier == "torch":
        return f"the core tier is LibTorch-free and never includes the torch tier ({other} is a torch layer)"
    other_units = [other] if other in UNITS else [u for u in UNITS if LAYER_OF_UNIT[u] == other]
    if any(unit in BELOW[u] for u in other_units):
        return f"{other} is above {unit}; a layer includes only its own and lower layers ({ORDER_TEXT[tier]})"
    if LAYER_OF_UNIT[unit] == "format" and LAYER_OF_UNIT.get(other, other) == "format":
        return ("zip, pickle and safetensors sit side by side on format/value and must not include one another;"
                " value includes none of them")
    return f"{unit} and {other} are side by side, not one above the other, and must not include each other ({ORDER_TEXT[tier]})"


def public_may_include(layer: str, target: Target) -> str | None:
    tier = TIER_OF_LAYER[layer]
    if target.kind in ("generated", "system"):
        return None
    if target.kind == "libtorch":
        if tier == "core":
            return "public headers of the core tier are LibTorch-free"
        return None
    if target.kind == "public":
        other = target.name
        layer_units = [u for u in UNITS if LAYER_OF_UNIT[u] == layer]
        if other == layer or any(other in PUBLIC_LAYERS_BELOW[u] for u in layer_units):
            return None
        return direction_reason(layer, other)
    return "a public header includes only public holdpoint/ headers (and system/third-party ones), never a private one"


def program_may_include(folder: str, private_ok: bool, torch_ok: bool, rel: str, target: Target) -> str | None:
    label = "the CLI" if folder == "tools/holdpoint" else folder
    if target.kind in ("generated", "system"):
        return None
    if target.kind == "libtorch":
        if torch_ok:
            return None
        return f"{label} is LibTorch-free"
    if target.kind == "public":
        if not torch_ok and TIER_OF_LAYER[target.name] == "torch":
            return f"{label} is LibTorch-free and includes only public headers of the core tier"
        return None
    if target.kind == "private":
        if private_ok:
            return None
        return f"{label} includes only public holdpoint/ headers, never private ones of src/"
    if target.kind == "local":
        if target.path.startswith(os.path.dirname(rel) + "/"):
            return None
        return f"{label} includes only its own local headers, not {target.path}"
    if target.kind == "elsewhere":
        return f"{label} includes only public holdpoint/ headers, never files under src/ or include/ outside the layers"
    return None


# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def check(root: Path) -> tuple[list[Violation], int, int]:
    tree = Tree(root)
    violations: list[Violation] = []
    n_files = n_includes = 0
    scanned = sorted(
        rel for rel in tree.files
        if any(rel.startswith(top + "/") for top in SCANNED_ROOTS) and rel.endswith(SCANNED_SUFFIXES)
    )
    for rel in scanned:
        n_files += 1
        place = place_of(rel)
        if place.kind == "misplaced":
            if rel.startswith("src/"):
                folders = ", ".join(folder + "/" for _, folder, _ in UNITS.values())
                violations.append(Violation(rel, 1, f"file is not inside a known layer folder; sources live directly in one of {folders}"))
            elif rel.startswith(PUBLIC_ROOT + "/"):
                violations.append(Violation(rel, 1, f"public header is not inside a known layer folder; public headers live in include/holdpoint/<layer>/ with layer one of {', '.join(LAYERS)}"))
            else:
                violations.append(Violation(rel, 1, "file is not inside a known folder"))
        for line, bracket, spec in read_includes(root / rel):
            n_includes += 1
            written = bracket + spec + ('>' if bracket == '<' else '"')
            target = tree.resolve(rel, bracket, spec)
            if target.kind == "unresolved":
                violations.append(Violation(rel, line, f"{place.label} must not include {written} (no such file): it resolves to no known file ({target.note})"))
                continue
            if place.kind == "unit":
                reason = unit_may_include(place.name, target)
            elif place.kind == "public":
                reason = public_may_include(place.name, target)
            elif place.kind == "program":
                _, _, private_ok, torch_ok = program_of(rel)
                reason = program_may_include(place.name, private_ok, torch_ok, rel, target)
            else:
                reason = None  # reported above; its directions are unknown
            if reason is not None:
                violations.append(Violation(rel, line, f"{place.label} must not include {written} ({target.label()}): {reason}"))
    return violations, n_files, n_includes


def main(argv: list[str]) -> int:
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    root = Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parent.parent
    if not (root / "src").is_dir():
        print(f"check_layers.py: {root} has no src/ (give the repository root)", file=sys.stderr)
        return 2
    violations, n_files, n_includes = check(root.resolve())
    for v in violations:
        print(v)
    if violations:
        print(f"{len(violations)} include direction violation(s) in {len({v.path for v in violations})} file(s) "
              f"({n_files} files, {n_includes} includes); see docs/architecture.md")
        return 1
    print(f"{n_files} files, {n_includes} includes, all directions allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
