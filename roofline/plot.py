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
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from roofline.ceilings import NO_ROOF_BELOW_FP32
from roofline.devices import ROOF_CLASSES
from roofline.plot_scaling import plot_scaling  # noqa: F401  (an entry point)
from roofline.rows import (
    DTYPE_ORDER,
    KERNEL_ORDER,
    PROVIDER_ORDER,
    Ceiling,
    _ordered,
    _panel_classes,
    clean_rows,
    ok_rows,
    run_ceilings,
)
from roofline.schema import (
    CACHE,
    ROOFLINE_PNG,
    ROW_ID,
    SCALING_PNG,
    WARM,
    RunLoadError,
    cache_column,
    check_metrics,
    load_run,
    resolve_results_json,
)
from roofline.style import (  # noqa: F401  (re-exported)
    _FASTER,
    _KERNEL_SIZES,
    _L2_STYLE,
    _POINT_SIZE,
    _ROOF_COLOR,
    _ROOF_STYLE,
    _SLOWER,
    _grid,
    _kernel_color,
    _new_figure,
    _provider_marker,
    _tidy_grid,
    _title,
    fmt_gbps,
    fmt_sig,
    fmt_tflops,
    save_figure,
)


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
    # and bf16), or against a class measured too slow to be one (bf16 on a CPU without
    # its unit), are plotted without a roof: say which, rather than leave the reader
    # guessing.
    for cls in classes:
        if not any(cls in c.tflops for c in ceilings.values()):
            rate = next((c.no_roof[cls] for c in ceilings.values() if cls in c.no_roof), None)
            text = (f"{cls}: no ceiling recorded" if rate is None else
                    f"{cls}: no roof (measured {fmt_tflops(rate)} TFLOP/s, under "
                    f"{NO_ROOF_BELOW_FP32:g}x fp32's)")
            labels.append((0.0, text, f"ridge:none:{cls}", "0.4", None))
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
    for kernel in _ordered(rows["kernel"].unique(), KERNEL_ORDER):
        for provider in _ordered(rows["provider"].unique(), PROVIDER_ORDER):
            for is_warm in (False, True):
                sel = rows[(rows["kernel"] == kernel) & (rows["provider"] == provider)
                           & (warm == is_warm)]
                if sel.empty:
                    continue
                color = _kernel_color(kernel, kernels)
                look: dict[str, Any] = (
                    dict(facecolors="none", edgecolors=color, linewidths=1.2) if is_warm
                    else dict(color=color, edgecolors="white", linewidths=0.5))
                tag = " warm" if is_warm else ""
                ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float),
                           s=_KERNEL_SIZES.get(kernel, _POINT_SIZE),
                           marker=_provider_marker(provider, providers), alpha=0.85,
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
                   s=_KERNEL_SIZES.get(kernel, _POINT_SIZE),
                   marker=_provider_marker(provider, providers), facecolors="none",
                   edgecolors="0.55", linewidths=0.8, zorder=3,
                   gid=f"baseline:{dtype}:{kernel}:{provider}")
    # Joined on the row's identity, cache mode included: a warm point never pairs with
    # a cold one.
    pairs = old.assign(**{CACHE: _warm(old)}).merge(new.assign(**{CACHE: _warm(new)}),
                                                    on=ROW_ID, suffixes=("_old", "_new"))
    for _, r in pairs.iterrows():
        ratio = r["tflops_new"] / r["tflops_old"]
        if abs(math.log(ratio)) < math.log(1.02):
            continue
        ax.annotate("", xy=(r["intensity_new"], r["tflops_new"]),
                    xytext=(r["intensity_old"], r["tflops_old"]),
                    arrowprops=dict(arrowstyle="->", lw=0.8, shrinkA=2, shrinkB=3,
                                    color=_FASTER if ratio > 1 else _SLOWER),
                    zorder=3.5, gid=f"arrow:{r['kernel']}:{r['provider']}:{dtype}:{r['shape']}"
                    + (":warm" if r[CACHE] else ""))


