"""pytest-benchmark: the wall time of the main job, `python run_bench.py` with no flags,
on this machine (on a CPU: the default CPU sweep, target under 3 minutes on 2 cores).

    pytest benches/test_bench_default_run.py --benchmark-columns=min,max

Four figures: with the ceilings measured (a first run on a machine) or taken from the
cache, each on a quiet machine and beside a CPU-heavy job (one busy process per core,
as CI machines have other jobs).  A benchmark, not a timed test: the figures are
reported (and the run's exit code checked), never asserted against a time.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _spin(stop: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1_103_515_245 + 12_345) % 2**31


class CpuLoad:
    """One busy process per core while the block runs: another CPU-heavy job."""

    def __enter__(self) -> CpuLoad:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_spin, args=(self.stop,), daemon=True)
                      for _ in range(os.cpu_count() or 1)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def _main_job(out: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "run_bench.py", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    return wall


@pytest.mark.parametrize("load", ["quiet", "beside a CPU-heavy job"])
@pytest.mark.parametrize("ceilings", ["measured", "cached"])
def test_default_run_wall_time(benchmark, tmp_path, ceilings, load):
    out = tmp_path / "results"
    if ceilings == "cached":
        _main_job(out)  # the first run fills the ceiling cache of `out`

    walls: list[float] = []

    def run() -> None:
        target = out if ceilings == "cached" else tmp_path / f"fresh-{len(walls)}"
        if load == "quiet":
            walls.append(_main_job(target))
        else:
            with CpuLoad():
                walls.append(_main_job(target))

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update(wall_s=walls[-1], ceilings=ceilings, load=load,
                                cores=os.cpu_count(), target_s=180.0)
    shutil.rmtree(tmp_path, ignore_errors=True)
