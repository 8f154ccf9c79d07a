"""summary.md of a run: what ran where, against which ceilings, how close to the roof.

Sections, in order: run facts (device, date, versions, command), ceilings (datasheet and
measured side by side, with ridge points), the two figures, row counts, the best ok point
per (kernel, dtype), Triton/torch ratios, warm against cold (runs timed both ways),
failed rows, skipped reasons, the timing settings.  Only ok rows
enter the performance tables: a failed row's speed belongs to a wrong answer.

A run is read as a RunDoc (contract/schema.py): the metadata by its typed parts, the rows
picked on the run's frame (RunDoc.frame(), clean_rows) and each table's cells read from
the typed rows (findings.records).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from contract.ceilings import no_roofs
from contract.devices import ROOF_CLASSES
from contract.meta_parts import CeilingsJson, NotRecorded
from contract.physics import ratio_text
from contract.record import RunRow
from contract.request import baseline_provider
from contract.rows import Ceiling, clean_rows, run_ceilings
from contract.run_meta import RunMeta
from contract.schema import (
    ROOFLINE_PNG,
    SCALING_PNG,
    SUMMARY_MD,
    RunDoc,
    atomic_write_text,
)
from roofline.report.cells import cell, md_table, mhz, num, pct, ratio
from roofline.report.energy import energy_sections
from roofline.report.findings import (
    above_roof_cause,
    above_roof_rows,
    best_points,
    cache_bytes,
    cache_gaps,
    finite_or_none,
    in_canonical_order,
    launch_bound_rows,
    provider_ratios,
    ratio_summary,
    records,
    throttled_rows,
    warm_rows,
)
from roofline.report.providers import Table, provider_tables, step_table
from roofline.report.run_facts import run_facts
from roofline.report.run_time import row_time_sections
from roofline.report.style import fmt_gbps, fmt_sig, fmt_tflops
from roofline.report.timing_settings import timing_settings
from roofline.report.withheld import withheld_sections


def _shape(r: RunRow) -> str:
    """A row's shape cell, with the row's mode when it is not its device's native one
    (schema.mode_tag: "warm" on a GPU, "cold" on a CPU)."""
    tag = r.mode_tag
    return f"`{r.case.shape}`" + (f" {tag}" if tag else "")


def _name(r: RunRow) -> list[Any]:
    """A row's kernel, provider, dtype and shape cells."""
    return [r.case.kernel, r.case.provider, r.case.dtype, _shape(r)]


def _timing_section(meta: RunMeta) -> str | None:
    """The run's timing settings, one row each with what it means; None for a run that
    did not record them as a mapping (its `timing` fact says what it recorded)."""
    timing = meta.settings.timing
    if not isinstance(timing, dict) or not timing:
        return None
    rows = [[f"`{s.name}`", s.value, s.meaning] for s in timing_settings(timing)]
    return md_table(["setting", "value", "what it means"], rows)


def _throttled_section(rows: Sequence[RunRow], df: pd.DataFrame) -> str:
    cells = [[*_name(r), mhz(finite_or_none(r.clocks.sm_clock_mhz)) or "-", r.reason or ""]
             for r in records(rows, in_canonical_order(throttled_rows(df)))]
    return ("Timed while the GPU's SM clock sat below the throttle threshold (the clock-"
            "event reasons NVML gave are in the reason), still so after re-timing: their "
            "times describe a throttled GPU, and the regression gate gives them the "
            "verdict `throttled`.\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "SM clock", "reason"], cells,
                     "llllrl"))


def _launch_bound_cells(r: RunRow) -> list[Any]:
    host, device_us = float(r.timing.host_us or 0.0), float(r.timing.ms_median or 0.0) * 1e3
    return [*_name(r), f"{host:.1f}", f"{device_us:.1f}", f"{host / device_us:.1f}x"]


def _launch_bound_section(rows: Sequence[RunRow], df: pd.DataFrame) -> str:
    cells = [_launch_bound_cells(r)
             for r in records(rows, in_canonical_order(launch_bound_rows(df)))]
    return ("Host dispatch per call (`host_us`: Python and launch, measured apart) longer "
            "than the device time: called back to back, these kernels leave the GPU "
            "waiting for the host, so their real cost is the dispatch. The timings "
            "themselves exclude it (CUDA graphs, or the GPU kept busy after each L2 "
            "flush).\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "host us/call", "device us",
                      "host / device"], cells, "llllrrr"))


