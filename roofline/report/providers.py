"""The summary's provider comparison: per kernel and dtype, every provider's time side
by side on each shape, the winner and its speedup against the run's baseline provider
(`--baseline-provider`); and for a `--sizes model:NAME` run, where one forward pass of
the model spends its kernel time by provider, and what the best provider per kernel
saves against the baseline, with the sum.

The tables are returned as data (header, rows, alignment) for summary.md to render.  The
rows are picked and grouped on the run's frame; each cell is read from the typed row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from contract.physics import clocks_differ
from contract.record import RunRow
from contract.request import baseline_provider, stored_selection
from contract.schema import RunDoc
from kernels import PROVIDERS
from roofline.report.findings import finite_or_none, in_canonical_order, records
from roofline.report.withheld import speedup_text


@dataclass(frozen=True)
class Table:
    """One markdown table: a title line above it, then its header, rows and alignment
    (one l or r per column)."""

    title: str
    header: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    align: str = ""


def _ok(doc: RunDoc) -> pd.DataFrame:
    """The run's ok, timed rows (its frame), with their cache mode and a numeric
    ms_median."""
    df = doc.frame()
    if df.empty or "status" not in df:
        return df.iloc[0:0]
    ok = df[df["status"] == "ok"].copy()
    ok["ms_median"] = pd.to_numeric(ok["ms_median"], errors="coerce")
    ok = ok[ok["ms_median"] > 0]
    ok["_cache"] = [r.case.cache for r in records(doc.rows, ok)]
    return ok


def _providers(ok: pd.DataFrame, baseline: str) -> list[str]:
    """The providers of these rows, baseline first, then kernels.PROVIDERS' order."""
    have = set(ok["provider"])
    order = [baseline, *[p for p in PROVIDERS if p != baseline]]
    return [p for p in order if p in have] + sorted(have - set(order))


def _ms(x: Any) -> str:
    """4 significant digits, whole milliseconds from 1000 on (a step's sums)."""
    v = finite_or_none(x)
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _unequal(rows: Sequence[RunRow]) -> bool:
    """Whether a shape's provider rows were timed at SM clocks more than 2% apart (the
    fastest and slowest clock known): its winner is then the clocks' as much as the
    code's."""
    clocks = [c for r in rows if (c := finite_or_none(r.clocks.sm_clock_mhz))]
    return len(clocks) > 1 and clocks_differ(min(clocks), max(clocks))


def _ms_of(r: RunRow) -> float:
    """A picked row's ms_median (_ok keeps only rows that have one)."""
    return float(r.timing.ms_median or 0.0)


def _shape_cells(by: dict[str, RunRow], provs: list[str], baseline: str) -> list[str]:
    """One shape's provider cells, then the winner and its speedup."""
    win = min(by, key=lambda p: _ms_of(by[p]))
    base = by.get(baseline)
    cells = []
    for p in provs:
        r = by.get(p)
        cells.append("-" if r is None else (
            _ms(_ms_of(r)) if p == baseline else f"{_ms(_ms_of(r))}, {speedup_text(r, base)}"))
    return cells + [win + (" (unequal clocks)" if _unequal(list(by.values())) else ""),
                    "1.00x" if win == baseline else speedup_text(by[win], base)]


def provider_tables(doc: RunDoc, baseline: str) -> list[Table]:
    """One table per (kernel, dtype, cache mode) that has ok rows of two providers or
    more: a row per shape (its layer where the run sized a model), each provider's
    ms_median with its speedup against `baseline` and both rows' SM clocks (marked
    "unequal clocks" where they differ by more than 2%), and the fastest provider."""
    ok = _ok(doc)
    if ok.empty:
        return []
    tables = []
    keys = in_canonical_order(ok)[["kernel", "dtype", "_cache"]].drop_duplicates()
    for kernel, dtype, cache in keys.itertuples(index=False):
        part = ok[(ok["kernel"] == kernel) & (ok["dtype"] == dtype) & (ok["_cache"] == cache)]
        provs = _providers(part, baseline)
        if len(provs) < 2:
            continue
        layered = part["layer"].notna().any() if "layer" in part else False
        rows = []
        for shape, g in part.groupby("shape", sort=False):
            layer = [(g["layer"].dropna().iloc[0] if g["layer"].notna().any() else "-")
                     ] if layered else []
            by = {r.case.provider: r for r in records(doc.rows, g)}
            rows.append([f"`{shape}`", *layer, *_shape_cells(by, provs, baseline)])
        header = ["shape", *(["layer"] if layered else []), *[f"{p} ms" for p in provs],
                  "winner", f"winner vs {baseline}"]
        align = "l" + ("l" if layered else "") + "r" * len(provs) + "lr"
        tables.append(Table(f"**{kernel} {dtype}** ({cache})", header, rows, align))
    return tables


def step_table(doc: RunDoc) -> Table | None:
    """For a `--sizes model:NAME` run (metadata model_step): each kernel shape of one
    forward pass with its calls per pass, every provider's time per pass (ms x calls),
    the best provider and what it saves against the run's baseline provider; the last
    row sums them over the shapes every provider column has (a provider missing a shape
    sums to '-')."""
    step = doc.meta.settings.model_step
    ok = _ok(doc)
    if not isinstance(step, dict) or ok.empty:
        return None
    baseline = baseline_provider(doc.meta)
    asked = stored_selection(doc.meta)
    cache = (asked.cache if asked and asked.cache else [None])[0] or ok["_cache"].iloc[0]
    ok = ok[ok["_cache"] == cache]
    provs = _providers(ok, baseline)
    if not provs:
        return None
    rows: list[list[Any]] = []
    totals: dict[str, float | None] = dict.fromkeys(provs, 0.0)
    base_sum = best_sum = 0.0
    for layer in step.get("layers", []):
        part = ok[(ok["kernel"] == layer["kernel"]) & (ok["shape"] == layer["shape"])]
        if part.empty or not layer["count"]:  # count 0: not part of a forward pass
            continue
        n = int(layer["count"])
        per = {r.case.provider: _ms_of(r) * n for r in records(doc.rows, part)}
        for p in provs:
            t = totals[p]
            totals[p] = None if t is None or p not in per else t + per[p]
        best = min(per, key=lambda p: per[p])
        saved = per[baseline] - per[best] if baseline in per else None
        if baseline in per:
            base_sum += per[baseline]
            best_sum += per[best]
        rows.append([layer["kernel"], layer["layer"], f"`{layer['shape']}`", n,
                     *[_ms(per.get(p)) for p in provs], best, _ms(saved)])
    if not rows:
        return None
    rows.append(["**sum**", "", "", "", *[_ms(totals[p]) for p in provs],
                 f"best per kernel: {_ms(best_sum)}", _ms(base_sum - best_sum)])
    title = (f"One forward pass of {step.get('model')} over {step.get('tokens')} tokens "
             f"({step.get('describe')}), {cache} rows: each shape's ms x its calls per "
             f"pass, by provider; `saved`: the baseline ({baseline}) minus the best "
             "provider, per pass.  Kernels not selected, and rows not ok, are not in it.")
    return Table(title, ["kernel", "layer", "shape", "calls", *[f"{p} ms" for p in provs],
                         "best", f"saved vs {baseline} ms"],
                 rows, "lllr" + "r" * len(provs) + "lr")
