"""summary.md of a run: what ran where, against which ceilings, how close to the roof.

Sections, in order: run facts (device, date, versions, command), ceilings (datasheet and
measured side by side, with ridge points), the two figures, row counts, the best ok point
per (kernel, dtype), Triton/torch ratios, failed rows, skipped reasons.  Only ok rows
enter the performance tables: a failed row's speed belongs to a wrong answer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from roofline.devices import ROOF_CLASSES
from roofline.rows import DTYPE_ORDER, KERNEL_ORDER, Ceiling, clean_rows, l2_bytes, run_ceilings
from roofline.schema import ROOFLINE_PNG, SCALING_PNG, SUMMARY_MD, atomic_write_text, parse_shape
from roofline.style import fmt_gbps, fmt_sig, fmt_tflops

BEST_COLUMNS = ["kernel", "dtype", "provider", "shape", "tflops", "gbps", "mfu", "pct_roof",
                "pct_meas_roof", "intensity", "ms_median", "roof"]


# ------------------------------------------------------------------------------ formatting


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _num(x: Any) -> str:
    """989.4, 66.9, 3350, 9.52, 0.000123; '-' for missing."""
    v = _finite(x)
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def _pct(x: Any, scale: float = 1.0) -> str:
    v = _finite(x)
    return "-" if v is None else f"{v * scale:.1f}%"


def _ratio(x: Any) -> str:
    v = _finite(x)
    return "-" if v is None else f"{v:.2f}x"


def _cell(x: Any) -> str:
    """A markdown table cell: pipes escaped, newlines folded (reasons are free text)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return str(x).replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip() or "-"


def _table(header: list[str], rows: list[list[Any]], align: str = "") -> str:
    """GitHub markdown table; `align` is one char per column: l or r (default l)."""
    seps = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(seps) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in canonical kernel, then dtype order (unknown names after known ones)."""
    k = {v: i for i, v in enumerate(KERNEL_ORDER)}
    d = {v: i for i, v in enumerate(DTYPE_ORDER)}
    keyed = df.assign(_k=df["kernel"].map(lambda x: k.get(x, len(k))),
                      _d=df["dtype"].map(lambda x: d.get(x, len(d))))
    return keyed.sort_values(["_k", "kernel", "_d", "dtype"]).drop(columns=["_k", "_d"])


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _size(shape: Any) -> float:
    """Problem size of a shape string (product of its dims) to find the largest shape."""
    try:
        return float(math.prod(parse_shape(str(shape)).values()))
    except ValueError:
        return 0.0


# ------------------------------------------------------------------------------- analysis


def _is_cpu(meta: dict[str, Any]) -> bool:
    return meta.get("device_kind") == "cpu" or meta.get("device_key") == "cpu"


def cache_bytes(meta: dict[str, Any]) -> tuple[float | None, str]:
    """(bytes, name) of the cache a footprint may sit in: the CPU's last-level cache
    (metadata llc_mb), or the GPU's L2."""
    if _is_cpu(meta):
        mb = _finite(meta.get("llc_mb"))
        return (mb * 2**20 if mb else None), "last-level cache"
    return l2_bytes(meta), "L2"


def _cache_gbps(meta: dict[str, Any]) -> float | None:
    measured = _dict(_dict(meta.get("ceilings")).get("measured"))
    v = _finite(measured.get("l2_gbps"))
    return v if v and v > 0 else None


def effective_roofs(df: pd.DataFrame, meta: dict[str, Any] | None = None) -> pd.DataFrame:
    """Rows (cleaned) with `best_pct` and `roof` (which roof binds: compute, memory or
    cache) as the best-point table holds them.

    On a CPU no flush runs between samples, so a footprint that fits in the last-level
    cache is served from it: such rows are held against the measured cache roof
    (min(compute peak, intensity x cache bandwidth)) instead of the DRAM one, where they
    would read as several hundred percent."""
    meta = meta or {}
    d = clean_rows(df)
    if d.empty:
        return d.assign(best_pct=pd.Series(dtype=float), roof=pd.Series(dtype=object))
    for col in ("pct_roof", "pct_meas_roof", "roof_tflops", "peak_tflops", "meas_roof_tflops",
                "meas_peak_tflops", "tflops", "bytes", "intensity"):
        if col not in d.columns:
            d[col] = float("nan")
    pct = d["pct_roof"].fillna(d["pct_meas_roof"])
    roof = d["roof_tflops"].fillna(d["meas_roof_tflops"])
    peak = d["peak_tflops"].fillna(d["meas_peak_tflops"])
    memory = "DRAM" if _is_cpu(meta) else "HBM"
    kind = pd.Series([None] * len(d), index=d.index, dtype=object)
    kind[roof.notna()] = memory
    kind[roof.notna() & peak.notna() & (roof >= peak * (1 - 1e-9))] = "compute"
    size, _ = cache_bytes(meta)
    gbps = _cache_gbps(meta)
    dram = _finite(_dict(_dict(meta.get("ceilings")).get("measured")).get("hbm_gbps"))
    if gbps and dram:
        gbps = max(gbps, dram)  # a cache measured slower than DRAM is a bad measurement
    if _is_cpu(meta) and size and gbps:
        fits = d["bytes"] <= size
        cache_roof = (d["intensity"] * gbps / 1e3).where(peak.isna(),
                                                          (d["intensity"] * gbps / 1e3)
                                                          .clip(upper=peak))
        # Only rows that have a roof at all (fp8e5 matmul on a CPU has none).
        use = fits & roof.notna() & cache_roof.notna() & (cache_roof > 0)
        pct = pct.where(~use, 100.0 * d["tflops"] / cache_roof)
        kind[use] = "cache"
        kind[use & peak.notna() & (cache_roof >= peak * (1 - 1e-9))] = "compute"
    return d.assign(best_pct=pct, roof=kind)


