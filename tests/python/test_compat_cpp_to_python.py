"""holdpoint's torch-1.13-compatible files, loaded by torch 1.13 itself.

Run by ctest with Debian's python3-torch (HOLDPOINT_COMPAT_PYTHON) where it is
installed: test_cpp_to_python.py's checks of the compatibility mode, against the
torch 1.13 weights_only loader that the mode exists for.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_cpp_to_python  # noqa: E402

if __name__ == "__main__":
    sys.exit(test_cpp_to_python.main(modes=["compat"]))
