"""What a run's rows say, as data for summary.md: the roof each row is held to (the
cache roof for warm rows that fit in cache), the best point per kernel and dtype, rows
above their roof and why, Triton against torch, warm against cold, and throttled and
launch-bound rows.  The selections are made on the rows' frame (RunDoc.frame(), its
index the rows' order); a table's cells come from the typed rows (`records`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from contract.meta_parts import Measured
from contract.physics import clocks_differ
from contract.record import RunRow
from contract.rows import DTYPE_ORDER, clean_rows, kernel_order, l2_bytes
from contract.run_meta import JsonDoc, RunMeta
from contract.schema import WARM, cache_column, native_cache, parse_shape, row_cache

BEST_COLUMNS = ["kernel", "dtype", "provider", "shape", "tflops", "gbps", "mfu", "pct_roof",
                "pct_meas_roof", "intensity", "ms_median", "roof"]


def finite_or_none(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def in_canonical_order(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in canonical kernel, then dtype order (unknown names after known ones)."""
    k = {v: i for i, v in enumerate(kernel_order())}
    d = {v: i for i, v in enumerate(DTYPE_ORDER)}
    keyed = df.assign(_k=df["kernel"].map(lambda x: k.get(x, len(k))),
                      _d=df["dtype"].map(lambda x: d.get(x, len(d))))
    return keyed.sort_values(["_k", "kernel", "_d", "dtype"]).drop(columns=["_k", "_d"])


def records(rows: Sequence[RunRow], frame: pd.DataFrame) -> list[RunRow]:
    """The typed rows a selection of the rows' frame holds, in the selection's order (the
    frame's index is the rows' position: RunDoc.frame(), clean_rows keep it)."""
    return [rows[i] for i in frame.index]


def canonical_rows(rows: Sequence[RunRow]) -> list[RunRow]:
    """Typed rows in in_canonical_order's order."""
    if not rows:
        return []
    keys = pd.DataFrame({"kernel": [r.case.kernel for r in rows],
                         "dtype": [r.case.dtype for r in rows]})
    return records(rows, in_canonical_order(keys))


def as_dict(x: Any) -> JsonDoc:
    """A metadata sub-document (a JSON object one stage writes and a reader reads) as an
    object, {} where it is something else."""
    return x if isinstance(x, dict) else {}


# Shape keys that switch a variant on or off rather than size the problem.
SHAPE_FLAGS = frozenset({"causal"})


def _size(shape: Any) -> float:
    """Problem size of a shape string (product of its sizes) to find the largest shape;
    flags such as attention's `causal` (0 or 1) are not sizes and are left out."""
    try:
        dims = parse_shape(str(shape))
        return float(math.prod(v for k, v in dims.items() if k not in SHAPE_FLAGS))
    except ValueError:
        return 0.0


def _is_cpu(meta: RunMeta) -> bool:
    return meta.device.device_kind == "cpu" or meta.device.device_key == "cpu"


def warm_rows(df: pd.DataFrame) -> pd.Series:
    """Which rows were timed warm (back-to-back calls on the same buffers): column
    `cache`; a row without it has its device's native mode (schema.native_cache)."""
    return cache_column(df) == WARM


def one_mode(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of one cache mode, for tables that compare rows with each other (best
    points, Triton vs torch): those in their device's native mode (cold on a GPU, warm
    on a CPU: schema.native_cache), or all of a run with none.  The two modes are held
    against each other in their own section (cache_gaps)."""
    if df.empty:
        return df
    native = [row_cache(r) == native_cache(r) for r in df.to_dict("records")]
    mine = df[native]
    return mine if not mine.empty else df


def cache_bytes(meta: RunMeta) -> tuple[float | None, str]:
    """(bytes, name) of the cache a footprint may sit in: the CPU's last-level cache
    (metadata llc_mb), or the GPU's L2."""
    if _is_cpu(meta):
        mb = finite_or_none(meta.device.llc_mb)
        return (mb * 2**20 if mb else None), "last-level cache"
    return l2_bytes(meta), "L2"


def _measured(meta: RunMeta) -> Measured:
    """The run's measured ceilings as it recorded them (contract/ceilings.py's format)."""
    got = meta.ceilings.get("measured")
    return got if isinstance(got, dict) else Measured()


def _cache_gbps(meta: RunMeta) -> float | None:
    v = finite_or_none(_measured(meta).get("l2_gbps"))
    return v if v and v > 0 else None


