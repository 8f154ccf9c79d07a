"""What summary.md says of the physics check (contract/physics.py, applied to the rows
by whoever hands them over: schema.load_run, the sweep's writer): the "Numbers withheld"
section (each kind of bound with its counts, then the rows), and a
provider's speedup as the tables show it, with both rows' SM clocks, marked where they
differ by more than 2% (a ratio of the clocks as much as of the code)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from contract.physics import (
    BOUNDS,
    KINDS,
    UNEQUAL_CLOCKS,
    Withheld,
    number,
    ratio_text,
    withheld_of,
    withheld_value,
)
from roofline.report.findings import in_canonical_order

# The rows of the withheld table shown; the rest are folded below it.
ROWS_SHOWN = 10


def shown_speedup(row: Mapping[str, Any]) -> float | None:
    """A row's speedup; where the check withheld it for unequal clocks, the value it had,
    which the tables show marked as such (any other withheld speedup: None)."""
    s = number(row.get("speedup"))
    if s is not None:
        return s
    w = withheld_value(row, "speedup")
    return w.value if w is not None and w.kind == UNEQUAL_CLOCKS else None


def speedup_text(row: Mapping[str, Any], base: Mapping[str, Any] | None,
                 digits: int = 2) -> str:
    """'0.99x (1,980 vs 1,965 MHz)', 'unequal clocks: 0.86x (1,545 vs 1,770 MHz)': the
    row's speedup with its SM clock, then its baseline row's."""
    base_mhz = base.get("sm_clock_mhz") if base is not None else None
    return ratio_text(shown_speedup(row), row.get("sm_clock_mhz"), base_mhz, digits)


def _primary(df: pd.DataFrame) -> list[tuple[Any, Withheld, list[str]]]:
    """(row, record, the columns taken with it) for each value that broke its own bound."""
    out = []
    for _, r in in_canonical_order(df).iterrows():
        records = withheld_of(r)
        for w in records:
            if w.derived_from is None:
                out.append((r, w, [d.column for d in records if d.derived_from == w.column]))
    return out


def withheld_sections(df: pd.DataFrame,
                      table: Callable[[list[str], list[list[Any]], str], str]) -> list[str]:
    """summary.md's "Numbers withheld" section (`table`: its md_table); [] for a run with
    none."""
    if df.empty or "withheld" not in df.columns:
        return []
    records = [(r, w) for _, r in df.iterrows() for w in withheld_of(r)]
    if not records:
        return []
    n_rows = sum(bool(withheld_of(r)) for _, r in df.iterrows())
    kinds = [k for k in KINDS if any(w.kind == k for _, w in records)]
    kinds += sorted({w.kind for _, w in records} - set(kinds))
    summary = []
    for kind in kinds:
        mine = [(r, w) for r, w in records if w.kind == kind]
        rows = {(r["kernel"], r["provider"], r["dtype"], r["shape"], r.get("cache"))
                for r, _ in mine}
        cols: dict[str, int] = {}
        for _, w in mine:
            cols[w.column] = cols.get(w.column, 0) + 1
        summary.append([kind, len(mine), len(rows),
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
    detail = [[r["kernel"], r["provider"], r["dtype"], f"`{r['shape']}`", w.kind, w.column,
               w.bound_text(), ", ".join(also) or "-",
               w.reason if w.kind == UNEQUAL_CLOCKS else "-"] for r, w, also in _primary(df)]
    header = ["kernel", "provider", "dtype", "shape", "kind", "column", "bound",
              "also withheld", "clocks"]
    text += "\n\n" + table(header, detail[:ROWS_SHOWN], "lllllllll")
    if len(detail) > ROWS_SHOWN:
        text += (f"\n\n<details><summary>All {len(detail)}</summary>\n\n"
                 + table(header, detail, "lllllllll") + "\n\n</details>")
    return [f"## Numbers withheld ({len(records)})", text]
