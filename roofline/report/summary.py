"""summary.md of a run: what ran where, against which ceilings, how close to the roof.

Sections, in order: run facts (device, date, versions, command), ceilings (datasheet and
measured side by side, with ridge points), the two figures, row counts, the best ok point
per (kernel, dtype), Triton/torch ratios, warm against cold (runs timed both ways),
failed rows, skipped reasons, the timing settings.  Only ok rows
enter the performance tables: a failed row's speed belongs to a wrong answer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from contract.ceilings import no_roofs
from contract.devices import ROOF_CLASSES
from contract.markdown import md_table_lines
from contract.physics import ratio_text
from contract.rows import Ceiling, clean_rows, run_ceilings
from contract.schema import (
    ROOFLINE_PNG,
    SCALING_PNG,
    SUMMARY_MD,
    atomic_write_text,
    mode_tag,
)
from contract.speedup import baseline_of
from roofline.report.energy import energy_sections
from roofline.report.findings import (
    above_roof_cause,
    above_roof_rows,
    as_dict,
    best_points,
    cache_bytes,
    cache_gaps,
    finite_or_none,
    in_canonical_order,
    launch_bound_rows,
    provider_ratios,
    ratio_summary,
    throttled_rows,
    warm_rows,
)
from roofline.report.providers import Table, provider_tables, step_table
from roofline.report.run_time import (
    compiled_ahead_line,
    compiles_line,
    row_time_sections,
    time_split_line,
)
from roofline.report.style import fmt_gbps, fmt_sig, fmt_tflops
from roofline.report.timing_settings import timing_settings
from roofline.report.withheld import withheld_sections


def _num(x: Any) -> str:
    """989.4, 66.9, 3350, 9.52, 0.000123; '-' for missing."""
    v = finite_or_none(x)
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _pct(x: Any, scale: float = 1.0) -> str:
    v = finite_or_none(x)
    return "-" if v is None else f"{v * scale:.1f}%"


def _ratio(x: Any) -> str:
    v = finite_or_none(x)
    return "-" if v is None else f"{v:.2f}x"


def _cell(x: Any) -> str:
    """A markdown table cell: pipes escaped, newlines folded (reasons are free text)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return str(x).replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip() or "-"


def _shape(r: Any) -> str:
    """A row's shape cell, with the row's mode when it is not its device's native one
    (schema.mode_tag: "warm" on a GPU, "cold" on a CPU)."""
    tag = mode_tag(r)
    return f"`{r['shape']}`" + (f" {tag}" if tag else "")


