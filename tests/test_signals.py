"""Signals after an in-process Triton compile, and a run signalled twice.

A Triton compile runs LLVM, which installs C-level SIGINT/SIGTERM handlers of its own over
Python's.  GNU `timeout` signals the process, then its whole group: on the H200 a sweep cut
that way died within a second, with no "interrupted" line and no results.json rows.
These tests compile for sm_90 in-process (no GPU needed) and read the C-level handler
(sigaction), then signal whole runs twice in a row."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from contract.schema import ROWS_JOURNAL

ROOT = Path(__file__).resolve().parent.parent

# Both children compile one small kernel for sm_90 in-process (no GPU needed), as the
# first Triton row on a GPU does; `triton` is imported before it.
COMPILE_FOR_SM90 = textwrap.dedent("""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def twice(X, Y, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + o, tl.load(X + o, mask=o < n) * 2, mask=o < n)

    def compile_for_sm90():
        src = ASTSource(twice, {"X": "*fp32", "Y": "*fp32", "n": "i32"}, {"BLOCK": 1024})
        triton.compile(src, target=GPUTarget("cuda", 90, 32))
""")


# A child: the C-level handlers of SIGINT and SIGTERM before and after one compile of
# the suite's add kernel for sm_90, inside the run's own signal handling.
PROBE = textwrap.dedent("""
    import ctypes, json, signal, sys, warnings
    warnings.filterwarnings("ignore")
    libc = ctypes.CDLL(None, use_errno=True)

    def c_handlers():
        out = {}
        for s in (signal.SIGINT, signal.SIGTERM):
            buf = ctypes.create_string_buffer(512)  # struct sigaction; sa_handler first
            assert libc.sigaction(s, None, buf) == 0
            out[int(s)] = ctypes.c_void_p.from_buffer(buf).value
        return out

    import triton
    from triton import knobs
    from benches.inspect import compile as inspect
""") + COMPILE_FOR_SM90 + textwrap.dedent("""
    from benches.sweep.interrupt import restore_handlers_after_compiles, signals_raise

    mode = sys.argv[1]
    with signals_raise():
        before = c_handlers()
        if mode == "inspect":  # the inspect path's own compile of the add kernel
            case = inspect.collect(["add"], ["fp32"], "sm_90")[0][0]
            inspect.compile_case(case.kernel, case.where, "sm_90", "fast")
        else:  # a JIT compile: Triton calls its post-compile hook once it is done
            seen = []
            knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw)
            if mode == "jit":
                restore_handlers_after_compiles()
            compile_for_sm90()
            hook = knobs.runtime.jit_post_compile_hook
            hook(key=None, repr="", fn=None, compile=None, is_manual_warmup=False,
                 already_compiled=False)
            assert len(seen) == 1  # a hook set before is kept, and called
        after = c_handlers()
    print(json.dumps({"before": before, "after": after}))
""")


def _probe(mode: str, tmp_path: Path) -> dict[str, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / f"triton-{mode}")  # a real compile, not a hit
    script = tmp_path / "probe.py"  # a file: @triton.jit reads its function's source
    script.write_text(PROBE)
    p = subprocess.run([sys.executable, str(script), mode], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_python_handlers_are_back_after_an_in_process_compile(tmp_path):
    raw = _probe("raw", tmp_path)
    if raw["before"] == raw["after"]:
        pytest.skip("this Triton's compile leaves the signal handlers alone")
    # The control above: a compile put LLVM's handlers in place of Python's.  Through the
    # JIT's post-compile hook and through inspect's own compile, Python's are back.
    for mode in ("jit", "inspect"):
        got = _probe(mode, tmp_path)
        assert got["after"] == got["before"], mode


# A child: a CPU sweep in which the first case compiles a kernel for sm_90 in-process,
# as the first Triton row on a GPU does, then hands Triton's post-compile hook the turn.
SWEEP = textwrap.dedent("""
    import sys, warnings
    warnings.filterwarnings("ignore")
    import triton
    from triton import knobs
    import run_bench
    from benches.sweep import runner
    from benches.sweep.interrupt import exit_now
