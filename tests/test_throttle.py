"""Clocks and throttling that describe the timing, and that the gate sees.

The NVML window of a row covers its timing only, and its clock the readings of a busy
GPU; a timing whose SM clock sat below the threshold is taken again after a pause
(nvbench's --throttle-threshold / --throttle-recovery-delay) and the row marked if it
stays throttled, with NVML's clock-event reasons reported beside the clock, never judged
alone; summary.md shows the run's clocks, power and throttled rows; the comparison gives
such rows the verdict `throttled`, which fails the gate unless allowed.
"""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import pytest

import run_bench
from benches.sweep import gpu_monitor, runner, timers
from benches.sweep import retime as retime_client
from benches.sweep.cases import InputCache
from benches.sweep.gpu_monitor import SLOWDOWN_REASONS, ClockWindow, MonitorSummary, Reading
from benches.sweep.nvml_doc import NvmlFacts
from benches.sweep.runner import run_case
from benches.sweep.sample_clocks import keep_unthrottled, per_sample_clocks
from benches.sweep.throttle import (
    ThrottleConfig,
    run_clock_facts,
    throttle_state,
    time_unthrottled,
)
from benches.timing import clock as timing
from benches.timing import plan as timing_plan
from contract.record import CaseId, Clocks, RunRow, Timing, parse_row
from contract.run_meta import parse_meta
from contract.schema import ALL_COLUMNS, RunDoc, parse_row_key
from kernels import Target
from roofline.gate.cli import main
from roofline.gate.promote import promote
from roofline.gate.rules import CompareError
from roofline.gate.verdicts import compare_frames
from roofline.report.summary import render_summary
from tests.test_measurement import case, gpu_cfg


class WindowMonitor:
    """A monitor whose windows come from a list, one per timing: each window's readings
    carry its clock and reasons."""

    def __init__(self, windows: list[ClockWindow], max_clock: float | None = 2000.0) -> None:
        self.windows, self.max_sm_clock_mhz, self.calls = list(windows), max_clock, []
        self.current = ClockWindow(None)

    def window(self, t0: float, t1: float) -> ClockWindow:
        self.calls.append((t0, t1))
        self.current = self.windows.pop(0) if len(self.windows) > 1 else self.windows[0]
        return self.current

    def busy_between(self, t0: float, t1: float) -> list[Reading]:
        w = self.current
        bits = sum(SLOWDOWN_REASONS[n] for n in w.throttle_reasons)
        return [Reading((t0 + t1) / 2, sm_clock_mhz=w.sm_clock_mhz, clock_reasons=bits)]


CLEAN = ClockWindow(1980.0)
CAPPED = ClockWindow(1400.0, ("sw_power_cap",))


def _timer():
    """A case of one row: each timing is named by its attempt."""
    calls = []

    def time_fn():
        calls.append(time.monotonic())
        return [(f"timing {len(calls)}", "")]
    return time_fn, calls


def one(got):
    (t, note, cols), = got
    return t, note, cols


# ---- the decision -----------------------------------------------------------------------

@pytest.mark.parametrize("clock, throttled", [(1480.0, True), (1499.0, True),
                                              (1500.0, False), (1520.0, False)])
def test_threshold_is_a_share_of_the_maximum_sm_clock(clock, throttled):
    w = ClockWindow(clock)
    why = throttle_state(w, 2000.0, ThrottleConfig(threshold_pct=75.0))
    assert (why is not None) is throttled
    if throttled:
        assert f"{clock:.0f} MHz" in why and "75%" in why


@pytest.mark.parametrize("reason", ["sw_power_cap", "hw_slowdown", "sw_thermal",
                                    "hw_thermal", "hw_power_brake"])
