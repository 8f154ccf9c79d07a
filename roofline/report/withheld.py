"""What summary.md says of the physics check (contract/physics.py, applied to the rows
by whoever hands them over: schema.load_doc, the sweep's writer): the "Numbers withheld"
section (each kind of bound with its counts, then the rows), and a
provider's speedup as the tables show it, with both rows' SM clocks, marked where they
differ by more than 2% (a ratio of the clocks as much as of the code)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contract.physics import (
    BOUNDS,
    KINDS,
    UNEQUAL_CLOCKS,
    Withheld,
    number,
    ratio_text,
)
from contract.record import RunRow
from roofline.report.findings import canonical_rows

# The rows of the withheld table shown; the rest are folded below it.
ROWS_SHOWN = 10


def shown_speedup(row: RunRow) -> float | None:
    """A row's speedup; where the check withheld it for unequal clocks, the value it had,
    which the tables show marked as such (any other withheld speedup: None)."""
    s = number(row.comparison.speedup)
    if s is not None:
        return s
    w = next((w for w in row.withheld if w.column == "speedup"), None)
    return w.value if w is not None and w.kind == UNEQUAL_CLOCKS else None


def speedup_text(row: RunRow, base: RunRow | None, digits: int = 2) -> str:
    """'0.99x (1,980 vs 1,965 MHz)', 'unequal clocks: 0.86x (1,545 vs 1,770 MHz)': the
    row's speedup with its SM clock, then its baseline row's."""
    base_mhz = base.clocks.sm_clock_mhz if base is not None else None
    return ratio_text(shown_speedup(row), row.clocks.sm_clock_mhz, base_mhz, digits)


def _primary(rows: Sequence[RunRow]) -> list[tuple[RunRow, Withheld, list[str]]]:
    """(row, record, the columns taken with it) for each value that broke its own bound."""
    out = []
    for r in canonical_rows(rows):
        for w in r.withheld:
            if w.derived_from is None:
                out.append((r, w, [d.column for d in r.withheld if d.derived_from == w.column]))
    return out


def withheld_sections(rows: Sequence[RunRow],
                      table: Callable[[list[str], list[list[Any]], str], str]) -> list[str]:
    """summary.md's "Numbers withheld" section (`table`: its md_table); [] for a run with
    none."""
    records = [(r, w) for r in rows for w in r.withheld]
    if not records:
        return []
    n_rows = sum(bool(r.withheld) for r in rows)
    kinds = [k for k in KINDS if any(w.kind == k for _, w in records)]
    kinds += sorted({w.kind for _, w in records} - set(kinds))
    summary = []
    for kind in kinds:
        mine = [(r, w) for r, w in records if w.kind == kind]
        keys = {r.key for r, _ in mine}
        cols: dict[str, int] = {}
        for _, w in mine:
            cols[w.column] = cols.get(w.column, 0) + 1
        summary.append([kind, len(mine), len(keys),
                        ", ".join(f"{c} ({n})" for c, n in cols.items()),
                        BOUNDS.get(kind, "-")])
    head = (f"{len(records)} values of {n_rows} rows break a physical bound, or come "
            "from one that does, and are left out of every table and figure here (the "
            "physics check: contract/physics.py; its bounds and margins: "
            "docs/measurement.md, \"The physics check\"). The values themselves are not "
            "printed here: each row keeps them in its `withheld` column with their bound "
            "and why, and `python -m roofline check RUN` lists them. A speedup at unequal "
            "clocks is still shown in the provider tables, marked: a ratio of the clocks "
            "as much as of the code.\n\n")
    text = head + table(["kind", "values", "rows", "columns", "bound"], summary, "lrrll")
    detail = [[r.case.kernel, r.case.provider, r.case.dtype, f"`{r.case.shape}`", w.kind,
               w.column, w.bound_text(), ", ".join(also) or "-",
               w.reason if w.kind == UNEQUAL_CLOCKS else "-"] for r, w, also in _primary(rows)]
    header = ["kernel", "provider", "dtype", "shape", "kind", "column", "bound",
              "also withheld", "clocks"]
    text += "\n\n" + table(header, detail[:ROWS_SHOWN], "lllllllll")
    if len(detail) > ROWS_SHOWN:
        text += (f"\n\n<details><summary>All {len(detail)}</summary>\n\n"
                 + table(header, detail, "lllllllll") + "\n\n</details>")
    return [f"## Numbers withheld ({len(records)})", text]
