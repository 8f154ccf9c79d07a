"""Roofline and scaling figures of a run, and `python -m roofline plot RUN`.

Two figures per run (docs/design.md):

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

import math
import os
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator, NullFormatter

from contract.ceilings import NO_ROOF_BELOW_FP32
from contract.devices import ROOF_CLASSES
from contract.rows import (
    DTYPE_ORDER,
    PROVIDER_ORDER,
    Ceiling,
    canonical_order,
    clean_rows,
    kernel_order,
    ok_rows,
    panel_classes,
    run_ceilings,
)
from contract.schema import (
    CACHE,
    ROW_ID,
    WARM,
    RunDoc,
    cache_column,
)
from roofline.report.style import (
    FASTER,
    KERNEL_SIZES,
    L2_STYLE,
    POINT_SIZE,
    ROOF_COLOR,
    ROOF_STYLE,
    SLOWER,
    RidgeLabel,
    draw_grid,
    draw_ridge_labels,
    fmt_gbps,
    fmt_sig,
    fmt_tflops,
    kernel_color,
    new_figure,
    point_look,
    provider_marker,
    run_title,
    save_figure,
    tidy_grid,
)


def axis_limits(points: list[pd.DataFrame], ceilings: dict[str, Ceiling],
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


def _draw_source(ax: Any, c: Ceiling, source: str, classes: list[str],
                 xlim: tuple[float, float]) -> list[RidgeLabel]:
    """One source's (datasheet or measured) HBM and L2 slopes and flat roofs, each ridge
    marked; returns the roofs' labels."""
    x0, x1 = xlim
    style, color = ROOF_STYLE[source], ROOF_COLOR[source]
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
                linestyle=L2_STYLE, color=color, lw=1.2, zorder=1,
                label=f"L2 {source} {fmt_gbps(c.l2_gbps)} GB/s", gid=f"roof:{source}:l2")
    labels: list[RidgeLabel] = []
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
        labels.append(RidgeLabel(peak, text + tag, f"ridge:{source}:{name}", color, xy))
    return labels


def _no_roof_labels(ceilings: dict[str, Ceiling], classes: list[str]) -> list[RidgeLabel]:
    """Rows held against a roof nobody recorded (e.g. fp16 on a CPU that measured only
    fp32 and bf16), or against a class measured too slow to be one (bf16 on a CPU
    without its unit), are plotted without a roof: say which, rather than leave the
    reader guessing."""
    labels = []
    for cls in classes:
        if not any(cls in c.tflops for c in ceilings.values()):
            rate = next((c.no_roof[cls] for c in ceilings.values() if cls in c.no_roof), None)
            text = (f"{cls}: no ceiling recorded" if rate is None else
                    f"{cls}: no roof (measured {fmt_tflops(rate)} TFLOP/s, under "
                    f"{NO_ROOF_BELOW_FP32:g}x fp32's)")
            labels.append(RidgeLabel(0.0, text, f"ridge:none:{cls}", "0.4", None))
    return labels


def draw_ceilings(ax: Any, ceilings: dict[str, Ceiling], classes: list[str],
                   xlim: tuple[float, float]) -> None:
    """Slopes and flat roofs of one panel, each ridge marked and labelled.

    Labels are stacked in the panel's upper-left corner, a region that is always empty
    (it lies above every slope, and no point can beat its roof), each roof's label tied
    to its ridge marker by a thin leader line.  Labels placed next to the ridges collide
    whenever two roofs are close (datasheet vs measured, or fp32 vs bf16 on a CPU) and
    land on the points near the roof; the corner block avoids both."""
    labels: list[RidgeLabel] = []
    for source in ("datasheet", "measured"):
        c = ceilings.get(source)
        if c is not None:
            labels += _draw_source(ax, c, source, classes, xlim)
    draw_ridge_labels(ax, labels + _no_roof_labels(ceilings, classes))


def _warm(rows: pd.DataFrame) -> pd.Series:
    """Which rows were timed warm (column `cache`; a row without it: its device's native
    mode, schema.native_cache)."""
    return cache_column(rows) == WARM


