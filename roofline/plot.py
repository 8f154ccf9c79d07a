"""Roofline and scaling figures of a run, and `python -m roofline plot RUN`.

Two figures per run (DESIGN.md sections 1 and 3):

- roofline.png: log-log, arithmetic intensity (FLOP/byte) against TFLOP/s, one panel per
  benchmark dtype on shared axes.  Each panel draws the ceilings its rows are held
  against: the HBM slope (and an L2 slope when one was measured) and one flat roof per
  roof class (fp32 vector units for elementwise/dot/matvec rows, the dtype's tensor-core
  class for matmul).  Datasheet ceilings are solid, measured ones dashed; every ridge is
  marked and annotated with its value.  Only ok rows are plotted: a failed row produced a
  wrong result, so its speed means nothing.
- scaling.png: achieved GB/s (memory-bound kernels, against footprint in bytes) or TFLOP/s
  (matmul, against FLOPs) as the problem grows, one panel per kernel, one line per
  (provider, dtype), with the L2 size marked, so the launch-overhead regime at small
  sizes and the cache knee show.

Figures are built on matplotlib's object API with the Agg canvas (never pyplot), so
plotting works headless and leaves no global figure state behind.  Artists carry gids
and labels (``roof:datasheet:bf16``, ``ridge:measured:fp32``, ``points:bf16:matmul:triton``
...) so tests can check a figure's content without looking at pixels.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

from roofline.devices import DEVICES, ROOF_CLASS, ROOF_CLASSES
from roofline.schema import (
    KEY,
    ROOFLINE_PNG,
    SCALING_PNG,
    RunLoadError,
    check_metrics,
    load_run,
)

KERNEL_ORDER: tuple[str, ...] = ("add", "mul", "gelu", "gelu_erf", "dot", "matvec", "matmul")
DTYPE_ORDER: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8e5")
PROVIDER_ORDER: tuple[str, ...] = ("torch", "triton")
# Kernels compared against compute roofs as GEMMs; everything else is memory-bound by design.
COMPUTE_KERNELS: frozenset[str] = frozenset({"matmul"})

# Kernel colours avoid tab10 green/red/grey: green and red mean faster/slower on baseline
# arrows, grey is the ceilings.
_KERNEL_COLORS = {
    "add": "#1f77b4", "mul": "#ff7f0e", "gelu": "#9467bd", "gelu_erf": "#8c564b",
    "dot": "#e377c2", "matvec": "#17becf", "matmul": "#bcbd22",
}
_EXTRA_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173")
# add/mul and gelu/gelu_erf have the same intensity by construction and usually the same
# speed, so one would hide the other: the first of each pair (drawn first) is larger and
# shows as a ring around the second.  x is never jittered: intensity is exact.
_KERNEL_SIZES = {"add": 46, "mul": 18, "gelu": 46, "gelu_erf": 18}
_POINT_SIZE = 28
_DTYPE_COLORS = {
    "fp32": "#1f77b4", "tf32": "#17becf", "fp16": "#ff7f0e", "bf16": "#d62728",
    "fp8": "#2ca02c", "fp8e5": "#8c564b",
}
_PROVIDER_MARKERS = {"torch": "o", "triton": "^"}
_EXTRA_MARKERS = ("s", "D", "v", "P", "X")
_FASTER, _SLOWER = "#2ca02c", "#d62728"
_ROOF_COLOR = {"datasheet": "0.15", "measured": "0.40"}
_ROOF_STYLE = {"datasheet": "-", "measured": "--"}
_L2_STYLE = ":"
DPI = 140

_NUMERIC = (
    "flops", "bytes", "intensity", "ms_median", "ms_p20", "ms_p80", "n_samples", "tflops",
    "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "mfu", "pct_roof", "rel_err",
    "meas_peak_tflops", "meas_peak_gbps", "meas_roof_tflops", "pct_meas_roof", "tolerance",
)


# --------------------------------------------------------------------------- data helpers


def clean_rows(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with numeric columns coerced (JSON nulls and stray strings become NaN),
    intensity filled from flops/bytes where missing, and roof_class filled in for rows
    written before that column existed."""
    out = df.copy()
    for col in _NUMERIC:
        if col in out.columns:
            out[col] = pd.to_numeric(out[col], errors="coerce")
    for col in ("kernel", "provider", "dtype", "shape", "status", "reason"):
        if col not in out.columns:
            out[col] = None
    if "flops" in out.columns and "bytes" in out.columns:
        with np.errstate(divide="ignore", invalid="ignore"):
            derived = out["flops"] / out["bytes"].where(out["bytes"] > 0)
        out["intensity"] = out["intensity"].fillna(derived) if "intensity" in out else derived
    if "roof_class" not in out.columns:
        out["roof_class"] = None
    missing = out["roof_class"].isna()
    if missing.any():
        out.loc[missing, "roof_class"] = [
            row_roof_class(k, d) for k, d in zip(out.loc[missing, "kernel"],
                                                  out.loc[missing, "dtype"], strict=True)
        ]
    return out


