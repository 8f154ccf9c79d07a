"""step.png: a measured training step on the device's roofline.  Each kind of work
whose FLOPs and bytes are known (the step's GEMMs, its attention) is one point at
(FLOP/byte, TFLOP/s) of its profiled time, its area proportional to its share of the
step's time; the kinds without FLOPs (norms and elementwise, loss, optimizer, other)
are listed with their shares, since a roofline has no place for them."""

from __future__ import annotations

import os
from typing import Any

from matplotlib.figure import Figure

from roofline.devices import ROOF_CLASS
from roofline.plan.plot import marker_area, roofline_axes
from roofline.rows import run_ceilings
from roofline.style import save_figure

_COLORS = {"gemm": "#1f77b4", "attention": "#d62728"}


def plot_step(plan: dict[str, Any], out: str | os.PathLike | None = None) -> Figure:
    sm = plan["step_measured"]
    report, meas = sm["report"], sm["measurement"]
    rc = ROOF_CLASS[meas["dtype"]]
    ceilings = run_ceilings({"ceilings": sm["ceilings"]} if sm.get("ceilings")
                            else {"device_key": plan["device"]})
    points = [c for c in report["categories"] if c["tflops"] and c["intensity"]]
    xs = [c["intensity"] for c in points]
    ys = [c["tflops"] for c in points]
    for c in ceilings.values():
        if rc in c.tflops:
            ys.append(c.tflops[rc])
            if c.ridge(rc):
                xs.append(c.ridge(rc))
    xlim = (min(xs) / 8, max(xs) * 8) if xs else (0.1, 1e4)
    ylim = (min(ys) / 8, max(ys) * 8) if ys else (1e-3, 1e4)
    fig, ax = roofline_axes(ceilings, rc, xlim, ylim)
    for c in points:
        ax.scatter([c["intensity"]], [c["tflops"]], s=[marker_area(c["share"])],
                   color=_COLORS.get(c["category"], "0.4"), alpha=0.6, edgecolors="black",
                   linewidths=0.5, zorder=4, gid=f"step:{c['category']}",
                   label=f"{c['category']}: {c['share']:.1%} of the step, "
                         f"{c['tflops']:.3g} TFLOP/s")
    rest = [c for c in report["categories"] if c not in points and c["share"] > 0.0005]
    if rest:
        text = "not on the roofline (no FLOP count):\n" + "\n".join(
            f"  {c['category']}: {c['share']:.1%}" for c in
            sorted(rest, key=lambda c: -c["share"]))
        ax.text(0.02, 0.02, text, transform=ax.transAxes, fontsize=8, va="bottom", ha="left",
                gid="step:unplaced",
                bbox=dict(boxstyle="square,pad=0.3", fc="white", ec="0.8", alpha=0.9))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    m = plan.get("model") or {}
    sliced = (f", extrapolated from {meas['measured_layers']} of {meas['layers']} blocks"
              if report["slice"] else "")
    fig.suptitle(f"Training step of {m.get('name', '?')} ({meas['micro_batch']} x "
                 f"{m.get('seq_len', '?')} tokens, {meas['dtype']}) on "
                 f"{plan['device_name']}: {report['step_ms']:.4g} ms, MFU "
                 f"{report['mfu']:.1%}{sliced}\nmarker area = share of the step's time "
                 "(one profiled step)", fontsize=10)
    if points:
        ax.legend(loc="lower right", fontsize=8)
    if out is not None:
        save_figure(fig, out)
    return fig
