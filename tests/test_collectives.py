"""The collectives' timing and report without torchrun: the slowest rank's time is a
row's (two gloo processes whose clocks are stood in for), and a world of one rank runs
every op with its algbw measured and no busbw ("n/a" in the fleet report)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch.distributed as dist

from benches.fleet import collectives
from contract.record import RunRow, flat
from contract.schema import ALL_COLUMNS, row_problems
from roofline.report.fleet import DeviceFigures, plot_fleet, render_fleet_md

ROOT = Path(__file__).resolve().parent.parent

# A rank of a two-process gloo group measuring one all_reduce with its clock stood in
# for: the batch sizing's warm-up reads 100 ms (a batch of one call), then the samples
# read the rank's pattern.  The collectives themselves run for real.
RANK_SCRIPT = r"""
import json, sys
import torch.distributed as dist
from benches.fleet import collectives

rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
patterns = json.loads(sys.argv[4])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
readings = iter([100.0] + patterns[rank])

def clock(fn, on_gpu):
    fn()
    return next(readings)

collectives.time_call_ms = clock
row = collectives.measure("all_reduce", "fp32", 4096, "cpu", iters=len(patterns[rank]))
with open(out, "w") as f:
    json.dump({"ms_median": row.timing.ms_median, "samples_ms": list(row.timing.samples_ms),
               "config": row.build.config, "status": row.status}, f)
dist.destroy_process_group()
"""


def test_a_collective_takes_its_slowest_ranks_time_sample_by_sample(tmp_path: Path) -> None:
    """Per-sample times where the slowest rank (max), the fastest (min), the ranks' mean
    (nccl-tests' average) and the larger of the ranks' own medians all differ: only the
    sample-by-sample maximum gives a median of 55 ms."""
    patterns = [[20.0, 60.0] * 5, [50.0, 30.0] * 5]
    # max per sample: [50, 60] (median 55); min: [20, 30] (25); mean: [35, 45] (40);
    # each rank's own median: 40 and 40.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r),
                               str(tmp_path / "store"), str(tmp_path / f"rank{r}.json"),
                               json.dumps(patterns)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=180)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0, err[-3000:]
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for row in rows:  # every rank holds the same row
        assert row["status"] == "ok" and row["config"] == "1 calls per sample"
        assert row["samples_ms"] == [50.0, 60.0] * 5
        assert row["ms_median"] == pytest.approx(55.0)


@pytest.fixture()
def one_rank(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_one_rank_runs_every_collective_with_algbw_and_no_busbw(one_rank) -> None:
    records: list[RunRow] = []
    assert collectives.sweep("cpu", sizes=(4096,), dtypes=("fp32",), rows=records) == 0
    assert [r.case.kernel for r in records] == list(collectives.OPS)
    # as the files hold them (contract.record.flat), each a Row (contract/schema.py)
    for r in (flat(x, ALL_COLUMNS) for x in records):
        assert r["status"] == "ok" and r["correct"], r
        assert r["provider"] == "gloo" and r["shape"] == "bytes=4096,ranks=1"
        assert r["busbw_gbps"] is None  # no link crossed: not 0, not algbw
        assert r["algbw_gbps"] == pytest.approx(4096 / (r["ms_median"] / 1e3) / 1e9)
        assert r["gbps"] == r["algbw_gbps"] > 0
        # a Row's numbers (the H200's fleet run of 2026-11-27 wrote intensity None; the
        # device columns are the fleet runner's to fill): no arithmetic, 0 FLOP/byte,
        # never plotted on the roofline
        assert r["intensity"] == 0.0
        assert not [p for p in row_problems(r) if not p.startswith(("device", "gpu_name"))]


@pytest.mark.parametrize("op", collectives.OPS)
def test_busbw_of_one_rank_is_none_for_every_op(op: str) -> None:
    assert collectives.busbw(op, 100.0, 1) is None
    assert collectives.busbw(op, 100.0, 2) is not None


def _coll_rows(busbw: float | None) -> pd.DataFrame:
    rows = [{"kernel": op, "provider": "nccl", "dtype": "bf16", "bytes": 2**20,
             "ms_median": 0.01, "algbw_gbps": 104.9, "busbw_gbps": busbw, "status": "ok"}
            for op in ("all_reduce", "broadcast")]
    return pd.DataFrame(rows)


@pytest.mark.parametrize("frame", [_coll_rows(None),
                                   # as read back from results.csv: NaN, not None
                                   _coll_rows(None).astype({"busbw_gbps": float})])
def test_the_fleet_report_says_n_a_for_one_ranks_busbw(frame: pd.DataFrame,
                                                       tmp_path: Path) -> None:
    devices = [DeviceFigures(0, "h", "H200", figures={"copy_gbps": 4000.0},
                             throttled_rows=0, exit_code=0, ratios={"copy_gbps": 1.0})]
    md = render_fleet_md(devices, [], {"copy_gbps": 4000.0}, 5.0, frame)
    assert "| all_reduce | nccl | bf16 | 1,048,576 | 0.01 | 104.9 | n/a |" in md
    assert "| broadcast | nccl | bf16 | 1,048,576 | 0.01 | 104.9 | n/a |" in md
    assert "no busbw (n/a)" in md and "| 0 |" not in md.split("## Collectives")[1]
    plot_fleet(devices, frame, 450.0, 5.0, tmp_path / "fleet.png")  # algbw drawn instead
    assert (tmp_path / "fleet.png").read_bytes()[:4] == b"\x89PNG"


def test_the_fleet_report_prints_a_measured_busbw() -> None:
    md = render_fleet_md([], [], {}, 5.0, _coll_rows(183.5))
    assert "| all_reduce | nccl | bf16 | 1,048,576 | 0.01 | 104.9 | 183.5 |" in md
    assert "n/a" not in md