def row_roof_class(kernel: str, dtype: str) -> str:
    """The roof a row is held against when the row does not say: GEMMs run on the
    dtype's tensor cores, every other kernel on the fp32 vector units."""
    if kernel in COMPUTE_KERNELS:
        return ROOF_CLASS.get(dtype, dtype)
    return "fp32"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that can be plotted: status ok with a positive, finite intensity and TFLOP/s.

    Failed rows are excluded on purpose: a wrong kernel must never look fast."""
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0]
    d = df[df["status"] == "ok"]
    for col in ("intensity", "tflops"):
        if col not in d.columns:
            return d.iloc[0:0]
        d = d[np.isfinite(d[col].astype(float)) & (d[col].astype(float) > 0)]
    return d


def _ordered(values: Iterable[Any], order: Iterable[str]) -> list[str]:
    """Known values in canonical order, then unknown ones sorted (new kernels/dtypes)."""
    present = {str(v) for v in values if isinstance(v, str) and v}
    known = [v for v in order if v in present]
    return known + sorted(present - set(known))


def _pos(x: Any) -> float | None:
    """x as a positive finite float, else None (nulls, NaN, zero, junk)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


@dataclass(frozen=True)
class Ceiling:
    """One set of ceilings (datasheet or measured) of a run."""

    source: str  # "datasheet" or "measured"
    tflops: dict[str, float] = field(default_factory=dict)  # roof class -> TFLOP/s
    hbm_gbps: float | None = None
    l2_gbps: float | None = None

    def ridge(self, roof_class: str) -> float | None:
        """FLOP/byte where the HBM slope meets this roof (TFLOP/s / GB/s x 1e3)."""
        peak = self.tflops.get(roof_class)
        if peak is None or not self.hbm_gbps:
            return None
        return peak * 1e3 / self.hbm_gbps


def _ceiling_from(source: str, doc: Any) -> Ceiling | None:
    if not isinstance(doc, dict):
        return None
    raw = doc.get("tflops") or {}
    tflops = {str(k): v for k, v in ((k, _pos(v)) for k, v in raw.items()) if v is not None} \
        if isinstance(raw, dict) else {}
    c = Ceiling(source, tflops, _pos(doc.get("hbm_gbps")), _pos(doc.get("l2_gbps")))
    return c if (c.tflops or c.hbm_gbps or c.l2_gbps) else None


def run_ceilings(meta: dict[str, Any], df: pd.DataFrame | None = None) -> dict[str, Ceiling]:
    """{"datasheet": Ceiling, "measured": Ceiling}, each present only when known.

    Reads metadata["ceilings"] (format in roofline/ceilings.py).  A run written without
    that key falls back on the device table for the datasheet and on the rows'
    meas_peak_* columns for the measured values, so older runs still plot."""
    out: dict[str, Ceiling] = {}
    ceil = meta.get("ceilings")
    if isinstance(ceil, dict):
        for source in ("datasheet", "measured"):
            c = _ceiling_from(source, ceil.get(source))
            if c is not None:
                out[source] = c
        return out
    dev = DEVICES.get(str(meta.get("device_key") or meta.get("device") or ""))
    if dev is not None and dev.peaks_tflops:
        out["datasheet"] = Ceiling("datasheet", dict(dev.peaks_tflops), dev.hbm_gbps)
    if df is not None and not df.empty and "meas_peak_tflops" in df.columns:
        d = clean_rows(df)
        peaks = d.dropna(subset=["meas_peak_tflops"]).groupby("roof_class")["meas_peak_tflops"]
        tflops = {str(k): float(v) for k, v in peaks.max().items() if _pos(v)}
        gbps = _pos(d["meas_peak_gbps"].max()) if "meas_peak_gbps" in d.columns else None
        if tflops or gbps:
            out["measured"] = Ceiling("measured", tflops, gbps)
    return out


def l2_bytes(meta: dict[str, Any]) -> float | None:
    """L2 size in bytes from metadata["l2_mb"], else the device table (MiB, as CUDA reports)."""
    mb = _pos(meta.get("l2_mb"))
    if mb is None:
        dev = DEVICES.get(str(meta.get("device_key") or ""))
        mb = _pos(dev.l2_mb) if dev is not None else None
    return None if mb is None else mb * 2**20


# ------------------------------------------------------------------------------ formatting


def fmt_sig(x: float) -> str:
    """3 significant digits without scientific notation: 295, 20, 148, 1977, 0.523."""
    if x >= 1000:
        return f"{x:.0f}"
    return f"{x:.3g}"


