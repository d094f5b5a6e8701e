#!/usr/bin/env python3
"""Checks that docs/api.md shows the compiled examples exactly.

docs/api.md introduces each example with a marker line

    <!-- example: docs/examples/<name>.cpp -->

followed by a ```cpp block. The test suite compiles and runs every
docs/examples/*.cpp (tests/CMakeLists.txt), so the page stays true only if each
marked block equals its file byte for byte (a final newline aside), every
example file is shown, and no C++ block on the page escapes compilation by
having no marker.

    check_api_examples.py [REPO_ROOT]   (default: the folder above scripts/)

Exit 0 when everything matches; 1 naming each mismatch.
"""
import re
import sys
from pathlib import Path

API_PAGE = Path("docs/api.md")
EXAMPLES = Path("docs/examples")
MARKER = re.compile(r"^<!-- example: (\S+) -->$")


def marked_blocks(lines):
    """Yields (marker line number, named path, block text or None, problem or None)."""
    i = 0
    while i < len(lines):
        match = MARKER.match(lines[i])
        if not match:
            i += 1
            continue
        start = i + 1
        fence = start
        while fence < len(lines) and lines[fence].strip() == "":
            fence += 1
        if fence >= len(lines) or lines[fence] != "```cpp":
            yield start, match.group(1), None, "the marker is not followed by a ```cpp block"
            i = start
            continue
        end = fence + 1
        while end < len(lines) and lines[end] != "```":
            end += 1
        if end >= len(lines):
            yield start, match.group(1), None, "the ```cpp block is never closed"
            return
        yield start, match.group(1), "\n".join(lines[fence + 1:end]), None
        i = end + 1


def unmarked_cpp_blocks(lines):
    """Line numbers of ```cpp fences that no marker introduces."""
    found = []
    previous_text = ""
    inside = False
    for number, line in enumerate(lines, start=1):
        if inside:
            if line == "```":
                inside = False
                previous_text = line
            continue
        if line.startswith("```"):
            inside = True
            if line == "```cpp" and not MARKER.match(previous_text):
                found.append(number)
            continue
        if line.strip():
            previous_text = line
    return found


def check(root):
    page = root / API_PAGE
    try:
        lines = page.read_bytes().decode("utf-8").split("\n")
    except OSError as error:
        return [f"{API_PAGE}: cannot read: {error.strerror}"]
    problems = []
    shown = {}
    for line_number, named, block, problem in marked_blocks(lines):
        where = f"{API_PAGE}:{line_number}"
        if problem:
            problems.append(f"{where}: {named}: {problem}")
            continue
        if named in shown:
            problems.append(f"{where}: {named} is shown twice (first at line {shown[named]})")
            continue
        shown[named] = line_number
        path = root / named
        if Path(named).parent != EXAMPLES or path.suffix != ".cpp":
            problems.append(f"{where}: {named} is not a {EXAMPLES}/*.cpp file")
            continue
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as error:
            problems.append(f"{where}: {named}: cannot read: {error.strerror}")
            continue
        text = text[:-1] if text.endswith("\n") else text
        if block != text:
            page_lines, file_lines = block.split("\n"), text.split("\n")
            first = next((n for n, (a, b) in enumerate(zip(page_lines, file_lines)) if a != b),
                         min(len(page_lines), len(file_lines)))
            problems.append(f"{where}: the block differs from {named} at its line {first + 1} "
                            f"({len(page_lines)} lines on the page, {len(file_lines)} in the file)")
    for line_number in unmarked_cpp_blocks(lines):
        problems.append(f"{API_PAGE}:{line_number}: a ```cpp block without an example marker "
                        "(C++ on this page must be a compiled docs/examples file)")
    for path in sorted((root / EXAMPLES).glob("*.cpp")):
        named = path.relative_to(root).as_posix()
        if named not in shown:
            problems.append(f"{named}: not shown in {API_PAGE} (no '<!-- example: {named} -->' marker)")
    if not shown and not problems:
        problems.append(f"{API_PAGE}: no example markers")
    return problems


def main(argv):
    if len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[1]) if len(argv) == 2 else Path(__file__).resolve().parent.parent
    problems = check(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{API_PAGE}: every example block equals its file")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