def _ceilings_section(ceilings: dict[str, Ceiling],
                      meta_ceilings: CeilingsJson | NotRecorded | None = None
                      ) -> str:
    if not ceilings:
        return "No ceilings recorded for this run: % of roof is unavailable."
    ds, ms = ceilings.get("datasheet"), ceilings.get("measured")
    classes = [c for c in ROOF_CLASSES if any(c in x.tflops for x in (ds, ms) if x)]

    def roof(c: Ceiling | None, cls: str) -> str:
        if c is None or cls not in c.tflops:
            return "-"
        # Same number formats as the roofline figure, so the two can be read side by side.
        ridge = c.ridge(cls)
        return f"{fmt_tflops(c.tflops[cls])} TFLOP/s" + (f" (ridge {fmt_sig(ridge)} FLOP/B)"
                                                         if ridge else "")

    def frac(a: float | None, b: float | None) -> str:
        return pct(b / a, 100) if a and b else "-"

    rows = [[cls, roof(ds, cls), roof(ms, cls),
             frac(ds and ds.tflops.get(cls), ms and ms.tflops.get(cls))] for cls in classes]
    for label, attr in (("HBM", "hbm_gbps"), ("L2", "l2_gbps")):
        a, b = (getattr(ds, attr) if ds else None), (getattr(ms, attr) if ms else None)
        if a or b:
            rows.append([label, f"{fmt_gbps(a)} GB/s" if a else "-",
                         f"{fmt_gbps(b)} GB/s" if b else "-", frac(a, b)])
    note = "" if ds else ("\n\nNo datasheet for this device: rows are held against the "
                          "measured ceilings.")
    measured = (meta_ceilings or {}).get("measured") or {}
    raw = measured.get("tflops") if isinstance(measured.get("tflops"), dict) else {}
    for rc, why in no_roofs({k: v for k, v in raw.items()
                             if isinstance(v, int | float)}).items():
        note += f"\n\nNo {rc} roof: {why}."
    method = measured.get("method")
    if isinstance(method, dict) and method:
        note += "\n\nMeasured by: " + "; ".join(f"{k}: {cell(m)}" for k, m in method.items())
    return md_table(["ceiling", "datasheet", "measured", "measured / datasheet"], rows,
                  "lllr") + note


def _best_section(df: pd.DataFrame, meta: RunMeta | None = None) -> str:
    best = best_points(df, meta)
    n_above = len(above_roof_rows(df))
    note = (f"\n\n{n_above} row(s) above 100% of roof are left out: see Above 100% of roof."
            if n_above else "")
    if best.empty:
        return "No ok rows within their roof." + note if n_above else "No ok rows."
    rows = [[r.kernel, r.dtype, r.provider, f"`{r.shape}`", num(r.tflops), num(r.gbps),
             pct(r.mfu, 100), pct(r.pct_roof), pct(r.pct_meas_roof), r.roof]
            for r in best.itertuples()]
    table = md_table(["kernel", "dtype", "provider", "shape", "TFLOP/s", "GB/s", "MFU",
                    "% of roof", "% of measured roof", "roof"], rows, "llllrrrrrl")
    if (best["roof"] == "cache").any():
        table += ("\n\nroof `cache`: on a CPU no flush runs between samples, so a footprint "
                  "that fits in the last-level cache is held against the measured cache "
                  "bandwidth (ceiling L2), not the DRAM one.")
    return table + note


def _above_roof_section(doc: RunDoc, df: pd.DataFrame) -> str:
    def roof_pct(r: RunRow) -> str:
        m = r.metrics
        return pct(m.pct_roof if finite_or_none(m.pct_roof) is not None else m.pct_meas_roof)

    out = [[*_name(r), roof_pct(r), r.timing.timer, above_roof_cause(r, doc.meta)]
           for r in records(doc.rows, in_canonical_order(above_roof_rows(df)))]
    return ("Faster than the roofline allows: a finding to explain, not a best point "
            "(column `above_roof`).\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "% of roof", "timer",
                      "likely cause"], out, "llllrll"))


