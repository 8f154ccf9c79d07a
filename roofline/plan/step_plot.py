"""step.png: a measured training step on the device's roofline.  Each kind of work
whose FLOPs and bytes are known (the step's GEMMs, its attention) is one point at
(FLOP/byte, TFLOP/s) of its profiled time, its area proportional to its share of the
step's time; the kinds without FLOPs (norms and elementwise, loss, optimizer, other)
are listed with their shares, since a roofline has no place for them.

With --explain the points are the explain categories whose kernels the harness timed:
filled at their rate in the step, hollow at their rate alone, joined by a line; a second
panel sets each category's profiled time beside the same ops' time alone."""

from __future__ import annotations

import os
from typing import Any

from matplotlib.figure import Figure

from contract.ceilings import Ceilings
from contract.devices import ROOF_CLASS
from contract.rows import run_ceilings
from roofline.plan.arithmetic import over_peak, rate_text
from roofline.plan.explain import CategoryExplained, ExplainReport
from roofline.plan.gemm_plot import marker_area, roofline_axes, seq_len_of
from roofline.plan.plan_record import Plan
from roofline.plan.step_records import StepCategory, StepReport
from roofline.report.style import save_figure

_COLORS = {"gemm": "#1f77b4", "attention": "#d62728"}
_EXPLAIN_COLORS = {"norm": "#2ca02c", "loss/softmax": "#9467bd",
                   "optimizer/elementwise": "#ff7f0e", "other": "#7f7f7f"}


def plot_step(plan: Plan, out: str | os.PathLike | None = None) -> Figure:
    sm = plan.step_measured
    assert sm is not None  # drawn only for a measured step
    report, meas, explain = sm.report, sm.measured, sm.explain
    rc = ROOF_CLASS[meas.dtype]
    ceilings = run_ceilings({"ceilings": sm.ceilings} if sm.ceilings
                            else {"device_key": plan.device})
    points = [] if explain else [c for c in report.categories if c.tflops and c.intensity]
    placed = [c for c in (explain.categories if explain else ())
              if c.comparison.intensity and c.comparison.in_step.tflops
              and c.comparison.alone.tflops]
    xs = [c.intensity for c in points] + [c.comparison.intensity for c in placed]
    ys = [c.tflops for c in points] + [r.tflops for c in placed
                                       for r in (c.comparison.in_step, c.comparison.alone)]
    fig, ax = roofline_axes(ceilings, rc, *_limits(xs, ys, ceilings, rc))
    _step_points(ax, report, points)
    if explain:
        _explain_points(ax, explain, placed)
        _explain_bars(fig, ax, explain)
    rest = [c for c in report.categories if c not in points and c.share > 0.0005]
    if rest and not explain:
        text = "not on the roofline (no FLOP count):\n" + "\n".join(
            f"  {c.category}: {c.share:.1%}" for c in sorted(rest, key=lambda c: -c.share))
        ax.text(0.02, 0.02, text, transform=ax.transAxes, fontsize=8, va="bottom", ha="left",
                gid="step:unplaced",
                bbox=dict(boxstyle="square,pad=0.3", fc="white", ec="0.8", alpha=0.9))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    m = plan.model
    sliced = (f", extrapolated from {meas.measured_layers} of {meas.layers} blocks"
              if report.slice else "")
    fig.suptitle(f"Training step of {m.name if m else '?'} ({meas.micro_batch} x "
                 f"{seq_len_of(m)} tokens, {meas.dtype}) on "
                 f"{plan.device_name}: {report.step_ms:.4g} ms, MFU "
                 f"{report.mfu:.1%}{sliced}\nmarker area = share of the step's time "
                 "(one profiled step)", fontsize=10)
    if points or placed:
        ax.legend(loc="best" if placed else "lower right", fontsize=7 if placed else 8)
    if out is not None:
        save_figure(fig, out)
    return fig


def _limits(xs: list[float], ys: list[float], ceilings: dict[str, Ceilings], rc: str
            ) -> tuple[tuple[float, float], tuple[float, float]]:
    """Around the points and the roof's ridge, a factor 8 each way."""
    for c in ceilings.values():
        if rc in c.tflops:
            ys.append(c.tflops[rc])
            if c.ridge(rc):
                xs.append(c.ridge(rc))
    xlim = (min(xs) / 8, max(xs) * 8) if xs else (0.1, 1e4)
    ylim = (min(ys) / 8, max(ys) * 8) if ys else (1e-3, 1e4)
    return xlim, ylim