def md_table(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    """GitHub markdown table of escaped cells; `align` is one char per column: l or r
    (default l)."""
    return "\n".join(md_table_lines(header, [[_cell(c) for c in r] for r in rows], align))


# What each fp8 accumulation mode means for the fp8 matmul rows and the fp8 ceiling.
_FP8_ACCUM = {
    "fast": "fast (tensor-core accumulator over the whole K: Triton max_num_imprecise_acc "
            "= 2^30, torch._scaled_mm use_fast_accum=True), for the Triton kernel, torch and "
            "the fp8 ceiling alike",
    "precise": "precise (partial sums promoted to fp32 every 128 of K: Triton "
               "max_num_imprecise_acc = BLOCK_K, torch._scaled_mm use_fast_accum=False), "
               "for the Triton kernel, torch and the fp8 ceiling alike",
}


def _run_facts(meta: dict[str, Any]) -> str:
    def v(*keys: str) -> Any:
        for k in keys:
            if meta.get(k) not in (None, ""):
                return meta[k]
        return None

    # A partial run must say so before anyone reads its numbers.
    if meta.get("aborted"):
        why = meta.get("abort_reason") or "no reason recorded"
        status = (f"**aborted**: a CUDA error left the context unusable ({_cell(why)}); "
                  "partial results, the rows after it were not run")
    elif meta.get("interrupted"):
        status = "**interrupted**: partial results, the sweep did not finish"
    elif meta.get("complete") is False:
        status = "**incomplete**: the sweep had not finished when this was written"
    else:
        status = None
    if meta.get("check_only"):
        status = (status + "; " if status else "") + "correctness check only, no timing"

    versions = ", ".join(f"{k} {meta[k]}" for k in ("python", "torch", "triton", "cuda",
                                                   "driver") if meta.get(k))
    # Settings recorded as a mapping get a table of their own (_timing_section).
    timing = None if isinstance(meta.get("timing"), dict) else meta.get("timing")
    command = v("command")
    name, model = v("device_name", "gpu_name"), v("device_model")
    facts: list[tuple[str, Any]] = [
        ("status", status),
        ("device", f"{name or '?'} (`{v('device_key') or '?'}`)"),
        # The model whose peaks the rows use, when it is not the device itself (e.g. an
        # H200 run as --device h100, or "host CPU").
        ("device model", model if model and model != name else None),
        ("run", v("run_id")),
        ("date", v("created")),
        ("versions", versions or None),
        # Outside the declared bounds (contract/versions.py): the numbers may not hold.
        ("version warnings", "; ".join(map(str, meta.get("version_warnings") or [])) or None),
        ("git commit", v("git_commit")),
        ("command", f"`{command}`" if command else None),
        ("seed", v("seed")),
        ("sizes", v("sizes")),
        ("timing", timing),
        ("time", time_split_line(meta)),
        ("Triton compiles", compiles_line(meta)),
        ("compiled ahead", compiled_ahead_line(meta)),
        ("fp8 accumulation", _FP8_ACCUM.get(str(meta.get("fp8_accum")), meta.get("fp8_accum"))),
    ]
    for key, label in (("capability", "compute capability"), ("sms", "SMs"),
                       ("l2_mb", "L2 MiB"), ("gpu_memory_gb", "GPU memory GB"),
                       ("memory_gb", "memory GB"), ("cpu_cores", "CPU cores"),
                       ("cores", "CPU cores"), ("threads", "threads"),
                       ("platform", "platform")):
        val = meta.get(key)
        if val not in (None, "", []):
            facts.append((label, ".".join(map(str, val)) if isinstance(val, list) else val))
    for key in ("clocks", "power", "throttle"):
        if meta.get(key):
            val = meta[key]
            nice = _CLOCK_FACTS[key](val) if isinstance(val, dict) else None
            facts.append((key, nice or (json.dumps(val) if isinstance(val, dict | list)
                                        else val)))
    return "\n".join(f"- **{k}**: {val if k == 'status' else _cell(val)}"
                     for k, val in facts if val is not None)


def _timing_section(meta: dict[str, Any]) -> str | None:
    """The run's timing settings, one row each with what it means; None for a run that
    did not record them as a mapping (its `timing` fact says what it recorded)."""
    timing = meta.get("timing")
    if not isinstance(timing, dict) or not timing:
        return None
    rows = [[f"`{s.name}`", s.value, s.meaning] for s in timing_settings(timing)]
    return md_table(["setting", "value", "what it means"], rows)


def _mhz(v: Any) -> str | None:
    return f"{v:.0f} MHz" if isinstance(v, int | float) and math.isfinite(v) else None


def _clocks_fact(c: dict[str, Any]) -> str | None:
    med, lo, hi = (_mhz(c.get(k)) for k in ("sm_mhz_median", "sm_mhz_min", "sm_mhz_max"))
    if not med:
        return None
    text = f"SM {med} median while timing ({lo} to {hi})"
    if _mhz(c.get("sm_mhz_max_possible")):
        text += f", of a {_mhz(c['sm_mhz_max_possible'])} maximum"
    if _mhz(c.get("mem_mhz")):
        text += f"; memory {_mhz(c['mem_mhz'])}"
    return text


def _power_fact(p: dict[str, Any]) -> str | None:
    top, limit = p.get("max_w"), p.get("limit_w")
    if not isinstance(top, int | float):
        return None
    return f"{top:.0f} W peak" + (f" of a {limit:.0f} W limit"
                                 if isinstance(limit, int | float) else "")


def _throttle_fact(t: dict[str, Any]) -> str | None:
    n = t.get("throttled_rows")
    if n is None:
        return None
    frac = t.get("throttled_fraction_of_readings")
    seen = ", ".join(t.get("reasons_seen") or []) or "none"
    text = (f"{n} row(s) throttled after re-timing; throttle reasons seen: {seen}")
    if isinstance(frac, int | float):
        text += f" ({frac:.0%} of readings)"
    return text + (f"; threshold {t.get('threshold_pct'):g}% of the maximum SM clock, "
                   f"re-timed after {t.get('recovery_delay_s'):g} s"
                   if isinstance(t.get("threshold_pct"), int | float)
                   and isinstance(t.get("recovery_delay_s"), int | float) else "")


_CLOCK_FACTS = {"clocks": _clocks_fact, "power": _power_fact, "throttle": _throttle_fact}


def _throttled_section(df: pd.DataFrame) -> str:
    rows = [[r["kernel"], r["provider"], r["dtype"], _shape(r),
             _mhz(finite_or_none(r.get("sm_clock_mhz"))) or "-", r.get("reason") or ""]
            for _, r in in_canonical_order(throttled_rows(df)).iterrows()]
    return ("Timed while the GPU's SM clock sat below the throttle threshold (the clock-"
            "event reasons NVML gave are in the reason), still so after re-timing: their "
            "times describe a throttled GPU, and the regression gate gives them the "
            "verdict `throttled`.\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "SM clock", "reason"], rows,
                     "llllrl"))


