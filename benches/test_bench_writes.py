"""pytest-benchmark: what writing one result row costs, at row 100 and at row 1,000.

    pytest benches/test_bench_writes.py --benchmark-columns=mean,median,max

A GPU row carries up to ~1,000 raw samples.  `journal` is how runs write rows
(benches.sweep.results.ResultWriter.add: one appended line each); `rewrite` is the former way,
every results file rewritten whole after each row, kept here as the yardstick: its cost
grows with the rows before it, the journal's does not.  A benchmark, not a timed test:
the figures are reported, never asserted.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from benches.sweep.results import ResultWriter
from contract.schema import ALL_COLUMNS, SAMPLES

SAMPLES_PER_ROW = 900


def _row(i: int, rng: np.random.Generator) -> dict:
    row = dict.fromkeys(ALL_COLUMNS)
    row.update(kernel="matmul", provider="triton", dtype="bf16", shape=f"M={i},N=64,K=64",
               flops=2.0 * i * 64 * 64, bytes=1.0 * i, status="ok", reason="",
               n_samples=SAMPLES_PER_ROW, ms_median=0.01, timer="cudagraph")
    row[SAMPLES] = rng.random(SAMPLES_PER_ROW).tolist()
    return row


@pytest.mark.parametrize("method", ["journal", "rewrite"])
@pytest.mark.parametrize("rows_before", [100, 1000])
def test_write_row(benchmark, tmp_path, method, rows_before):
    rng = np.random.default_rng(0)
    writer = ResultWriter(tmp_path / "run", {"run_id": "bench"})
    writer.flush()
    for i in range(rows_before):
        writer.add(_row(i, rng))
    counter = itertools.count(rows_before)
    if method == "rewrite":
        writer.flush()

    def write_one():
        writer.add(_row(next(counter), rng))
        if method == "rewrite":
            writer.flush()

    benchmark.pedantic(write_one, rounds=10, iterations=1, warmup_rounds=1)
    benchmark.extra_info.update(rows_before=rows_before, samples_per_row=SAMPLES_PER_ROW,
                                method=method)
