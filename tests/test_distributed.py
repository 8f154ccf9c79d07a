"""Fleet runs on torch.distributed, with real processes: two ranks launched through
torchrun (torch.distributed.run) with gloo on this CPU.  The slow-rank, early-exit and
other-case-list paths use the test-only hooks documented in benches/fleet.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benches.collectives import busbw

ROOT = Path(__file__).resolve().parent.parent
# Two ranks share two busy cores: their rows and ceilings can differ by up to 2x by
# contention alone, so the tests hold the fleet to 50% (the slow-rank hook is 10x).
SWEEP = ["--device", "cpu", "--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
         "--sizes", "n=4096;n=65536", "--no-plots", "--fleet-tolerance", "50"]


def torchrun(out: Path, *extra: str, env: dict[str, str] | None = None,
             timeout: float = 400) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
         "run_bench.py", *SWEEP, "--out", str(out), *extra],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=e)


def ours_traceback(stderr: str) -> bool:
    """A traceback through the suite's own files.  torchrun itself prints one
    (ChildFailedError) whenever a worker exits non-zero: that one is the launcher's."""
    return f'File "{ROOT}' in stderr or 'File "run_bench.py"' in stderr


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """A results root whose per-rank ceiling caches start from the repo's CPU cache when
    there is one (measuring them takes ~25 s per rank)."""
    root = tmp_path_factory.mktemp("fleet")
    cached = sorted((ROOT / "results" / ".ceilings").glob("ceilings-cpu-*.json"))
    if cached:
        import socket

        for r in (0, 1):
            d = root / ".ceilings" / f"{socket.gethostname()}-rank{r}"
            d.mkdir(parents=True)
            shutil.copy(cached[-1], d)
    return root


@pytest.fixture(scope="module")
def fleet(out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    return torchrun(out, "--run-id", "f1"), out / "fleet" / "f1"


def test_a_two_rank_fleet_gathers_every_row(fleet):
    p, folder = fleet
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = json.loads((folder / "results.json").read_text())["rows"]
    kernels = [r for r in rows if r["kernel"] == "add"]
    assert sorted({r["rank"] for r in kernels}) == [0, 1]
    assert len(kernels) == 4 and all(r["host"] for r in kernels)
    assert (folder / "fleet.md").exists() and (folder / "fleet.png").exists()
    assert (folder / "summary.md").exists()
    for r in (0, 1):  # each rank's own run folder is kept too
        assert (folder / "ranks" / f"rank-{r}" / "cpu" / "f1" / "results.json").exists()


def test_collectives_are_correct_and_in_nccl_tests_terms(fleet):
    _, folder = fleet
    rows = json.loads((folder / "results.json").read_text())["rows"]
    coll = [r for r in rows if r["kernel"] in ("all_reduce", "all_gather", "reduce_scatter",
                                               "all_to_all", "broadcast")]
    assert {r["kernel"] for r in coll} == {"all_reduce", "all_gather", "reduce_scatter",
                                           "all_to_all", "broadcast"}
    assert all(r["status"] == "ok" and r["correct"] for r in coll)
    for r in coll:
        assert r["provider"] == "gloo" and r["shape"].endswith(",ranks=2")
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["ms_median"] / 1e3) / 1e9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r["kernel"], 0.5)  # n = 2
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
    md = (folder / "fleet.md").read_text()
    assert "## Collectives (slowest rank)" in md


@pytest.mark.parametrize("n, op, factor", [(2, "all_reduce", 1.0), (4, "all_reduce", 1.5),
                                           (8, "all_reduce", 1.75), (8, "all_gather", 0.875),
                                           (4, "reduce_scatter", 0.75), (8, "broadcast", 1)])
def test_busbw_factors(n, op, factor):
    assert busbw(op, 100.0, n) == pytest.approx(100.0 * factor)


def test_a_slow_rank_is_an_outlier(out, fleet):
    p = torchrun(out, "--run-id", "f2", "--no-collectives",
                 env={"GPUBENCH_TEST_SLOW_RANK": "1"})
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert "OUTLIER rank 1" in p.stdout
    md = (out / "fleet" / "f2" / "fleet.md").read_text()
    assert "- rank 1 " in md and "- rank 0 " not in md


def test_different_case_lists_are_refused_before_measuring(out):
    p = torchrun(out, "--run-id", "f3", env={"GPUBENCH_TEST_CASES_RANK": "1"})
    assert p.returncode != 0
    assert "ranks disagree on the versions and cases: rank(s) [1]" in p.stderr
    assert "kernels" in p.stderr and not ours_traceback(p.stderr)
    assert not (out / "fleet" / "f3").exists()


def test_a_rank_that_leaves_stops_the_other_within_the_timeout(out, fleet):
    t = time.monotonic()
    p = torchrun(out, "--run-id", "f4", "--dist-timeout", "20",
                 env={"GPUBENCH_TEST_EXIT_RANK": "1"})
    took = time.monotonic() - t
    assert p.returncode != 0
    assert "rank 0" in p.stderr and "a peer died or did not answer" in p.stderr
    assert not ours_traceback(p.stderr)
    assert took < 200
    # Rank 0 keeps what it measured.
    assert (out / "fleet" / "f4" / "ranks" / "rank-0" / "cpu" / "f4" / "results.json").exists()