def fmt_tflops(x: float) -> str:
    """Datasheet-style TFLOP/s: 989.4, 66.9, 1978.9; small (CPU) values keep 3 digits."""
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def fmt_gbps(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _fmt_bytes(x: float, _pos_: Any = None) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:g} {unit}"
    return f"{x:g} B"


class _PlainLogFormatter(LogFormatter):
    """LogFormatter's choice of which ticks get a label (minor ones only on short axes),
    written as plain numbers: 20, 0.6, 1000 rather than 2x10^1, 6e-01, 10^3."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def _title(meta: dict[str, Any], what: str) -> str:
    name = meta.get("device_name") or meta.get("gpu_name") or meta.get("device_key") or "?"
    key = meta.get("device_key")
    head = f"{what}: {name}" + (f" ({key})" if key and key != name else "")
    # Three short lines rather than one long one: a one-panel figure is narrow, and a
    # long centred title would run into the legend on the right.
    run = []
    created = str(meta.get("created") or "")
    if created:
        run.append(created[:16].replace("T", " "))
    if meta.get("run_id"):
        run.append(f"run {meta['run_id']}")
    if meta.get("git_commit"):
        run.append(f"git {str(meta['git_commit'])[:10]}")
    versions = [f"{k} {meta[k]}" for k in ("torch", "triton", "python") if meta.get(k)]
    lines = [head] + ["  |  ".join(b) for b in (run, versions) if b]
    return "\n".join(lines)


def _kernel_color(kernel: str, kernels: list[str]) -> str:
    if kernel in _KERNEL_COLORS:
        return _KERNEL_COLORS[kernel]
    unknown = [k for k in kernels if k not in _KERNEL_COLORS]
    return _EXTRA_COLORS[unknown.index(kernel) % len(_EXTRA_COLORS)]


def _provider_marker(provider: str, providers: list[str]) -> str:
    if provider in _PROVIDER_MARKERS:
        return _PROVIDER_MARKERS[provider]
    unknown = [p for p in providers if p not in _PROVIDER_MARKERS]
    return _EXTRA_MARKERS[unknown.index(provider) % len(_EXTRA_MARKERS)]


def _dtype_color(dtype: str, dtypes: list[str]) -> str:
    if dtype in _DTYPE_COLORS:
        return _DTYPE_COLORS[dtype]
    unknown = [d for d in dtypes if d not in _DTYPE_COLORS]
    return _EXTRA_COLORS[unknown.index(dtype) % len(_EXTRA_COLORS)]


def _new_figure(width: float, height: float) -> Figure:
    # Constrained layout keeps the outside legend, suptitle and shared labels apart.
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _grid(n: int) -> tuple[int, int]:
    ncols = {1: 1, 2: 2, 3: 3, 4: 2}.get(n, 3)
    return math.ceil(n / ncols), ncols


def _tidy_grid(fig: Figure, axes: np.ndarray, n: int) -> list[Any]:
    """Drop the unused cells of a shared grid, and give x tick labels back to a panel that
    now has no panel under it (sharex hid them)."""
    nrows, ncols = axes.shape
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.remove()
    used = flat[:n]
    for i, ax in enumerate(used):
        if i + ncols >= n:  # nothing below it
            ax.xaxis.set_tick_params(which="both", labelbottom=True)
    return used


def save_figure(fig: Figure, out: str | os.PathLike) -> Path:
    """Write the figure as PNG atomically (temp file + rename): a crash mid-write never
    leaves a truncated image in place of a good one."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# -------------------------------------------------------------------------------- roofline


def _panel_classes(rows: pd.DataFrame) -> list[str]:
    return _ordered(rows["roof_class"].dropna().unique(), ROOF_CLASSES)


def _limits(points: list[pd.DataFrame], ceilings: dict[str, Ceiling],
            classes: list[str]) -> tuple[tuple[float, float], tuple[float, float]]:
    """Shared axis limits: every point, every ridge, and headroom above the top roof for
    the ridge labels."""
    xs: list[float] = [0.05, 10.0]
    ys: list[float] = []
    for p in points:
        xs += list(p["intensity"].astype(float))
        ys += list(p["tflops"].astype(float))
    peaks: list[float] = []
    for c in ceilings.values():
        for cls in classes:
            if cls in c.tflops:
                peaks.append(c.tflops[cls])
                r = c.ridge(cls)
                if r:
                    xs.append(r)
    xlo = min(xs) / 2.5
    # Room right of the last ridge so every flat roof shows as a segment.
    xhi = max(xs) * 5
    top = max(peaks + ys) if (peaks or ys) else 1.0
    # Low enough for the slowest point and for the slopes to enter from the left edge,
    # and always at least three decades so the slope reads as a slope.
    lows = ys + [xlo * 4 * c.hbm_gbps / 1e3 for c in ceilings.values() if c.hbm_gbps]
    ylo = min((min(lows) if lows else top) / 3, top / 1e3)
    # Headroom above the top roof keeps the label block clear of the slopes.
    return (xlo, xhi), (ylo, top * 12)


