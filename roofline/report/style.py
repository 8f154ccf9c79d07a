"""How the figures look and how their numbers read: colours per kernel, markers per
provider, ceiling line styles, number formats shared with summary.md, and the
headless Agg figure helpers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from contract.run_meta import RunMeta
from contract.schema import atomic_write

# Kernel colours avoid tab10 green/red/grey: green and red mean faster/slower on baseline
# arrows, grey is the ceilings.
_KERNEL_COLORS = {
    "add": "#1f77b4", "mul": "#ff7f0e", "gelu": "#9467bd", "gelu_erf": "#8c564b",
    "dot": "#e377c2", "matvec": "#17becf", "matmul": "#bcbd22",
    "softmax": "#393b79", "layernorm": "#637939", "rmsnorm": "#8c6d31",
    "attention": "#843c39", "attention_bwd": "#7b4173",
}

_EXTRA_COLORS = ("#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194")

# add/mul and gelu/gelu_erf have the same intensity by construction and usually the same
# speed, so one would hide the other: the first of each pair (drawn first) is larger and
# shows as a ring around the second.  x is never jittered: intensity is exact.
KERNEL_SIZES = {"add": 46, "mul": 18, "gelu": 46, "gelu_erf": 18}

POINT_SIZE = 28

_DTYPE_COLORS = {
    "fp32": "#1f77b4", "tf32": "#17becf", "fp16": "#ff7f0e", "bf16": "#d62728",
    "fp8": "#2ca02c", "fp8e5": "#8c564b", "mxfp8": "#9467bd", "mxfp4": "#e377c2",
    "nvfp4": "#bcbd22",
}

# One marker per provider (kernels.PROVIDERS), fixed so a provider reads the same in every
# figure; a provider without one takes the next of _EXTRA_MARKERS.
_PROVIDER_MARKERS = {"torch": "o", "triton": "^", "compile": "s", "compile-max": "D",
                     "sdpa-flash": "v", "sdpa-cudnn": "P", "sdpa-efficient": "X",
                     "sdpa-math": "<"}

# The cross-device figure (roofline/report/plot_devices.py): one colour per run, in the order
# given, for its roofs and its points alike.
_DEVICE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                  "#17becf", "#bcbd22", "#d62728", "#7f7f7f")

_EXTRA_MARKERS = ("p", "h", ">", "*", "d")

# Baseline arrows: this run faster or slower than the baseline.
FASTER, SLOWER = "#2ca02c", "#d62728"
ROOF_COLOR = {"datasheet": "0.15", "measured": "0.40"}

ROOF_STYLE = {"datasheet": "-", "measured": "--"}

L2_STYLE = ":"

DPI = 140


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


def fmt_bytes(x: float, _pos_: Any = None) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:g} {unit}"
    return f"{x:g} B"


class PlainLogFormatter(LogFormatter):
    """LogFormatter's choice of which ticks get a label (minor ones only on short axes),
    written as plain numbers: 20, 0.6, 1000 rather than 2x10^1, 6e-01, 10^3."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:g}" if super().__call__(x, pos) else ""


def run_title(meta: RunMeta, what: str) -> str:
    """A figure's title: what it shows, the device, the run (date, id, commit) and the
    versions it ran with."""
    key = meta.device.device_key
    name = meta.device.device_name or key or "?"
    head = f"{what}: {name}" + (f" ({key})" if key and key != name else "")
    # Three short lines rather than one long one: a one-panel figure is narrow, and a
    # long centred title would run into the legend on the right.
    run = []
    prov, sw = meta.provenance, meta.software
    created = str(prov.created or "")
    if created:
        run.append(created[:16].replace("T", " "))
    if prov.run_id:
        run.append(f"run {prov.run_id}")
    if prov.git_commit:
        run.append(f"git {str(prov.git_commit)[:10]}")
    versions = [f"{k} {v}" for k, v in (("torch", sw.torch), ("triton", sw.triton),
                                         ("python", sw.python)) if v]
    lines = [head] + ["  |  ".join(b) for b in (run, versions) if b]
    return "\n".join(lines)