def above_roof_rows(df: pd.DataFrame) -> pd.DataFrame:
    """ok rows faster than their roof: flagged by the run (above_roof) or, for runs
    written before that column, pct_roof (else pct_meas_roof) over 100."""
    d = clean_rows(df)
    if d.empty:
        return d
    pct = d["pct_roof"].fillna(d["pct_meas_roof"]) if "pct_meas_roof" in d else d["pct_roof"]
    flag = pct > 100.0
    if "above_roof" in d.columns:
        flag = flag | d["above_roof"].map(lambda v: v is True or v == 1 or v == "True")
    return d[(d["status"] == "ok") & flag]


def above_roof_cause(r: Any, meta: dict[str, Any]) -> str:
    """The likely reason a row beat its roof, most likely first."""
    size, name = cache_bytes(meta)
    nbytes = _finite(r.get("bytes"))
    ms = _finite(r.get("ms_median"))
    if size and nbytes is not None and nbytes <= size:
        flushed = "" if _is_cpu(meta) else " despite the flush/rotation (check the timer)"
        return (f"cache-resident footprint: {nbytes / 2**20:.3g} MiB fits in the "
                f"{size / 2**20:.3g} MiB {name}, served faster than the memory roof{flushed}")
    if ms is not None and ms < 0.005:
        return (f"timer resolution: {ms * 1e3:.2g} us per call is close to what the timer "
                "resolves")
    if _finite(r.get("peak_tflops")) is None or not _dict(
            _dict(meta.get("ceilings")).get("datasheet")):
        return ("measured ceiling too low: the kernel beat what the ceiling measurement "
                "reached (re-measure with --remeasure-ceilings)")
    return ("wrong FLOP or byte count (more than the kernel really does), or a datasheet "
            "peak below this device's clocks")


def best_points(df: pd.DataFrame, meta: dict[str, Any] | None = None) -> pd.DataFrame:
    """The best ok row per (kernel, dtype): highest % of its roof, ties and rows without a
    roof broken by TFLOP/s.  Rows above their roof are findings (listed apart), not best
    points.  On a CPU, cache-resident rows are held against the cache roof
    (effective_roofs): `pct_roof` here is the % of the roof named in `roof`.
    Columns: BEST_COLUMNS."""
    d = effective_roofs(df, meta)
    ok = d[d["status"] == "ok"] if not d.empty else d
    if not ok.empty:
        ok = ok[~(ok["best_pct"] > 100.0)]
    if ok.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    for col in BEST_COLUMNS:
        if col not in ok.columns:
            ok = ok.assign(**{col: None})
    ok = ok.assign(pct_roof=ok["best_pct"])
    ranked = ok.sort_values(["pct_roof", "tflops"], ascending=False, na_position="last")
    best = ranked.groupby(["kernel", "dtype"], sort=False).head(1)
    return _order(best)[BEST_COLUMNS].reset_index(drop=True)