def _draw_ceilings(ax: Any, ceilings: dict[str, Ceiling], classes: list[str],
                   xlim: tuple[float, float]) -> None:
    """Slopes and flat roofs of one panel, each ridge marked and labelled.

    Labels are stacked in the panel's upper-left corner, a region that is always empty
    (it lies above every slope, and no point can beat its roof), each roof's label tied
    to its ridge marker by a thin leader line.  Labels placed next to the ridges collide
    whenever two roofs are close (datasheet vs measured, or fp32 vs bf16 on a CPU) and
    land on the points near the roof; the corner block avoids both."""
    x0, x1 = xlim
    # (peak, text, gid, colour, ridge xy or None)
    labels: list[tuple[float, str, str, str, tuple[float, float] | None]] = []
    for source in ("datasheet", "measured"):
        c = ceilings.get(source)
        if c is None:
            continue
        style, color = _ROOF_STYLE[source], _ROOF_COLOR[source]
        tag = "" if source == "datasheet" else " (measured)"
        # Roofs with equal peaks (fp16 and bf16 on every NVIDIA part) are one line.
        by_peak: dict[float, list[str]] = {}
        for cls in classes:
            if cls in c.tflops:
                by_peak.setdefault(c.tflops[cls], []).append(cls)
        ridges = {p: p * 1e3 / c.hbm_gbps for p in by_peak} if c.hbm_gbps else {}
        if c.hbm_gbps:
            # The slope runs up to the highest ridge; lower roofs cut across it.
            x_end = max(ridges.values()) if ridges else x1
            ax.plot([x0, x_end], [x0 * c.hbm_gbps / 1e3, x_end * c.hbm_gbps / 1e3],
                    linestyle=style, color=color, lw=1.3, zorder=1,
                    label=f"HBM {source} {fmt_gbps(c.hbm_gbps)} GB/s", gid=f"roof:{source}:hbm")
        if c.l2_gbps:
            top = max(by_peak) if by_peak else None
            x_end = top * 1e3 / c.l2_gbps if top else x1
            ax.plot([x0, x_end], [x0 * c.l2_gbps / 1e3, x_end * c.l2_gbps / 1e3],
                    linestyle=_L2_STYLE, color=color, lw=1.2, zorder=1,
                    label=f"L2 {source} {fmt_gbps(c.l2_gbps)} GB/s", gid=f"roof:{source}:l2")
        for peak, group in by_peak.items():
            name = "/".join(group)
            ridge = ridges.get(peak)
            ax.plot([ridge or x0, x1], [peak, peak], linestyle=style, color=color, lw=1.3,
                    zorder=1, label=f"{name} {source} {fmt_tflops(peak)} TFLOP/s",
                    gid=f"roof:{source}:{name}")
            text = f"{name} {fmt_tflops(peak)} TFLOP/s"
            xy = None
            if ridge:
                ax.plot([ridge], [peak], marker="o", ms=5, color=color,
                        mfc="white" if source == "measured" else color, zorder=2,
                        gid=f"ridge-marker:{source}:{name}")
                text += f", ridge {fmt_sig(ridge)} FLOP/B"
                xy = (ridge, peak)
            labels.append((peak, text + tag, f"ridge:{source}:{name}", color, xy))
    # Rows held against a roof nobody recorded (e.g. fp16 on a CPU that measured only fp32
    # and bf16) are plotted without a roof: say so rather than leave the reader guessing.
    for cls in classes:
        if not any(cls in c.tflops for c in ceilings.values()):
            labels.append((0.0, f"{cls}: no ceiling recorded", f"ridge:none:{cls}", "0.4", None))
    # Highest roof on top, so leader lines fan out downwards without crossing.
    labels.sort(key=lambda t: -t[0])
    for i, (_, text, gid, color, xy) in enumerate(labels):
        pos = (0.03, 0.97 - 0.052 * i)
        # The box keeps lines (grid, L2 slope, the leader of the label above, which is drawn
        # earlier) from cutting through the text, and clips this label's own leader to the
        # box edge nearest its marker.  Points (zorder 4) still draw over it.
        kw: dict[str, Any] = dict(
            fontsize=7, color=color, ha="left", va="top", zorder=2.5, gid=gid,
            annotation_clip=False,
            bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.9))
        if xy is None:
            ax.annotate(text, xy=pos, xycoords="axes fraction", **kw)
        else:
            ax.annotate(text, xy=xy, xytext=pos, textcoords="axes fraction", **kw,
                        arrowprops=dict(arrowstyle="-", color=color, lw=0.6, alpha=0.7,
                                        shrinkA=0, shrinkB=4))


