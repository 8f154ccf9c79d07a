"""A fleet run's devices side by side: fleet.md and fleet.png, one line per device
(rank) with its key figures as ratios to the fleet median, and the outliers: a device
more than the tolerance below the median on any key figure (what DCGM diagnostics and
per-GPU mamf-finder runs are used for: finding the slow GPU).  Each device is a
DeviceFigures record, each outlier an Outlier; a rank's own facts come as the JSON object
the rank wrote (benches/fleet), its rows as the fleet run's frame."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

import pandas as pd

from contract.markdown import md_table_lines
from contract.rows import positive_float
from contract.run_meta import JsonDoc
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


Figures = dict[str, float | None]  # a figure's name (figure_name) -> its value


@dataclass
class DeviceFigures:
    """One device (rank) of a fleet: where it ran, its key figures (FIGURES, and the
    other cache mode's under figure_name), each figure's ratio to the fleet median (set
    by find_outliers), its throttled rows and its exit code."""

    rank: int
    host: str
    device: str | None = None
    gpu_uuid: str | None = None
    figures: Figures = field(default_factory=dict)
    throttled_rows: int = 0
    exit_code: int | None = None
    ratios: Figures = field(default_factory=dict)


@dataclass(frozen=True)
class Outlier:
    """A device more than the tolerance below the fleet median, and on which figures."""

    device: DeviceFigures
    why: str


def figure_name(figure: str, tag: str) -> str:
    """A figure's name for rows of cache mode `tag` ("" for the native mode)."""
    return f"{figure} ({tag})" if tag else figure


def figures_of(devices: list[DeviceFigures]) -> list[str]:
    """The figures the devices hold, in FIGURES order, each figure's native mode first."""
    out = []
    for f in FIGURES:
        out.append(f)
        out += sorted({k for d in devices for k in d.figures
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


def _row_figures(ok: pd.DataFrame) -> Figures:
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


def device_figures(rank: JsonDoc, rows: pd.DataFrame) -> DeviceFigures:
    """One device's key figures from its rows (one set per cache mode, ROW_FIGURES) and
    its measured ceilings; `rank`: the rank's own facts, as it wrote them."""
    ok = rows[(rows["status"] == "ok")] if not rows.empty else rows
    throttled = int(sum(1 for v in ok.get("throttled", []) if v is True)) \
        if "throttled" in ok else 0
    tags = pd.Series([mode_tag(r) for r in ok.to_dict("records")], index=ok.index,
                     dtype=object)
    figures: Figures = {"copy_gbps": positive_float(rank.get("copy_gbps")),
                        **_row_figures(ok[tags == ""])}
    for tag in sorted(set(tags) - {""}):
        figures.update({figure_name(f, tag): v
                        for f, v in _row_figures(ok[tags == tag]).items()})
    return DeviceFigures(rank["rank"], rank["host"], rank.get("device_name"),
                         rank.get("gpu_uuid"), figures, throttled, rank.get("exit_code"))


def find_outliers(devices: list[DeviceFigures], tolerance_pct: float
                  ) -> tuple[list[Outlier], dict[str, float]]:
    """(outliers with their reasons, fleet medians): a device is an outlier when a key
    figure is more than tolerance_pct below the fleet median of that figure.  Each
    device's ratios to the medians are set on it."""
    medians = {f: statistics.median(v) for f in figures_of(devices)
               if (v := [x for d in devices if (x := d.figures.get(f))])}
    out = []
    for d in devices:
        low = []
        for f, med in medians.items():
            v = d.figures.get(f)
            if v and v < med * (1 - tolerance_pct / 100):
                low.append(f"{f} {v:.4g} = {v / med:.2f}x the median {med:.4g}")
            d.ratios[f] = v / med if v else None
        if low:
            out.append(Outlier(d, "; ".join(low)))
    return out, medians


def bandwidth_cell(v: object) -> str:
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


def _device_cells(d: DeviceFigures, figures: list[str]) -> list[str]:
    cells = [str(d.rank), str(d.host), str(d.device or "-")]
    for f in figures:
        v, r = d.figures.get(f), d.ratios.get(f)
        cells.append(f"{v:.4g} ({r:.2f}x)" if v and r else "-")
    return [*cells, str(d.throttled_rows), str(d.exit_code)]


def _collective_lines(collectives: pd.DataFrame) -> list[str]:
    """The collectives' table (their ok rows) and, for one rank, why busbw is n/a."""
    ok = collectives[collectives["status"] == "ok"]
    busbw = ok["busbw_gbps"] if "busbw_gbps" in ok else [None] * len(ok)
    lines = ["", "## Collectives (slowest rank)", "", *md_table_lines(
        ["op", "backend", "dtype", "bytes", "ms", "algbw GB/s", "busbw GB/s"],
        [[op, backend, dtype, f"{size:,}", f"{ms:.4g}", f"{algbw:.4g}", bandwidth_cell(bus)]
         for op, backend, dtype, size, ms, algbw, bus in zip(
             ok["kernel"], ok["provider"], ok["dtype"], ok["bytes"], ok["ms_median"],
             ok["algbw_gbps"], busbw, strict=True)], tight=True)]
    if not has_busbw(collectives):
        lines += ["", "One rank: no data crosses a link, so there is no busbw (n/a); "
                      "algbw is the local copy's."]
    return lines


def render_fleet_md(devices: list[DeviceFigures], outliers: list[Outlier],
                    medians: dict[str, float], tolerance_pct: float,
                    collectives: pd.DataFrame, note: str | None = None) -> str:
    figures = figures_of(devices)
    head = ["rank", "host", "device", *figures, "throttled rows", "exit"]
    lines = ["# Fleet", "", *([f"**{note}**", ""] if note else []),
             f"{len(devices)} device(s); each key figure as a ratio to the fleet median "
             f"(an outlier is more than {tolerance_pct:g}% below it on any figure).", ""]
    lines += md_table_lines(head, [_device_cells(d, figures) for d in devices], tight=True)
    lines += ["", "Fleet medians: " + ", ".join(f"{k} {v:.4g}" for k, v in medians.items()),
              "", f"## Outliers ({len(outliers)})", ""]
    lines += [f"- rank {o.device.rank} on {o.device.host} "
              f"({o.device.gpu_uuid or o.device.device}): {o.why}" for o in outliers] \
        or ["None."]
    if not collectives.empty:
        lines += _collective_lines(collectives)
    return "\n".join(lines) + "\n"


def plot_fleet(devices: list[DeviceFigures], collectives: pd.DataFrame,
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
        ys = [d.ratios.get(f) for d in devices]
        pts = [(x + (i - len(figures) // 2) * 0.08, y) for x, y in zip(xs, ys, strict=True)
               if y]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=f, s=30, zorder=3, gid=f"fleet:{f}")
    ax.axhspan(1 - tolerance_pct / 100, 2, color="0.93", zorder=0)
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xticks(xs, [f"rank {d.rank}\n{d.host}" for d in devices], fontsize=7)
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


def write_fleet(folder: str | os.PathLike, devices: list[DeviceFigures],
                collectives: pd.DataFrame, tolerance_pct: float,
                link_gbps: float | None, plot: bool = True,
                note: str | None = None) -> list[Outlier]:
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