def _draw_points(ax: Any, rows: pd.DataFrame, dtype: str, kernels: list[str],
                 providers: list[str]) -> int:
    """The ok points: cold rows filled; warm rows (back-to-back calls on the same
    buffers) hollow in their kernel's colour, so a time served from the cache is never
    read as a cold one.  Warm artists' gids and labels end in "warm"."""
    n = 0
    warm = _warm(rows)
    for kernel in canonical_order(rows["kernel"].unique(), kernel_order()):
        for provider in canonical_order(rows["provider"].unique(), PROVIDER_ORDER):
            for is_warm in (False, True):
                sel = rows[(rows["kernel"] == kernel) & (rows["provider"] == provider)
                           & (warm == is_warm)]
                if sel.empty:
                    continue
                color = kernel_color(kernel, kernels)
                look = point_look(color, hollow=is_warm)
                tag = " warm" if is_warm else ""
                ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float),
                           s=KERNEL_SIZES.get(kernel, POINT_SIZE),
                           marker=provider_marker(provider, providers), alpha=0.85,
                           zorder=4, label=f"{kernel} {provider}{tag}",
                           gid=f"points:{dtype}:{kernel}:{provider}" + tag.replace(" ", ":"),
                           **look)
                n += len(sel)
    return n


def _draw_baseline(ax: Any, new: pd.DataFrame, old: pd.DataFrame, dtype: str,
                   providers: list[str]) -> None:
    """Baseline points hollow grey; an arrow from each baseline point to the same
    (kernel, provider, dtype, shape) in this run, green when faster, red when slower.
    Changes under 2% get no arrow: at that size they are noise and only add clutter."""
    for (kernel, provider), sel in old.groupby(["kernel", "provider"], sort=True):
        ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float),
                   s=KERNEL_SIZES.get(kernel, POINT_SIZE),
                   marker=provider_marker(provider, providers), facecolors="none",
                   edgecolors="0.55", linewidths=0.8, zorder=3,
                   gid=f"baseline:{dtype}:{kernel}:{provider}")
    # Joined on the row's identity, cache mode included: a warm point never pairs with
    # a cold one.
    pairs = old.assign(**{CACHE: _warm(old)}).merge(new.assign(**{CACHE: _warm(new)}),
                                                    on=ROW_ID, suffixes=("_old", "_new"))
    for p in pairs.itertuples(index=False):
        ratio = p.tflops_new / p.tflops_old
        if abs(math.log(ratio)) < math.log(1.02):
            continue
        ax.annotate("", xy=(p.intensity_new, p.tflops_new),
                    xytext=(p.intensity_old, p.tflops_old),
                    arrowprops=dict(arrowstyle="->", lw=0.8, shrinkA=2, shrinkB=3,
                                    color=FASTER if ratio > 1 else SLOWER),
                    zorder=3.5, gid=f"arrow:{p.kernel}:{p.provider}:{dtype}:{p.shape}"
                    + (":warm" if getattr(p, CACHE) else ""))


def _legend(fig: Figure, kernels: list[str], providers: list[str],
            ceilings: dict[str, Ceiling], baseline: bool, warm: bool = False) -> None:
    handles: list[Any] = []
    for k in kernels:
        size = math.sqrt(KERNEL_SIZES.get(k, POINT_SIZE))  # scatter s is area, ms is width
        handles.append(Line2D([], [], ls="", marker="o", ms=size,
                              color=kernel_color(k, kernels), label=k))
    for p in providers:
        handles.append(Line2D([], [], ls="", marker=provider_marker(p, providers), ms=6,
                              color="0.3", label=p))
    # The bandwidths are the same in every panel, so they are stated once, here.
    for source in ("datasheet", "measured"):
        c = ceilings.get(source)
        if c is None:
            continue
        hbm = f"\nHBM {fmt_gbps(c.hbm_gbps)} GB/s" if c.hbm_gbps else ""
        handles.append(Line2D([], [], ls=ROOF_STYLE[source], color=ROOF_COLOR[source],
                              label=f"{source} roof{hbm}"))
        if c.l2_gbps:
            handles.append(Line2D([], [], ls=L2_STYLE, color=ROOF_COLOR[source],
                                  label=f"{source} L2\n{fmt_gbps(c.l2_gbps)} GB/s"))
    if warm:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.3", mew=1.2,
                              label="warm: same buffers\nback to back (hollow)"))
    if baseline:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.55",
                              label="baseline"))
        handles.append(Line2D([], [], color=FASTER, label="faster (>2%)"))
        handles.append(Line2D([], [], color=SLOWER, label="slower (>2%)"))
    if handles:
        # Outside the axes: with hundreds of points no corner of a panel is free.
        fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)


Panel = tuple[str, pd.DataFrame, list[str]]  # (dtype, its rows, its roof classes)


def _panels(d: pd.DataFrame, ceilings: dict[str, Ceiling]) -> tuple[list[Panel], bool]:
    """One panel per dtype in the run (a dtype whose rows all failed keeps its panel so
    the gap is visible), and True; a run with no rows at all gets one panel with every
    known roof, and False."""
    dtypes = canonical_order(d["dtype"].unique(), DTYPE_ORDER) if not d.empty else []
    if dtypes:
        return [(dt, d[d["dtype"] == dt], panel_classes(d[d["dtype"] == dt]))
                for dt in dtypes], True
    classes = canonical_order({k for c in ceilings.values() for k in c.tflops}, ROOF_CLASSES)
    return [("all dtypes", d, classes)], False


