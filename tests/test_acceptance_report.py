"""Fleet acceptance's reports (benches/fleet/acceptance_report.py) rendered from the
first GPU run's own acceptance.json (a one-GPU NVIDIA H200 SXM in a VM:
tests/data/h200-acceptance.json, as written) and from a document holding every verdict;
the NVLink rule on the hardware that reports no link; the rules table of docs/fleet.md."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from benches.fleet import acceptance_report as report
from benches.fleet.acceptance_records import AcceptanceDoc
from benches.fleet.acceptance_report import COLORS, PNG, finish, write_reports
from benches.fleet.acceptance_rules import (
    CRITICAL,
    NA,
    OK,
    VERDICTS,
    WARN,
    Thresholds,
)
from tests.test_acceptance import FakeNVML, judge, stressed

ROOT = Path(__file__).resolve().parent.parent
H200 = Path(__file__).resolve().parent / "data" / "h200-acceptance.json"


def h200() -> dict:
    return json.loads(H200.read_text())


def colours_drawn(png: Path) -> set[str]:
    """The verdicts whose colour fills a cell of the figure: over 1000 pixels (a cell
    holds about 10,000; the text's antialiased edges make a few of any grey)."""
    rgb = imread(png)[..., :3].reshape(-1, 3)
    return {v for v, c in COLORS.items()
            if (np.abs(rgb - np.array(to_rgb(c))).max(axis=1) < 1.5 / 255).sum() > 1000}


def test_every_verdict_has_its_own_colour():
    assert set(COLORS) == set(VERDICTS)
    assert len(set(COLORS.values())) == len(VERDICTS)


def test_the_h200_one_gpu_run_renders_png_included(tmp_path):
    """The run that crashed in the plot (KeyError: 'N/A'): busbw and nvlink N/A."""
    doc = h200()
    write_reports(tmp_path, AcceptanceDoc.from_json(doc), Thresholds())
    assert (tmp_path / "acceptance.md").read_text().startswith("# Fleet acceptance: OK")
    assert (tmp_path / PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert colours_drawn(tmp_path / PNG) == {OK, NA}


def every_verdict() -> dict:
    """The H200's document with its GPU's checks given every verdict in turn."""
    doc = h200()
    gpu = doc["gpus"][0]
    for i, c in enumerate(gpu["checks"]):
        c["verdict"] = VERDICTS[i % len(VERDICTS)]
        c["why"] = c["why"] or f"planted {c['verdict']}"
    gpu["verdict"] = doc["nodes"][0]["verdict"] = doc["verdict"] = CRITICAL
    doc["exit_code"] = 2
    return doc


def test_a_document_with_every_verdict_draws_each(tmp_path):
    write_reports(tmp_path, AcceptanceDoc.from_json(every_verdict()), Thresholds())
    assert colours_drawn(tmp_path / PNG) == set(VERDICTS)
    md = (tmp_path / "acceptance.md").read_text()
    assert all(f"**{v}**" in md for v in VERDICTS)


def test_a_figure_that_fails_keeps_the_verdict_line_and_exit_code(tmp_path, monkeypatch,
                                                                  capsys):
    def broken(doc, path):
        raise KeyError("N/A")

    monkeypatch.setattr(report, "plot", broken)
    doc = every_verdict()
    assert finish(tmp_path, AcceptanceDoc.from_json(doc), Thresholds()) == 2
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1] == \
        f"verdict: CRITICAL (exit 2) {tmp_path / 'acceptance.json'}"
    (warning,) = err.strip().splitlines()
    assert warning.startswith("warning: ") and "KeyError" in warning and PNG in warning
    assert json.loads((tmp_path / "acceptance.json").read_text())["verdict"] == CRITICAL
    assert not (tmp_path / PNG).exists()


def test_the_h200s_readings_judged_again():
    """An SXM H200 alone in a VM reports no NVLink: N/A, saying what is known (links
    not visible), not that it is a PCIe card; the node OK, exit 0."""
    doc = h200()
    nodes = [{"host": "vm", "ranks": [0], "busbw_gbps": None, "expected_gbps": 450.0}]
    again = judge(doc["ranks"], nodes, Thresholds())
    nvlink = next(c for c in again["gpus"][0]["checks"] if c["check"] == "nvlink")
    assert nvlink["verdict"] == NA
    assert "links not visible" in nvlink["why"] and "H200 SXM" in nvlink["why"]
    assert "a PCIe card" not in nvlink["why"]
    assert (again["verdict"], again["exit_code"]) == (OK, 0)


def node_of(n: int, links: list[list[int]], names: list[str]) -> list[dict]:
    recs = []
    for i in range(n):
        r = stressed(FakeNVML(nvlinks=links[i]))
        r.update(rank=i, local_rank=i, device_name=names[i])
        recs.append(r)
    return recs


def nvlink_of(recs: list[dict], rank: int) -> dict:
    nodes = [{"host": "node-a", "ranks": [r["rank"] for r in recs], "busbw_gbps": None,
              "expected_gbps": None}]
    doc = judge(recs, nodes, Thresholds())
    gpu = next(g for g in doc["gpus"] if g["rank"] == rank)
    return next(c for c in gpu["checks"] if c["check"] == "nvlink")


SXM, PCIE = "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"


@pytest.mark.parametrize("links, names, verdict, says", [
    # An SXM part reporting no link beside other GPUs of its node: not visible or not
    # set up.
    ([[], []], [SXM, SXM], WARN, "beside 1 other GPU(s)"),
    # PCIe cards say the same and have none to report.
    ([[], []], [PCIE, PCIE], NA, "a PCIe card, or links not visible"),
    # One SXM GPU alone: nothing to link to.
    ([[]], [SXM], NA, "alone on its node"),
    # Another H100 SXM of the fleet has its 18 links up: none is fewer.
    ([[], [1] * 18], [SXM, SXM], CRITICAL, "another GPU of this model has 18"),
])
def test_no_nvlink_reported(links, names, verdict, says):
    c = nvlink_of(node_of(len(links), links, names), rank=0)
    assert c["verdict"] == verdict and says in c["why"], c


def test_the_docs_show_the_rules_in_force():
    """One source of truth: docs/fleet.md's table is the one every report prints."""
    from benches.fleet.acceptance_report import rules_table

    doc = (ROOT / "docs" / "fleet.md").read_text()
    assert not [line for line in rules_table(Thresholds()) if line not in doc]

