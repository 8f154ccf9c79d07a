"""Several runs' rooflines on one figure: `python -m roofline plot RUN_A RUN_B ... --devices`.

One run per device (H100 vs H200 vs a CPU; a B200 when there is a run of one), one colour
per run, in the order given.  As in a single run's roofline.png (roofline/report/plot.py) there
is one panel per benchmark dtype on shared log-log axes; each panel draws, for every run,
its HBM slope and the flat roofs its rows are held against (every roof class used by
that dtype's rows in any of the runs, so the devices compare roof for roof), datasheet
solid and measured dashed, every ridge marked, and that run's ok rows as points in its
colour (marker per provider, size per kernel, as in roofline.png).  A device without a
roof of a class (fp4 anywhere but Blackwell, any datasheet roof on a CPU) draws none, and
the panel says so.  The L2 slopes and baseline arrows of the single-run figure are left
out: with three devices they would hide the comparison.

Artists carry gids with the run's tag (its device key, "-2", "-3" appended when two runs
share one): ``roof:h100:datasheet:hbm``, ``roof:h200:measured:fp16/bf16``,
``ridge-marker:cpu:measured:fp32``, ``ridge:h100:bf16``, ``points:h200:bf16:triton``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from contract.devices import ROOF_CLASSES
from contract.rows import (
    DTYPE_ORDER,
    PROVIDER_ORDER,
    Ceiling,
    canonical_order,
    clean_rows,
    kernel_order,
    ok_rows,
    run_ceilings,
)
from contract.schema import RunDoc
from roofline.report.plot import axis_limits
from roofline.report.style import (
    KERNEL_SIZES,
    POINT_SIZE,
    ROOF_STYLE,
    RidgeLabel,
    device_color,
    draw_grid,
    draw_ridge_labels,
    fmt_gbps,
    fmt_sig,
    fmt_tflops,
    new_figure,
    provider_marker,
    save_figure,
    tidy_grid,
)

SOURCES = ("datasheet", "measured")


@dataclass(frozen=True)
class DeviceRun:
    """One run of the figure, read back: its rows, ceilings, tag and colour."""

    tag: str  # unique in the figure: the device key, "-2", "-3" when keys repeat
    name: str  # the device's name as the run recorded it
    run_id: str
    rows: pd.DataFrame  # clean rows (contract.rows.clean_rows)
    ok: pd.DataFrame  # the plottable ones (ok_rows)
    ceilings: dict[str, Ceiling]
    color: str

    @property
    def legend(self) -> str:
        hbm = [f"HBM {fmt_gbps(c.hbm_gbps)} GB/s ({s})" for s, c in self.ceilings.items()
               if c.hbm_gbps]
        return "\n".join([f"{self.name} ({self.tag})", f"run {self.run_id}", *hbm])


def device_runs(runs: list[RunDoc]) -> list[DeviceRun]:
    """The runs as the figure reads them, tagged and coloured in the order given."""
    out: list[DeviceRun] = []
    seen: dict[str, int] = {}
    for i, doc in enumerate(runs):
        dev, df = doc.meta.device, doc.frame()
        key = str(dev.device_key or f"run{i + 1}")
        seen[key] = seen.get(key, 0) + 1
        tag = key if seen[key] == 1 else f"{key}-{seen[key]}"
        name = str(dev.device_name or key)
        rows = clean_rows(df)
        out.append(DeviceRun(tag, name, str(doc.meta.provenance.run_id or "?"), rows,
                             ok_rows(rows), run_ceilings(doc.meta, df), device_color(i)))
    return out


def _roof_groups(run: DeviceRun, classes: list[str]) -> dict[tuple, list[str]]:
    """Classes of one panel with the same (datasheet, measured) peaks share one line and
    one label: fp16 and bf16 on every NVIDIA part."""
    groups: dict[tuple, list[str]] = {}
    for cls in classes:
        peaks = tuple(run.ceilings[s].tflops.get(cls) if s in run.ceilings else None
                      for s in SOURCES)
        if any(p is not None for p in peaks):
            groups.setdefault(peaks, []).append(cls)
    return groups


def _draw_device_ceilings(ax: Any, run: DeviceRun, classes: list[str],
                          xlim: tuple[float, float]) -> list[RidgeLabel]:
    """One run's slopes, flat roofs and ridge markers in its colour; returns its labels
    (peak, text, gid, colour, ridge xy) for the panel's label block."""
    x0, x1 = xlim
    groups = _roof_groups(run, classes)
    labels: list[RidgeLabel] = []
    for si, source in enumerate(SOURCES):
        c = run.ceilings.get(source)
        if c is None:
            continue
        peaks = [p[si] for p in groups if p[si] is not None]
        if c.hbm_gbps:
            # The slope runs up to the highest ridge of the panel; lower roofs cut across it.
            x_end = max(peaks) * 1e3 / c.hbm_gbps if peaks else x1
            ax.plot([x0, x_end], [x0 * c.hbm_gbps / 1e3, x_end * c.hbm_gbps / 1e3],
                    linestyle=ROOF_STYLE[source], color=run.color, lw=1.3, zorder=1,
                    label=f"{run.tag} HBM {source} {fmt_gbps(c.hbm_gbps)} GB/s",
                    gid=f"roof:{run.tag}:{source}:hbm")
        for key, group in groups.items():
            peak = key[si]
            if peak is None:
                continue
            name = "/".join(group)
            ridge = c.ridge(group[0])
            ax.plot([ridge or x0, x1], [peak, peak], linestyle=ROOF_STYLE[source],
                    color=run.color, lw=1.3, zorder=1,
                    label=f"{run.tag} {name} {source} {fmt_tflops(peak)} TFLOP/s",
                    gid=f"roof:{run.tag}:{source}:{name}")
            if ridge:
                ax.plot([ridge], [peak], marker="o", ms=5, color=run.color,
                        mfc="white" if source == "measured" else run.color, zorder=2,
                        gid=f"ridge-marker:{run.tag}:{source}:{name}")
    for (ds, ms), group in groups.items():
        name = "/".join(group)
        parts: list[str] = []
        xy = None
        for source, peak in zip(SOURCES, (ds, ms), strict=True):
            if peak is None:
                continue
            ridge = run.ceilings[source].ridge(group[0])
            head = f"{fmt_tflops(peak)} TFLOP/s" if source == "datasheet" or ds is None \
                else f"meas. {fmt_tflops(peak)}"
            parts.append(head + (f", ridge {fmt_sig(ridge)}" if ridge else ""))
            if xy is None and ridge:
                xy = (ridge, peak)
        if ds is None:  # measured only (a CPU): say so, the line style alone is subtle
            parts[0] = "measured " + parts[0]
        labels.append(RidgeLabel(ds or ms or 0.0, f"{run.tag} {name} " + "; ".join(parts),
                                 f"ridge:{run.tag}:{name}", run.color, xy))
    for cls in classes:
        if not any(cls in g for g in groups.values()):
            labels.append(RidgeLabel(0.0, f"{run.tag}: no {cls} roof",
                                     f"ridge:{run.tag}:none:{cls}", run.color))
    return labels


