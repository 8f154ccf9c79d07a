"""Markdown tables: the one helper every report that writes them uses (summary.md, the
gate's and the history's reports, acceptance.md, the fleet's and ncu's reports).  Written
here rather than taken from pandas: DataFrame.to_markdown needs `tabulate`, which is no
dependency, and pads every cell to its column's width, which would change the reports'
text.  The standard library only: any layer may load it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_table_lines(header: Sequence[object], rows: Iterable[Sequence[object]],
                   align: str = "", tight: bool = False) -> list[str]:
    """A GitHub markdown table's lines: the header, its rule, a line per row, each cell as
    str() gives it (escaping a cell's pipes is the caller's, who knows what it holds).
    `align`: a character per column, "r" right-aligned, anything else (or none) left;
    `tight`: the rule written |---|---| rather than | --- | --- |."""
    rule = ["---:" if align[i:i + 1] == "r" else "---" for i in range(len(header))]
    return ["| " + " | ".join(map(str, header)) + " |",
            "|" + "|".join(rule) + "|" if tight else "| " + " | ".join(rule) + " |",
            *("| " + " | ".join(map(str, r)) + " |" for r in rows)]