def _draw_points(ax: Any, rows: pd.DataFrame, dtype: str, kernels: list[str],
                 providers: list[str]) -> int:
    n = 0
    for kernel in _ordered(rows["kernel"].unique(), KERNEL_ORDER):
        for provider in _ordered(rows["provider"].unique(), PROVIDER_ORDER):
            sel = rows[(rows["kernel"] == kernel) & (rows["provider"] == provider)]
            if sel.empty:
                continue
            ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float),
                       s=_KERNEL_SIZES.get(kernel, _POINT_SIZE),
                       marker=_provider_marker(provider, providers),
                       color=_kernel_color(kernel, kernels), alpha=0.85,
                       edgecolors="white", linewidths=0.5, zorder=4,
                       label=f"{kernel} {provider}", gid=f"points:{dtype}:{kernel}:{provider}")
            n += len(sel)
    return n


def _draw_baseline(ax: Any, new: pd.DataFrame, old: pd.DataFrame, dtype: str,
                   providers: list[str]) -> None:
    """Baseline points hollow grey; an arrow from each baseline point to the same
    (kernel, provider, dtype, shape) in this run, green when faster, red when slower.
    Changes under 2% get no arrow: at that size they are noise and only add clutter."""
    for (kernel, provider), sel in old.groupby(["kernel", "provider"], sort=True):
        ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float),
                   s=_KERNEL_SIZES.get(kernel, _POINT_SIZE),
                   marker=_provider_marker(provider, providers), facecolors="none",
                   edgecolors="0.55", linewidths=0.8, zorder=3,
                   gid=f"baseline:{dtype}:{kernel}:{provider}")
    pairs = old.merge(new, on=KEY, suffixes=("_old", "_new"))
    for _, r in pairs.iterrows():
        ratio = r["tflops_new"] / r["tflops_old"]
        if abs(math.log(ratio)) < math.log(1.02):
            continue
        ax.annotate("", xy=(r["intensity_new"], r["tflops_new"]),
                    xytext=(r["intensity_old"], r["tflops_old"]),
                    arrowprops=dict(arrowstyle="->", lw=0.8, shrinkA=2, shrinkB=3,
                                    color=_FASTER if ratio > 1 else _SLOWER),
                    zorder=3.5, gid=f"arrow:{r['kernel']}:{r['provider']}:{dtype}:{r['shape']}")


def _legend(fig: Figure, kernels: list[str], providers: list[str],
            ceilings: dict[str, Ceiling], baseline: bool) -> None:
    handles: list[Any] = []
    for k in kernels:
        size = math.sqrt(_KERNEL_SIZES.get(k, _POINT_SIZE))  # scatter s is area, ms is width
        handles.append(Line2D([], [], ls="", marker="o", ms=size,
                              color=_kernel_color(k, kernels), label=k))
    for p in providers:
        handles.append(Line2D([], [], ls="", marker=_provider_marker(p, providers), ms=6,
                              color="0.3", label=p))
    # The bandwidths are the same in every panel, so they are stated once, here.
    for source in ("datasheet", "measured"):
        c = ceilings.get(source)
        if c is None:
            continue
        hbm = f"\nHBM {fmt_gbps(c.hbm_gbps)} GB/s" if c.hbm_gbps else ""
        handles.append(Line2D([], [], ls=_ROOF_STYLE[source], color=_ROOF_COLOR[source],
                              label=f"{source} roof{hbm}"))
        if c.l2_gbps:
            handles.append(Line2D([], [], ls=_L2_STYLE, color=_ROOF_COLOR[source],
                                  label=f"{source} L2\n{fmt_gbps(c.l2_gbps)} GB/s"))
    if baseline:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.55",
                              label="baseline"))
        handles.append(Line2D([], [], color=_FASTER, label="faster (>2%)"))
        handles.append(Line2D([], [], color=_SLOWER, label="slower (>2%)"))
    if handles:
        # Outside the axes: with hundreds of points no corner of a panel is free.
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


