"""energy.png (`python -m roofline plot RUN --energy`): FLOP per joule against arithmetic
intensity, an energy roofline.  The ceiling is the run's own: its best GEMM's FLOP/J per
dtype (flat) and its best memory-bound row's bytes/J (the slope: intensity x bytes/J),
the roof min of the two (roofline/report/energy.py, EnergyRoof).  Points are the ok rows
with an energy per call, coloured by kernel, marked by provider; a throttled row's point
is hollow.  Artists carry gids (``energy:roof:gemm:bf16``, ``energy:roof:copy``,
``energy:points:matmul:torch``, ``energy:points:matmul:torch:throttled``) for the tests.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from contract.rows import (
    DTYPE_ORDER,
    PROVIDER_ORDER,
    canonical_order,
    is_throttled,
    kernel_order,
)
from contract.schema import RunDoc
from roofline.report.energy import energy_roof, energy_rows
from roofline.report.style import (
    POINT_SIZE,
    dtype_color,
    kernel_color,
    new_figure,
    point_look,
    provider_marker,
    run_title,
    save_figure,
)

ENERGY_PNG = "energy.png"


class NoEnergy(ValueError):
    """A run with no row that carries an energy per call: nothing to draw."""


def plot_energy(doc: RunDoc, out: str | os.PathLike | None = None) -> Figure:
    """The run's energy roofline (the module's docstring); NoEnergy for a run with no
    row to draw, with the reason its metadata gives."""
    df = doc.frame()
    d = energy_rows(df)
    d = d[(d["intensity"] > 0) & (d["tflop_per_j"] > 0)]
    if d.empty:
        energy = doc.meta.telemetry.energy
        why = energy.get("reason") if isinstance(energy, dict) else None
        raise NoEnergy("no ok row carries an energy per call" + (f" ({why})" if why else ""))
    roof = energy_roof(df)
    fig = new_figure(8.0, 5.6)
    ax = fig.add_subplot(1, 1, 1)
    x = d["intensity"].astype(float)
    y = d["tflop_per_j"].astype(float) * 1e12 / 1e9  # GFLOP/J
    lo, hi = float(x.min()) / 3, float(x.max()) * 3
    xs = np.geomspace(lo, hi, 200)
    dtypes = canonical_order(d["dtype"].unique(), DTYPE_ORDER)
    for dtype in canonical_order(roof.gemm_flop_per_j, DTYPE_ORDER):
        flat = roof.gemm_flop_per_j[dtype]
        ys = [roof.at(dtype, float(v)) for v in xs]
        ax.plot(xs, np.array(ys) / 1e9, color=dtype_color(dtype, dtypes), lw=1.6,
                ls="--", gid=f"energy:roof:gemm:{dtype}",
                label=f"roof {dtype}: best GEMM {flat / 1e12:.3g} TFLOP/J")
    if roof.copy_bytes_per_j:
        ax.plot(xs, xs * roof.copy_bytes_per_j / 1e9, color="0.4", lw=1.0, ls=":",
                gid="energy:roof:copy",
                label=f"best memory-bound row {roof.copy_bytes_per_j / 1e9:.3g} GB/J")
    kernels = canonical_order(d["kernel"].unique(), kernel_order())
    providers = canonical_order(d["provider"].unique(), PROVIDER_ORDER)
    hot = d["throttled"].map(is_throttled) if "throttled" in d.columns \
        else pd.Series(False, index=d.index)
    for kernel in kernels:
        for provider in providers:
            for throttled in (False, True):
                sel = (d["kernel"] == kernel) & (d["provider"] == provider) & \
                    (hot == throttled)
                if not sel.any():
                    continue
                color = kernel_color(kernel, kernels)
                look = point_look(color, hollow=throttled)
                tag = ":throttled" if throttled else ""
                ax.scatter(x[sel], y[sel], s=POINT_SIZE,
                           marker=provider_marker(provider, providers), zorder=4, alpha=0.9,
                           gid=f"energy:points:{kernel}:{provider}{tag}",
                           label=f"{kernel} {provider}" + (" (throttled)" if throttled
                                                          else ""), **look)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP per joule")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    fig.suptitle(run_title(doc.meta, "Energy roofline"), fontsize=9)
    if out is not None:
        save_figure(fig, out)
    return fig
