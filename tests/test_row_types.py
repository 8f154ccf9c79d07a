"""The typed row (contract/schema.py Row): the columns' order is the contract's, and the
check that a row is well typed catches what it must."""

from __future__ import annotations

import json
from pathlib import Path

from contract.schema import ALL_COLUMNS, COLUMNS, EXTRA_COLUMNS, SAMPLES, Row, row_problems

ROOT = Path(__file__).resolve().parents[1]


def test_the_required_columns_are_the_contracts_in_order():
    assert COLUMNS == [
        "kernel", "provider", "dtype", "shape", "flops", "bytes", "intensity",
        "ms_median", "ms_p20", "ms_p80", "n_samples", "tflops", "gbps",
        "peak_tflops", "peak_gbps", "roof_tflops", "mfu", "pct_roof",
        "correct", "rel_err", "status", "reason"]
    assert ALL_COLUMNS == COLUMNS + EXTRA_COLUMNS
    assert SAMPLES in Row.__annotations__ and SAMPLES not in ALL_COLUMNS


def _good() -> dict:
    return {"kernel": "add", "provider": "torch", "dtype": "fp32", "shape": "n=16",
            "flops": 16, "bytes": 192, "intensity": 1 / 12, "ms_median": 0.5,
            "n_samples": 10, "correct": True, "rel_err": 0.0, "status": "ok",
            "reason": None, SAMPLES: [0.5, 0.5], "rank": None, "cut_short": None}


def test_a_well_typed_row_has_no_problem():
    assert row_problems(_good()) == []
    assert row_problems({**_good(), "ms_median": 1}) == []  # an int is a float


def test_what_a_row_may_not_hold():
    assert row_problems({**_good(), "new_column": 1}) == ["undeclared column 'new_column'"]
    assert row_problems({**_good(), "ms_median": "0.5"})  # text in a number column
    assert row_problems({**_good(), "flops": True})  # a bool is not a count
    assert row_problems({**_good(), "kernel": None})  # a required name missing
    assert row_problems({**_good(), "rank": 1.5})  # a rank is whole


def test_every_committed_run_is_well_typed():
    """The runs the repository keeps (read by the gate, the history, the docs) hold
    Rows: a column's type changed in the schema without them shows here."""
    files = sorted((ROOT / "results").rglob("results.json"))
    assert files
    for f in files:
        rows = json.loads(f.read_text())["rows"]
        problems = {p for r in rows for p in row_problems(r)}
        assert not problems, f"{f}: {sorted(problems)[:5]}"