def effective_roofs(df: pd.DataFrame, meta: RunMeta | None = None) -> pd.DataFrame:
    """Rows (cleaned) with `best_pct` and `roof` (which roof binds: compute, memory or
    cache) as the best-point table holds them.

    A warm row (and a CPU row written before the `cache` column: warm, native_cache)
    runs back to back on the same buffers, so a footprint that fits in the cache (the
    CPU's last-level cache, the GPU's L2) is served from it: such rows are held against
    the measured cache roof (min(compute peak, intensity x cache bandwidth)) instead of
    the memory one, where they would read as several hundred percent."""
    meta = meta or RunMeta()
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
    dram = finite_or_none(_measured(meta).get("hbm_gbps"))
    if gbps and dram:
        gbps = max(gbps, dram)  # a cache measured slower than DRAM is a bad measurement
    if size and gbps:
        fits = (d["bytes"] <= size) & warm_rows(d)
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


def above_roof_cause(r: RunRow, meta: RunMeta) -> str:
    """The likely reason a row beat its roof, most likely first."""
    size, name = cache_bytes(meta)
    nbytes = finite_or_none(r.accounting.bytes)
    ms = finite_or_none(r.timing.ms_median)
    if size and nbytes is not None and nbytes <= size:
        # A cold row was flushed or rotated past: its cache cannot explain it.
        flushed = " (timed warm: back-to-back calls on the same buffers)" \
            if r.case.cache == WARM else " despite the flush/rotation (check the timer)"
        return (f"cache-resident footprint: {nbytes / 2**20:.3g} MiB fits in the "
                f"{size / 2**20:.3g} MiB {name}, served faster than the memory roof{flushed}")
    if ms is not None and ms < 0.005:
        return (f"timer resolution: {ms * 1e3:.2g} us per call is close to what the timer "
                "resolves")
    if finite_or_none(r.accounting.peak_tflops) is None \
            or not as_dict(meta.ceilings.get("datasheet")):
        return ("measured ceiling too low: the kernel beat what the ceiling measurement "
                "reached (re-measure with --remeasure-ceilings)")
    return ("wrong FLOP or byte count (more than the kernel really does), or a datasheet "
            "peak below this device's clocks")


def best_points(df: pd.DataFrame, meta: RunMeta | None = None) -> pd.DataFrame:
    """The best ok row per (kernel, dtype): highest % of its roof, ties and rows without a
    roof broken by TFLOP/s, among the rows of one cache mode (one_mode: cold, unless the
    run has none).  Rows above their roof are findings (listed apart), not best
    points.  On a CPU, cache-resident rows are held against the cache roof
    (effective_roofs): `pct_roof` here is the % of the roof named in `roof`.
    Columns: BEST_COLUMNS."""
    d = effective_roofs(one_mode(df), meta)
    ok = d[d["status"] == "ok"] if not d.empty else d
    if not ok.empty:
        # A row whose time the physics check withheld has no rate to rank by.
        ok = ok[~(ok["best_pct"] > 100.0) & ok["tflops"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=BEST_COLUMNS)
    for col in BEST_COLUMNS:
        if col not in ok.columns:
            ok = ok.assign(**{col: None})
    ok = ok.assign(pct_roof=ok["best_pct"])
    ranked = ok.sort_values(["pct_roof", "tflops"], ascending=False, na_position="last")
    best = ranked.groupby(["kernel", "dtype"], sort=False).head(1)
    return in_canonical_order(best)[BEST_COLUMNS].reset_index(drop=True)


def provider_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, dtype, shape) where both providers have an ok row: torch and Triton
    median times and ratio = torch_ms / triton_ms (Triton's speed-up; > 1 means Triton is
    faster), and each row's SM clock (NaN where not known).  Same FLOPs on both sides, so
    it is also the TFLOP/s ratio.  Rows of one cache mode (one_mode), so a cold time is
    never divided by a warm one."""
    cols = ["kernel", "dtype", "shape", "torch_ms", "triton_ms", "ratio", "torch_mhz",
            "triton_mhz"]
    d = clean_rows(one_mode(df))
    if d.empty:
        return pd.DataFrame(columns=cols)
    if "sm_clock_mhz" not in d.columns:
        d = d.assign(sm_clock_mhz=float("nan"))
    d = d.assign(sm_clock_mhz=pd.to_numeric(d["sm_clock_mhz"], errors="coerce"))
    ok = d[(d["status"] == "ok") & (d["ms_median"] > 0)]
    key = ["kernel", "dtype", "shape"]
    torch_ = ok[ok["provider"] == "torch"][key + ["ms_median", "sm_clock_mhz"]].rename(
        columns={"ms_median": "torch_ms", "sm_clock_mhz": "torch_mhz"})
    triton_ = ok[ok["provider"] == "triton"][key + ["ms_median", "sm_clock_mhz"]].rename(
        columns={"ms_median": "triton_ms", "sm_clock_mhz": "triton_mhz"})
    both = torch_.merge(triton_, on=key)
    if both.empty:
        return pd.DataFrame(columns=cols)
    both["ratio"] = both["torch_ms"] / both["triton_ms"]
    return in_canonical_order(both)[cols].reset_index(drop=True)


def unequal_clocks(ratios: pd.DataFrame) -> pd.Series:
    """Which provider_ratios rows compare two rows timed at SM clocks more than 2% apart
    (contract.physics.clocks_differ): their ratio is the clocks' as much as the code's."""
    return pd.Series([clocks_differ(a, b) for a, b in
                      zip(ratios["triton_mhz"], ratios["torch_mhz"], strict=True)],
                     index=ratios.index, dtype=bool)


def ratio_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, dtype): shapes compared, how many of them at unequal clocks, the
    median/min/max ratio over the others (NaN where none is left), and the ratio at the
    largest shape (where launch overhead matters least, the number targets are set on)
    with its two clocks."""
    cols = ["kernel", "dtype", "n_shapes", "n_unequal", "median", "min", "max",
            "largest_shape", "ratio_at_largest", "triton_mhz", "torch_mhz"]
    out = []
    for col in ("triton_mhz", "torch_mhz"):  # a frame made without the clocks
        if col not in ratios.columns:
            ratios = ratios.assign(**{col: float("nan")})
    for (kernel, dtype), g in ratios.groupby(["kernel", "dtype"], sort=False):
        largest = g.loc[g["shape"].map(_size).idxmax()]
        unequal = unequal_clocks(g)
        equal = g.loc[~unequal, "ratio"]
        out.append([kernel, dtype, len(g), int(unequal.sum()), equal.median(), equal.min(),
                    equal.max(), largest["shape"], largest["ratio"], largest["triton_mhz"],
                    largest["torch_mhz"]])
    return pd.DataFrame(out, columns=cols)


