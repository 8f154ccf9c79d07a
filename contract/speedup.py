"""The `speedup` column: each row against the run's baseline provider
(`--baseline-provider`, default torch) on the same kernel, dtype, shape and cache mode,
baseline time / row time (a row's Comparison group, contract/record.py).  Set where a
run's rows are written whole (results.json at every flush, a resumed run's and a
finalized journal's alike), so a row's baseline may be measured after it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from contract.record import Comparison, RunRow
from contract.run_meta import DEFAULT_BASELINE, RunMeta, parse_meta

__all__ = ["DEFAULT_BASELINE", "baseline_of", "speedup_against", "with_speedups"]


def baseline_of(meta: RunMeta | Mapping[str, Any]) -> str:
    """The baseline provider a run's metadata names (its stored request), else torch."""
    return (meta if isinstance(meta, RunMeta) else parse_meta(meta)).baseline_provider


def _ms(row: RunRow) -> float | None:
    ms = row.timing.ms_median
    if not row.ok or not isinstance(ms, int | float) or not ms > 0:
        return None
    return float(ms)


def speedup_against(row: RunRow, rows: Sequence[RunRow], baseline: str) -> Comparison:
    """One row's Comparison against its baseline row among `rows` (no speedup where
    either is not ok and timed, or the baseline row is not there yet): a row as it is
    appended."""
    if row.case.provider == baseline:
        return Comparison(1.0 if _ms(row) is not None else None)
    key = row.case.case
    ref = next((ms for r in rows if r.case.provider == baseline and r.case.case == key
                and (ms := _ms(r)) is not None), None)
    ms = _ms(row)
    return Comparison(ref / ms if ms is not None and ref is not None else None)


def with_speedups(rows: Sequence[RunRow], baseline: str) -> list[RunRow]:
    """The rows, each with its speedup = the baseline row's ms_median / its own (the
    baseline's own rows: 1.0); none where the row or its baseline row is not ok and
    timed."""
    base = {r.case.case: ms for r in rows
            if r.case.provider == baseline and (ms := _ms(r)) is not None}
    out = []
    for r in rows:
        ms, ref = _ms(r), base.get(r.case.case)
        out.append(replace(r, comparison=Comparison(
            ref / ms if ms is not None and ref is not None else None)))
    return out
