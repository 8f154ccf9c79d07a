"""The physics check: every number a row carries against the bound physics puts on it,
and what must be withheld, each value with its reason.

A value outside its bound is no measurement of the device (a power reading above what
the card can draw, a kernel faster than the memory can feed it) or no measurement of the
code (two providers timed at different SM clocks).  It is withheld: set empty, with the
values computed from it, and recorded on its row (RunRow.withheld, the column WITHHELD on
disk: a list of Withheld records: column, value, bound, kind, reason), so nothing
measured is lost and no reader shows it.  Each group of a row checks the numbers it owns
(contract/record.py: Clocks, Energy, Metrics, Profile, Comparison; the bounds in
contract/bounds.py); `apply` withholds what they find and what it takes with it.  The
sweep's writer applies it before a row is written (benches/sweep/results.py) and the
loader when a saved run is read (contract/schema.py load_doc), so an old run's
impossible numbers are withheld wherever they are shown.  Applying it twice changes
nothing.  The bounds, their margins and why: docs/measurement.md, "The physics check".

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

# The bounds and the records live in contract/bounds.py (the row's groups check against
# them); re-exported here, where the readers import them.
from contract.bounds import (  # noqa: F401
    BANDWIDTH_MARGIN,
    BOUNDS,
    CLOCK,
    CLOCK_SPREAD,
    DERIVED,
    ENERGY,
    ENERGY_TOLERANCE,
    GBPS,
    KERNEL_TIME,
    KINDS,
    POWER,
    POWER_MARGIN,
    TFLOPS,
    TFLOPS_MARGIN,
    UNEQUAL_CLOCKS,
    UNITS,
    WITHHELD,
    RunBounds,
    Withheld,
    clocks_differ,
    clocks_text,
    counts,
    number,
    positive,
    ratio_text,
    value_text,
    withheld_of,
    withheld_text,
    withheld_value,
)
from contract.record import RunRow, parse_row
from contract.run_meta import RunMeta, parse_meta


def _withhold(row: RunRow, found: Withheld, records: list[Withheld]) -> tuple[RunRow, int]:
    """The found value emptied on the row and recorded (once per column); 1 if it was
    recorded now."""
    row = row.emptied(found.column)
    if any(w.column == found.column for w in records):
        return row, 0
    records.append(found)
    return row, 1


def _derived(row: RunRow, records: list[Withheld]) -> tuple[RunRow, int]:
    """Withhold what the row's withheld values take with them (DERIVED)."""
    n = 0
    for w in list(records):
        if w.derived_from is not None:
            continue
        for col in DERIVED.get(w.column, ()):
            v = number(row.value(col))
            if v is None:
                continue
            row, k = _withhold(row, Withheld(col, v, None, w.kind, f"computed from "
                                             f"{w.column}, which is withheld", w.column),
                               records)
            n += k
    return row, n


def _own(row: RunRow, b: RunBounds) -> tuple[RunRow, int]:
    """A row's own values checked (RunRow.findings), with what they take with them."""
    records = list(row.withheld)
    n = 0
    for found in row.findings(b):
        row, k = _withhold(row, found, records)
        n += k
    row, k = _derived(row, records)
    return replace(row, withheld=tuple(records)), n + k


def _speedup(row: RunRow, base: RunRow | None) -> tuple[RunRow, int]:
    """The row's speedup against its baseline row (None: none, or itself)."""
    if base is None or base is row:
        return row, 0
    found = row.comparison.withheld(row.clocks.sm_clock_mhz, base)
    if found is None:
        return row, 0
    records = list(row.withheld)
    row, n = _withhold(row, found, records)
    return replace(row, withheld=tuple(records)), n


def _is_baseline(r: RunRow, baseline: str) -> bool:
    """A row a speedup is taken against: the baseline provider's, ok and timed."""
    return r.case.provider == baseline and r.ok and positive(r.timing.ms_median) is not None


def apply_row(row: RunRow, b: RunBounds, others: Sequence[RunRow] = ()) -> RunRow:
    """One row checked (its speedup against its baseline row among `others`, the rows
    written before it)."""
    row, _ = _own(row, b)
    if number(row.comparison.speedup) is not None and row.case.provider != b.baseline:
        # The latest baseline row of its case, as the speedups take it; searched from
        # the end, where a sweep has just written it, so a row costs little however
        # many came before.
        base = next((r for r in reversed(others) if _is_baseline(r, b.baseline)
                     and r.case.case == row.case.case), None)
        row, _ = _speedup(row, base)
    return row


def checked(rows: Sequence[RunRow], meta: RunMeta) -> tuple[list[RunRow], int]:
    """Every row of a run checked: each failing value emptied and recorded with the
    values derived from it, then each speedup against its baseline row; (the rows, how
    many values were withheld now: 0 for rows checked before, it is idempotent)."""
    b = RunBounds.of(meta)
    out, n = [], 0
    for row in rows:
        row, k = _own(row, b)
        out.append(row)
        n += k
    base = {r.case.case: r for r in out if _is_baseline(r, b.baseline)}
    for i, row in enumerate(out):
        out[i], k = _speedup(row, base.get(row.case.case))
        n += k
    return out, n


def apply(rows: Sequence[RunRow], meta: RunMeta) -> list[RunRow]:
    """Every row of a run checked (`checked`'s rows)."""
    return checked(rows, meta)[0]

def check(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[list[Withheld]]:
    """What each row must have withheld (its records, those it carried included), the
    rows left as they are."""
    got, _ = checked([parse_row(r, lenient=True) for r in rows], parse_meta(meta))
    return [list(r.withheld) for r in got]
