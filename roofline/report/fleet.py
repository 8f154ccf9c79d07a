"""A fleet run's devices side by side: fleet.md and fleet.png, one line per device
(rank) with its key figures as ratios to the fleet median, and the outliers: a device
more than the tolerance below the median on any key figure (what DCGM diagnostics and
per-GPU mamf-finder runs are used for: finding the slow GPU)."""

from __future__ import annotations

import os
import statistics
from typing import Any

import pandas as pd

from contract.markdown import md_table_lines
from contract.rows import positive_float
from contract.schema import atomic_write_text, mode_tag
from roofline.report.style import new_figure, save_figure

DEFAULT_TOLERANCE = {"cuda": 5.0, "cpu": 25.0}  # percent below the fleet median
# Key figures, higher is better: the measured copy bandwidth, the largest matmuls'
# TFLOP/s in bf16 and fp8, the median SM clock (GPU), and the median TFLOP/s and GB/s of
# the rank's rows (every device, the CPU too).
FIGURES = ("copy_gbps", "bf16_matmul_tflops", "fp8_matmul_tflops", "sm_clock_mhz",
           "rows_gbps")
# The figures read from a rank's rows, one set per cache mode: a cold and a warm time of
# one case are different numbers (the gate never compares them either), so a median or a
# largest matmul never mixes the two.  The device's native mode (cold on a GPU, warm on a
# CPU; a row without a `cache` cell has it, schema.mode_tag) keeps the plain names, the
# other mode's figures are named "rows_gbps (warm)" and compared only with each other.
ROW_FIGURES = ("bf16_matmul_tflops", "fp8_matmul_tflops", "sm_clock_mhz", "rows_gbps")


def figure_name(figure: str, tag: str) -> str:
    """A figure's name for rows of cache mode `tag` ("" for the native mode)."""
    return f"{figure} ({tag})" if tag else figure


def figures_of(devices: list[dict[str, Any]]) -> list[str]:
    """The figures the devices hold, in FIGURES order, each figure's native mode first."""
    out = []
    for f in FIGURES:
        out.append(f)
        # "rows_gbps (warm)", not its "rows_gbps (warm)_ratio"
        out += sorted({k for d in devices for k in d
                       if k.startswith(f"{f} (") and k.endswith(")")})
    return out


def _largest_matmul(rows: pd.DataFrame, dtype: str) -> float | None:
    sel = rows[(rows["kernel"] == "matmul") & (rows["dtype"] == dtype)
               & (rows["status"] == "ok")]
    if sel.empty:
        return None
    sel = sel.assign(_f=pd.to_numeric(sel["flops"], errors="coerce"))
    top = sel[sel["_f"] == sel["_f"].max()]
    return positive_float(pd.to_numeric(top["tflops"], errors="coerce").max())


def _row_figures(ok: pd.DataFrame) -> dict[str, Any]:
    """ROW_FIGURES of ok rows of one cache mode."""
    clocks = [c for c in (pd.to_numeric(ok.get("sm_clock_mhz"), errors="coerce")
                          if "sm_clock_mhz" in ok else []) if positive_float(c)]
    gbps = [g for g in pd.to_numeric(ok.get("gbps"), errors="coerce") if positive_float(g)] \
        if "gbps" in ok else []
    return {
        "bf16_matmul_tflops": _largest_matmul(ok, "bf16") if not ok.empty else None,
        "fp8_matmul_tflops": _largest_matmul(ok, "fp8") if not ok.empty else None,
        "sm_clock_mhz": statistics.median(clocks) if clocks else None,
        "rows_gbps": statistics.median(gbps) if gbps else None,
    }