def provider_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, dtype, shape) where both providers have an ok row: torch and Triton
    median times and ratio = torch_ms / triton_ms (Triton's speed-up; > 1 means Triton is
    faster).  Same FLOPs on both sides, so it is also the TFLOP/s ratio."""
    cols = ["kernel", "dtype", "shape", "torch_ms", "triton_ms", "ratio"]
    d = clean_rows(df)
    if d.empty:
        return pd.DataFrame(columns=cols)
    ok = d[(d["status"] == "ok") & (d["ms_median"] > 0)]
    key = ["kernel", "dtype", "shape"]
    torch_ = ok[ok["provider"] == "torch"][key + ["ms_median"]].rename(
        columns={"ms_median": "torch_ms"})
    triton_ = ok[ok["provider"] == "triton"][key + ["ms_median"]].rename(
        columns={"ms_median": "triton_ms"})
    both = torch_.merge(triton_, on=key)
    if both.empty:
        return pd.DataFrame(columns=cols)
    both["ratio"] = both["torch_ms"] / both["triton_ms"]
    return _order(both)[cols].reset_index(drop=True)


def ratio_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, dtype): shapes compared, median/min/max ratio, and the ratio at the
    largest shape (where launch overhead matters least, the number targets are set on)."""
    cols = ["kernel", "dtype", "n_shapes", "median", "min", "max", "largest_shape",
            "ratio_at_largest"]
    out = []
    for (kernel, dtype), g in ratios.groupby(["kernel", "dtype"], sort=False):
        largest = g.loc[g["shape"].map(_size).idxmax()]
        out.append([kernel, dtype, len(g), g["ratio"].median(), g["ratio"].min(),
                    g["ratio"].max(), largest["shape"], largest["ratio"]])
    return pd.DataFrame(out, columns=cols)


# ------------------------------------------------------------------------------- sections

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
    timing = meta.get("timing")
    if isinstance(timing, dict):
        timing = ", ".join(f"{k}={val}" for k, val in timing.items())
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
        ("git commit", v("git_commit")),
        ("command", f"`{command}`" if command else None),
        ("seed", v("seed")),
        ("sizes", v("sizes")),
        ("timing", timing),
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


def throttled_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows timed while the GPU throttled, after their re-timing (column `throttled`)."""
    if df.empty or "throttled" not in df.columns:
        return df.iloc[0:0]
    mark = df["throttled"].map(lambda v: v is True or str(v).strip().lower() == "true")
    return df[mark & (df["status"] == "ok")]


def _throttled_section(df: pd.DataFrame) -> str:
    rows = [[r["kernel"], r["provider"], r["dtype"], f"`{r['shape']}`",
             _mhz(_finite(r.get("sm_clock_mhz"))) or "-", r.get("reason") or ""]
            for _, r in _order(throttled_rows(df)).iterrows()]
    return ("Timed while the GPU slowed itself down (power cap, thermal, hardware slowdown, "
            "or an SM clock below the threshold), still so after re-timing: their times "
            "describe a throttled GPU, and the regression gate gives them the verdict "
            "`throttled`.\n\n"
            + _table(["kernel", "provider", "dtype", "shape", "SM clock", "reason"], rows,
                     "llllrl"))


def launch_bound_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok GPU rows whose host dispatch per call (`host_us`) is longer than their device
    time: in a loop of such calls the GPU waits for Python, not the other way round."""
    if df.empty or "host_us" not in df.columns:
        return df.iloc[0:0]
    host = pd.to_numeric(df["host_us"], errors="coerce")
    device_us = pd.to_numeric(df["ms_median"], errors="coerce") * 1e3
    return df[(df["status"] == "ok") & (host > device_us)]


