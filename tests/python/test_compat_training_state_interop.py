"""test_training_state_interop.py with Debian's torch 1.13 (HOLDPOINT_COMPAT_PYTHON),
on a TrainingState saved with --torch-1-13-compatible: torch 1.13 opens the whole
training state, and its model, Adam and StepLR load and continue from it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import test_training_state_interop  # noqa: E402

if __name__ == "__main__":
    sys.exit(test_training_state_interop.main(compatible=True))