def test_a_clock_event_reason_above_the_threshold_is_not_throttling(reason):
    """nvbench's rule: the clock against the threshold, nothing else.  An H100 SXM holds
    its 700 W cap (sw_power_cap) through every long GEMM at a clock near its maximum."""
    w = ClockWindow(1755.0, (reason,))
    assert throttle_state(w, 1980.0, ThrottleConfig()) is None
    why = throttle_state(dataclasses.replace(w, sm_clock_mhz=1400.0), 1980.0,
                         ThrottleConfig())
    assert "1400 MHz" in why and reason in why  # below it: throttled, reasons beside
    assert throttle_state(CLEAN, None, ThrottleConfig()) is None  # no maximum known
    assert throttle_state(ClockWindow(None, (reason,)), 1980.0,
                          ThrottleConfig()) is None  # no busy reading: cannot be told


# ---- re-timing after a pause -----------------------------------------------------------

def test_a_throttled_timing_is_taken_again_after_the_delay():
    time_fn, calls = _timer()
    slept: list[float] = []
    mon = WindowMonitor([CAPPED, CLEAN])
    t, note, cols = one(time_unthrottled(time_fn, mon, ThrottleConfig(recovery_delay_s=0.25),
                                         sleep=slept.append))
    assert t == "timing 2" and slept == [0.25]
    assert cols == Clocks(sm_clock_mhz=1980.0, throttled=False)
    assert "timed again 1x" in note


def test_a_row_that_stays_throttled_is_kept_and_marked():
    time_fn, calls = _timer()
    slept: list[float] = []
    t, note, cols = one(time_unthrottled(time_fn, WindowMonitor([CAPPED]),
                                         ThrottleConfig(retries=3), sleep=slept.append))
    assert len(calls) == 4 and slept == [0.05] * 3 and t == "timing 4"
    assert cols.throttled is True and cols.sm_clock_mhz == 1400.0
    assert "throttled in all 4 timings" in note and "sw_power_cap" in note


def test_a_clean_timing_is_taken_once():
    time_fn, calls = _timer()
    _, note, cols = one(time_unthrottled(time_fn, WindowMonitor([CLEAN]), ThrottleConfig(),
                                         sleep=lambda s: pytest.fail("no pause needed")))
    assert len(calls) == 1 and note == "" and cols.throttled is False


def test_the_window_covers_the_timing_only(monkeypatch):
    """Inputs, the float64 reference and the first (tuning) calls come before the window
    opens; before, the window opened with the row."""
    from tests.test_measurement import gpu_faked

    marks: dict[str, float] = {}
    mon = WindowMonitor([CLEAN])
    gpu_faked(monkeypatch, mon)

    def take(k):
        marks.setdefault("timing", time.monotonic())
        return [0.5] * k
    monkeypatch.setattr(timers.GpuTimer, "prepare", lambda self, row: timers.Prepared(
        timers.Sampler(take, 25, 0.5), timing_plan.TIMER_FLUSHED, "", 5.0))

    class Cache(InputCache):
        def get(self, c, cfg):
            marks["inputs"] = time.monotonic()
            time.sleep(0.01)
            return super().get(c, dataclasses.replace(cfg, target=Target("cpu")))

        def reference(self, c):
            ref = super().reference(c)
            time.sleep(0.01)
            marks["reference"] = time.monotonic()
            return ref

    row = run_case(case(shape={"n": 4096}), gpu_cfg(), Cache())
    assert row.status == "ok" and row.clocks.throttled is False
    (t0, t1), = mon.calls
    assert marks["inputs"] < marks["reference"] <= t0 <= marks["timing"] <= t1


def _reading(t: float, clock: int, reasons: int = 0, power: float = 300.0) -> Reading:
    return Reading(t, sm_clock_mhz=clock, power_w=power, temperature_c=60,
                   clock_reasons=reasons)


