"""Files that torch 1.13 itself writes, read by holdpoint.

Run by ctest with Debian's python3-torch (HOLDPOINT_COMPAT_PYTHON) where it is
installed: test_python_to_cpp.py's fixtures (zip and legacy streams, pickle
protocols 2 and 4, optimizer states in torch 1.13's layout), written by torch
1.13's own torch.save and compared with what holdpoint reads.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_python_to_cpp  # noqa: E402

if __name__ == "__main__":
    sys.exit(test_python_to_cpp.main())