def _launch_bound_section(df: pd.DataFrame) -> str:
    rows = [[r["kernel"], r["provider"], r["dtype"], _shape(r),
             f"{float(r['host_us']):.1f}", f"{float(r['ms_median']) * 1e3:.1f}",
             f"{float(r['host_us']) / (float(r['ms_median']) * 1e3):.1f}x"]
            for _, r in in_canonical_order(launch_bound_rows(df)).iterrows()]
    return ("Host dispatch per call (`host_us`: Python and launch, measured apart) longer "
            "than the device time: called back to back, these kernels leave the GPU "
            "waiting for the host, so their real cost is the dispatch. The timings "
            "themselves exclude it (CUDA graphs, or the GPU kept busy after each L2 "
            "flush).\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "host us/call", "device us",
                      "host / device"], rows, "llllrrr"))


def _ceilings_section(ceilings: dict[str, Ceiling], meta_ceilings: Any = None) -> str:
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
        return _pct(b / a, 100) if a and b else "-"

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
        note += "\n\nMeasured by: " + "; ".join(f"{k}: {_cell(m)}" for k, m in method.items())
    return md_table(["ceiling", "datasheet", "measured", "measured / datasheet"], rows,
                  "lllr") + note


def _best_section(df: pd.DataFrame, meta: dict[str, Any] | None = None) -> str:
    best = best_points(df, meta)
    n_above = len(above_roof_rows(df))
    note = (f"\n\n{n_above} row(s) above 100% of roof are left out: see Above 100% of roof."
            if n_above else "")
    if best.empty:
        return "No ok rows within their roof." + note if n_above else "No ok rows."
    rows = [[r.kernel, r.dtype, r.provider, f"`{r.shape}`", _num(r.tflops), _num(r.gbps),
             _pct(r.mfu, 100), _pct(r.pct_roof), _pct(r.pct_meas_roof), r.roof]
            for r in best.itertuples()]
    table = md_table(["kernel", "dtype", "provider", "shape", "TFLOP/s", "GB/s", "MFU",
                    "% of roof", "% of measured roof", "roof"], rows, "llllrrrrrl")
    if (best["roof"] == "cache").any():
        table += ("\n\nroof `cache`: on a CPU no flush runs between samples, so a footprint "
                  "that fits in the last-level cache is held against the measured cache "
                  "bandwidth (ceiling L2), not the DRAM one.")
    return table + note


def _above_roof_section(df: pd.DataFrame, meta: dict[str, Any]) -> str:
    rows = in_canonical_order(above_roof_rows(df))
    out = [[r["kernel"], r["provider"], r["dtype"], _shape(r),
            _pct(r["pct_roof"] if finite_or_none(r.get("pct_roof")) is not None
                 else r.get("pct_meas_roof")), r.get("timer"), above_roof_cause(r, meta)]
           for _, r in rows.iterrows()]
    return ("Faster than the roofline allows: a finding to explain, not a best point "
            "(column `above_roof`).\n\n"
            + md_table(["kernel", "provider", "dtype", "shape", "% of roof", "timer",
                      "likely cause"], out, "llllrll"))