def test_the_monitor_leaves_out_readings_before_and_between_timings():
    """Readings of the reference and compile (idle clock, a power-cap event) sit before
    the window: neither the row's columns nor the run's facts may include them."""
    from tests.test_measurement import FakeNVML

    nv = FakeNVML()  # device 1 reads 1755 MHz, no reasons, 650 W
    mon = gpu_monitor.GpuMonitor(nv, nv.devs[1])
    t0 = time.monotonic()
    mon.readings.extend([_reading(t0 - 2.0, 345, power=90.0),  # compiling: idle clock
                         _reading(t0 - 1.0, 1200, 0x4, power=700.0)])  # reference: capped
    mon.readings.append(_reading(t0 + 0.001, 1740))  # the sampler, while timing
    w = mon.window(t0, t0 + 0.002)
    assert w == ClockWindow((1740 + 1755) / 2, (), idle_readings=0)
    mon.readings.append(_reading(time.monotonic() + 1.0, 500, 0x20))  # between rows
    s = mon.summary()
    assert (s.sm_clock_mhz_min, s.sm_clock_mhz_max, s.power_w_max) == (1740, 1755, 650.0)
    assert s.throttle_reasons_seen == () and s.throttled_fraction == 0.0
    assert (s.readings, s.readings_all) == (2, 5)


def test_retiming_children_leave_out_throttled_rounds(monkeypatch, capsys):
    """The gate's confirmation rounds run under the run's throttle settings, and a round
    that stayed throttled cannot confirm a row slower."""
    import json
    from types import SimpleNamespace

    from benches.sweep import job, retime
    from benches.sweep.cases import Case
    from kernels import REGISTRY
    from tests.test_measurement import cpu_cfg

    keys = [("add", "torch", "fp32", "n=4096"), ("add", "torch", "fp32", "n=8192")]
    seen: list[ThrottleConfig] = []

    def fake_run_case(c, cfg, cache):
        seen.append(cfg.throttle)
        hot = c.shape["n"] == 8192
        return RunRow(c.id, status="ok", timing=Timing(samples_ms=(2.0,)),
                      clocks=Clocks(throttled=hot))
    monkeypatch.setattr(runner, "run_case", fake_run_case)
    cfg = dataclasses.replace(cpu_cfg(), throttle=ThrottleConfig(90.0, 0.5))
    sent: list[dict] = []

    def child(*a, input, **k):
        sent.append(json.loads(input))
        asked = retime.RetimeSpec.from_json({**sent[-1], "device": "cpu"})
        answer = retime.retime(asked).to_json()
        return SimpleNamespace(returncode=0, stdout=json.dumps(answer), stderr="")
    monkeypatch.setattr(retime_client, "RETIME_ROUNDS", 2)
    monkeypatch.setattr(retime_client, "RETIME_SPACING_S", 0.0)
    monkeypatch.setattr(retime_client.subprocess, "run", child)
    cases = [Case(REGISTRY["add"], "torch", "fp32", {"n": n}) for n in (4096, 8192)]
    got = job.compare_retimer(cases, cfg, [])(keys)
    assert sent[0]["throttle"] == {"threshold_pct": 90.0, "recovery_delay_s": 0.5,
                                   "retries": 3}
    assert seen == [ThrottleConfig(90.0, 0.5)] * 4
    # Keys come back whole: (kernel, provider, dtype, shape, cache), a 4-part key as cold.
    assert got == {parse_row_key(keys[0]): [[2.0], [2.0]], parse_row_key(keys[1]): []}
    assert "throttled in 1 rows' timings" in capsys.readouterr().out


def _marked(throttled: bool) -> RunRow:
    return RunRow(CaseId("add", "torch", "fp32", "n=1"), clocks=Clocks(throttled=throttled))


# The sampler's summary of a run at 1400-1980 MHz, 690 W at most, power-capped.
SUMMARY = MonitorSummary(
    readings=0, readings_idle=0, readings_all=0, interval_s=0.1, sm_clock_mhz_min=1400,
    sm_clock_mhz_median=1980, sm_clock_mhz_max=1980, power_w_max=690.0,
    throttled_fraction=None, throttle_reasons_seen=("sw_power_cap",))