def _draw_device_points(ax: Any, run: DeviceRun, rows: pd.DataFrame, dtype: str,
                        providers: list[str]) -> int:
    n = 0
    for provider in canonical_order(rows["provider"].unique(), PROVIDER_ORDER):
        sel = rows[rows["provider"] == provider]
        sizes = [KERNEL_SIZES.get(k, POINT_SIZE) for k in sel["kernel"]]
        ax.scatter(sel["intensity"].astype(float), sel["tflops"].astype(float), s=sizes,
                   marker=provider_marker(provider, providers), color=run.color,
                   alpha=0.8, edgecolors="white", linewidths=0.5, zorder=4,
                   label=f"{run.tag} {provider}", gid=f"points:{run.tag}:{dtype}:{provider}")
        n += len(sel)
    return n


def plot_devices(runs: list[RunDoc], out: str | os.PathLike | None = None) -> Figure:
    """Rooflines of several runs (one per device) on one figure, one panel per dtype.

    `runs` as contract.schema.load_doc reads them.  Writes a PNG to `out` when given and
    returns the Figure either way."""
    devs = device_runs(runs)
    every = pd.concat([d.rows for d in devs if not d.rows.empty] or [pd.DataFrame()])
    dtypes = canonical_order(every["dtype"].unique(), DTYPE_ORDER) if not every.empty else []
    providers = canonical_order(set().union(*(set(d.ok["provider"]) for d in devs)), PROVIDER_ORDER)

    # A panel's roofs: every class that dtype's rows use on any of the devices.
    if dtypes:
        panels = [(dt, canonical_order(
            every.loc[every["dtype"] == dt, "roof_class"].dropna().unique(), ROOF_CLASSES))
            for dt in dtypes]
    else:
        known = {k for d in devs for c in d.ceilings.values() for k in c.tflops}
        panels = [("all dtypes", canonical_order(known, ROOF_CLASSES))]
    all_classes = sorted({c for _, cl in panels for c in cl})
    ceilings = {f"{d.tag}:{s}": c for d in devs for s, c in d.ceilings.items()}
    xlim, ylim = axis_limits([d.ok for d in devs if not d.ok.empty], ceilings, all_classes)

    nrows, ncols = draw_grid(len(panels))
    fig = new_figure(max(5.0 * ncols + 2.4, 8.0), 5.0 * nrows + 0.9)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
    used = tidy_grid(fig, axes, len(panels))
    for i, (ax, (dtype, classes)) in enumerate(zip(used, panels, strict=True)):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        ax.set_box_aspect(1)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
        ax.set_axisbelow(True)
        labels: list[RidgeLabel] = []
        counts: list[str] = []
        for d in devs:
            labels += _draw_device_ceilings(ax, d, classes, xlim)
            rows = d.ok[d.ok["dtype"] == dtype] if dtypes else d.ok
            n = _draw_device_points(ax, d, rows, dtype, providers) if not rows.empty else 0
            counts.append(f"{d.tag} {n}")
        # plot.py's layout, tighter and in device colours.
        draw_ridge_labels(ax, labels, step=0.048, fontsize=6.5, leader_alpha=0.6)
        ax.set_title(f"{dtype}: " + ", ".join(counts) + " points" if dtypes
                     else "no rows in these runs: every known roof", fontsize=10)
        if i % ncols == 0:
            ax.set_ylabel("TFLOP/s")
        if i + ncols >= len(panels):
            ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    fig.suptitle("Roofline across devices: " + " vs ".join(d.tag for d in devs), fontsize=11)
    _legend(fig, devs, providers)
    if out is not None:
        save_figure(fig, out)
    return fig


def _legend(fig: Figure, devs: list[DeviceRun], providers: list[str]) -> None:
    handles: list[Any] = [Line2D([], [], color=d.color, lw=2, label=d.legend) for d in devs]
    handles += [Line2D([], [], ls="", marker=provider_marker(p, providers), ms=6,
                       color="0.3", label=p) for p in providers]
    kernels = canonical_order(set().union(*(set(d.ok["kernel"]) for d in devs)), kernel_order())
    sizes = sorted({KERNEL_SIZES.get(k, POINT_SIZE) for k in kernels})
    if len(sizes) > 1:  # point size tells kernels apart only where KERNEL_SIZES does
        for s in sizes:
            names = [k for k in kernels if KERNEL_SIZES.get(k, POINT_SIZE) == s]
            handles.append(Line2D([], [], ls="", marker="o", ms=math.sqrt(s), color="0.5",
                                  label=", ".join(names)))
    handles += [Line2D([], [], ls=ROOF_STYLE[s], color="0.3", label=f"{s} roof")
                for s in SOURCES]
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
