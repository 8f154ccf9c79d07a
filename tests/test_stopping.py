"""The stopping rule (benches/timing/stopping.py): a row samples until its median's
distribution-free interval is within TimingConfig.ci_rel_width, never under the gate's
10 samples, never past its time cap; on a CPU, a row skips its later rounds once the
rule is met after cpu_min_rounds."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom

from benches.sweep import runner
from benches.timing import clock as timing
from benches.timing import plan as timing_plan
from benches.timing.plan import TimingConfig
from benches.timing.stopping import (
    STOP_CAP,
    STOP_NOISE,
    cpu_settled,
    median_ci,
    median_ci_ranks,
    sample_until_settled,
    settled_count,
)
from tests.test_dispatch import FakeGpu
from tests.test_interleave import _cases, _recorder
from tests.test_measurement import FAST, cpu_cfg


def test_the_interval_is_the_order_statistics_of_the_binomial():
    # 10 samples at 95%: the 2nd smallest to the 2nd largest (coverage 1 - 2 x 11/1024)
    assert median_ci_ranks(10, 0.95) == (1, 8)
    assert median_ci_ranks(5, 0.95) is None  # 1 - 2/32 < 95%: no interval at all
    for n in (6, 10, 25, 100, 1000):
        lo, hi = median_ci_ranks(n, 0.95)
        assert hi == n - 1 - lo
        coverage = 1 - 2 * binom.cdf(lo, n, 0.5)
        assert coverage >= 0.95  # holds the level ...
        assert 1 - 2 * binom.cdf(lo + 1, n, 0.5) < 0.95  # ... and is the narrowest that does
    assert median_ci(list(range(10, 0, -1)), 0.95) == (2.0, 9.0)  # sorted first


def test_the_interval_covers_the_median_of_a_skewed_distribution_at_its_level():
    # Exponential samples (median ln 2), 2,000 trials of 20: the level holds whatever the
    # distribution's shape.
    rng = np.random.default_rng(0)
    hits = sum(lo <= np.log(2) <= hi for lo, hi in
               (median_ci(rng.exponential(1.0, 20), 0.95) for _ in range(2000)))
    assert hits / 2000 >= 0.94


def _stream(values: list[float]) -> tuple[list[int], Any]:
    asked: list[int] = []
    it = iter(values)

    def take(k: int) -> list[float]:
        asked.append(k)
        return [next(it) for _ in range(k)]

    return asked, take


def test_a_tight_stream_stops_at_the_gate_floor():
    asked, take = _stream([1.0 + 1e-4 * (i % 3) for i in range(1000)])
    got = sample_until_settled(take, 500, 0.005, 0.95, 10)
    assert len(got.samples) == 10 and got.stopped == STOP_NOISE and asked == [10]


def test_a_noisy_stream_runs_to_its_time_cap():
    rng = np.random.default_rng(1)
    asked, take = _stream(list(rng.lognormal(0.0, 0.2, 1000)))
    got = sample_until_settled(take, 300, 0.005, 0.95, 10)
    assert len(got.samples) == 300 and got.stopped == STOP_CAP and sum(asked) == 300


def test_a_stream_that_settles_later_stops_within_a_quarter_of_it():
    # 1% noise: the 95% interval of the median reaches 0.5% after ~100-200 samples.
    rng = np.random.default_rng(2)
    values = list(rng.normal(1.0, 0.01, 1000))
    asked, take = _stream(values)
    got = sample_until_settled(take, 1000, 0.005, 0.95, 10)
    first = next(n for n in range(10, 1001) if (lambda c: (c[1] - c[0]) / np.median(
        values[:n]) <= 0.005)(median_ci(values[:n], 0.95)))
    assert got.stopped == STOP_NOISE and first <= len(got.samples) <= 1.25 * first + 5
    assert settled_count(values, 0.005, 0.95, 10) == len(got.samples)  # the simulation


def test_never_under_ten_samples_and_off_at_zero():
    asked, take = _stream([1.0] * 100)
    assert len(sample_until_settled(take, 100, 0.005, 0.95, 10).samples) == 10
    asked, take = _stream([1.0] * 100)
    off = sample_until_settled(take, 40, 0.0, 0.95, 10)
    assert len(off.samples) == 40 and asked == [40]  # the cap in one batch, as before
    asked, take = _stream([1.0] * 100)
    assert len(sample_until_settled(take, 7, 0.005, 0.95, 10).samples) == 7  # cap < floor


def test_the_gpu_timers_stop_when_the_median_settles(monkeypatch):
    """time_flushed and time_warm on the fake GPU of tests/test_dispatch.py: a kernel of
    the same 5 us each call stops at the gate's 10 samples, where its 100 ms of samples
    would be 150 (the defaults: 0.5% at 95%)."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=55.0)
    cfg = TimingConfig()
    flushed = timing.time_flushed(lambda: gpu.op(300.0, 5.0), cfg, host_us=300.0)
    warm = timing.time_warm(lambda: gpu.op(300.0, 5.0), cfg, host_us=300.0)
    for t in (flushed, warm):
        assert t.n_samples == 10 and t.stopped == STOP_NOISE
        assert t.ms_median == pytest.approx(0.005)
    assert timing_plan.sample_count(0.055 + 0.61 + 0.005, cfg) == 149


# ---- CPU: later rounds skipped --------------------------------------------------------

PER_ROUND = 10  # a short call's round: 10 blocks of 1 ms (cpu_min_run_time_s / 5)


def _fixed_time_cpu(values: Any):
    def time_cpu(fn: Any, cfg: TimingConfig, plan: Any = None) -> timing.Timing:
        fn()
        return timing.summarize([next(values) for _ in range(PER_ROUND)],
                                timing_plan.TIMER_CPU)
    return time_cpu


