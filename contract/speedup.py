"""The `speedup` column: each row against the run's baseline provider
(`--baseline-provider`, default torch) on the same kernel, dtype, shape and cache mode,
baseline time / row time.  Set where a run's rows are written whole (results.json at
every flush, a resumed run's and a finalized journal's alike), so a row's baseline may
be measured after it."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from contract.modes import row_cache

DEFAULT_BASELINE = "torch"


def baseline_of(meta: Mapping[str, Any]) -> str:
    """The baseline provider a run's metadata names (its stored request), else torch."""
    req = meta.get("request") or {}
    return str(req.get("baseline_provider") or DEFAULT_BASELINE)


def _ms(row: Mapping[str, Any]) -> float | None:
    ms = row.get("ms_median")
    if row.get("status") != "ok" or not isinstance(ms, (int, float)) or not ms > 0:
        return None
    return float(ms)


def speedup_against(row: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                    baseline: str) -> float | None:
    """One row's speedup against its baseline row among `rows` (None where either is not
    ok and timed, or the baseline row is not there yet): a row as it is appended."""
    if row.get("provider") == baseline:
        return 1.0 if _ms(row) is not None else None
    key = case_of(row)
    ref = next((ms for r in rows if r.get("provider") == baseline and case_of(r) == key
                and (ms := _ms(r)) is not None), None)
    ms = _ms(row)
    return ref / ms if ms is not None and ref is not None else None


def case_of(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """The case a row's speedup is taken within: kernel, dtype, shape and cache mode (its
    providers' rows share it)."""
    return (r.get("kernel"), r.get("dtype"), r.get("shape"), row_cache(r))


def set_speedups(rows: Sequence[MutableMapping[str, Any]], baseline: str) -> None:
    """Each row's speedup = the baseline row's ms_median / its own (the baseline's own
    rows: 1.0); None where the row or its baseline row is not ok and timed."""
    base = {case_of(r): ms for r in rows
            if r.get("provider") == baseline and (ms := _ms(r)) is not None}
    for r in rows:
        ms, ref = _ms(r), base.get(case_of(r))
        r["speedup"] = ref / ms if ms is not None and ref is not None else None