def kernel_color(kernel: str, kernels: list[str]) -> str:
    if kernel in _KERNEL_COLORS:
        return _KERNEL_COLORS[kernel]
    unknown = [k for k in kernels if k not in _KERNEL_COLORS]
    return _EXTRA_COLORS[unknown.index(kernel) % len(_EXTRA_COLORS)]


def provider_marker(provider: str, providers: list[str]) -> str:
    if provider in _PROVIDER_MARKERS:
        return _PROVIDER_MARKERS[provider]
    unknown = [p for p in providers if p not in _PROVIDER_MARKERS]
    return _EXTRA_MARKERS[unknown.index(provider) % len(_EXTRA_MARKERS)]


class PointLook(TypedDict, total=False):
    """A scatter point's face and edge, as matplotlib's scatter() takes them."""

    color: str
    facecolors: str
    edgecolors: str
    linewidths: float


def point_look(color: str, hollow: bool) -> PointLook:
    """A scatter point's face and edge: filled with a white rim, or hollow in its colour
    (a warm row on the roofline, a throttled one on the energy figure)."""
    if hollow:
        return PointLook(facecolors="none", edgecolors=color, linewidths=1.2)
    return PointLook(color=color, edgecolors="white", linewidths=0.5)


def dtype_color(dtype: str, dtypes: list[str]) -> str:
    if dtype in _DTYPE_COLORS:
        return _DTYPE_COLORS[dtype]
    unknown = [d for d in dtypes if d not in _DTYPE_COLORS]
    return _EXTRA_COLORS[unknown.index(dtype) % len(_EXTRA_COLORS)]


def device_color(index: int) -> str:
    return _DEVICE_COLORS[index % len(_DEVICE_COLORS)]


def new_figure(width: float, height: float) -> Figure:
    # Constrained layout keeps the outside legend, suptitle and shared labels apart.
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def draw_grid(n: int) -> tuple[int, int]:
    ncols = {1: 1, 2: 2, 3: 3, 4: 2}.get(n, 3)
    return math.ceil(n / ncols), ncols


def tidy_grid(fig: Figure, axes: np.ndarray, n: int) -> list[Any]:
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
    """Write the figure as PNG atomically (temp file + rename, contract.schema.atomic_write):
    a crash mid-write never leaves a truncated image in place of a good one, and the PNG
    gets the same mode as the run's other files."""
    return atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=DPI))


@dataclass(frozen=True)
class RidgeLabel:
    """One line of a panel's label block: the roof height it is sorted by, its text, its
    SVG id, its colour, and the marker its leader line ties it to (None: no leader)."""

    height: float
    text: str
    gid: str
    color: str
    xy: tuple[float, float] | None = None


def draw_ridge_labels(ax: Any, labels: list[RidgeLabel], step: float = 0.052,
                      fontsize: float = 7.0, leader_alpha: float = 0.7) -> None:
    """The label block in a panel's upper-left corner, highest roof first (so the leader
    lines fan out downwards without crossing), each label tied to its marker by a leader
    line.  The box keeps lines (grid, L2 slope, the leader of the label above, drawn
    earlier) from cutting through the text, and clips the label's own leader to the box
    edge nearest its marker; points (zorder 4) still draw over it."""
    for i, label in enumerate(sorted(labels, key=lambda lb: -lb.height)):
        text, gid, color, xy = label.text, label.gid, label.color, label.xy
        pos = (0.03, 0.97 - step * i)
        kw = dict(
            fontsize=fontsize, color=color, ha="left", va="top", zorder=2.5, gid=gid,
            annotation_clip=False,
            bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.9))
        if xy is None:
            ax.annotate(text, xy=pos, xycoords="axes fraction", **kw)
        else:
            ax.annotate(text, xy=xy, xytext=pos, textcoords="axes fraction", **kw,
                        arrowprops=dict(arrowstyle="-", color=color, lw=0.6,
                                        alpha=leader_alpha, shrinkA=0, shrinkB=4))