def _ratio_section(df: pd.DataFrame) -> str:
    ratios = provider_ratios(df)
    if ratios.empty:
        return "No (kernel, dtype, shape) has ok rows from both providers."
    summary = ratio_summary(ratios)
    rows = [[r.kernel, r.dtype, r.n_shapes, r.n_unequal, ratio(r.median), ratio(r.min),
             ratio(r.max), f"`{r.largest_shape}`",
             ratio_text(r.ratio_at_largest, r.triton_mhz, r.torch_mhz)]
            for r in summary.itertuples()]
    head = ("Ratio = torch time / Triton time (> 1: Triton faster), over the shapes where "
            "both providers have an ok row, with the Triton row's SM clock, then the torch "
            "row's. A shape whose two rows were timed at clocks more than 2% apart is "
            "marked `unequal clocks` and left out of the median, min and max (column "
            "`unequal clocks`): its ratio is the clocks' as much as the code's.\n\n")
    detail = md_table(["kernel", "dtype", "shape", "torch ms", "Triton ms", "ratio"],
                    [[r.kernel, r.dtype, f"`{r.shape}`", f"{r.torch_ms:.4g}",
                      f"{r.triton_ms:.4g}", ratio_text(r.ratio, r.triton_mhz, r.torch_mhz)]
                     for r in ratios.itertuples()], "lllrrr")
    # The per-shape table can run to hundreds of rows: folded, so the summary stays short.
    return (head + md_table(["kernel", "dtype", "shapes", "unequal clocks", "median", "min",
                           "max", "largest shape", "at largest"], rows, "llrrrrrlr")
            + f"\n\n<details><summary>Per shape ({len(ratios)})</summary>\n\n{detail}\n\n"
              "</details>")


# Rows of the warm-vs-cold table shown; the rest are folded below it.
GAP_ROWS_SHOWN = 10


def _gap_section(df: pd.DataFrame, meta: RunMeta) -> str:
    gaps = cache_gaps(df, meta)
    if gaps.empty:
        return "No case has both an ok cold and an ok warm row to hold against each other."
    size, name = cache_bytes(meta)
    fits = (f"; `fits`: the footprint fits in the {size / 2**20:.4g} MiB {name}, the rows "
            "that show the gap" if size else "")

    def line(r: Any) -> list[Any]:
        yes = "-" if r.fits is None else ("yes" if r.fits else "no")
        return [r.kernel, r.provider, r.dtype, f"`{r.shape}`", f"{r.bytes / 2**20:.3g}",
                f"{r.cold_ms:.4g}", f"{r.warm_ms:.4g}", ratio(r.gap), yes]

    header = ["kernel", "provider", "dtype", "shape", "MiB", "cold ms", "warm ms",
              "cold / warm", "fits"]
    rows = [line(r) for r in gaps.itertuples()]
    text = ("Each case timed both ways (`--cache cold,warm`): cold = caches flushed (GPU) "
            "or rotated past (CPU) before every call; warm = back-to-back calls on the "
            "same buffers, as nvbench's batch measurement. The other tables hold the "
            "device's default mode (cold on a GPU, warm on a CPU). Cold / warm = how "
            "much faster the warm time is"
            f"{fits}. Largest gaps first; warm rows are plotted hollow and never "
            "compared with cold ones by the regression gate.\n\n"
            + md_table(header, rows[:GAP_ROWS_SHOWN], "llllrrrrl"))
    if len(rows) > GAP_ROWS_SHOWN:
        text += (f"\n\n<details><summary>All {len(rows)}</summary>\n\n"
                 + md_table(header, rows, "llllrrrrl") + "\n\n</details>")
    return text


def _failed_section(rows: Sequence[RunRow], df: pd.DataFrame) -> str:
    failed = df[df["status"] == "failed"]
    if failed.empty:
        return "None."

    def num(x: float | None) -> str:
        v = finite_or_none(x)
        return "-" if v is None else f"{v:.3g}"

    cells = [[*_name(r), num(r.check.rel_err), num(r.check.tolerance), r.reason]
             for r in records(rows, in_canonical_order(failed))]
    return md_table(["kernel", "provider", "dtype", "shape", "rel_err", "tolerance", "reason"],
                  cells, "llllrrl")


def _skipped_section(df: pd.DataFrame) -> str:
    skipped = df[df["status"] == "skipped"]
    if skipped.empty:
        return "None."
    reasons = skipped["reason"].fillna("(no reason given)").astype(str)
    rows = []
    for reason, g in skipped.groupby(reasons, sort=False):
        kernels = ", ".join(sorted(g["kernel"].dropna().astype(str).unique()))
        dtypes = ", ".join(sorted(g["dtype"].dropna().astype(str).unique()))
        providers = ", ".join(sorted(g["provider"].dropna().astype(str).unique()))
        rows.append([reason, len(g), kernels, providers, dtypes])
    rows.sort(key=lambda r: (-r[1], r[0]))
    return md_table(["reason", "rows", "kernels", "providers", "dtypes"], rows, "lrlll")


