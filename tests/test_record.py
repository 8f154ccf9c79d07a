"""A row as a typed record (contract/record.py): each column owned by exactly one group,
one writer (flat) and one loader (parse_row), every committed run's rows read back as
they were written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.record import OWNER, SAMPLES, CaseId, RunRow, Timing, flat, parse_row
from contract.schema import ALL_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted(p for p in (ROOT / "results").rglob("results.json"))


def test_each_column_belongs_to_one_group():
    assert set(OWNER) == {*ALL_COLUMNS, SAMPLES}
    # A column's owner is where its value lives: flat writes nothing it does not own.
    row = RunRow(CaseId("add", "torch", "fp32", "n=4096"))
    assert list(flat(row, ALL_COLUMNS)) == ALL_COLUMNS  # no samples: none written
    timed = RunRow(row.case, status="ok", timing=Timing(ms_median=1.0, samples_ms=(1.0,)))
    assert list(flat(timed, ALL_COLUMNS)) == [*ALL_COLUMNS, SAMPLES]


@pytest.mark.parametrize("path", RUNS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_committed_row_reads_back_as_written(path):
    """flat(parse_row(r)) is r, but for what a run written before a column lacked: the
    cache mode (its device's native one) and an empty sample list."""
    for r in json.loads(path.read_text())["rows"]:
        back = flat(parse_row(r), ALL_COLUMNS)
        for c in ALL_COLUMNS:
            if c == "cache" and r.get(c) is None:
                assert back[c] in ("cold", "warm")
                continue
            assert back[c] == r.get(c) or (back[c] is None and r.get(c) is None), (c, r)
        assert back.get(SAMPLES, []) == (r.get(SAMPLES) or [])


def test_a_csv_cell_reads_as_its_fields_type():
    """A CSV round trip gives text and floats: the loader turns them into the field's
    type (an int count, a bool flag), and an empty cell into None."""
    row = parse_row({"kernel": "add", "provider": "torch", "dtype": "fp32",
                     "shape": "n=4096", "status": "ok", "n_samples": 25.0, "flops": 4096.0,
                     "throttled": "False", "correct": "True", "ms_median": "0.5",
                     "reason": "", "sm_clock_mhz": float("nan")})
    assert row.timing.n_samples == 25 and isinstance(row.timing.n_samples, int)
    assert row.accounting.flops == 4096 and row.clocks.throttled is False
    assert row.check.correct is True and row.timing.ms_median == 0.5
    assert row.clocks.sm_clock_mhz is None and row.reason == ""
