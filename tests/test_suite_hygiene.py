"""The suite writes temporary folders only (tests/conftest.py): every command's ceiling
cache is a temporary one per session, and a test that changes results/ fails.  And no
test measures this CPU's ceilings: the cache holds the session CPU's, and a test that
measured fails.

Checked on a child pytest whose guarded folder is a temporary stand-in for results/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benches.measured_ceilings import CACHE_DIR_ENV

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 600  # a hang guard only: a child pytest of four trivial tests

CHILD_TESTS = f'''
import os
from pathlib import Path

GUARDED = Path(os.environ["GPUBENCH_TEST_GUARDED_DIR"])


def test_the_cache_is_a_seeded_copy():
    from benches.measured_ceilings import get_ceilings
    from contract.ceilings import Ceilings
    from contract.devices import DEVICES, host_cpu

    cache = Path(os.environ["{CACHE_DIR_ENV}"])
    assert not cache.is_relative_to(GUARDED)
    assert (cache / "ceilings-h100-x.json").read_text() == "measured"
    assert not (cache / "ceilings-cpu-x.json").exists()  # this CPU's: never read
    (cache / "ceilings-h100-x.json").write_text("written by a test")
    (GUARDED.parent / "seen-cache").write_text(str(cache))
    got = get_ceilings(DEVICES["cpu"], host_cpu(), GUARDED / ".ceilings",
                       log=lambda m: (_ for _ in ()).throw(AssertionError(m)))
    assert got.measured["tflops"]["bf16"] == 0.0014  # --cpu-ceilings slow-bf16


def test_measures_this_cpu():
    from benches.measured_ceilings import cache_key
    from contract.devices import host_cpu

    cache = Path(os.environ["{CACHE_DIR_ENV}"])
    (cache / f"ceilings-{{cache_key(host_cpu(), 99)}}.json").write_text("{{}}")


def test_creates_a_file_in_results():
    (GUARDED / ".ceilings" / "ceilings-cpu-y.json").write_text("{{}}")


def test_edits_a_file_in_results_in_place():
    with open(GUARDED / "cpu" / "run" / "results.csv", "a") as f:
        f.write("appended")
'''


def test_tests_get_a_temporary_ceiling_cache_and_fail_on_writes_to_results(tmp_path):
    guarded = tmp_path / "results"
    (guarded / ".ceilings").mkdir(parents=True)
    for name in ("ceilings-cpu-x.json", "ceilings-h100-x.json"):
        (guarded / ".ceilings" / name).write_text("measured")
    (guarded / "cpu" / "run").mkdir(parents=True)
    (guarded / "cpu" / "run" / "results.csv").write_text("kernel\n")
    child = tmp_path / "child"
    child.mkdir()
    (child / "test_child.py").write_text(CHILD_TESTS)
    env = {**os.environ, "GPUBENCH_TEST_GUARDED_DIR": str(guarded)}
    env.pop(CACHE_DIR_ENV, None)  # the child makes its own session cache
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "tests.conftest", "--rootdir", str(child), str(child / "test_child.py"),
         "--cpu-ceilings", "slow-bf16"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    # The test that created a file fails (at teardown), by name, and so does the one that
    # measured this CPU's ceilings.
    assert "4 passed, 2 errors" in out, out[-3000:]
    assert "ERROR at teardown of test_measures_this_cpu" in out
    assert "this CPU's ceilings were measured by test_child.py::test_measures_this_cpu" in out
    assert "ERROR at teardown of test_creates_a_file_in_results" in out
    assert "test_creates_a_file_in_results changed" in out
    assert "files changed in .ceilings" in out
    # An in-place edit leaves the folders as they were: the session's end catches it.
    assert "the test run changed" in out and "created .ceilings/ceilings-cpu-y.json" in out
    assert "modified .ceilings, cpu/run/results.csv" in out
    assert "tests must write temporary folders only" in out
    # The cache the test wrote to was a copy, never written back, gone after the run.
    assert (guarded / ".ceilings" / "ceilings-h100-x.json").read_text() == "measured"
    assert not Path((tmp_path / "seen-cache").read_text()).exists()
