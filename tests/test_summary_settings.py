"""summary.md's timing settings: one table (setting | value | what it means), not one
bullet of every setting run together."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from benches.sweep import results
from benches.timing.plan import TimingConfig
from contract.schema import ALL_COLUMNS, RESULTS_JSON
from roofline.report.summary import render_summary
from roofline.report.timing_settings import TIMING_MEANINGS
from tests.run_docs import doc_of
from tests.test_measurement import cpu_cfg

ROOT = Path(__file__).resolve().parent.parent
H200_QUICK = ROOT / "results" / "h200" / "2026-11-26" / "quick"


def no_rows() -> pd.DataFrame:
    return pd.DataFrame(columns=ALL_COLUMNS)


def settings_table(text: str) -> list[str]:
    m = re.search(r"^## Timing settings\n\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "no timing settings section"
    return m.group(1).strip().splitlines()


def test_the_h200_runs_settings_are_a_table_with_their_meanings():
    meta = json.loads((H200_QUICK / RESULTS_JSON).read_text())["metadata"]
    text = render_summary(doc_of(meta, no_rows()))
    assert "- **timing**" not in text  # no longer one bullet of every setting
    table = settings_table(text)
    assert table[:2] == ["| setting | value | what it means |", "| --- | --- | --- |"]
    # One row per recorded setting, in the run's order.
    assert [ln.split(" | ")[0] for ln in table[2:]] == [f"| `{k}`" for k in meta["timing"]]
    assert "| `rep_ms` | 100.0 | how long a GPU row samples (do_bench's rep), ms |" in table
    assert ("| `gate_min_samples` | 10 | samples a row never goes under (the fewest with "
            "which the gate can call a change); a row that cannot fit them is skipped |"
            in table)
    assert ("| `cudagraph_below_ms` | 0.02 | a case whose roofline bound is under this is "
            "replayed in CUDA graphs; the rest are timed with the L2 flushed before each "
            "call, ms |" in table)
    budget = next(ln for ln in table if ln.startswith("| `budget` |"))
    assert budget == ("| `budget` | each row's timing within 5 s (never fewer than 10 "
                      "samples; a row that cannot fit them is skipped) | the timing budgets "
                      "of a row and of the sweep |")


def test_every_setting_a_run_records_has_a_meaning():
    meta = results.collect_metadata(cpu_cfg(timing=TimingConfig()), "r", ["run_bench.py"])
    assert set(meta.settings.timing) - set(TIMING_MEANINGS) == set()


def test_an_unknown_setting_has_no_meaning_and_a_pipe_is_escaped():
    text = render_summary(doc_of({"device_key": "cpu", "timing": {"new_knob": "a|b"}}, no_rows()))
    assert settings_table(text)[2:] == ["| `new_knob` | a\\|b | - |"]


def test_settings_not_recorded_as_a_mapping_stay_a_fact():
    text = render_summary(doc_of({"device_key": "cpu", "timing": "do_bench defaults"}, no_rows()))
    assert "- **timing**: do_bench defaults" in text
    assert "## Timing settings" not in text
    assert "## Timing settings" not in render_summary(doc_of({"device_key": "cpu"}, no_rows()))