@pytest.mark.parametrize("min_rounds", [3, 4])
def test_a_settled_cpu_row_skips_its_later_rounds(monkeypatch, min_rounds):
    flat = iter([0.01] * 10_000)
    monkeypatch.setattr(timing, "time_cpu", _fixed_time_cpu(flat))
    calls, fn = _recorder()
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0,
                                             cpu_min_rounds=min_rounds))
    rows = [row for _, row in runner.iterate(_cases(fn), cfg)]
    for row in rows:
        assert row.status == "ok"
        assert row.timing.n_samples == min_rounds * PER_ROUND  # rounds after the rule: none
        assert not runner.cut_short(row) and "rounds only" not in row.reason


def test_a_noisy_cpu_row_takes_all_its_rounds(monkeypatch):
    rng = np.random.default_rng(3)
    monkeypatch.setattr(timing, "time_cpu",
                        _fixed_time_cpu(iter(rng.lognormal(-4, 0.3, 10_000))))
    calls, fn = _recorder()
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0))
    for _, row in runner.iterate(_cases(fn), cfg):
        assert row.timing.n_samples == cfg.timing.cpu_rounds * PER_ROUND


def test_the_cpu_rule_waits_for_its_minimum_rounds():
    t = TimingConfig()
    assert t.cpu_min_rounds == 3
    flat = [0.01] * 30
    assert not cpu_settled(flat, 2, t)
    assert cpu_settled(flat, 3, t)
    assert not cpu_settled(flat, 3, dataclasses.replace(t, ci_rel_width=0.0))
    assert not cpu_settled(list(np.linspace(0.01, 0.02, 30)), 4, t)
    # a CPU row's floor of 25 samples stays: 3 rounds of 5 are not enough
    assert not cpu_settled([0.01] * 15, 3, t)


def test_the_width_docs_quote_replayed_on_the_committed_h200_rows():
    """docs/measurement.md's table: at 0.5 % the rule keeps 36 % of the committed H200
    rows' samples, 19 of the 278 rows never get within it (they take their cap)."""
    import json
    from pathlib import Path

    from benches.timing.stopping import ci_rel_width

    rows = []
    for f in sorted(Path(__file__).resolve().parent.parent.glob(
            "results/h200/2026-11-26/*/results.json")):
        rows += [r["samples_ms"] for r in json.loads(f.read_text())["rows"]
                 if r.get("status") == "ok" and len(r.get("samples_ms") or []) >= 10]
    assert len(rows) == 278
    kept = [settled_count(s, 0.005, 0.95, 10) for s in rows]
    assert sum(kept) / sum(map(len, rows)) == pytest.approx(0.36, abs=0.005)
    never = sum(n == len(s) and ci_rel_width(s, 0.95) > 0.005 for s, n in zip(rows, kept,
                                                                               strict=True))
    assert never == 19
    full = [ci_rel_width(s, 0.95) for s in rows]
    assert np.percentile(full, 50) == pytest.approx(0.0011, abs=1e-4)


def test_the_gate_on_identical_h200_runs_is_no_worse_with_the_rule():
    """benches/fixtures/history_noise_h200.json (5 identical H200 runs of 4 bf16 add
    rows): every ordered pair compared by the gate (GPU threshold 5 %, the per-row
    alpha of a 1,000-row comparison) with all samples and with the samples the rule
    takes: no false alarm either way, on fewer samples (docs/measurement.md)."""
    import itertools
    import json
    from pathlib import Path

    from roofline.gate.stats import Timing, row_alpha
    from roofline.gate.verdicts import judge

    doc = json.loads((Path(__file__).resolve().parent.parent /
                      "benches/fixtures/history_noise_h200.json").read_text())
    alarms = {"all": 0, "rule": 0}
    kept = total = 0
    for runs in doc["rows"].values():
        ruled = [s[:settled_count(s, 0.005, 0.95, 10)] for s in runs]
        kept += sum(map(len, ruled))
        total += sum(map(len, runs))
        for key, rs in (("all", runs), ("rule", ruled)):
            for i, j in itertools.permutations(range(len(rs)), 2):
                side = [Timing("ok", float(np.median(rs[k])), samples=tuple(rs[k]), timer="t")
                        for k in (i, j)]
                verdict, _ = judge(*side, 5.0, row_alpha(1000))
                alarms[key] += verdict in ("slower", "faster")
    assert alarms == {"all": 0, "rule": 0}
    assert kept / total == pytest.approx(0.58, abs=0.01)


def test_a_ceilings_best_of_takes_every_sample(monkeypatch):
    """A ceiling is its fastest sample (benches/measured_ceilings.py): the stopping rule, which
    settles a median, would cut its samples and make it slower.  On the fake GPU a
    steady copy takes all its 200 ms of samples, not the gate's 10."""
    from benches import measured_ceilings as ceilings

    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=55.0)
    got = timing.time_flushed(lambda: gpu.op(300.0, 5.0), ceilings.CEILING_TIMING,
                              host_us=300.0)
    assert got.n_samples == timing_plan.sample_count(0.055 + 0.61 + 0.005,
                                                     ceilings.CEILING_TIMING) > 10


def test_a_run_does_not_import_scipy_stats():
    """scipy.stats costs a run 0.6 s of start-up on the CPU VM: the stopping rule takes
    the binomial CDF from scipy.special, the gate imports its test only to compare."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, run_bench, benches.sweep.job, benches.sweep.runner, "
            "roofline.gate.runs, roofline.gate.cli; print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"
