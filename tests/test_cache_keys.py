"""Readers of saved rows that pick or pair rows keep a case's cold and warm rows apart, as
the gate does: the fleet's per-device figures (roofline/report/fleet.py) and section 7's targets
(roofline/report/targets.py).  A row without a `cache` cell has its device's native mode (cold
on a GPU, warm on a CPU: contract.schema.native_cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from roofline.report import targets, targets_cli
from roofline.report.fleet import device_figures, figures_of, find_outliers, render_fleet_md
from roofline.report.targets import MET, NOT_MEASURED
from tests.test_gpu_ci import COPY_GBPS, N26, ci_row, mm_row, write_ci_run

# ---- fleet: one set of figures per cache mode --------------------------------------------

S = 8192


def _fleet_row(tflops: float, gbps: float, clock: float, cache: str | None,
               device: str = "h100", timer: str = "cudagraph") -> dict[str, Any]:
    row = {"kernel": "matmul", "provider": "torch", "dtype": "bf16",
           "shape": f"M={S},N={S},K={S}", "flops": 2.0 * S**3, "tflops": tflops,
           "gbps": gbps, "sm_clock_mhz": clock, "status": "ok", "device": device,
           "timer": timer}
    if cache is not None:
        row["cache"] = cache
    return row


def _rank(rank: int) -> dict[str, Any]:
    return {"rank": rank, "host": f"h{rank}", "device_name": "H100", "copy_gbps": 3000.0,
            "exit_code": 0}


def test_fleet_figures_never_mix_a_cold_and_a_warm_row() -> None:
    # Rank 0 ran cold and warm, rank 1 cold only (its rows written before the column:
    # no cache cell, a GPU's native cold).  Mixed, rank 0's largest bf16 matmul would be
    # its warm 700 and its median row GB/s (100 + 300) / 2: rank 1 an outlier on both.
    r0 = device_figures(_rank(0), pd.DataFrame([_fleet_row(500.0, 100.0, 1980.0, "cold"),
                                                _fleet_row(700.0, 300.0, 1700.0, "warm")]))
    r1 = device_figures(_rank(1), pd.DataFrame([_fleet_row(500.0, 100.0, 1980.0, None)]))
    f0, f1 = r0.figures, r1.figures
    assert (f0["bf16_matmul_tflops"], f0["rows_gbps"], f0["sm_clock_mhz"]) == \
        (500.0, 100.0, 1980.0)
    assert (f0["bf16_matmul_tflops (warm)"], f0["rows_gbps (warm)"]) == (700.0, 300.0)
    assert (f1["bf16_matmul_tflops"], f1["rows_gbps"]) == (500.0, 100.0)
    assert "bf16_matmul_tflops (warm)" not in f1
    devices = [r0, r1]
    out, medians = find_outliers(devices, 5.0)
    assert out == []
    assert medians["bf16_matmul_tflops"] == 500.0 and medians["rows_gbps"] == 100.0
    assert medians["bf16_matmul_tflops (warm)"] == 700.0  # rank 0's alone
    figures = figures_of(devices)
    assert figures.index("bf16_matmul_tflops") + 1 == \
        figures.index("bf16_matmul_tflops (warm)")
    assert not any(f.endswith("_ratio") for f in figures)
    md = render_fleet_md(devices, out, medians, 5.0, pd.DataFrame(columns=["status"]))
    assert "| bf16_matmul_tflops | bf16_matmul_tflops (warm) |" in md
    assert "| 0 | h0 | H100 | 3000 (1.00x) | 500 (1.00x) | 700 (1.00x) |" in md


def test_a_slow_warm_device_is_an_outlier_among_warm_figures_only() -> None:
    devices = [device_figures(_rank(i), pd.DataFrame([
        _fleet_row(500.0, 100.0, 1980.0, "cold"), _fleet_row(warm, 300.0, 1980.0, "warm")]))
        for i, warm in enumerate((700.0, 700.0, 600.0))]
    out, _ = find_outliers(devices, 5.0)
    assert [o.device.rank for o in out] == [2]
    assert out[0].why.startswith("bf16_matmul_tflops (warm) 600 = 0.86x the median 700")


def test_a_cpu_rows_native_mode_is_warm() -> None:
    # CPU rows without a cache cell are warm (their timers always reused the buffers):
    # they keep the plain names, and a cold CPU row is the tagged one.
    rows = pd.DataFrame([_fleet_row(0.5, 10.0, float("nan"), None, "cpu", "timeit blocks"),
                         _fleet_row(0.3, 5.0, float("nan"), "cold", "cpu", "timeit blocks")])
    figures = device_figures(_rank(0), rows).figures
    assert (figures["bf16_matmul_tflops"], figures["bf16_matmul_tflops (cold)"]) == (0.5, 0.3)
    assert (figures["rows_gbps"], figures["rows_gbps (cold)"]) == (10.0, 5.0)


# ---- section 7's targets: rows of the native mode, pairs of one mode -----------------------

def _warm(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "cache": "warm"}


def test_targets_judge_cold_rows_and_never_pair_a_warm_one(tmp_path: Path) -> None:
    n27 = 1 << 27
    run = write_ci_run(tmp_path / "r", [
        # add bf16: the cold 384 MiB row (0.95 of copy); a warm row at 768 MiB, larger
        # and faster, would win "the largest footprint" and be held against the cold copy
        ci_row("add", "triton", "bf16", f"n={N26}", 6 * N26, gbps=2850),
        ci_row("add", "torch", "bf16", f"n={N26}", 6 * N26, gbps=2700),
        _warm(ci_row("add", "triton", "bf16", f"n={n27}", 6 * n27, gbps=3300)),
        # its torch twin at the cold row's shape, warm and slow: never its eager pair
        _warm(ci_row("add", "torch", "bf16", f"n={N26}", 6 * N26, gbps=1000)),
        # matmul bf16 4096^3: Triton cold, torch warm only: no pair
        mm_row("triton", "bf16", 4096, 700), _warm(mm_row("torch", "bf16", 4096, 800)),
        # matmul fp8 8192^3: a warm Triton row only
        _warm(mm_row("triton", "fp8", 8192, 1300)), mm_row("torch", "fp8", 8192, 1300),
    ])
    checks = {c.target: c for c in targets.checks([targets.load(str(run))])}
    add = checks["add bf16"]
    assert add.verdict == MET and add.case.startswith(f"n={N26}, 384 MiB")
    assert [p.value for p in add.parts] == pytest.approx([2850 / COPY_GBPS, 2850 / 2700])
    mm = checks["matmul bf16 4096^3"]
    assert mm.verdict == NOT_MEASURED
    assert mm.cells()[-1] == ("not measured: no torch row (only warm-cache rows, which the "
                              "targets do not hold)")
    fp8 = checks["matmul fp8 8192^3"]
    assert fp8.verdict == NOT_MEASURED and "no Triton row (only warm-cache rows" \
        in fp8.cells()[-1]


def test_same_rows_keys_a_row_by_its_cache_mode(tmp_path: Path) -> None:
    cold = ci_row("add", "triton", "bf16", f"n={N26}", 6 * N26, gbps=2850)
    plain = targets.load(str(write_ci_run(tmp_path / "plain", [cold, _warm(cold)])))
    # The fleet's warm row failed: keyed without the mode it hid behind the cold one.
    failed = {**_warm(cold), "status": "failed", "reason": "rel_err"}
    fleet = targets.load(str(write_ci_run(tmp_path / "fleet", [cold, failed])))
    same, why = targets_cli.same_rows(plain, fleet)
    assert not same and why == "1 with another status (first: add triton bf16 " \
                               f"n={N26} warm)"
    only_cold = targets.load(str(write_ci_run(tmp_path / "cold", [cold])))
    same, why = targets_cli.same_rows(plain, only_cold)
    assert not same and why.startswith("1 only in the plain run")
    assert targets_cli.same_rows(plain, plain) == (True, "same 2 rows, same statuses")