def _ratio_section(df: pd.DataFrame) -> str:
    ratios = provider_ratios(df)
    if ratios.empty:
        return "No (kernel, dtype, shape) has ok rows from both providers."
    summary = ratio_summary(ratios)
    rows = [[r.kernel, r.dtype, r.n_shapes, r.n_unequal, _ratio(r.median), _ratio(r.min),
             _ratio(r.max), f"`{r.largest_shape}`",
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


def _gap_section(df: pd.DataFrame, meta: dict[str, Any]) -> str:
    gaps = cache_gaps(df, meta)
    if gaps.empty:
        return "No case has both an ok cold and an ok warm row to hold against each other."
    size, name = cache_bytes(meta)
    fits = (f"; `fits`: the footprint fits in the {size / 2**20:.4g} MiB {name}, the rows "
            "that show the gap" if size else "")

    def line(r: Any) -> list[Any]:
        yes = "-" if r.fits is None else ("yes" if r.fits else "no")
        return [r.kernel, r.provider, r.dtype, f"`{r.shape}`", f"{r.bytes / 2**20:.3g}",
                f"{r.cold_ms:.4g}", f"{r.warm_ms:.4g}", _ratio(r.gap), yes]

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


def _failed_section(df: pd.DataFrame) -> str:
    failed = df[df["status"] == "failed"]
    if failed.empty:
        return "None."
    failed = in_canonical_order(failed)
    rows = [[r["kernel"], r["provider"], r["dtype"], _shape(r),
             f"{r['rel_err']:.3g}" if finite_or_none(r.get("rel_err")) is not None else "-",
             f"{r['tolerance']:.3g}" if finite_or_none(r.get("tolerance")) is not None else "-",
             r.get("reason")] for _, r in failed.iterrows()]
    return md_table(["kernel", "provider", "dtype", "shape", "rel_err", "tolerance", "reason"],
                  rows, "llllrrl")


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


def render_summary(meta: dict[str, Any], df: pd.DataFrame) -> str:
    """The markdown text of summary.md.  `df`: the rows as the physics check left them
    (schema.load_run and the sweep's writer apply it), each withheld value empty and
    listed in the section "Numbers withheld"."""
    d = clean_rows(df)
    counts = d["status"].value_counts() if not d.empty else pd.Series(dtype=int)
    n = {s: int(counts.get(s, 0)) for s in ("ok", "failed", "skipped")}
    other = len(d) - sum(n.values())
    count_line = (f"{len(d)} rows: {n['ok']} ok, {n['failed']} failed, {n['skipped']} skipped"
                  + (f", {other} with another status" if other else ""))
    name = meta.get("device_name") or meta.get("device_key") or "unknown device"
    parts = [
        f"# Benchmark summary: {name}",
        _run_facts(meta),
        "## Ceilings",
        _ceilings_section(run_ceilings(meta, df), as_dict(meta.get("ceilings"))),
        "## Figures",
        f"![roofline]({ROOFLINE_PNG})\n\n![scaling]({SCALING_PNG})",
        "## Rows",
        count_line + ". Failed rows (wrong results) are left out of every table and figure "
                     "except the failed list below.",
        *withheld_sections(d, md_table),  # roofline/report/withheld.py
        "## Best point per kernel and dtype",
        "Highest % of roof (the roofline bound min(peak, intensity x bandwidth)); MFU is "
        "achieved / compute peak.\n\n" + _best_section(d, meta),
        *([f"## Above 100% of roof ({len(above_roof_rows(d))})",
           _above_roof_section(d, meta)] if len(above_roof_rows(d)) else []),
        "## Triton vs torch",
        _ratio_section(d),
        *([f"## Providers (against {baseline_of(meta)})",
           "Each provider's ms_median, then its speedup (the baseline's time / its own) "
           "with its SM clock and the baseline row's; `unequal clocks` where they differ "
           "by more than 2%: that ratio is the clocks' as much as the code's. The fastest "
           "per shape.\n\n" + _tables(provs)]
          if (provs := provider_tables(d, baseline_of(meta))) else []),
        *(["## The model's forward pass", _tables([step])]
          if (step := step_table(d, meta, baseline_of(meta))) else []),
        *(["## Warm vs cold", _gap_section(d, meta)]
          if warm_rows(d).any() and not warm_rows(d).all() else []),
        *([f"## Throttled rows ({len(throttled_rows(d))})", _throttled_section(d)]
          if len(throttled_rows(d)) else []),
        *([f"## Launch-bound rows ({len(launch_bound_rows(d))})", _launch_bound_section(d)]
          if len(launch_bound_rows(d)) else []),
        *energy_sections(meta, d, md_table),  # roofline/report/energy.py
        *row_time_sections(meta),  # roofline/report/run_time.py
        f"## Failed rows ({n['failed']})",
        _failed_section(d),
        f"## Skipped rows ({n['skipped']})",
        _skipped_section(d),
        *(["## Timing settings", timing] if (timing := _timing_section(meta)) else []),
    ]
    return "\n\n".join(parts) + "\n"


def write_summary(run_dir: Path, meta: dict[str, Any], df: pd.DataFrame) -> Path:
    """Write `run_dir/summary.md` atomically and return its path."""
    path = Path(run_dir) / SUMMARY_MD
    atomic_write_text(path, render_summary(meta, df))
    return path
