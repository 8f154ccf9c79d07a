"""How summary.md (and the reports that take its tables) writes a value in a cell:
numbers, percentages, ratios and clocks ('-' where there is none), free text escaped,
and its GitHub markdown tables."""

from __future__ import annotations

import math
from typing import Any

from contract.markdown import md_table_lines
from roofline.report.findings import finite_or_none


def num(x: Any) -> str:
    """989.4, 66.9, 3350, 9.52, 0.000123; '-' for missing."""
    v = finite_or_none(x)
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def pct(x: Any, scale: float = 1.0) -> str:
    v = finite_or_none(x)
    return "-" if v is None else f"{v * scale:.1f}%"


def ratio(x: Any) -> str:
    v = finite_or_none(x)
    return "-" if v is None else f"{v:.2f}x"


def cell(x: Any) -> str:
    """A markdown table cell: pipes escaped, newlines folded (reasons are free text)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return str(x).replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip() or "-"


def md_table(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    """GitHub markdown table of escaped cells; `align` is one char per column: l or r
    (default l)."""
    return "\n".join(md_table_lines(header, [[cell(c) for c in r] for r in rows], align))


def mhz(v: Any) -> str | None:
    return f"{v:.0f} MHz" if isinstance(v, int | float) and math.isfinite(v) else None
