"""The suite writes temporary folders only (tests/conftest.py): every command's ceiling
cache is a temporary one per session, and a test that changes results/ fails.

Checked on a child pytest whose guarded folder is a temporary stand-in for results/."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from roofline.ceilings import CACHE_DIR_ENV

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD_S = 600  # a hang guard only: a child pytest of three trivial tests

CHILD_TESTS = f'''
import os
from pathlib import Path

GUARDED = Path(os.environ["GPUBENCH_TEST_GUARDED_DIR"])


def test_the_cache_is_a_seeded_copy():
    cache = Path(os.environ["{CACHE_DIR_ENV}"])
    assert not cache.is_relative_to(GUARDED)
    assert (cache / "ceilings-cpu-x.json").read_text() == "measured"
    (cache / "ceilings-cpu-x.json").write_text("written by a test")
    (GUARDED.parent / "seen-cache").write_text(str(cache))


def test_creates_a_file_in_results():
    (GUARDED / ".ceilings" / "ceilings-cpu-y.json").write_text("{{}}")


def test_edits_a_file_in_results_in_place():
    with open(GUARDED / "cpu" / "run" / "results.csv", "a") as f:
        f.write("appended")
'''


def test_tests_get_a_temporary_ceiling_cache_and_fail_on_writes_to_results(tmp_path):
    guarded = tmp_path / "results"
    (guarded / ".ceilings").mkdir(parents=True)
    (guarded / ".ceilings" / "ceilings-cpu-x.json").write_text("measured")
    (guarded / "cpu" / "run").mkdir(parents=True)
    (guarded / "cpu" / "run" / "results.csv").write_text("kernel\n")
    child = tmp_path / "child"
    child.mkdir()
    (child / "test_child.py").write_text(CHILD_TESTS)
    env = {**os.environ, "GPUBENCH_TEST_GUARDED_DIR": str(guarded)}
    env.pop(CACHE_DIR_ENV, None)  # the child makes its own session cache
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "tests.conftest", "--rootdir", str(child), str(child / "test_child.py")],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    # The test that created a file fails (at teardown), by name.
    assert "3 passed, 1 error" in out, out[-3000:]
    assert "ERROR at teardown of test_creates_a_file_in_results" in out
    assert "test_creates_a_file_in_results changed" in out
    assert "files changed in .ceilings" in out
    # An in-place edit leaves the folders as they were: the session's end catches it.
    assert "the test run changed" in out and "created .ceilings/ceilings-cpu-y.json" in out
    assert "modified .ceilings, cpu/run/results.csv" in out
    assert "tests must write temporary folders only" in out
    # The cache the test wrote to was a copy, never written back, gone after the run.
    assert (guarded / ".ceilings" / "ceilings-cpu-x.json").read_text() == "measured"
    assert not Path((tmp_path / "seen-cache").read_text()).exists()
