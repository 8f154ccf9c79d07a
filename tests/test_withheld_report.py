"""What the readers show of the physics check: summary.md's "Numbers withheld", the
provider ratios with both SM clocks (marked at unequal clocks) in summary.md, the
targets and the gate's report, launch gaps only where the host launched each call, and
`python -m roofline summary`, which writes a saved run's summary.md again."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from contract.schema import ALL_COLUMNS, load_doc
from roofline.__main__ import main as roofline_main
from roofline.gate.render import render_markdown
from roofline.gate.runs import compare_runs
from roofline.report import targets, targets_cli
from roofline.report.energy import launch_gap_rows
from roofline.report.summary import render_summary

ROOT = Path(__file__).resolve().parents[1]
DAY = ROOT / "results" / "h200" / "2026-11-27"


def _section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table of a text: (header, body rows)."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            body = []
            for ln in lines[i + 2:]:
                if not ln.startswith("| "):
                    break
                body.append([c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]])
            header = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            out.append((header, body))
    return out


def _gpu_runs() -> list[Path]:
    return sorted(p.parent for p in DAY.rglob("results.json"))


@pytest.mark.parametrize("run", _gpu_runs(), ids=lambda p: str(p.relative_to(DAY)))
def test_no_summary_of_a_committed_run_shows_a_power_past_the_limit(run):
    doc = load_doc(run)
    text = render_summary(doc)
    watts = [float(r[h.index("W")]) for h, body in _tables(text) if "W" in h
             for r in body if r[h.index("W")] not in ("-", "")]
    assert all(w <= 700 * 1.05 for w in watts)
    # Launch gaps are host launch gaps: no CUDA-graph row among them.
    gaps = launch_gap_rows(doc.frame())
    assert not (gaps["timer"] == "cudagraph").any() if len(gaps) else True


def test_the_summary_says_what_was_withheld_and_prints_none_of_it():
    text = render_summary(load_doc(DAY / "quick-warm2"))
    sec = _section(text, "Numbers withheld")
    # The powers held to the 700 W limit itself (a run before the energy meter).
    assert text.index("## Numbers withheld (164)") < text.index("## Best point")
    (_, kinds), (_, rows), *_ = _tables(sec)
    summary = {r[0]: r[1:3] for r in kinds}
    assert summary == {"power": ["140", "35"], "kernel_time": ["6", "6"],
                       "unequal_clocks": ["18", "18"]}
    assert len(rows) == 10 and "All 59" in sec  # 35 + 6 + 18 values of their own bound
    assert "3594" not in text and "3,594" not in text  # the withheld power, not shown
    # 177 launch gaps before, 130 of them CUDA-graph rows (no host launch between calls)
    assert "## Launch gaps (47)" in text


def test_provider_ratios_carry_both_clocks_and_unequal_ones_are_marked():
    text = render_summary(load_doc(DAY / "matmul-8192"))
    provs = _section(text, "Providers (against torch)")
    assert "| `M=8192,N=8192,K=8192` | 1.418 | 1.643, unequal clocks: 0.86x (1,545 vs 1,770 " \
           "MHz) | torch (unequal clocks) | 1.00x |" in provs
    ratios = _section(text, "Triton vs torch")
    bf16 = next(r for h, body in _tables(ratios) for r in body if r[:2] == ["matmul", "bf16"])
    # 1 shape, 1 at unequal clocks: no median of code ratios left.
    assert bf16[2:] == ["1", "1", "-", "-", "-", "`M=8192,N=8192,K=8192`",
                        "unequal clocks: 0.86x (1,545 vs 1,770 MHz)"]
    eq = _section(render_summary(load_doc(DAY / "quick")), "Providers (against torch)")
    assert re.search(r"\| \d\.\d+x \(1,980 vs 1,980 MHz\) \|", eq)  # equal: read as code


def _gap_rows(timer: str) -> pd.DataFrame:
    r = dict.fromkeys(ALL_COLUMNS) | {"kernel": "add", "provider": "torch", "dtype": "fp32",
                                      "shape": "n=4096", "status": "ok", "ms_median": 0.003,
                                      "kernel_ms": 0.001, "timer": timer}
    return pd.DataFrame([r])


@pytest.mark.parametrize("timer,listed", [("cudagraph", False), ("do_bench", True),
                                          ("back-to-back events", True), (None, True)])
def test_launch_gaps_only_where_the_host_launches_each_call(timer, listed):
    assert (len(launch_gap_rows(_gap_rows(timer))) == 1) == listed


def test_the_targets_do_not_judge_a_ratio_at_unequal_clocks():
    runs = [targets.load(str(DAY / n)) for n in ("matmul-8192", "fp8-precise")]
    found = {c.target: c for c in targets.checks(runs)}
    bf16 = found["matmul bf16 8192^3"]
    assert bf16.verdict == targets.UNEQUAL
    assert bf16.cells()[2] == "0.863x cuBLAS (1,545 vs 1,770 MHz)"
    assert found["matmul fp8 8192^3"].cells()[2] == "0.575x _scaled_mm (1,560 vs 1,980 MHz)"
    text = targets_cli.render(runs)
    assert "at unequal clocks" in text.split("## Targets: ")[1].splitlines()[0]


def test_the_gate_report_shows_the_clocks_and_keeps_its_verdicts():
    result = compare_runs(ROOT / "results/h200/2026-11-26/matmul-8192", DAY / "matmul-8192")
    assert result.counts == {"ambiguous": 2, "same": 2}
    text = render_markdown(result)
    assert "| unequal clocks: 0.948x (1,770 vs 1,575 MHz) |" in text


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_the_summary_command_writes_only_summary_md(tmp_path, capsys):
    run = shutil.copytree(DAY / "matmul-8192", tmp_path / "matmul-8192")
    before = _digest(run)
    assert roofline_main(["summary", str(run)]) == 0
    after = _digest(run)
    changed = {n for n in before if before[n] != after[n]}
    assert changed <= {"summary.md"} and set(after) == set(before)
    assert "## Numbers withheld (10)" in (run / "summary.md").read_text()
    assert capsys.readouterr().out.strip() == str(run / "summary.md")
    assert roofline_main(["summary", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.startswith("error: no results found")