def _log_axes(ax: Any, xlim: tuple[float, float], ylim: tuple[float, float]) -> None:
    """A panel's shared log-log axes, square, with a light major grid."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_box_aspect(1)  # square panels: a slope of 1 looks like one in every panel
    # Axes span ~7 decades: minor tick labels would only be noise, and one unlabelled
    # minor tick a decade reads as well as matplotlib's eight, which cost the
    # constrained layout about half the figure's time (docs/measurement.md).
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_locator(LogLocator(subs=(3.0,)))
        axis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
    ax.set_axisbelow(True)


def _panel_notes(ax: Any, dtype: str, rows: pd.DataFrame, n: int, one_per_dtype: bool,
                 has_ceilings: bool) -> None:
    """A panel's title (its points, and the rows not plotted) and its notes: no ok rows,
    no ceilings."""
    status = rows["status"].value_counts() if not rows.empty else pd.Series(dtype=int)
    extra = ", ".join(f"{int(status[s])} {s}" for s in ("failed", "skipped") if s in status)
    title = f"{dtype}: {n} points" + (f" ({extra}, not plotted)" if extra else "")
    ax.set_title(title if one_per_dtype else "no rows in this run: every known roof",
                 fontsize=10)
    if n == 0:
        # Lower right: below every roof and slope, so the note covers no line.
        ax.text(0.95, 0.05, "no ok rows" + (f"\n({extra})" if extra else ""),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=11,
                color="0.35", gid="note:no-ok-rows",
                bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.8"))
    if not has_ceilings:
        ax.text(0.5, 0.92, "no ceilings in this run", transform=ax.transAxes,
                ha="center", fontsize=8, color="0.35", gid="note:no-ceilings")


def plot_roofline(doc: RunDoc, out: str | os.PathLike | None = None,
                  baseline: RunDoc | None = None) -> Figure:
    """Roofline figure of a run: one panel per dtype, shared log-log axes.

    `baseline` overlays a previous run: hollow grey points, and arrows from each old
    point to the new one where they moved by more than 2%.  Writes a PNG to `out` when
    given and returns the Figure either way."""
    frame = doc.frame()
    d = clean_rows(frame)
    ceilings = run_ceilings(doc.meta, frame)
    ok = ok_rows(d)
    old = ok_rows(clean_rows(baseline.frame())) if baseline is not None else None

    kernels = canonical_order(ok["kernel"].unique(), kernel_order())
    providers = canonical_order(ok["provider"].unique(), PROVIDER_ORDER)
    if old is not None:
        kernels = canonical_order(set(kernels) | set(old["kernel"].unique()), kernel_order())
        providers = canonical_order(set(providers) | set(old["provider"].unique()), PROVIDER_ORDER)

    panels, one_per_dtype = _panels(d, ceilings)
    all_classes = sorted({c for _, _, cl in panels for c in cl})
    pts = [ok] + ([old] if old is not None and not old.empty else [])
    xlim, ylim = axis_limits([p for p in pts if not p.empty], ceilings, all_classes)

    nrows, ncols = draw_grid(len(panels))
    fig = new_figure(max(4.3 * ncols + 1.6, 8.0), 4.2 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    used = tidy_grid(fig, axes, len(panels))
    for i, (ax, (dtype, rows, classes)) in enumerate(zip(used, panels, strict=True)):
        _log_axes(ax, xlim, ylim)
        draw_ceilings(ax, ceilings, classes, xlim)
        panel_ok = ok[ok["dtype"] == dtype] if one_per_dtype else ok
        n = _draw_points(ax, panel_ok, dtype, kernels, providers)
        if old is not None:
            _draw_baseline(ax, panel_ok, old[old["dtype"] == dtype] if one_per_dtype else old,
                           dtype, providers)
        _panel_notes(ax, dtype, rows, n, one_per_dtype, bool(ceilings))
        if i % ncols == 0:
            ax.set_ylabel("TFLOP/s")
        if i + ncols >= len(panels):
            ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    title = run_title(doc.meta, "Roofline")
    if baseline is not None:
        title += f"\nvs baseline {baseline.meta.provenance.run_id or '?'} (hollow grey)"
    fig.suptitle(title, fontsize=11)
    _legend(fig, kernels, providers, ceilings, baseline is not None,
            warm=bool(_warm(ok).any()))
    if out is not None:
        save_figure(fig, out)
    return fig