def plot_roofline(meta: dict[str, Any], df: pd.DataFrame, out: str | os.PathLike | None = None,
                  baseline: tuple[dict[str, Any], pd.DataFrame] | None = None) -> Figure:
    """Roofline figure of a run: one panel per dtype, shared log-log axes.

    `baseline=(meta_b, df_b)` overlays a previous run: hollow grey points, and arrows from
    each old point to the new one where they moved by more than 2%.  Writes a PNG to `out`
    when given and returns the Figure either way."""
    d = clean_rows(df)
    ceilings = run_ceilings(meta, df)
    ok = ok_rows(d)
    old = ok_rows(clean_rows(baseline[1])) if baseline is not None else None

    dtypes = _ordered(d["dtype"].unique(), DTYPE_ORDER) if not d.empty else []
    kernels = _ordered(ok["kernel"].unique(), KERNEL_ORDER)
    providers = _ordered(ok["provider"].unique(), PROVIDER_ORDER)
    if old is not None:
        kernels = _ordered(set(kernels) | set(old["kernel"].unique()), KERNEL_ORDER)
        providers = _ordered(set(providers) | set(old["provider"].unique()), PROVIDER_ORDER)

    # One panel per dtype in the run (a dtype whose rows all failed keeps its panel so the
    # gap is visible); a run with no rows at all gets one panel with every known roof.
    if dtypes:
        panels = [(dt, d[d["dtype"] == dt], _panel_classes(d[d["dtype"] == dt]))
                  for dt in dtypes]
    else:
        classes = _ordered({k for c in ceilings.values() for k in c.tflops}, ROOF_CLASSES)
        panels = [("all dtypes", d, classes)]

    all_classes = sorted({c for _, _, cl in panels for c in cl})
    pts = [ok] + ([old] if old is not None and not old.empty else [])
    xlim, ylim = _limits([p for p in pts if not p.empty], ceilings, all_classes)

    nrows, ncols = _grid(len(panels))
    fig = _new_figure(max(4.3 * ncols + 1.6, 8.0), 4.2 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    used = _tidy_grid(fig, axes, len(panels))
    for i, (ax, (dtype, rows, classes)) in enumerate(zip(used, panels, strict=True)):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_box_aspect(1)  # square panels: a slope of 1 looks like one in every panel
        # Axes span ~7 decades: minor tick labels would only be noise.
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
        ax.set_axisbelow(True)
        _draw_ceilings(ax, ceilings, classes, xlim)
        panel_ok = ok[ok["dtype"] == dtype] if dtypes else ok
        n = _draw_points(ax, panel_ok, dtype, kernels, providers)
        if old is not None:
            _draw_baseline(ax, panel_ok, old[old["dtype"] == dtype] if dtypes else old,
                           dtype, providers)
        status = rows["status"].value_counts() if not rows.empty else pd.Series(dtype=int)
        extra = ", ".join(f"{int(status[s])} {s}" for s in ("failed", "skipped") if s in status)
        title = f"{dtype}: {n} points" + (f" ({extra}, not plotted)" if extra else "")
        ax.set_title(title if dtypes else "no rows in this run: every known roof", fontsize=10)
        if n == 0:
            # Lower right: below every roof and slope, so the note covers no line.
            ax.text(0.95, 0.05, "no ok rows" + (f"\n({extra})" if extra else ""),
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=11,
                    color="0.35", gid="note:no-ok-rows",
                    bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.8"))
        if not ceilings:
            ax.text(0.5, 0.92, "no ceilings in this run", transform=ax.transAxes,
                    ha="center", fontsize=8, color="0.35", gid="note:no-ceilings")
        if i % ncols == 0:
            ax.set_ylabel("TFLOP/s")
        if i + ncols >= len(panels):
            ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    title = _title(meta, "Roofline")
    if baseline is not None:
        title += f"\nvs baseline {baseline[0].get('run_id') or '?'} (hollow grey)"
    fig.suptitle(title, fontsize=11)
    _legend(fig, kernels, providers, ceilings, baseline is not None)
    if out is not None:
        save_figure(fig, out)
    return fig


# --------------------------------------------------------------------------------- scaling


def plot_scaling(meta: dict[str, Any], df: pd.DataFrame,
                 out: str | os.PathLike | None = None) -> Figure:
    """How throughput grows with problem size: one panel per kernel, a line per
    (provider, dtype).

    Memory-bound kernels plot achieved GB/s against their footprint (compulsory bytes)
    with the HBM ceilings as horizontal lines and the L2 size as a vertical one: tiny
    sizes sit far below the roof (launch overhead), and the L2 knee shows where the
    footprint stops fitting in cache.  matmul plots TFLOP/s against FLOPs with one
    horizontal roof per roof class present."""
    d = clean_rows(df)
    ok = ok_rows(d)
    ok = ok[np.isfinite(ok["bytes"]) & (ok["bytes"] > 0)] if "bytes" in ok.columns else ok
    ceilings = run_ceilings(meta, df)
    l2 = l2_bytes(meta)
    kernels = _ordered(ok["kernel"].unique(), KERNEL_ORDER)
    dtypes = _ordered(ok["dtype"].unique(), DTYPE_ORDER)
    providers = _ordered(ok["provider"].unique(), PROVIDER_ORDER)

    n = max(1, len(kernels))
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = _new_figure(max(4.2 * ncols + 1.5, 8.0), 3.6 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    used = _tidy_grid(fig, axes, n)
    if not kernels:
        ax = used[0]
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no ok rows", transform=ax.transAxes, ha="center", va="center",
                fontsize=12, color="0.35", gid="note:no-ok-rows")
    for ax, kernel in zip(used, kernels, strict=False):
        rows = ok[ok["kernel"] == kernel]
        compute = kernel in COMPUTE_KERNELS
        xcol, ycol = ("flops", "tflops") if compute else ("bytes", "gbps")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="major", color="0.9", lw=0.6)
        ax.set_axisbelow(True)
        for dtype in dtypes:
            for provider in providers:
                sel = rows[(rows["dtype"] == dtype) & (rows["provider"] == provider)]
                sel = sel[np.isfinite(sel[ycol]) & (sel[ycol] > 0)].sort_values(xcol)
                if sel.empty:
                    continue
                ax.plot(sel[xcol], sel[ycol], marker=_provider_marker(provider, providers),
                        ms=4, lw=1.2, color=_dtype_color(dtype, dtypes),
                        ls="-" if provider == "torch" else "--", zorder=3,
                        label=f"{dtype} {provider}", gid=f"scaling:{kernel}:{provider}:{dtype}")
        if compute:
            classes = _panel_classes(rows)
            _scaling_roofs(ax, ceilings, {c: c for c in classes}, "TFLOP/s")
            ax.set_xlabel("problem size (FLOPs)")
            ax.set_ylabel("TFLOP/s")
        else:
            _scaling_roofs(ax, ceilings, {"HBM": "hbm_gbps", "L2": "l2_gbps"}, "GB/s")
            ax.xaxis.set_major_formatter(FuncFormatter(_fmt_bytes))
            ax.set_xlabel("footprint (compulsory bytes)")
            ax.set_ylabel("GB/s")
            if l2:
                xs = rows["bytes"]
                ax.axvline(l2, color="0.3", lw=1.0, ls="-.", zorder=2, gid="l2-size",
                           label=f"L2 {l2 / 2**20:g} MiB")
                # Label only when the line is inside the data's range, else it would
                # stretch the axes to show an empty decade.
                if xs.min() <= l2 <= xs.max():
                    ax.text(l2, 0.03, f" L2 {l2 / 2**20:g} MiB", transform=ax.get_xaxis_transform(),
                            fontsize=7, color="0.3", ha="left", va="bottom", gid="l2-label")
                else:
                    ax.set_xlim(xs.min() / 1.5, xs.max() * 1.5)
        # Plain numbers ("20", "0.6"), not "2 x 10^1": a CPU panel can span under a decade,
        # where matplotlib labels minor ticks in scientific notation.
        ax.yaxis.set_major_formatter(_PlainLogFormatter())
        ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False,
                                                        minor_thresholds=(1, 0.5)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(kernel, fontsize=10)
        ax.tick_params(labelsize=8)
    fig.suptitle(_title(meta, "Scaling"), fontsize=11)
    handles: list[Any] = [Line2D([], [], color=_dtype_color(dt, dtypes), lw=2, label=dt)
                          for dt in dtypes]
    handles += [Line2D([], [], color="0.3", marker=_provider_marker(p, providers), ms=5,
                       ls="-" if p == "torch" else "--", label=p) for p in providers]
    handles += [Line2D([], [], color=_ROOF_COLOR[s], ls=_ROOF_STYLE[s], label=f"{s} ceiling")
                for s in ("datasheet", "measured") if s in ceilings]
    if l2:
        handles.append(Line2D([], [], color="0.3", ls="-.", label="L2 size"))
    if kernels:
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    if out is not None:
        save_figure(fig, out)
    return fig


def _scaling_roofs(ax: Any, ceilings: dict[str, Ceiling], what: dict[str, str],
                   unit: str) -> None:
    """Horizontal ceilings on a scaling panel: `what` maps a label to a roof class (for
    TFLOP/s) or to a Ceiling attribute (for GB/s).  Equal values share one line.

    A ceiling's datasheet and measured values are usually within 20% of each other, too
    close for a label each, so they share one label above the higher line ("bf16 989.4 |
    meas. 841.0"), at the left edge: small problems sit far below every ceiling there,
    while at the right the curves run into the ceilings."""
    fmt = fmt_tflops if unit == "TFLOP/s" else fmt_gbps
    found: dict[str, dict[str, float]] = {}  # merged label -> source -> value
    for source in ("datasheet", "measured"):
        c = ceilings.get(source)
        if c is None:
            continue
        values: dict[float, list[str]] = {}
        for name, attr in what.items():
            v = c.tflops.get(attr) if unit == "TFLOP/s" else getattr(c, attr)
            if v:
                values.setdefault(v, []).append(name)
        for v, names in values.items():
            label = "/".join(names)
            ax.axhline(v, color=_ROOF_COLOR[source], ls=_ROOF_STYLE[source], lw=1.0, zorder=1,
                       label=f"{label} {source} {fmt(v)} {unit}", gid=f"ceiling:{source}:{label}")
            found.setdefault(label, {})[source] = v
    # Distinct ceilings can still be close on screen (a CPU's fp16 1.46 and bf16 1.38
    # TFLOP/s): labels nearer than a text line share one, "fp16 meas. 1.46 ; bf16 ...".
    # The axis is final here (data and ceilings are drawn), so "near" is measured in
    # screen terms: a fraction of the panel's decades.
    y0, y1 = ax.get_ylim()
    min_gap = 0.07 * math.log10(y1 / y0)
    entries = sorted(found.items(), key=lambda kv: -max(kv[1].values()))
    clusters: list[list[tuple[str, dict[str, float]]]] = []
    for entry in entries:
        top = max(entry[1].values())
        if clusters and math.log10(max(clusters[-1][-1][1].values()) / top) < min_gap:
            clusters[-1].append(entry)
        else:
            clusters.append([entry])
    for cluster in clusters:
        texts = []
        for label, by_source in cluster:
            parts = [fmt(by_source["datasheet"])] if "datasheet" in by_source else []
            if "measured" in by_source:
                parts.append(f"meas. {fmt(by_source['measured'])}")
            texts.append(f"{label} " + " | ".join(parts))
        top = max(max(b.values()) for _, b in cluster)
        ax.annotate("; ".join(texts), xy=(0, top), xycoords=("axes fraction", "data"),
                    xytext=(3, 2), textcoords="offset points", ha="left", va="bottom",
                    fontsize=7, color="0.25", zorder=2,
                    gid="ceiling-label:" + ";".join(label for label, _ in cluster),
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.7))