def _launch_bound_section(df: pd.DataFrame) -> str:
    rows = [[r["kernel"], r["provider"], r["dtype"], f"`{r['shape']}`",
             f"{float(r['host_us']):.1f}", f"{float(r['ms_median']) * 1e3:.1f}",
             f"{float(r['host_us']) / (float(r['ms_median']) * 1e3):.1f}x"]
            for _, r in _order(launch_bound_rows(df)).iterrows()]
    return ("Host dispatch per call (`host_us`: Python and launch, measured apart) longer "
            "than the device time: called back to back, these kernels leave the GPU "
            "waiting for the host, so their real cost is the dispatch. The timings "
            "themselves exclude it (CUDA graphs, or the GPU kept busy after each L2 "
            "flush).\n\n"
            + _table(["kernel", "provider", "dtype", "shape", "host us/call", "device us",
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
    method = ((meta_ceilings or {}).get("measured") or {}).get("method")
    if isinstance(method, dict) and method:
        note += "\n\nMeasured by: " + "; ".join(f"{k}: {_cell(m)}" for k, m in method.items())
    return _table(["ceiling", "datasheet", "measured", "measured / datasheet"], rows,
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
    table = _table(["kernel", "dtype", "provider", "shape", "TFLOP/s", "GB/s", "MFU",
                    "% of roof", "% of measured roof", "roof"], rows, "llllrrrrrl")
    if (best["roof"] == "cache").any():
        table += ("\n\nroof `cache`: on a CPU no flush runs between samples, so a footprint "
                  "that fits in the last-level cache is held against the measured cache "
                  "bandwidth (ceiling L2), not the DRAM one.")
    return table + note


def _above_roof_section(df: pd.DataFrame, meta: dict[str, Any]) -> str:
    rows = _order(above_roof_rows(df))
    out = [[r["kernel"], r["provider"], r["dtype"], f"`{r['shape']}`",
            _pct(r["pct_roof"] if _finite(r.get("pct_roof")) is not None
                 else r.get("pct_meas_roof")), r.get("timer"), above_roof_cause(r, meta)]
           for _, r in rows.iterrows()]
    return ("Faster than the roofline allows: a finding to explain, not a best point "
            "(column `above_roof`).\n\n"
            + _table(["kernel", "provider", "dtype", "shape", "% of roof", "timer",
                      "likely cause"], out, "llllrll"))


def _ratio_section(df: pd.DataFrame) -> str:
    ratios = provider_ratios(df)
    if ratios.empty:
        return "No (kernel, dtype, shape) has ok rows from both providers."
    summary = ratio_summary(ratios)
    rows = [[r.kernel, r.dtype, r.n_shapes, _ratio(r.median), _ratio(r.min), _ratio(r.max),
             f"`{r.largest_shape}`", _ratio(r.ratio_at_largest)] for r in summary.itertuples()]
    head = ("Ratio = torch time / Triton time (> 1: Triton faster), over the shapes where "
            "both providers have an ok row.\n\n")
    detail = _table(["kernel", "dtype", "shape", "torch ms", "Triton ms", "ratio"],
                    [[r.kernel, r.dtype, f"`{r.shape}`", f"{r.torch_ms:.4g}",
                      f"{r.triton_ms:.4g}", _ratio(r.ratio)] for r in ratios.itertuples()],
                    "lllrrr")
    # The per-shape table can run to hundreds of rows: folded, so the summary stays short.
    return (head + _table(["kernel", "dtype", "shapes", "median", "min", "max",
                           "largest shape", "at largest"], rows, "llrrrrlr")
            + f"\n\n<details><summary>Per shape ({len(ratios)})</summary>\n\n{detail}\n\n"
              "</details>")


def _failed_section(df: pd.DataFrame) -> str:
    failed = df[df["status"] == "failed"]
    if failed.empty:
        return "None."
    failed = _order(failed)
    rows = [[r["kernel"], r["provider"], r["dtype"], f"`{r['shape']}`",
             f"{r['rel_err']:.3g}" if _finite(r.get("rel_err")) is not None else "-",
             f"{r['tolerance']:.3g}" if _finite(r.get("tolerance")) is not None else "-",
             r.get("reason")] for _, r in failed.iterrows()]
    return _table(["kernel", "provider", "dtype", "shape", "rel_err", "tolerance", "reason"],
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
    return _table(["reason", "rows", "kernels", "providers", "dtypes"], rows, "lrlll")


def render_summary(meta: dict[str, Any], df: pd.DataFrame) -> str:
    """The markdown text of summary.md."""
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
        _ceilings_section(run_ceilings(meta, df), _dict(meta.get("ceilings"))),
        "## Figures",
        f"![roofline]({ROOFLINE_PNG})\n\n![scaling]({SCALING_PNG})",
        "## Rows",
        count_line + ". Failed rows (wrong results) are left out of every table and figure "
                     "except the failed list below.",
        "## Best point per kernel and dtype",
        "Highest % of roof (the roofline bound min(peak, intensity x bandwidth)); MFU is "
        "achieved / compute peak.\n\n" + _best_section(d, meta),
        *([f"## Above 100% of roof ({len(above_roof_rows(d))})",
           _above_roof_section(d, meta)] if len(above_roof_rows(d)) else []),
        "## Triton vs torch",
        _ratio_section(d),
        *([f"## Throttled rows ({len(throttled_rows(d))})", _throttled_section(d)]
          if len(throttled_rows(d)) else []),
        *([f"## Launch-bound rows ({len(launch_bound_rows(d))})", _launch_bound_section(d)]
          if len(launch_bound_rows(d)) else []),
        f"## Failed rows ({n['failed']})",
        _failed_section(d),
        f"## Skipped rows ({n['skipped']})",
        _skipped_section(d),
    ]
    return "\n\n".join(parts) + "\n"


def write_summary(run_dir: Path, meta: dict[str, Any], df: pd.DataFrame) -> Path:
    """Write `run_dir/summary.md` atomically and return its path."""
    path = Path(run_dir) / SUMMARY_MD
    atomic_write_text(path, render_summary(meta, df))
    return path