def _step_points(ax: Any, report: StepReport, points: list[StepCategory]) -> None:
    """Each kind of work with FLOPs and bytes at its rate in the step, its area its
    share of the step's time."""
    for c in points:
        # A point above the peak is an accounting error: drawn hollow, said so.
        wrong = over_peak(c.tflops, report.peak_tflops)
        color = _COLORS.get(c.category, "0.4")
        rate = rate_text(c.tflops, report.peak_tflops, report.peak_source)
        ax.scatter([c.intensity], [c.tflops], s=[marker_area(c.share)],
                   facecolors="none" if wrong else color, alpha=0.6,
                   edgecolors=color if wrong else "black", linewidths=1.5 if wrong else 0.5,
                   zorder=4, gid=f"step:{c.category}",
                   label=f"{c.category}: {c.share:.1%} of the step, {rate}"
                         + ("" if rate.startswith("accounting") else " TFLOP/s"))


def _color(category: str) -> str:
    return _COLORS.get(category, _EXPLAIN_COLORS.get(category, "0.4"))


def _explain_points(ax: Any, explain: ExplainReport, placed: list[CategoryExplained]
                    ) -> None:
    """Each timed category at its FLOP/byte: filled at its rate in the step (area: its
    share of the step's profiled time), hollow at its rate alone."""
    total = explain.profiled_ms or 1.0
    for cat in placed:
        c, color = cat.comparison, _color(cat.category)
        x = c.intensity
        step, alone = c.in_step.tflops, c.alone.tflops
        ax.plot([x, x], [step, alone], color=color, lw=1, zorder=3)
        ax.scatter([x], [step], s=[marker_area(cat.profiled_total_ms / total)],
                   color=color, alpha=0.7, edgecolors="black", linewidths=0.5, zorder=4,
                   gid=f"explain:step:{cat.category}",
                   label=f"{cat.category} in the step: {step:.3g} TFLOP/s "
                         f"({'+'.join(c.passes)})")
        ax.scatter([x], [alone], s=[40], facecolors="none", edgecolors=color,
                   linewidths=1.2, zorder=4, gid=f"explain:alone:{cat.category}",
                   label=f"{cat.category} alone: {alone:.3g} TFLOP/s")


def _explain_bars(fig: Figure, ax: Any, explain: ExplainReport) -> None:
    """A second panel: per category, the profiled time in the step beside the same ops'
    time alone (none where the harness has no kernel for them, said on the bar)."""
    w, h = fig.get_size_inches()
    fig.set_size_inches(w * 1.9, h)
    gs = fig.add_gridspec(1, 2, width_ratios=[1.15, 1])
    ax.set_subplotspec(gs[0])
    bx = fig.add_subplot(gs[1])
    cats = [c for c in explain.categories if c.profiled_total_ms or c.kernels]
    ys = list(range(len(cats)))[::-1]
    labelled: set[str] = set()
    for y, cat in zip(ys, cats, strict=True):
        c, color, name = cat.comparison, _color(cat.category), cat.category
        bx.barh(y + 0.2, cat.profiled_total_ms, height=0.38, color=color, alpha=0.3,
                gid=f"explain:bar:step:{name}",
                label=_once(labelled, "profiled in the step"))
        if c.alone_ms is not None:  # the passes the kernels alone cover
            bx.barh(y + 0.2, c.step_ms, height=0.38, color=color, alpha=0.9,
                    gid=f"explain:bar:covered:{name}",
                    label=_once(labelled, "of it, the passes timed alone"))
            bx.barh(y - 0.2, c.alone_ms, height=0.38, color="white", edgecolor=color,
                    hatch="//", gid=f"explain:bar:alone:{name}",
                    label=_once(labelled, "the same ops alone"))
            text = (f"step / alone {c.ratio:.3g} ({'+'.join(c.passes)})"
                    if c.ratio else "")
        else:
            text = "no kernel in the harness: no figure alone"
        bx.text(1.0, y, f"  {text}", transform=bx.get_yaxis_transform(), va="center",
                ha="left", fontsize=7, color="0.3", clip_on=False)
    bx.set_yticks(ys, [c.category for c in cats], fontsize=8)
    times = [t for c in cats for t in (c.profiled_total_ms, c.comparison.alone_ms) if t]
    if times:
        bx.set_xscale("log")
        bx.set_xlim(min(times) / 3, max(times) * 3)
    bx.set_xlabel("ms per step")
    bx.legend(loc="lower right", fontsize=8)
    bx.set_title(f"the step's time against its kernels alone ({explain.provider})",
                 fontsize=9)


def _once(seen: set[str], label: str) -> str | None:
    """A legend label the first time only."""
    if label in seen:
        return None
    seen.add(label)
    return label
