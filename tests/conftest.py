"""Test setup: which Triton the tests get, and which tests run where.

Triton decides at import whether its kernels are compiled for the GPU or run in the CPU
interpreter (TRITON_INTERPRET read when @triton.jit decorates them), so the choice is made
here, at the top of the conftest, before any test module imports a kernel:

- no CUDA device: the interpreter (TRITON_INTERPRET=1); tests marked `gpu` are skipped;
- a CUDA device: compiled kernels, and the `gpu` tests run on it.  Tests marked
  `interpreter` launch Triton kernels on CPU tensors, which compiled kernels refuse
  ("Pointer argument cannot be accessed from Triton (cpu tensor?)"): they are skipped in
  this process and run together in a child process with the interpreter on and CUDA
  hidden (tests/test_gpu_machine.py), so a GPU machine runs the whole suite.
"""

import os
import sys
from pathlib import Path

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# What the kernels will be decorated with (nothing has imported them yet).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU" if not HAS_CUDA else
                              "needs compiled Triton kernels (TRITON_INTERPRET=1 is set)")
    no_interp = pytest.mark.skip(reason="needs the Triton CPU interpreter: run in a child "
                                        "process by test_gpu_machine.py")
    for item in items:
        if "gpu" in item.keywords and (not HAS_CUDA or INTERPRETED):
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not INTERPRETED:
            item.add_marker(no_interp)