def _summary(**given: object) -> MonitorSummary:
    return dataclasses.replace(SUMMARY, **given)


def test_run_clock_facts_count_throttled_rows():
    during = _summary(readings=50, readings_idle=4, throttled_fraction=0.1)
    start = NvmlFacts(max_sm_clock_mhz=1980, mem_clock_mhz=2619, power_limit_w=700.0)
    facts = run_clock_facts(during, start, [_marked(True), _marked(False)], ThrottleConfig())
    assert facts["throttle"]["throttled_rows"] == 1
    assert facts["clocks"]["sm_mhz_median"] == 1980 and facts["power"]["limit_w"] == 700.0
    assert facts["throttle"]["threshold_pct"] == 75.0
    assert facts["throttle"]["readings_idle_left_out"] == 4


# ---- summary.md -------------------------------------------------------------------------

def _rows(throttled_run: bool) -> list[dict]:
    rows = []
    for i, n in enumerate((4096, 8192)):
        rows.append(dict.fromkeys(ALL_COLUMNS) | {
                     "kernel": "add", "provider": "torch", "dtype": "fp32",
                     "shape": f"n={n}", "flops": n, "bytes": 12 * n, "intensity": 1 / 12,
                     "ms_median": 0.01, "ms_p20": 0.0099, "ms_p80": 0.0101, "n_samples": 25,
                     "tflops": n / 1e-5 / 1e12, "gbps": 12 * n / 1e-5 / 1e9,
                     "status": "ok", "reason": "", "timer": "do_bench",
                     "samples_ms": [0.01] * 25, "sm_clock_mhz": 1400.0 if i else 1980.0,
                     "throttled": bool(i) and throttled_run, "correct": True,
                     "peak_tflops": 66.9, "peak_gbps": 3350.0, "roof_tflops": 0.28,
                     "mfu": 0.0061, "pct_roof": 1.5, "rel_err": 0.0})
    return rows


def test_summary_shows_clocks_power_and_throttled_rows():
    meta = {"device_name": "NVIDIA H100 80GB HBM3", "device_key": "h100",
            **run_clock_facts(_summary(readings=None, readings_idle=None),
                              NvmlFacts(max_sm_clock_mhz=1980, power_limit_w=700.0),
                              [_marked(True)], ThrottleConfig())}

    def doc(throttled_run: bool) -> RunDoc:
        return RunDoc(parse_meta(meta), tuple(parse_row(r) for r in _rows(throttled_run)))

    md = render_summary(doc(True))
    assert "SM 1980 MHz median while timing (1400 MHz to 1980 MHz)" in md
    assert "690 W peak of a 700 W limit" in md
    assert "## Throttled rows (1)" in md and "`n=8192`" in md and "1400 MHz" in md
    assert "## Throttled rows" not in render_summary(doc(False))


# ---- the gate ---------------------------------------------------------------------------

def _frame(scale: float, throttled: bool) -> pd.DataFrame:
    rows = _rows(throttled)
    for r in rows:
        r["samples_ms"] = [0.01 * scale * (1 + 0.001 * k) for k in range(25)]
        r["ms_median"] = 0.01 * scale * 1.012
    return pd.DataFrame(rows)


@pytest.mark.parametrize("scale", [1.0, 1.5])  # same speed, and much slower
def test_a_throttled_row_gets_its_own_verdict(scale):
    out = compare_frames(_frame(1.0, False), _frame(scale, True), threshold=5)
    v = dict(zip(out["shape"], out["verdict"], strict=True))
    assert v["n=8192"] == "throttled"  # never "same" (silent) nor "slower"
    assert v["n=4096"] == ("same" if scale == 1.0 else "slower")
    note = out.loc[out["shape"] == "n=8192", "note"].iloc[0]
    assert "1400 MHz" in note and "the run's" in note