# ------------------------------------------------------------------------------------- CLI


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints a usage block and exits; the contract is one line and return 2.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgError(message)


def _outputs(run: str, out: str | None) -> tuple[Path, Path]:
    """(roofline path, scaling path).  Default: RUN's folder.  --out names the roofline PNG
    or a folder for it (an existing folder, or a name with no suffix).  The scaling figure
    goes beside it: scaling.png when the roofline keeps its default name, else
    <stem>-scaling.png, so two runs plotted into one folder keep both scaling figures."""
    run_path = Path(run)
    run_dir = run_path if run_path.is_dir() else run_path.parent
    if out is None:
        roof = run_dir / ROOFLINE_PNG
    else:
        o = Path(out)
        is_dir = o.is_dir() or out.endswith(("/", os.sep)) or not o.suffix
        roof = o / ROOFLINE_PNG if is_dir else o
    if roof.name == ROOFLINE_PNG:
        return roof, roof.with_name(SCALING_PNG)
    return roof, roof.with_name(f"{roof.stem}-scaling{roof.suffix or '.png'}")


def main(argv: list[str]) -> int:
    """`python -m roofline plot RUN [--out PNG] [--baseline RUN]`; returns the exit code."""
    usage = "python -m roofline plot RUN [--out PNG] [--baseline RUN]"
    parser = _Parser(prog="python -m roofline plot", usage=usage,
                     description="Re-plot a saved run: roofline.png and scaling.png.")
    parser.add_argument("run", metavar="RUN", help="run folder or its results.json")
    parser.add_argument("--out", metavar="PNG",
                        help="roofline PNG path or folder (default: RUN's folder); "
                             "the scaling figure is written beside it")
    parser.add_argument("--baseline", metavar="RUN",
                        help="overlay an earlier run: arrows from its points to this run's")
    try:
        args = parser.parse_args(argv)
    except _ArgError as e:
        print(f"error: {e} (usage: {usage})", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help prints and exits 0
        return e.code if isinstance(e.code, int) else 0
    try:
        meta, df = load_run(args.run)
        check_metrics(df, args.run)
        base = load_run(args.baseline) if args.baseline else None
        if base is not None:
            check_metrics(base[1], args.baseline)
    except RunLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # A hand-edited file may carry metadata that is not an object: plot without it.
    meta = meta if isinstance(meta, dict) else {}
    if base is not None and not isinstance(base[0], dict):
        base = ({}, base[1])
    roof_png, scaling_png = _outputs(args.run, args.out)
    try:
        plot_roofline(meta, df, roof_png, baseline=base)
        plot_scaling(meta, df, scaling_png)
    except OSError as e:
        print(f"error: cannot write figures: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        # Rows that load but cannot be plotted (hand-edited, wrong types): one line, no
        # traceback, per the CLI contract.
        print(f"error: cannot plot {args.run}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(roof_png)
    print(scaling_png)
    return 0
