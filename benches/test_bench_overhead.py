"""pytest-benchmark: the sweep's overhead on this machine, from its own time split
(benches/sweep/time_split.py): the wall time of the main job, `python run_bench.py` (on a CPU the
default CPU sweep), against the seconds it spends timing, phase by phase, on a quiet
machine and beside a busy process per core; and `run_bench.py --estimate`, made just
before each run from a run just before it (in the same conditions), against the run it
predicts.

    pytest benches/test_bench_overhead.py --benchmark-columns=min,max -s

Each figure goes into the benchmark's extra_info (--benchmark-json keeps them): the
wall time, every phase, timing's share of the wall, the estimate and its ratio to the
wall.  A benchmark, not a timed test: the run's exit code is checked, no figure is
asserted against a time.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benches.test_bench_default_run import CpuLoad

ROOT = Path(__file__).resolve().parents[1]
# The estimate's line for the method a run uses now, its Triton cache as it will be.
_ESTIMATE = re.compile(r"now, Triton cache (?:warm|cold): timing [\d.]+ s of ([\d.]+) s")


def _command(out: Path, run_id: str, *extra: str) -> list[str]:
    return [sys.executable, "run_bench.py", "--out", str(out), "--run-id", run_id, *extra]


def _estimate_s(out: Path) -> float | None:
    proc = subprocess.run([sys.executable, "run_bench.py", "--out", str(out), "--estimate"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = _ESTIMATE.findall(proc.stdout)
    return float(found[-1]) if proc.returncode == 0 and found else None


def _run(out: Path, run_id: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run(_command(out, run_id), cwd=ROOT, capture_output=True, text=True,
                          timeout=3600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = sorted(out.glob(f"*/{run_id}/results.json"))
    meta = json.loads(found[0].read_text())["metadata"]
    return wall, meta


@pytest.mark.parametrize("load", ["quiet", "beside a CPU-heavy job"])
def test_the_main_jobs_time_split(benchmark, tmp_path, load):
    out = tmp_path / "results"
    got: dict = {}

    def runs() -> None:
        # ceilings measured and cached, and a run for the estimate to scale to, in the
        # same conditions as the run it predicts
        _run(out, "first")
        got["estimate_s"] = _estimate_s(out)
        got["wall"], got["meta"] = _run(out, "timed")

    def run() -> None:
        if load == "quiet":
            runs()
        else:
            with CpuLoad():
                runs()

    benchmark.pedantic(run, rounds=1, iterations=1, warmup_rounds=0)
    split, wall = got["meta"]["time_split_s"], got["wall"]
    estimate = got["estimate_s"]
    benchmark.extra_info.update(
        load=load, wall_s=round(wall, 2), split_wall_s=got["meta"]["wall_s"],
        split_sum_s=round(sum(split.values()), 2), timing_share=round(split["timing"] / wall, 3),
        estimate_s=estimate, estimate_ratio=round(estimate / wall, 3) if estimate else None,
        **{f"{k}_s": v for k, v in split.items()})
    print(f"\n{load}: wall {wall:.1f} s; " + ", ".join(f"{k} {v:.1f}" for k, v in split.items())
          + (f"; estimate {estimate:.1f} s ({estimate / wall:.2f}x)" if estimate else ""))