def test_throttled_fails_the_gate_unless_allowed(tmp_path, capsys):
    from tests.test_regression_gate import write_run

    base = write_run(tmp_path / "base", _frame(1.0, False).to_dict("records"),
                     created="2026-01-01T00:00:00+00:00")
    run = write_run(tmp_path / "run", _frame(1.0, True).to_dict("records"),
                    created="2026-01-02T00:00:00+00:00")
    assert main(["compare", str(base), str(run)]) == 1
    out = capsys.readouterr().out
    assert "1 throttled" in out and "--allow throttled" in out
    assert main(["compare", str(base), str(run), "--allow", "throttled"]) == 0


@pytest.mark.parametrize("argv, needle", [
    (["--throttle-threshold", "0"], "--throttle-threshold"),
    (["--throttle-threshold", "101"], "--throttle-threshold"),
    (["--throttle-threshold", "nan"], "--throttle-threshold"),
    (["--throttle-recovery-delay", "-1"], "--throttle-recovery-delay"),
])
def test_bad_throttle_flags_are_one_line_exit_2(argv, needle, capsys, tmp_path):
    assert run_bench.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and len(err.splitlines()) == 1


def test_gpu_monitor_reads_the_maximum_sm_clock():
    from tests.test_measurement import FakeNVML

    nv = FakeNVML()
    assert gpu_monitor.GpuMonitor(nv, nv.devs[1]).max_sm_clock_mhz == 1980.0


