"""Fleet acceptance's outputs: acceptance.json (everything read, measured and judged),
acceptance.md (one line per node and per GPU, every check's value and verdict, worst
first; then why, and the rules in force), acceptance.png (the same grid, coloured by
verdict), and rank 0's console lines ending with `verdict: ...`.  Files are written
atomically into the run's own folder (made empty before measuring).  The figure comes
last and is optional: one that cannot be drawn is a warning line, never a lost verdict
line or exit code."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from benches.fleet.acceptance_records import AcceptanceDoc, GpuVerdict, NodeVerdict
from benches.fleet.acceptance_rules import (
    CRITICAL,
    EXIT_CODE,
    NA,
    OK,
    UNKNOWN,
    WARN,
    Thresholds,
    rules,
)
from benches.fleet.rank_io import say_line
from contract.markdown import md_table_lines

JSON, MD, PNG = "acceptance.json", "acceptance.md", "acceptance.png"
# One colour per verdict (acceptance_rules.VERDICTS; a test holds the two together).
COLORS = {OK: "#b7e1b0", WARN: "#f7d774", CRITICAL: "#ef8a80", UNKNOWN: "#d0d0d0",
          NA: "#f4f4f4"}


Verdicts = GpuVerdict | NodeVerdict


def _columns(rows: tuple[Verdicts, ...] | list[Verdicts]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols += [c.check for c in r.checks if c.check not in cols]
    return cols


def _cell(r: Verdicts, col: str) -> str:
    c = next((c for c in r.checks if c.check == col), None)
    return "" if c is None else f"{c.value} **{c.verdict}**".replace("|", "/")


def rules_table(t: Thresholds) -> list[str]:
    """The rules in force as markdown table lines (acceptance.md; the README's copy is
    checked against it by the tests)."""
    return md_table_lines(["check", "reads", "WARN", "CRITICAL", "source"],
                          [[f"`{r.check}`", r.reads, r.warn, r.critical, r.source]
                           for r in rules(t)], tight=True)


def markdown(doc: AcceptanceDoc, t: Thresholds) -> str:
    v, judged = doc.verdict, doc.judged
    out = [f"# Fleet acceptance: {v}", "",
           f"Run `{doc.run_id}`: {doc.world} rank(s) on {len(judged.nodes)} node(s), "
           f"{doc.backend}; matmul stress {', '.join(doc.stress_dtypes)}, "
           f"{doc.stress_seconds_per_dtype:.3g} s each; {doc.seconds:.0f} s in all.  "
           f"Exit code {EXIT_CODE[v]} (0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN only).", "",
           f"`{doc.command}`", "", "## Nodes (worst first)", ""]
    cols = _columns(judged.nodes)
    out += md_table_lines(["node", "ranks", "verdict", *cols], [
        [n.host, ", ".join(map(str, n.ranks)), f"**{n.verdict}**",
         *(_cell(n, c) for c in cols)] for n in judged.nodes], tight=True)
    cols = _columns(judged.gpus)
    out += ["", "## GPUs (worst first)", "", *md_table_lines(
        ["GPU", "device", "verdict", *cols],
        [[g.label, g.device_name, f"**{g.verdict}**", *(_cell(g, c) for c in cols)]
         for g in judged.gpus], tight=True)]
    why = []
    for r in (*judged.nodes, *judged.gpus):
        said: dict[tuple[str, str], list[str]] = {}  # checks not OK for the same reason
        for c in r.checks:
            if c.verdict != OK:
                said.setdefault((c.verdict, c.why), []).append(c.check)
        why += [f"- {r.label}: {', '.join(checks)} {verdict}: {text}"
                for (verdict, text), checks in said.items()]
    out += ["", "## Why (every check not OK)", "", *(why or ["- every check is OK"]), "",
            "## Rules", "", *rules_table(t)]
    out += ["", "A reading that is missing is UNKNOWN, never OK; on CPU ranks every "
            "GPU-only check (NVML) is UNKNOWN.", ""]
    return "\n".join(out)


def plot(doc: AcceptanceDoc, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from roofline.report.style import save_figure

    rows: list[Verdicts] = [*doc.judged.nodes, *doc.judged.gpus]
    cols = _columns(rows)
    fig, ax = plt.subplots(figsize=(2 + 1.25 * (len(cols) + 1), 1 + 0.45 * len(rows)))
    for i, r in enumerate(rows):
        cells = [("verdict", r.verdict, r.verdict)] + [
            (c.check, c.verdict, c.value) for c in r.checks]
        for col, verdict, text in cells:
            j = 0 if col == "verdict" else cols.index(col) + 1
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=COLORS[verdict], ec="white"))
            short = text.split(" (")[0].split(";")[0]
            short = short if len(short) <= 16 else short[:15] + "…"
            label = verdict if col == "verdict" else f"{short}\n{verdict}"
            ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=6)
    ax.set_xlim(0, len(cols) + 1)
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(cols) + 1)], ["verdict", *cols],
                  rotation=30, ha="right", fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r.label for r in rows], fontsize=7)
    ax.set_title(f"Fleet acceptance {doc.run_id}: {doc.verdict} (worst first)",
                 fontsize=9)
    for s in ax.spines.values():
        s.set_visible(False)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def write_reports(folder: Path, doc: AcceptanceDoc, t: Thresholds, plot_png: bool = True
                  ) -> None:
    """acceptance.json (the document and the rules in force) and .md, then the figure; a
    figure that fails is a warning line on stderr (the verdict stands on the two
    documents)."""
    from contract.schema import atomic_write_text

    whole = {**doc.to_json(), "rules": [asdict(r) for r in rules(t)]}
    atomic_write_text(folder / JSON, json.dumps(whole, indent=1, default=str) + "\n")
    atomic_write_text(folder / MD, markdown(doc, t))
    if plot_png:
        try:
            plot(doc, folder / PNG)
        except Exception as e:  # a figure is no reason to lose the verdict
            say_line(f"warning: {folder / PNG} not drawn ({type(e).__name__}: {e}); the "
                     f"verdict stands in {folder / MD}")


def finish(folder: Path, doc: AcceptanceDoc, t: Thresholds, plot_png: bool = True) -> int:
    """Rank 0's end: the reports, the console lines ending with the verdict line, and
    the verdict's exit code."""
    write_reports(folder, doc, t, plot_png)
    say(doc, folder)
    return EXIT_CODE[doc.verdict]


def say(doc: AcceptanceDoc, folder: Path) -> None:
    """Rank 0's console: one line per node and per GPU not OK, then the verdict line a
    job script reads (the last line on stdout)."""
    for n in doc.judged.nodes:
        print(f"node {n.host} (ranks {', '.join(map(str, n.ranks))}): {n.verdict}")
    for g in doc.judged.gpus:
        bad = [f"{c.check} {c.verdict}" for c in g.checks if c.verdict != OK]
        print(f"{g.label} {g.device_name}: {g.verdict}"
              + (f" ({', '.join(bad)})" if bad else ""))
    print(f"report: {folder / MD}")
    print(f"verdict: {doc.verdict} (exit {EXIT_CODE[doc.verdict]}) {folder / JSON}",
          flush=True)