def throttled_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows timed while the GPU throttled, after their re-timing (column `throttled`)."""
    if df.empty or "throttled" not in df.columns:
        return df.iloc[0:0]
    mark = df["throttled"].map(lambda v: v is True or str(v).strip().lower() == "true")
    return df[mark & (df["status"] == "ok")]


def launch_bound_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok GPU rows whose host dispatch per call (`host_us`) is longer than their device
    time: in a loop of such calls the GPU waits for Python, not the other way round."""
    if df.empty or "host_us" not in df.columns:
        return df.iloc[0:0]
    host = pd.to_numeric(df["host_us"], errors="coerce")
    device_us = pd.to_numeric(df["ms_median"], errors="coerce") * 1e3
    return df[(df["status"] == "ok") & (host > device_us)]


GAP_COLUMNS = ["kernel", "provider", "dtype", "shape", "bytes", "cold_ms", "warm_ms",
               "gap", "fits"]


def cache_gaps(df: pd.DataFrame, meta: RunMeta | None = None) -> pd.DataFrame:
    """Per (kernel, provider, dtype, shape) with an ok cold and an ok warm row: both
    median times, gap = cold / warm (> 1: the warm time is faster, what a cache-resident
    footprint buys back to back), and whether the footprint fits in the cache
    (cache_bytes: the GPU's L2, the CPU's last-level cache; None when unknown).
    Largest gap first.  Columns: GAP_COLUMNS."""
    d = clean_rows(df)
    if d.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    ok = d[(d["status"] == "ok") & (d["ms_median"] > 0)]
    key = ["kernel", "provider", "dtype", "shape"]
    warm = warm_rows(ok)
    cold_ = ok[~warm][key + ["bytes", "ms_median"]].rename(columns={"ms_median": "cold_ms"})
    warm_ = ok[warm][key + ["ms_median"]].rename(columns={"ms_median": "warm_ms"})
    both = cold_.merge(warm_, on=key)
    if both.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    both["gap"] = both["cold_ms"] / both["warm_ms"]
    size, _ = cache_bytes(meta or RunMeta())
    both["fits"] = [None if size is None or not math.isfinite(b) else bool(b <= size)
                    for b in both["bytes"]]
    return both.sort_values("gap", ascending=False)[GAP_COLUMNS].reset_index(drop=True)