def _legend(fig: Figure, kernels: list[str], providers: list[str],
            ceilings: dict[str, Ceiling], baseline: bool, warm: bool = False) -> None:
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
    if warm:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="0.3", mew=1.2,
                              label="warm: same buffers\nback to back (hollow)"))
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
    _legend(fig, kernels, providers, ceilings, baseline is not None,
            warm=bool(_warm(ok).any()))
    if out is not None:
        save_figure(fig, out)
    return fig


# `plot RUN_A RUN_B ... --devices` writes this, in the first RUN's folder unless --out.
DEVICES_PNG = "devices.png"


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
    """`python -m roofline plot RUN [--out PNG] [--baseline RUN]`, or several runs on one
    figure with `--devices` (roofline/plot_devices.py); returns the exit code."""
    usage = ("python -m roofline plot RUN [--out PNG] [--baseline RUN] | "
             "plot RUN_A RUN_B [...] --devices [--out PNG]")
    parser = _Parser(prog="python -m roofline plot", usage=usage,
                     description="Re-plot a saved run: roofline.png and scaling.png; or "
                                 "compare devices: several runs' rooflines on one figure.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folder or its results.json (several with --devices)")
    parser.add_argument("--out", metavar="PNG",
                        help="roofline PNG path or folder (default: RUN's folder); "
                             "the scaling figure is written beside it")
    parser.add_argument("--baseline", metavar="RUN",
                        help="overlay an earlier run: arrows from its points to this run's")
    parser.add_argument("--devices", action="store_true",
                        help=f"one figure ({DEVICES_PNG}, in the first RUN's folder unless "
                             "--out) with every RUN's roofs and points, one colour per device")
    try:
        args = parser.parse_args(argv)
        if args.devices and len(args.runs) < 2:
            raise _ArgError(f"--devices compares at least two runs, got {len(args.runs)}")
        if args.devices and args.baseline:
            raise _ArgError("--baseline overlays one run; it does not combine with --devices")
        if not args.devices and len(args.runs) > 1:
            raise _ArgError(f"{len(args.runs)} runs given: several runs go on one figure "
                            "only with --devices")
    except _ArgError as e:
        print(f"error: {e} (usage: {usage})", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help prints and exits 0
        return e.code if isinstance(e.code, int) else 0
    if args.devices:
        return _main_devices(args.runs, args.out)
    run = args.runs[0]
    try:
        meta, df = load_run(run)
        check_metrics(df, run)
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
    roof_png, scaling_png = _outputs(run, args.out)
    try:
        plot_roofline(meta, df, roof_png, baseline=base)
        plot_scaling(meta, df, scaling_png)
    except OSError as e:
        print(f"error: cannot write figures: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        # Rows that load but cannot be plotted (hand-edited, wrong types): one line, no
        # traceback, per the CLI contract.
        print(f"error: cannot plot {run}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(roof_png)
    print(scaling_png)
    return 0


def _main_devices(runs: list[str], out: str | None) -> int:
    """`plot RUN_A RUN_B ... --devices`: every run loaded and checked before anything is
    drawn, so an unreadable one is refused (one line, exit 2) without a partial figure."""
    from roofline.plot_devices import plot_devices

    loaded: list[tuple[dict[str, Any], pd.DataFrame]] = []
    seen: dict[Path, str] = {}
    try:
        for run in runs:
            path = resolve_results_json(run).resolve()
            if path in seen:
                raise RunLoadError(f"{run} is the same run as {seen[path]}: give each run once")
            seen[path] = run
            meta, df = load_run(run)
            check_metrics(df, run)
            loaded.append((meta, df))
    except RunLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    first = Path(runs[0])
    png = (first if first.is_dir() else first.parent) / DEVICES_PNG
    if out is not None:
        o = Path(out)
        png = o / DEVICES_PNG if o.is_dir() or out.endswith(("/", os.sep)) or not o.suffix \
            else o
    try:
        plot_devices(loaded, png)
    except OSError as e:
        print(f"error: cannot write the figure: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        print(f"error: cannot plot {' '.join(runs)}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    print(png)
    return 0
