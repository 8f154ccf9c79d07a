"""`history html`: a static dashboard that opens from disk and works offline.

    OUT/index.html                 the devices, linking to their pages
    OUT/plotly.min.js              one copy of Plotly's bundle, shared by every page
    OUT/<device>/index.html        every series: latest median, trend arrow, change points
    OUT/<device>/<family>.html     one chart per series of a kernel family: the median per
                                   run (commits on the x axis) with its p20-p80 band,
                                   change points marked, hover with commit and values
    OUT/<device>/roofline.png      the roofline of the device's latest run (roofline.report.plot)

The charts are Plotly figures written as HTML (no hand-written JavaScript).  Each chart's
div carries data-series, and its traces fixed names ("median", "p20-p80", "slower",
"faster") so a browser test can find them.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from pathlib import Path

from roofline.history.errors import HistoryError, require
from roofline.history.series import DeviceSeries, Series
from roofline.history.store import run_document

PLOTLY_JS = "plotly.min.js"
ROOFLINE_PNG = "roofline.png"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.slower { color: #c0392b; } .faster { color: #1e8449; } .flat { color: #777; }
.chart { max-width: 1100px; height: 340px; margin-bottom: 1.2em; }
img { max-width: 1100px; }
"""


def _page(title: str, body: str, js: str | None) -> str:
    script = f'<script src="{js}"></script>\n' if js else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n{script}<style>{_STYLE}</style>\n"
            f"</head>\n<body>\n{body}\n</body>\n</html>\n")


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in name)


def _arrow(s: Series, min_change: float) -> tuple[str, str]:
    """(arrow, css class) of the newest run against its current level."""
    t = s.trend()
    if not math.isfinite(t):
        return "–", "flat"
    if t > min_change:
        return "▲", "slower"
    if t < 1.0 / (1.0 + min_change) - 1.0:
        return "▼", "faster"
    return "→", "flat"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%" if math.isfinite(x) else ""


def _label(s: Series, i: int) -> str:
    commit = s.runs["git_commit"].iloc[i]
    return str(commit)[:7] if isinstance(commit, str) and commit else f"#{s.runs['seq'].iloc[i]}"


def _figure(s: Series):  # -> plotly Figure
    go = require("plotly.graph_objects", "history html")
    runs = s.runs
    x = runs["pos"].tolist()
    commits = [str(c) if isinstance(c, str) else "?" for c in runs["git_commit"]]
    hover = [f"run {rid} (#{seq})<br>commit {c[:10]}<br>{created}<br>median {m:.4g} ms"
             f"<br>p20-p80 {lo:.4g}-{hi:.4g} ms<br>{n} samples"
             for rid, seq, c, created, m, lo, hi, n in zip(
                 runs["run_id"], runs["seq"], commits, runs["created"], runs["median"], runs["p20"],
                 runs["p80"], runs["n"], strict=True)]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x + x[::-1], y=runs["p80"].tolist() + runs["p20"].tolist()[::-1],
                             fill="toself", mode="none", name="p20-p80", hoverinfo="skip",
                             fillcolor="rgba(31,119,180,0.18)"))
    fig.add_trace(go.Scatter(x=x, y=runs["median"].tolist(), mode="lines+markers",
                             name="median", text=hover, hoverinfo="text",
                             line={"color": "rgb(31,119,180)"}, marker={"size": 6}))
    for word, color, symbol in (("slower", "#c0392b", "triangle-up"),
                                ("faster", "#1e8449", "triangle-down")):
        cps = [c for c in s.changes if c.slower == (word == "slower")]
        if not cps:
            continue
        texts = []
        for c in cps:
            a, b = s.commit_range(c)
            texts.append(f"{word} {c.change * 100:+.1f}%<br>{c.before:.4g} -> {c.after:.4g} "
                         f"ms<br>commits {a[:10]}..{b[:10]}<br>p = {c.p_value:.1e}"
                         + ("<br>new" if c in s.new else ""))
        fig.add_trace(go.Scatter(
            x=[x[c.index] for c in cps], y=[float(runs["median"].iloc[c.index]) for c in cps],
            mode="markers", name=word, text=texts, hoverinfo="text",
            marker={"symbol": symbol, "size": 14, "color": color,
                    "line": {"width": 1, "color": "black"}}))
        for c in cps:
            fig.add_vline(x=x[c.index] - 0.5, line_dash="dash", line_color=color,
                          opacity=0.6)
    step = max(1, len(x) // 12)
    fig.update_layout(
        title={"text": s.name, "font": {"size": 14}}, margin={"l": 60, "r": 20, "t": 40,
                                                                  "b": 60},
        yaxis_title="ms (median)", xaxis_title="commit (oldest to newest run)",
        xaxis={"tickmode": "array", "tickvals": x[::step],
               "ticktext": [_label(s, i) for i in range(0, len(x), step)]},
        showlegend=False, template="plotly_white")
    return fig


def _roofline(d: DeviceSeries, folder: Path) -> str:
    """The latest run's roofline PNG (roofline.report.plot), or why there is none."""
    newest = d.newest()
    try:
        doc = run_document(d.history.path, newest.seq)
        import matplotlib.pyplot as plt

        from roofline.report.plot import plot_roofline

        plt.close(plot_roofline(doc, folder / ROOFLINE_PNG))
    except Exception as e:  # a figure problem must not cost the dashboard
        return f"<p>No roofline of the latest run: {html.escape(' '.join(str(e).split()))}</p>"
    run_id = html.escape(str(newest.run_id))
    return (f"<h2>Roofline of the latest run ({run_id})</h2>\n"
            f'<img src="{ROOFLINE_PNG}" alt="roofline of run {run_id}">')


def _family_page(d: DeviceSeries, family: str, series: list[Series]) -> str:
    parts = [f'<p><a href="index.html">{html.escape(d.device)}</a> / {html.escape(family)}'
             f" &middot; {len(series)} series, {len(d.runs)} runs</p>",
             f"<h1>{html.escape(family)} on {html.escape(d.device)}</h1>"]
    for i, s in enumerate(series):
        fig = _figure(s)
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{i}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f'<div class="chart" id="wrap-{i}" data-series="{html.escape(s.name)}">'
                     f"{div}</div>")
    parts.append(f'<p><img src="{ROOFLINE_PNG}" alt="roofline of the latest run"></p>')
    return _page(f"{family} — {d.device}", "\n".join(parts), f"../{PLOTLY_JS}")


