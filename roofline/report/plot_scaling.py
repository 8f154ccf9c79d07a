"""scaling.png: achieved GB/s (memory-bound kernels, against footprint in bytes) or
TFLOP/s (matmul, against FLOPs) as the problem grows, one panel per kernel, one line
per (provider, dtype), the L2 size marked.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, NullFormatter

from contract.rows import (
    DTYPE_ORDER,
    PROVIDER_ORDER,
    Ceiling,
    canonical_order,
    clean_rows,
    compute_kernels,
    kernel_order,
    l2_bytes,
    ok_rows,
    panel_classes,
    run_ceilings,
)
from contract.schema import WARM, RunDoc, cache_column
from roofline.report.style import (
    ROOF_COLOR,
    ROOF_STYLE,
    PlainLogFormatter,
    dtype_color,
    fmt_bytes,
    fmt_gbps,
    fmt_tflops,
    new_figure,
    provider_marker,
    run_title,
    save_figure,
    tidy_grid,
)


@dataclass(frozen=True)
class _Series:
    """What every panel shares: the dtypes and providers (colours and markers), the
    run's ceilings and L2 size."""

    dtypes: list[str]
    providers: list[str]
    ceilings: dict[str, Ceiling]
    l2: float | None


def _draw_lines(ax: Any, rows: pd.DataFrame, kernel: str, xcol: str, ycol: str,
                s: _Series) -> None:
    """A line per (dtype, provider) of one panel.  A warm row (cache column) is its own
    line, thin with hollow markers: a cold and a warm time of one shape are never
    joined."""
    warm = cache_column(rows) == WARM
    for dtype, provider, is_warm in itertools.product(s.dtypes, s.providers, (False, True)):
        sel = rows[(rows["dtype"] == dtype) & (rows["provider"] == provider)
                   & (warm == is_warm)]
        sel = sel[np.isfinite(sel[ycol]) & (sel[ycol] > 0)].sort_values(xcol)
        if sel.empty:
            continue
        tag = " warm" if is_warm else ""
        ax.plot(sel[xcol], sel[ycol], marker=provider_marker(provider, s.providers),
                ms=4, lw=0.8 if is_warm else 1.2, color=dtype_color(dtype, s.dtypes),
                mfc="none" if is_warm else None,
                ls="-" if provider == "torch" else "--", zorder=3,
                label=f"{dtype} {provider}{tag}",
                gid=f"scaling:{kernel}:{provider}:{dtype}" + tag.replace(" ", ":"))


def _l2_line(ax: Any, rows: pd.DataFrame, l2: float) -> None:
    """The L2 size on a memory-bound panel."""
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


def _scaling_panel(ax: Any, rows: pd.DataFrame, kernel: str, compute: bool,
                   s: _Series) -> None:
    """One kernel's panel: TFLOP/s against FLOPs under its roof classes' roofs (a GEMM),
    or GB/s against the footprint under the HBM and L2 ceilings, the L2 size marked."""
    xcol, ycol = ("flops", "tflops") if compute else ("bytes", "gbps")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="major", color="0.9", lw=0.6)
    ax.set_axisbelow(True)
    _draw_lines(ax, rows, kernel, xcol, ycol, s)
    if compute:
        classes = panel_classes(rows)
        _scaling_roofs(ax, s.ceilings, {c: c for c in classes}, "TFLOP/s")
        ax.set_xlabel("problem size (FLOPs)")
        ax.set_ylabel("TFLOP/s")
    else:
        _scaling_roofs(ax, s.ceilings, {"HBM": "hbm_gbps", "L2": "l2_gbps"}, "GB/s")
        ax.xaxis.set_major_formatter(FuncFormatter(fmt_bytes))
        ax.set_xlabel("footprint (compulsory bytes)")
        ax.set_ylabel("GB/s")
        if s.l2:
            _l2_line(ax, rows, s.l2)
    # Plain numbers ("20", "0.6"), not "2 x 10^1": a CPU panel can span under a decade,
    # where matplotlib labels minor ticks in scientific notation.
    ax.yaxis.set_major_formatter(PlainLogFormatter())
    ax.yaxis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False,
                                                    minor_thresholds=(1, 0.5)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(kernel, fontsize=10)
    ax.tick_params(labelsize=8)


def _scaling_legend(fig: Figure, ok: pd.DataFrame, s: _Series) -> None:
    handles: list[Any] = [Line2D([], [], color=dtype_color(dt, s.dtypes), lw=2, label=dt)
                          for dt in s.dtypes]
    handles += [Line2D([], [], color="0.3", marker=provider_marker(p, s.providers), ms=5,
                       ls="-" if p == "torch" else "--", label=p) for p in s.providers]
    if (cache_column(ok) == WARM).any():
        handles.append(Line2D([], [], color="0.3", marker="o", mfc="none", ms=5, lw=0.8,
                              label="warm (same buffers)"))
    handles += [Line2D([], [], color=ROOF_COLOR[c], ls=ROOF_STYLE[c], label=f"{c} ceiling")
                for c in ("datasheet", "measured") if c in s.ceilings]
    if s.l2:
        handles.append(Line2D([], [], color="0.3", ls="-.", label="L2 size"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


def plot_scaling(doc: RunDoc, out: str | os.PathLike | None = None) -> Figure:
    """How throughput grows with problem size: one panel per kernel, a line per
    (provider, dtype).

    Memory-bound kernels plot achieved GB/s against their footprint (compulsory bytes)
    with the HBM ceilings as horizontal lines and the L2 size as a vertical one: tiny
    sizes sit far below the roof (launch overhead), and the L2 knee shows where the
    footprint stops fitting in cache.  matmul plots TFLOP/s against FLOPs with one
    horizontal roof per roof class present."""
    frame = doc.frame()
    ok = ok_rows(clean_rows(frame))
    ok = ok[np.isfinite(ok["bytes"]) & (ok["bytes"] > 0)] if "bytes" in ok.columns else ok
    s = _Series(canonical_order(ok["dtype"].unique(), DTYPE_ORDER),
                canonical_order(ok["provider"].unique(), PROVIDER_ORDER),
                run_ceilings(doc.meta, frame), l2_bytes(doc.meta))
    kernels = canonical_order(ok["kernel"].unique(), kernel_order())
    compute_bound = compute_kernels()

    n = max(1, len(kernels))
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    fig = new_figure(max(4.2 * ncols + 1.5, 8.0), 3.6 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    used = tidy_grid(fig, axes, n)
    if not kernels:
        ax = used[0]
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no ok rows", transform=ax.transAxes, ha="center", va="center",
                fontsize=12, color="0.35", gid="note:no-ok-rows")
    for ax, kernel in zip(used, kernels, strict=False):
        _scaling_panel(ax, ok[ok["kernel"] == kernel], kernel, kernel in compute_bound, s)
    fig.suptitle(run_title(doc.meta, "Scaling"), fontsize=11)
    if kernels:
        _scaling_legend(fig, ok, s)
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
            ax.axhline(v, color=ROOF_COLOR[source], ls=ROOF_STYLE[source], lw=1.0, zorder=1,
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
