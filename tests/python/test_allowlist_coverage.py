"""Every global torch's safe loader allows is either read by holdpoint or listed in
docs/format.md §5.3.1 with the reason it is refused (issue 38, item 2).

The list comes from the installed torch (torch._weights_only_unpickler's
_get_allowed_globals), so a torch that adds a global makes this test fail until the
docs say what holdpoint does with it. Each name is probed on its own: a .pt archive
whose data.pkl is `GLOBAL module name` then STOP. holdpoint refuses a name it does not
know with pickle_global_forbidden; any other outcome (a value, or a code of its own
such as pickle_type_invalid for a bare type tag or storage_type_unsupported) means the
reader knows the name. Checked both ways:
- a name refused as unknown must be listed in §5.3.1;
- a name listed there must still be refused as unknown (a reader that learns a name
  must take it out of the table), and must be one torch allows (no stale rows).
"""

import os
import re
import sys
import tempfile

import torch
from torch._weights_only_unpickler import _get_allowed_globals

import harness

sys.path.insert(0, os.path.join(harness.BUILD_DIR, "python"))
import holdpoint  # noqa: E402

SECTION = "### 5.3.1"


def documented_refusals():
    """The dotted names in the first column of docs/format.md §5.3.1's table."""
    with open(os.path.join(harness.SOURCE_DIR, "docs", "format.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))
    names = set()
    for line in text[start:end].splitlines():
        if not line.startswith("| `"):
            continue
        first_column = line.split(" | ")[0]
        names.update(re.findall(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)`", first_column))
    return names


def probe(path, dotted):
    """holdpoint's error code for a pickle that names `dotted` and stops (None: read)."""
    module, _, name = dotted.rpartition(".")
    harness.pickle_archive(path, b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n.")
    try:
        holdpoint.load(path)
    except holdpoint.Error as error:
        return error.code
    return None


def main():
    report = harness.Report("allowlist_coverage")
    allowed = sorted(_get_allowed_globals())
    listed = documented_refusals()
    report.check(len(allowed) > 50, f"torch {torch.__version__} allows {len(allowed)} globals; expected more than 50")
    report.check(len(listed) > 10, f"docs/format.md §5.3.1 lists {len(listed)} names; the table was not found whole")
    unknown = []
    with tempfile.TemporaryDirectory(prefix="holdpoint-allowlist-") as tmp:
        path = os.path.join(tmp, "probe.pt")
        # The probe itself must tell the two apart.
        report.check(probe(path, "builtins.eval") == "pickle_global_forbidden",
                     "a global nobody allows is refused as pickle_global_forbidden")
        report.check(probe(path, "collections.OrderedDict") != "pickle_global_forbidden",
                     "a global holdpoint reads is not refused as unknown")
        for name in allowed:
            if probe(path, name) == "pickle_global_forbidden":
                unknown.append(name)
                report.check(name in listed, f"torch allows {name}; holdpoint refuses it, and docs/format.md "
                                             f"§5.3.1 does not say why")
            else:
                report.check(name not in listed, f"docs/format.md §5.3.1 lists {name} as refused, but holdpoint "
                                                 f"reads it: take it out of the table")
    for name in sorted(listed - set(allowed)):
        report.check(False, f"docs/format.md §5.3.1 lists {name}, which torch {torch.__version__} does not allow")
    print(f"torch {torch.__version__}: {len(allowed)} globals allowed; holdpoint reads {len(allowed) - len(unknown)}, "
          f"refuses {len(unknown)} (each listed with its reason)", flush=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
