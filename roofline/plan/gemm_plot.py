"""plan.png: the GEMMs of one training step on the device's roofline, each marker's area
proportional to its share of the step's matmul time (roofline/plan/arithmetic.py)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from contract.devices import ROOF_CLASS
from contract.rows import Ceiling, run_ceilings
from roofline.plan.arithmetic import Gemm
from roofline.report.plot import draw_ceilings
from roofline.report.style import fmt_tflops, new_figure, save_figure

if TYPE_CHECKING:
    from roofline.plan.plan_record import Plan, PlanModel

_PHASE_COLORS = {"forward": "#1f77b4", "bwd-input": "#ff7f0e", "bwd-weight": "#2ca02c"}
_MIN_AREA, _MAX_AREA = 12.0, 900.0  # points^2 for a 0% and a 100% share


def gemm_bytes(g: Gemm, dtype: str) -> float:
    """Compulsory bytes of a GEMM through the matmul spec (docs/design.md)."""
    from kernels import REGISTRY

    return float(REGISTRY["matmul"].nbytes({"M": g.M, "N": g.N, "K": g.K}, dtype))


def marker_area(share: float) -> float:
    return _MIN_AREA + (_MAX_AREA - _MIN_AREA) * share


def _axis_limits(df: pd.DataFrame, ceilings: dict[str, Ceiling],
                 rc: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """Around the points and the roof's ridge, with headroom above the roof for labels:
    a plan's GEMMs span a decade or two, unlike a full sweep."""
    xs = list(df["intensity"]) if not df.empty else []
    ys = list(df["tflops"]) if not df.empty else []
    for c in ceilings.values():
        if rc in c.tflops:
            ys.append(c.tflops[rc])
            if c.ridge(rc):
                xs.append(c.ridge(rc))
    if not xs or not ys:
        return (0.1, 1e4), (1e-3, 1e4)
    return (min(xs) / 8, max(xs) * 4), (min(ys) / 6, max(ys) * 8)


def _label_weights(ax: Any, df: pd.DataFrame, top: int = 6) -> None:
    """One label per weight (its three GEMMs' summed share of the step), stacked in the
    empty upper left under the roof labels and tied to the weight's largest GEMM by a
    leader: the three GEMMs of a weight often sit on one spot, where labels would pile."""
    shares = df.groupby("name")["share"].sum().sort_values(ascending=False)
    for i, (name, share) in enumerate(shares.head(top).items()):
        sel = df[df["name"] == name]
        top_gemm = sel["share"].idxmax()
        ax.annotate(f"{name}: {share:.1%} of step time",
                    xy=(sel.at[top_gemm, "intensity"], sel.at[top_gemm, "tflops"]),
                    xytext=(0.03, 0.80 - 0.05 * i), textcoords="axes fraction", fontsize=7,
                    color="0.2", ha="left", va="top", zorder=5, gid=f"weight-label:{name}",
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.9),
                    arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5, alpha=0.6,
                                    shrinkA=0, shrinkB=3))


def roofline_axes(ceilings: dict[str, Ceiling], rc: str, xlim: tuple[float, float],
                  ylim: tuple[float, float]) -> tuple[Figure, Any]:
    """One log-log panel with the device's HBM slope and the roof of class `rc`."""
    fig = new_figure(8.5, 6.2)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.grid(True, which="major", color="0.9", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    draw_ceilings(ax, ceilings, [rc], xlim)
    return fig, ax


def plot_plan(plan: Plan, out: str | os.PathLike | None = None) -> Figure:
    """One panel: the device's HBM slope and the dtype's roof (datasheet solid, measured
    dashed, from roofline/report/plot.py) and one marker per step GEMM at (FLOP/byte, TFLOP/s)."""
    dtype = plan.dtype
    rc = ROOF_CLASS[dtype]
    meas = plan.measurement
    measured = meas.ceilings if meas is not None else None
    ceilings = run_ceilings({"ceilings": measured} if isinstance(measured, dict)
                            else {"device_key": plan.device})
    df = pd.DataFrame([{"name": g.name, "phase": g.phase, "tflops": g.tflops,
                        "share": g.share, "intensity": g.flops / gemm_bytes(g, dtype)}
                       for g in plan.gemms if g.tflops])
    xlim, ylim = _axis_limits(df, ceilings, rc)
    fig, ax = roofline_axes(ceilings, rc, xlim, ylim)
    for phase, color in _PHASE_COLORS.items():
        sel = df[df["phase"] == phase] if not df.empty else df
        if sel.empty:
            continue
        ax.scatter(sel["intensity"], sel["tflops"], s=[marker_area(s or 0) for s in sel["share"]],
                   color=color, alpha=0.55, edgecolors="black", linewidths=0.5, zorder=4,
                   gid=f"gemms:{phase}", label=phase)
    if not df.empty:
        _label_weights(ax, df)
    st = plan.step
    if st.tflops:
        ax.axhline(st.tflops, color="#d62728", lw=1.0, ls="-.", zorder=3, gid="step-average",
                   label=f"step average {fmt_tflops(st.tflops)} TFLOP/s "
                         f"(MFU {st.mfu or 0:.1%})")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    m = plan.model
    src = plan.mfu_from
    where = (meas.device_name if meas is not None else None) or plan.device_name
    fig.suptitle(f"Step GEMMs of {m.name if m else '?'} ({plan.micro_batch} x "
                 f"{seq_len_of(m)} tokens, {dtype}) on {where}"
                 f"\nmarker area = share of the step's matmul time; {src}", fontsize=10)
    handles = [Line2D([], [], marker="o", ls="", color=c, alpha=0.6, label=p)
               for p, c in _PHASE_COLORS.items()]
    handles += [Line2D([], [], color="#d62728", ls="-.", label="step average")]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    if out is not None:
        save_figure(fig, out)
    return fig


def seq_len_of(m: PlanModel | None) -> int | str:
    """A plan's sequence length for a title: its shape's, '?' with --params alone."""
    return m.shape.seq_len if m is not None and m.shape is not None else "?"