def _tables(tables: list[Table]) -> str:
    return "\n\n".join(f"{t.title}\n\n{md_table(t.header, t.rows, t.align)}" for t in tables)


def _count_line(d: pd.DataFrame) -> tuple[str, dict[str, int]]:
    """'N rows: a ok, b failed, c skipped', and the counts by status."""
    counts = d["status"].value_counts() if not d.empty else pd.Series(dtype=int)
    n = {s: int(counts.get(s, 0)) for s in ("ok", "failed", "skipped")}
    other = len(d) - sum(n.values())
    return (f"{len(d)} rows: {n['ok']} ok, {n['failed']} failed, {n['skipped']} skipped"
            + (f", {other} with another status" if other else "")), n


def _performance_sections(doc: RunDoc, d: pd.DataFrame) -> list[str]:
    """Best points, rows above their roof, Triton vs torch, the providers, the model's
    forward pass, warm vs cold, throttled and launch-bound rows."""
    meta, baseline = doc.meta, baseline_provider(doc.meta)
    n_above, warm = len(above_roof_rows(d)), warm_rows(d)
    n_throttled, n_launch = len(throttled_rows(d)), len(launch_bound_rows(d))
    return [
        "## Best point per kernel and dtype",
        "Highest % of roof (the roofline bound min(peak, intensity x bandwidth)); MFU is "
        "achieved / compute peak.\n\n" + _best_section(d, meta),
        *([f"## Above 100% of roof ({n_above})", _above_roof_section(doc, d)]
          if n_above else []),
        "## Triton vs torch",
        _ratio_section(d),
        *([f"## Providers (against {baseline})",
           "Each provider's ms_median, then its speedup (the baseline's time / its own) "
           "with its SM clock and the baseline row's; `unequal clocks` where they differ "
           "by more than 2%: that ratio is the clocks' as much as the code's. The fastest "
           "per shape.\n\n" + _tables(provs)]
          if (provs := provider_tables(doc, baseline)) else []),
        *(["## The model's forward pass", _tables([step])]
          if (step := step_table(doc)) else []),
        *(["## Warm vs cold", _gap_section(d, meta)]
          if warm.any() and not warm.all() else []),
        *([f"## Throttled rows ({n_throttled})", _throttled_section(doc.rows, d)]
          if n_throttled else []),
        *([f"## Launch-bound rows ({n_launch})", _launch_bound_section(doc.rows, d)]
          if n_launch else []),
    ]


def render_summary(doc: RunDoc) -> str:
    """The markdown text of summary.md.  The rows as the physics check left them
    (schema.load_doc and the sweep's writer apply it), each withheld value empty and
    listed in the section "Numbers withheld"."""
    meta, frame = doc.meta, doc.frame()
    d = clean_rows(frame)
    count_line, n = _count_line(d)
    name = meta.device.device_name or meta.device.device_key or "unknown device"
    parts = [
        f"# Benchmark summary: {name}",
        run_facts(meta),
        "## Ceilings",
        _ceilings_section(run_ceilings(meta, frame), meta.ceilings),
        "## Figures",
        f"![roofline]({ROOFLINE_PNG})\n\n![scaling]({SCALING_PNG})",
        "## Rows",
        count_line + ". Failed rows (wrong results) are left out of every table and figure "
                     "except the failed list below.",
        *withheld_sections(doc.rows, md_table),  # roofline/report/withheld.py
        *_performance_sections(doc, d),
        *energy_sections(doc, md_table),  # roofline/report/energy.py
        *row_time_sections(meta.time.row_split_s),  # roofline/report/run_time.py
        f"## Failed rows ({n['failed']})",
        _failed_section(doc.rows, d),
        f"## Skipped rows ({n['skipped']})",
        _skipped_section(d),
        *(["## Timing settings", timing] if (timing := _timing_section(meta)) else []),
    ]
    return "\n\n".join(parts) + "\n"


def write_summary(run_dir: Path, doc: RunDoc) -> Path:
    """Write `run_dir/summary.md` atomically and return its path."""
    path = Path(run_dir) / SUMMARY_MD
    atomic_write_text(path, render_summary(doc))
    return path