def device_figures(rank: dict[str, Any], rows: pd.DataFrame) -> dict[str, Any]:
    """One device's key figures from its rows (one set per cache mode, ROW_FIGURES) and
    its measured ceilings."""
    ok = rows[(rows["status"] == "ok")] if not rows.empty else rows
    throttled = int(sum(1 for v in ok.get("throttled", []) if v is True)) \
        if "throttled" in ok else 0
    tags = pd.Series([mode_tag(r) for r in ok.to_dict("records")], index=ok.index,
                     dtype=object)
    out = {
        "rank": rank["rank"], "host": rank["host"], "device": rank.get("device_name"),
        "gpu_uuid": rank.get("gpu_uuid"),
        "copy_gbps": positive_float(rank.get("copy_gbps")),
        **_row_figures(ok[tags == ""]),
        "throttled_rows": throttled, "exit_code": rank.get("exit_code"),
    }
    for tag in sorted(set(tags) - {""}):
        out.update({figure_name(f, tag): v for f, v in _row_figures(ok[tags == tag]).items()})
    return out


def find_outliers(devices: list[dict[str, Any]], tolerance_pct: float
                  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(outliers with their reasons, fleet medians): a device is an outlier when a key
    figure is more than tolerance_pct below the fleet median of that figure."""
    medians = {f: statistics.median(v) for f in figures_of(devices)
               if (v := [d[f] for d in devices if d.get(f)])}
    out = []
    for d in devices:
        low = []
        for f, med in medians.items():
            if d.get(f) and d[f] < med * (1 - tolerance_pct / 100):
                low.append(f"{f} {d[f]:.4g} = {d[f] / med:.2f}x the median {med:.4g}")
            d[f"{f}_ratio"] = d[f] / med if d.get(f) else None
        if low:
            out.append({**d, "why": "; ".join(low)})
    return out, medians


def bandwidth_cell(v: Any) -> str:
    """A bandwidth for the tables: "n/a" where there is none (a collective of one rank
    has no busbw: None in the row, NaN once in a frame), never 0."""
    bw = positive_float(v)
    return f"{bw:.4g}" if bw is not None else "n/a"


def has_busbw(collectives: pd.DataFrame) -> bool:
    """Whether any ok collective row has a busbw (a fleet of one rank has none)."""
    if collectives.empty or "busbw_gbps" not in collectives:
        return False
    ok = collectives[collectives["status"] == "ok"]
    return bool((pd.to_numeric(ok["busbw_gbps"], errors="coerce") > 0).any())


def render_fleet_md(devices: list[dict[str, Any]], outliers: list[dict[str, Any]],
                    medians: dict[str, float], tolerance_pct: float,
                    collectives: pd.DataFrame, note: str | None = None) -> str:
    figures = figures_of(devices)
    head = ["rank", "host", "device", *figures, "throttled rows", "exit"]
    lines = ["# Fleet", "", *([f"**{note}**", ""] if note else []),
             f"{len(devices)} device(s); each key figure as a ratio to the fleet median "
             f"(an outlier is more than {tolerance_pct:g}% below it on any figure).", ""]
    rows = []
    for d in devices:
        cells = [str(d["rank"]), str(d["host"]), str(d.get("device") or "-")]
        for f in figures:
            v, r = d.get(f), d.get(f"{f}_ratio")
            cells.append(f"{v:.4g} ({r:.2f}x)" if v and r else "-")
        rows.append([*cells, str(d["throttled_rows"]), str(d.get("exit_code"))])
    lines += md_table_lines(head, rows, tight=True)
    lines += ["", "Fleet medians: " + ", ".join(f"{k} {v:.4g}" for k, v in medians.items()),
              "", f"## Outliers ({len(outliers)})", ""]
    lines += [f"- rank {o['rank']} on {o['host']} ({o.get('gpu_uuid') or o.get('device')}): "
              f"{o['why']}" for o in outliers] or ["None."]
    if not collectives.empty:
        lines += ["", "## Collectives (slowest rank)", "", *md_table_lines(
            ["op", "backend", "dtype", "bytes", "ms", "algbw GB/s", "busbw GB/s"],
            [[r["kernel"], r["provider"], r["dtype"], f"{r['bytes']:,}", f"{r['ms_median']:.4g}",
              f"{r['algbw_gbps']:.4g}", bandwidth_cell(r.get("busbw_gbps"))]
             for r in collectives.to_dict("records") if r["status"] == "ok"], tight=True)]
        if not has_busbw(collectives):
            lines += ["", "One rank: no data crosses a link, so there is no busbw (n/a); "
                          "algbw is the local copy's."]
    return "\n".join(lines) + "\n"


def plot_fleet(devices: list[dict[str, Any]], collectives: pd.DataFrame,
               link_gbps: float | None, tolerance_pct: float,
               out: str | os.PathLike) -> None:
    """Left: each device's key figures as ratios to the fleet median, the tolerance band
    shaded; right: busbw against message size per collective (the communication
    roofline), with the link's roof where it is known."""
    fig = new_figure(13, 5.2)
    ax = fig.add_subplot(1, 2, 1)
    xs = list(range(len(devices)))
    figures = figures_of(devices)
    for i, f in enumerate(figures):
        ys = [d.get(f"{f}_ratio") for d in devices]
        pts = [(x + (i - len(figures) // 2) * 0.08, y) for x, y in zip(xs, ys, strict=True)
               if y]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=f, s=30, zorder=3, gid=f"fleet:{f}")
    ax.axhspan(1 - tolerance_pct / 100, 2, color="0.93", zorder=0)
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(xs, [f"rank {d['rank']}\n{d['host']}" for d in devices], fontsize=7)
    ax.set_ylabel("ratio to the fleet median")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"devices (outlier below {1 - tolerance_pct / 100:.2f}x)", fontsize=9)
    bx = fig.add_subplot(1, 2, 2)
    ok = collectives[collectives["status"] == "ok"] if not collectives.empty else collectives
    # One rank has no busbw: its algbw (a local copy) is drawn instead, without the
    # link's roof, which it says nothing about.
    bus = has_busbw(collectives)
    column, name = ("busbw_gbps", "busbw") if bus else ("algbw_gbps", "algbw")
    for (op, dtype), g in (ok.groupby(["kernel", "dtype"]) if not ok.empty else []):
        g = g.sort_values("bytes")
        bx.plot(g["bytes"], pd.to_numeric(g[column], errors="coerce"), marker="o", ms=3,
                label=f"{op} {dtype}", gid=f"{name}:{op}:{dtype}")
    if link_gbps and bus:
        bx.axhline(link_gbps, color="0.2", ls="--", lw=1, label=f"link {link_gbps:g} GB/s")
    bx.set_xscale("log", base=2)
    bx.set_yscale("log")
    bx.set_xlabel("message size (bytes, whole array)")
    bx.set_ylabel("busbw (GB/s)" if bus else "algbw (GB/s), one rank: no busbw")
    bx.set_title("collectives: latency-bound (small) to bandwidth-bound (large)", fontsize=9)
    if not ok.empty:
        bx.legend(fontsize=6, ncol=2)
    save_figure(fig, out)


def write_fleet(folder: str | os.PathLike, devices: list[dict[str, Any]],
                collectives: pd.DataFrame, tolerance_pct: float,
                link_gbps: float | None, plot: bool = True,
                note: str | None = None) -> list[dict[str, Any]]:
    """fleet.md (with `note` on top: an incomplete fleet) and, with `plot`, fleet.png in
    `folder`; returns the outliers."""
    outliers, medians = find_outliers(devices, tolerance_pct)
    atomic_write_text(os.path.join(folder, "fleet.md"),
                      render_fleet_md(devices, outliers, medians, tolerance_pct, collectives,
                                      note))
    if plot:
        plot_fleet(devices, collectives, link_gbps, tolerance_pct,
                   os.path.join(folder, "fleet.png"))
    return outliers
