"""The suite on a machine with a GPU: `python -m pytest -q` must pass there too.

With CUDA present, conftest leaves the Triton interpreter off so that the `gpu` tests run
compiled kernels on the GPU; the tests marked `interpreter` (Triton kernels on CPU
tensors) are skipped in that process and run here, in a child process with the
interpreter on and CUDA hidden.  On a CPU machine they run in-process and the child run
is skipped.  The CPU can still show the mechanism: a child process with the interpreter
off is what a GPU machine's test process is, Triton-wise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import INTERPRETED

ROOT = Path(__file__).resolve().parent.parent


def _env(**kw: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    env.update(kw)
    return env


def run_interpreter_tests(*select: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    """The `interpreter` tests in a child pytest with the interpreter on and no CUDA
    device visible (torch then reports none, so conftest picks the interpreter)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "interpreter",
         *select, str(ROOT / "tests")],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env=_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""))


@pytest.mark.skipif(INTERPRETED, reason="the interpreter tests run in this process")
def test_interpreter_tests_pass_in_a_child_process():
    p = run_interpreter_tests()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert " passed" in p.stdout


def test_the_child_process_runs_interpreter_tests():
    p = run_interpreter_tests("-k", "interpreter_is_on or unwritten_output", timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "2 passed" in p.stdout


def test_interpreter_tests_skip_where_kernels_are_compiled():
    """A test process whose kernels are compiled (a GPU machine's): the interpreter tests
    skip instead of launching compiled kernels on CPU tensors and failing."""
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         "tests/test_kernels.py", "-k", "interpreter_is_on or unwritten_output or "
         "test_triton_provider_matches_float64 and add-fp32"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=_env(TRITON_INTERPRET="0"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "passed" not in p.stdout.splitlines()[-1] and "skipped" in p.stdout
    assert "needs the Triton CPU interpreter" in p.stdout


_CHECK_ONLY = ["--device", "cpu", "--check-only", "--sizes", "n=1000", "--kernels", "add",
               "--dtypes", "fp32", "--no-plots", "--run-id", "c"]


@pytest.mark.parametrize("imported_first", [False, True])
def test_check_only_interpreter_switch(tmp_path, imported_first):
    """run_bench switches the interpreter on for --check-only only before the kernels are
    imported (later it would change nothing), and never leaves TRITON_INTERPRET set."""
    code = (
        "import os, sys, json\n"
        + ("from kernels import REGISTRY\n" if imported_first else "")
        + "import run_bench\n"
        f"code = run_bench.main({_CHECK_ONLY + ['--out', str(tmp_path)]!r})\n"
        "rows = json.load(open(sys.argv[1]))['rows']\n"
        "tri = [r for r in rows if r['provider'] == 'triton']\n"
        "print(code, os.environ.get('TRITON_INTERPRET'), tri[0]['status'], "
        "tri[0]['reason'])\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cpu" / "c" / "results.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=_env(CUDA_VISIBLE_DEVICES=""))
    assert p.returncode == 0, p.stderr[-2000:]
    exit_code, env_after, status, reason = p.stdout.strip().splitlines()[-1].split(" ", 3)
    assert exit_code == "0" and env_after == "None"
    if imported_first:
        # Compiled kernels on a CPU: skipped with a reason, not a failed launch.
        assert status == "skipped" and "TRITON_INTERPRET" in reason
    else:
        assert status == "ok"