def _device_index(d: DeviceSeries, pages: dict[str, str], anchors: dict[int, int],
                  roofline: str) -> str:
    o = d.options
    newest = d.newest()
    rows = []
    for s in d.series:
        arrow, cls = _arrow(s, o.min_change)
        last = s.changes[-1] if s.changes else None
        change = "" if last is None else (
            f'<span class="{"slower" if last.slower else "faster"}">'
            f"{last.change * 100:+.1f}%</span> at {html.escape(_label(s, last.index))}"
            + (" <b>new</b>" if last in s.new else ""))
        rows.append(
            f'<tr><td><a href="{pages[s.family]}#wrap-{anchors[id(s)]}">'
            f"{html.escape(s.name)}</a></td><td class=\"num\">{s.latest:.4g}</td>"
            f'<td class="{cls}">{arrow} {_pct(s.trend())}</td>'
            f'<td class="num">{len(s.changes)}</td><td>{change}</td>'
            f"<td class=\"num\">{len(s.runs)}</td></tr>")
    body = (f'<p><a href="../index.html">devices</a> / {html.escape(d.device)}</p>'
            f"<h1>Performance history: {html.escape(d.device)}</h1>"
            f"<p>{len(d.runs)} runs, newest {html.escape(str(newest.run_id))} "
            f"({html.escape(str(newest.created))}). Change points: a step of at least "
            f"{o.min_change * 100:g}%, rank test p &lt; {o.alpha:g}, at least {o.min_size} "
            "runs a side. Trend: the newest run against the median of its level.</p>"
            "<p>Kernel families: " + ", ".join(
                f'<a href="{p}">{html.escape(f)}</a>' for f, p in pages.items()) + "</p>"
            "<table id=\"series\"><thead><tr><th>series</th><th>latest ms</th><th>trend</th>"
            "<th>change points</th><th>latest change</th><th>runs</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>\n" + roofline)
    return _page(f"history — {d.device}", body, None)


def write_dashboard(devices: Sequence[DeviceSeries], out: str | os.PathLike) -> list[Path]:
    """Write the dashboard under `out` (created; existing pages replaced); returns the
    pages written.  HistoryError when plotly is missing or `out` cannot be written."""
    plotly = require("plotly", "history html")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise HistoryError(f"cannot create {out}: {e.strerror or e}") from None
    offline = require("plotly.offline", "history html")
    written = [out / PLOTLY_JS]
    written[0].write_text(offline.get_plotlyjs(), encoding="utf-8")
    links = []
    for d in devices:
        folder = out / _safe(d.device)
        folder.mkdir(exist_ok=True)
        families: dict[str, list[Series]] = {}
        for s in d.series:
            families.setdefault(s.family, []).append(s)
        pages = {f: f"{_safe(f)}.html" for f in families}
        for f, series in families.items():
            p = folder / pages[f]
            p.write_text(_family_page(d, f, series), encoding="utf-8")
            written.append(p)
        roofline = _roofline(d, folder)
        p = folder / "index.html"
        anchors = {id(s): i for ss in families.values() for i, s in enumerate(ss)}
        p.write_text(_device_index(d, pages, anchors, roofline), encoding="utf-8")
        written.append(p)
        links.append(f'<li><a href="{_safe(d.device)}/index.html">{html.escape(d.device)}'
                     f"</a>: {len(d.series)} series, {len(d.runs)} runs</li>")
    index = out / "index.html"
    index.write_text(_page("performance history", "<h1>Performance history</h1><ul>"
                           + "".join(links) + f"</ul><p>Plotly {plotly.__version__}, "
                           "bundled; opens from disk.</p>", None), encoding="utf-8")
    return [index, *written]
