"""`run_bench.py --estimate` prices a GPU row's samples as the stopping rule takes them
(benches/timing/stopping.py), simulated on the H200 rows' recorded samples, not assumed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benches.estimate.price import estimate
from benches.estimate.rows import row_speed, settles_at
from benches.estimate.speeds import GPU
from benches.timing.plan import TimingConfig
from contract.schema import row_key
from tests.test_estimate import _gpu_plan

ROOT = Path(__file__).resolve().parent.parent
QUICK = ROOT / "results/h200/2026-11-26/quick/results.json"


def _row(kernel: str, provider: str, dtype: str, shape: str) -> dict:
    rows = json.loads(QUICK.read_text())["rows"]
    return next(r for r in rows if (r["kernel"], r["provider"], r["dtype"], r["shape"])
                == (kernel, provider, dtype, shape))


def test_the_rules_count_on_recorded_h200_rows():
    t = TimingConfig()
    # a steady 1 MiB copy: the gate's 10 of its 99 replays
    assert settles_at(_row("add", "torch", "fp32", "n=1048576"), t) == 10
    # 2^24 bf16 through Triton: the median settles after 663 of its 734 flushed samples
    assert settles_at(_row("add", "triton", "bf16", "n=16777216"), t) == 663
    # torch's: never within 0.5% in its 853 samples: it runs to its time cap
    assert settles_at(_row("add", "torch", "bf16", "n=16777216"), t) is None
    # the rule off: no count (the cap)
    off = dataclasses.replace(t, ci_rel_width=0.0)
    assert settles_at(_row("add", "torch", "fp32", "n=1048576"), off) is None


@pytest.fixture(scope="module")
def quick_both():
    cfg, cases, ref = _gpu_plan("h200", "--sizes", "quick")
    plans = (("now", False), ("now", True))
    ruled = estimate(cfg, cases, ref, GPU, ceilings_cached=False, plans=plans)
    off = dataclasses.replace(cfg, timing=dataclasses.replace(cfg.timing, ci_rel_width=0.0))
    capped = estimate(off, cases, ref, GPU, ceilings_cached=False, plans=plans)
    return cfg, cases, ref, ruled, capped


def test_a_row_is_priced_at_its_own_samples_count(quick_both):
    cfg, cases, ref, *_ = quick_both
    case = next(c for c in cases if (c.spec.name, c.provider, c.dtype, c.shape_str,
                                     c.cache) == ("add", "triton", "bf16", "n=16777216",
                                                  "cold"))
    assert row_key(ref.rows[case.key]) == case.key
    assert row_speed(case, cfg, ref, GPU).settles == 663


def test_the_h200_quick_sweeps_timing_with_the_rule(quick_both):
    """The figure docs/measurement.md quotes: the timing phase 37.2 s with every row to
    its time cap, 22.5 s with the rule (the model's, unscaled, the reference rows of
    2026-11-26); since a long timed call counts in its warm-up (clock.warmup_calls),
    36.5 and 21.9 s; nothing else changes."""
    *_, ruled, capped = quick_both
    cold = ruled[("now", False)]
    assert capped[("now", False)].phases["timing"] == pytest.approx(36.5, abs=0.3)
    assert cold.phases["timing"] == pytest.approx(21.9, abs=0.3)
    assert cold.counts["rows stopped by the rule"] > 300
    for phase in ("compile", "tune", "capture", "inputs"):
        assert cold.phases[phase] == pytest.approx(capped[("now", False)].phases[phase])


@pytest.mark.parametrize("device,cold,warm", [("h200", 92.5, 91.0), ("h100", 171.5, 90.3)])
def test_the_quick_estimates_docs_quote(device, cold, warm):
    """The command as CI runs it (compiled Triton's launches: the shipped configs'
    buckets match, which the interpreter's do not): the totals docs/measurement.md and
    docs/gpu-job.md quote."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "run_bench.py", "--estimate", "--device", device,
                          "--sizes", "quick"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    total = re.search(r"total\s*│([^\n]*)", out).group(1)
    got = [float(x) for x in re.findall(r"[0-9.]+", total)]
    assert got[2] == pytest.approx(cold, abs=1.0) and got[3] == pytest.approx(warm, abs=1.0)