""") + COMPILE_FOR_SM90 + textwrap.dedent("""

    real = runner.run_case
    state = {"compiled": False}

    def compiling(case, cfg, cache, *rest):
        if not state["compiled"]:
            state["compiled"] = True
            compile_for_sm90()
            hook = knobs.runtime.jit_post_compile_hook
            if hook is not None:
                hook(key=None, repr="", fn=None, compile=None, is_manual_warmup=False,
                     already_compiled=False)
        return real(case, cfg, cache, *rest)

    runner.run_case = compiling
    exit_now(run_bench.main(sys.argv[1:]))
""")


def _signalled_run(tmp_path: Path, i: int, first: int, gap_s: float, wait_s: float,
                   after_a_row: bool) -> tuple[int, str, Path]:
    """One sweep of its own (a process group of its own, as under `timeout`), signalled
    `wait_s` after its sweep started (after its first row, with `after_a_row`): `first`
    to the process, then SIGINT to its group `gap_s` later."""
    run_dir = tmp_path / "out" / "cpu" / f"r{i}"
    log = tmp_path / f"r{i}.log"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / f"triton-{i}")  # a real compile each time
    script = tmp_path / "sweep.py"
    with open(log, "w") as out:
        p = subprocess.Popen(
            [sys.executable, str(script), "--device", "cpu", "--sizes",
             ";".join(f"n={2048 + k}" for k in range(2000)), "--kernels", "add",
             "--dtypes", "fp32", "--providers", "torch", "--no-plots", "--out",
             str(tmp_path / "out"), "--run-id", f"r{i}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    try:
        deadline = time.monotonic() + 600  # a hang guard, not a speed expectation
        journal = run_dir / ROWS_JOURNAL

        def started() -> bool:
            if after_a_row:
                return journal.exists() and journal.stat().st_size > 0
            return " cases on " in log.read_text()

        while not started() and p.poll() is None:
            assert time.monotonic() < deadline, "the sweep did not start within 600 s"
            time.sleep(0.05)
        time.sleep(wait_s)
        os.kill(p.pid, first)
        time.sleep(gap_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, log.read_text(), run_dir


@pytest.mark.slow
def test_a_run_signalled_twice_keeps_its_rows_and_says_so(tmp_path):
    """20 runs, each compiling for sm_90 in its first row, signalled at a moment of its
    sweep (the compile included) with SIGINT or SIGTERM and then SIGINT to its group,
    0 to 300 ms apart: each keeps its rows in results.json, says it was interrupted, and
    exits 130 or 143 by the first signal (either, where both were sent together)."""
    (tmp_path / "sweep.py").write_text(SWEEP)  # a file: @triton.jit reads its source
    rng = random.Random(0)
    # Every other run is signalled once it holds a row, the others at any moment from
    # the start of the sweep (its compile included).
    plans = [(i, (signal.SIGINT, signal.SIGTERM)[i % 2], (0.0, 0.001, 0.01, 0.1, 0.3)[i % 5],
              rng.uniform(0.0, 2.0), i % 4 < 2) for i in range(20)]

    def one(plan: tuple[int, int, float, float, bool]) -> tuple:
        i, first, gap, wait, after_a_row = plan
        code, log, run_dir = _signalled_run(tmp_path, i, first, gap, wait, after_a_row)
        # Signals sent together (under 10 ms apart) may be taken in either order: the
        # kernel and LLVM's handler, inside a compile, deliver SIGINT before SIGTERM.
        expected = {130 if first == signal.SIGINT else 143} if gap >= 0.01 else {130, 143}
        doc_path = run_dir / "results.json"
        doc = json.loads(doc_path.read_text()) if doc_path.exists() else None
        ok = (code in expected and "interrupted" in log and "Traceback" not in log
              and doc is not None and doc["metadata"]["interrupted"] is True
              and doc["metadata"].get("ceilings") is not None
              and not (run_dir / ROWS_JOURNAL).exists()
              and (not after_a_row or len(doc["rows"]) >= 1))
        return (i, signal.Signals(first).name, gap, round(wait, 2), code, ok,
                len(doc["rows"]) if doc else None, log[-400:])

    # Four at a time: each mostly starts Python and waits for its moment.
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(one, plans))
    bad = [o for o in outcomes if not o[5]]
    # each failure whole, its log's tail included (a list's repr is cut short in CI)
    assert not bad, "\n".join(f"{o[:7]}\n{o[7]}" for o in bad)