def test_promotion_refuses_throttled_rows_and_pooling_keeps_the_mark(tmp_path):
    """A baseline's throttled row makes every later comparison of it `throttled`: promote
    refuses it unless forced, and a pool of runs is throttled where any run's row was."""
    import json

    from tests.test_regression_gate import write_run

    clean = write_run(tmp_path / "clean", _frame(1.0, False).to_dict("records"))
    hot = write_run(tmp_path / "hot", _frame(1.0, True).to_dict("records"))
    bl = tmp_path / "bl"
    with pytest.raises(CompareError, match="1 row.s. timed while the GPU throttled"):
        promote(hot, baselines_dir=bl)
    with pytest.raises(CompareError, match="hot has 1 row"):
        promote([hot, clean], baselines_dir=bl)
    path, _ = promote([hot, clean], baselines_dir=bl, force=True)
    rows = {r["shape"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["n=8192"]["throttled"] is True and rows["n=8192"]["pooled_runs"] == 2
    assert rows["n=4096"]["throttled"] is False


# ---- the clock judges, at the NVML boundary ----------------------------------------------

def _nvml_monitor():
    from tests.test_measurement import FakeNVML

    nv = FakeNVML()  # device 1: 1755 MHz of a 1980 MHz maximum, no reasons, 97% busy
    return nv, gpu_monitor.GpuMonitor(nv, nv.devs[1])


def test_a_power_capped_timing_at_full_clock_is_timed_once_and_not_marked():
    """sw_power_cap at 1755 of 1980 MHz (89%, above the 75% threshold): the row is timed
    once, not marked throttled (the gate passes it), and the reason is reported beside
    its clock in the row's note."""
    nv, mon = _nvml_monitor()
    nv.devs[1]["reasons"] = 0x4
    time_fn, calls = _timer()
    _, note, cols = one(time_unthrottled(time_fn, mon, ThrottleConfig(),
                                         sleep=lambda s: pytest.fail("re-timed at full clock")))
    assert len(calls) == 1 and cols == Clocks(sm_clock_mhz=1755.0, throttled=False)
    assert note == "clock-event reasons sw_power_cap at SM clock 1755 MHz, above 75% of " \
                   "1980 MHz: not throttled"
    assert mon.summary().throttle_reasons_seen == ("sw_power_cap",)


def test_a_power_capped_timing_below_the_threshold_is_throttled():
    nv, mon = _nvml_monitor()
    nv.devs[1]["clock"], nv.devs[1]["reasons"] = 1300, 0x4 | 0x8
    time_fn, calls = _timer()
    slept: list[float] = []
    _, note, cols = one(time_unthrottled(time_fn, mon, ThrottleConfig(), sleep=slept.append))
    assert len(calls) == 4 and cols == Clocks(sm_clock_mhz=1300.0, throttled=True)
    assert "SM clock 1300 MHz, below 75% of its 1980 MHz maximum" in note
    assert "hw_slowdown, sw_power_cap" in note


@pytest.mark.parametrize("idle", [{"reasons": 0x1}, {"util": 0}],
                         ids=["gpu-idle-reason", "utilization-0"])
def test_idle_readings_inside_a_window_do_not_read_as_throttling(idle):
    """A CUDA-graph row's window spans its dispatch bursts, copies and capture with the
    GPU waiting: readings of the idle GPU (NVML's GPU-idle reason, or no kernel in the
    last utilization period) at a falling clock are left out of the row's clock."""
    nv, mon = _nvml_monitor()
    t0 = time.monotonic()
    dev = nv.devs[1]
    for state in ({"clock": 1755}, {"clock": 345, **idle}, {"clock": 345, **idle},
                  {"clock": 600, **idle}, {"clock": 1740}):
        dev.update({"reasons": 0, "util": 97} | state)
        mon.sample()
    dev.update(clock=1755, reasons=0, util=97)
    w = mon.window(t0, time.monotonic())
    assert w == ClockWindow(1755.0, (), idle_readings=3)
    assert throttle_state(w, mon.max_sm_clock_mhz, ThrottleConfig()) is None
    s = mon.summary()
    assert (s.sm_clock_mhz_min, s.readings, s.readings_idle) == (1740, 3, 3)


def test_a_window_of_an_idle_gpu_only_cannot_be_throttled():
    nv, mon = _nvml_monitor()
    nv.devs[1].update(clock=210, reasons=0x1 | 0x4)
    time_fn, calls = _timer()
    _, note, cols = one(time_unthrottled(time_fn, mon, ThrottleConfig(),
                                         sleep=lambda s: pytest.fail("an idle clock re-timed")))
    assert cols == Clocks(sm_clock_mhz=None, throttled=False) and note == ""


def test_a_rows_readings_are_its_own_batches_or_span():
    """A row's clock comes from the readings inside its own samples' windows: its batches
    (each widened by BATCH_SLACK_S) when it was timed in turns with other providers, its
    span when it reports one, else the whole call; never from a CUDA graph's capture nor
    another provider's batch."""
    from benches.sweep.sample_clocks import BATCH_SLACK_S
    from benches.sweep.throttle import row_readings
    from benches.timing.interleave import Batch

    asked: list[tuple[float, float]] = []

    class Mon:
        def busy_between(self, t0, t1):
            asked.append((t0, t1))
            return [Reading(t0 + BATCH_SLACK_S, sm_clock_mhz=1500.0)]

    batched = dataclasses.replace(timing.summarize([0.5] * 4, timing_plan.TIMER_FLUSHED),
                                  batches=(Batch(10.0, 10.1, 2), Batch(10.3, 10.4, 2)),
                                  span=(10.0, 10.4))
    assert len(row_readings(Mon(), batched, 0.0, 99.0)) == 2
    assert asked == [(10.0 - BATCH_SLACK_S, 10.1 + BATCH_SLACK_S),
                     (10.3 - BATCH_SLACK_S, 10.4 + BATCH_SLACK_S)]
    asked.clear()
    row_readings(Mon(), dataclasses.replace(batched, batches=()), 0.0, 99.0)
    assert asked == [(10.0, 10.4)]
    asked.clear()
    row_readings(Mon(), "no span", 1.0, 2.0)
    assert asked == [(1.0, 2.0)]


def test_a_throttled_cell_reads_the_same_wherever_it_comes_from():
    """One reading of the `throttled` column for the gate, promotion and the energy
    figure: a bool column's cell from .loc is numpy's bool, a CSV's is text."""
    import numpy as np

    from contract.rows import is_throttled

    df = pd.DataFrame({"throttled": [True, False]})
    assert is_throttled(df.loc[0, "throttled"]) and not is_throttled(df.loc[1, "throttled"])
    assert isinstance(df.loc[0, "throttled"], np.bool_)
    for yes in (True, "true", " True "):
        assert is_throttled(yes)
    for no in (False, None, float("nan"), "false", "", 1, "1"):
        assert not is_throttled(no)


# ---- the throttle rule per sample --------------------------------------------------------

def _readings(clocks: list[tuple[float, float]]) -> list[Reading]:
    return [Reading(t, sm_clock_mhz=c, clock_reasons=0) for t, c in clocks]


class ReadingsMonitor:
    """A monitor holding fixed readings (a 1980 MHz GPU)."""

    max_sm_clock_mhz = 1980.0

    def __init__(self, reads: list[Reading]) -> None:
        self.reads, self.last_busy = reads, reads

    def window(self, t0, t1):
        return ClockWindow(None)

    def busy_between(self, t0, t1):
        return [r for r in self.reads if t0 <= r.t <= t1]


def test_a_batched_samples_clock_is_read_in_its_own_batch_only():
    """Two providers' batches alternate: a sample's clock never comes from a reading
    taken while the other provider ran, however near."""
    from benches.sweep.sample_clocks import batch_sample_clocks
    from benches.timing.interleave import Batch

    mine = [Batch(10.0, 10.01, 2), Batch(10.02, 10.03, 2)]  # the other ran 10.01..10.02
    reads = _readings([(10.005, 1500.0), (10.015, 1980.0), (10.029, 1520.0)])
    assert batch_sample_clocks([5.0] * 4, mine, reads) == [1500.0, 1500.0, 1520.0, 1520.0]
    # No reading inside the second batch: its samples' clock is unknown, not the other's.
    assert batch_sample_clocks([5.0] * 4, mine, reads[:2]) == [1500.0, 1500.0, None, None]


def test_each_sample_takes_the_clock_nearest_its_midpoint():
    samples = [1.0] * 10  # 10 samples over 10.0..10.1 s: midpoints 10.005, 10.015, ...
    clocks = per_sample_clocks(samples, (10.0, 10.1),
                               _readings([(10.0, 1200.0), (10.04, 1900.0), (10.1, 1900.0)]))
    assert clocks[:2] == [1200.0, 1200.0] and clocks[2:] == [1900.0] * 8
    far = per_sample_clocks(samples, (10.0, 10.1), _readings([(10.2, 1900.0)]))
    assert far == [None] * 10


def test_slow_samples_are_left_out_and_the_row_is_not_throttled():
    t = timing.Timing(**{**timing.summarize([2.0] * 4 + [1.0] * 16,
                                            timing_plan.TIMER_FLUSHED).__dict__,
                         "span": (10.0, 10.2)})  # 4 slow samples first, 10.0..10.067 s
    reads = _readings([(10.0 + i * 0.01, 1000.0 if i < 7 else 1900.0) for i in range(21)])
    kept = keep_unthrottled(t, reads, threshold_mhz=1485.0)
    assert kept is not None
    new, dropped, clock = kept
    assert dropped == 4 and new.n_samples == 16 and new.ms_median == 1.0 and clock == 1900.0

    out, note, cols = one(time_unthrottled(lambda: [(t, "")], ReadingsMonitor(reads),
                                           ThrottleConfig(),
                                           sleep=lambda s: pytest.fail("no re-timing needed")))
    assert out.ms_median == 1.0 and cols.throttled is False
    assert cols.throttled_samples == 4
    assert "4 of 20 samples left out: SM clock below 75% of 1980 MHz" in note


def test_a_samples_clock_is_a_reading_within_50_ms_and_half_the_samples_must_stay():
    one = [1.0]  # one sample over 10.0..10.001 s: its midpoint at 10.0005
    assert per_sample_clocks(one, (10.0, 10.001), _readings([(10.0405, 1900.0)])) == [1900.0]
    assert per_sample_clocks(one, (10.0, 10.001), _readings([(10.0705, 1900.0)])) == [None]

    def kept_of(slow: int):  # 30 samples of 1 ms over 30 ms, the first `slow` ones slow
        t = timing.Timing(**{**timing.summarize([1.0] * 30, timing_plan.TIMER_FLUSHED)
                             .__dict__, "span": (10.0, 10.03)})
        reads = _readings([(10.0004 + i * 0.001, 1000.0 if i < slow else 1900.0)
                           for i in range(30)])
        return keep_unthrottled(t, reads, threshold_mhz=1485.0)

    got = kept_of(12)  # 18 of 30 left: at least half, and at least 10
    assert got is not None and got[1] == 12 and got[0].n_samples == 18
    assert kept_of(17) is None  # 13 of 30 left: under half, timed again whole


def test_mostly_slow_samples_are_timed_again_whole():
    t = timing.Timing(**{**timing.summarize([2.0] * 20, timing_plan.TIMER_FLUSHED).__dict__,
                         "span": (10.0, 10.2)})
    reads = _readings([(10.0 + i * 0.01, 1000.0) for i in range(21)])
    assert keep_unthrottled(t, reads, threshold_mhz=1485.0) is None
    slept: list[float] = []

    _, note, cols = one(time_unthrottled(lambda: [(t, "")], ReadingsMonitor(reads),
                                         ThrottleConfig(retries=2), sleep=slept.append))
    assert cols.throttled is True and len(slept) == 2 and "throttled in all 3" in note


def _capped_timing():
    t = timing.summarize([2.0] * 20, timing_plan.TIMER_FLUSHED)
    return dataclasses.replace(t, span=(10.0, 10.2))


@pytest.mark.parametrize("bits, sustained, throttled", [
    (0x4, True, False),  # the power cap alone, in a case warmed to its sustained clock
    (0x4, False, True),  # not warmed up: nvbench's rule
    (0x4 | 0x8, True, True),  # a hardware slowdown beside it: throttled
    (0x0, True, True),  # no reason given: the rule
])
def test_a_sustained_case_under_the_power_cap_alone_is_not_throttled(bits, sustained,
                                                                      throttled):
    """A compute-bound case warmed up to its sustained clock runs at the power cap, and
    on an H200 that clock sits near 75% of the maximum: under the cap alone that is the
    speed it sustains (no sample left out, not marked), not a throttled timing."""
    from benches.sweep.throttle import judge

    reads = [Reading(10.0 + i * 0.01, sm_clock_mhz=1400.0, clock_reasons=bits)
             for i in range(21)]
    v = judge(_capped_timing(), reads, 1980.0, ThrottleConfig(), sustained=sustained)
    assert (v.why is not None) is throttled
    assert v.window.sm_clock_mhz == 1400.0
    if not throttled:
        assert v.dropped is None and v.timing.n_samples == 20


def test_the_monitor_reads_at_once_when_a_timing_starts():
    """fast() wakes the NVML thread: a CUDA-graph case samples for ~20 ms, less than a
    slow interval (here 5 s) the thread might still be sleeping through."""
    from tests.test_measurement import FakeNVML

    nv = FakeNVML()
    mon = gpu_monitor.GpuMonitor(nv, nv.devs[1], interval_s=5.0, fast_interval_s=0.005)
    mon.start()
    try:
        time.sleep(0.05)  # the thread now waits out its first slow interval
        before = len(mon.readings)
        t0 = time.monotonic()
        with mon.fast():
            while len(mon.readings) < before + 3 and time.monotonic() - t0 < 2.0:
                time.sleep(0.002)
        assert len(mon.readings) >= before + 3, "no fast readings within 2 s"
        assert time.monotonic() - t0 < 2.0
    finally:
        mon.stop()
