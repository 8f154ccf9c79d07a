"""Fair and cheap GPU timing, checked on a CPU: host dispatch measured per call (host_us)
and kept out of the device time, CUDA-graph captures bounded, launch-bound rows reported,
each Triton row's config recorded and reused by re-timing, and the pytest-benchmark
suite's rates taken from device time."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from benches import runner, timing
from benches.runner import Case, _InputCache, run_case
from benches.test_bench_kernels import bench_metrics
from benches.timing import TimingConfig, flush_padding_us, graph_plan, host_dispatch_us
from kernels import REGISTRY
from kernels.triton_utils import config_str, configs_text, parse_configs
from roofline.ceilings import Ceilings
from roofline.report import launch_bound_rows, render_summary
from roofline.schema import ALL_COLUMNS
from tests.test_measurement import cpu_cfg, gpu_cfg

# ---- host dispatch ----------------------------------------------------------------------

def test_host_dispatch_is_the_time_per_call_without_syncs():
    syncs = []

    def slow_dispatch():
        t = time.perf_counter()
        while time.perf_counter() - t < 200e-6:  # 200 us of "Python" per call
            pass

    us = host_dispatch_us(slow_dispatch, lambda: syncs.append(1), reps=10, repeats=3)
    assert 195 <= us < 2000
    assert len(syncs) == 2 + 3  # before and after the warm call, then after each burst


def test_flush_padding_covers_the_dispatch():
    assert flush_padding_us(40.0) == 90.0  # 2 x dispatch + 10 us
    assert flush_padding_us(None) == 0.0


def test_gpu_rows_carry_host_us_and_the_flushed_timer_gets_it(monkeypatch):
    got = {}

    def flushed(fn, cfg, host_us=None):
        got["host_us"] = host_us
        return timing.summarize([1.0] * cfg.min_samples, timing.TIMER_FLUSHED)

    monkeypatch.setattr(runner, "time_flushed", flushed)
    monkeypatch.setattr(runner, "host_dispatch_us", lambda call, sync: 123.0)
    spec = REGISTRY["add"]
    shape = {"n": 1 << 24}  # long enough for the flushed timer on an H100
    inputs = spec.make_inputs(shape, "fp32", 0, "cpu")
    t, _ = runner._time_case(Case(spec, "torch", "fp32", shape), gpu_cfg(), inputs,
                             spec.alloc_out(inputs, "fp32"))
    assert got["host_us"] == 123.0 and t.host_us == 123.0


def test_cpu_rows_have_no_host_us():
    row = run_case(Case(REGISTRY["add"], "torch", "fp32", {"n": 4096}), cpu_cfg(),
                   _InputCache())
    assert row["status"] == "ok" and row["host_us"] is None


# ---- CUDA-graph bounds -----------------------------------------------------------------

@pytest.mark.parametrize("copies, launches, host_us, calls, needle", [
    (500, 14, 5.0, 500, ""),  # 7,000 nodes: the full graph
    (100, 600, 5.0, 100, "one round over the 100 copies instead of 200"),  # 120k nodes
    (12_800, 14, 5.0, None, "179,200 graph nodes > 100,000"),  # fp8 dot at 2^12
    (1000, 1, 6000.0, None, "12 s of capture"),
])
def test_graph_plan_bounds_nodes_and_capture_time(copies, launches, host_us, calls, needle):
    got, note = graph_plan(copies, launches, host_us, TimingConfig())
    assert got == calls
    assert needle in note


def test_a_graph_too_large_is_timed_flushed_and_says_so(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "time_flushed", lambda fn, cfg, host_us=None: (
        seen.append("flushed"), timing.summarize([1.0] * 25, timing.TIMER_FLUSHED))[1])
    monkeypatch.setattr(runner, "time_cudagraph", lambda *a, **k: pytest.fail("captured"))
    monkeypatch.setattr(runner, "host_dispatch_us", lambda call, sync: 5.0)
    monkeypatch.setattr(runner, "count_launches", lambda call: 14)
    spec = REGISTRY["dot"]
    shape = {"n": 1 << 12}
    inputs = spec.make_inputs(shape, "fp8", 0, "cpu")
    t, note = runner._time_case(Case(spec, "torch", "fp8", shape), gpu_cfg(), inputs,
                                spec.alloc_out(inputs, "fp8"))
    assert seen == ["flushed"] and t.timer == timing.TIMER_GRAPH_FALLBACK
    assert "too large" in note and "graph nodes" in note


# ---- launch-bound rows in summary.md --------------------------------------------------

def test_summary_lists_launch_bound_rows():
    rows = pd.DataFrame([dict.fromkeys(ALL_COLUMNS) | r for r in [
        {"kernel": "add", "provider": "triton", "dtype": "bf16", "shape": "n=4096",
         "status": "ok", "ms_median": 0.004, "host_us": 22.0, "flops": 4096,
         "bytes": 24576, "tflops": 1e-3, "gbps": 6.0},
        {"kernel": "add", "provider": "torch", "dtype": "bf16", "shape": "n=4096",
         "status": "ok", "ms_median": 0.004, "host_us": 3.0, "flops": 4096,
         "bytes": 24576, "tflops": 1e-3, "gbps": 6.0},
    ]])
    assert list(launch_bound_rows(rows)["provider"]) == ["triton"]
    md = render_summary({"device_key": "h100"}, rows)
    assert "## Launch-bound rows (1)" in md and "22.0" in md and "5.5x" in md


# ---- Triton configs -------------------------------------------------------------------

@pytest.mark.interpreter
def test_triton_rows_record_their_config():
    cfg = cpu_cfg(check_only=True, target=runner.Target("cpu", None, True))
    row = run_case(Case(REGISTRY["matmul"], "triton", "fp32", {"M": 33, "N": 17, "K": 65}),
                   cfg, _InputCache())
    assert row["status"] == "ok", row["reason"]
    assert row["config"].startswith("matmul_kernel[BLOCK_M=")
    assert "num_warps=" in row["config"] and row["config"].endswith("]")


@pytest.mark.interpreter
def test_a_forced_config_runs_instead_of_tuning(monkeypatch):
    import triton

    spec = REGISTRY["matmul"]
    shape = {"M": 33, "N": 17, "K": 65}
    inputs = spec.make_inputs(shape, "fp32", 0, "cpu")
    launches = spec.triton_launches(inputs, spec.alloc_out(inputs, "fp32"), 0)
    forced = configs_text(launches, [launches[0].configs[-1]])
    assert forced != configs_text(launches, [launches[0].interp_config])
    monkeypatch.setattr(triton, "autotune", lambda *a, **k: pytest.fail("tuned again"))
    key = ("matmul", "triton", "fp32", "M=33,N=17,K=65")
    cfg = cpu_cfg(check_only=True, target=runner.Target("cpu", None, True),
                  configs={key: forced})
    row = run_case(Case(spec, "triton", "fp32", shape), cfg, _InputCache())
    assert row["status"] == "ok", row["reason"]
    assert row["config"] == forced


def test_config_text_round_trips():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 64, "N": 64, "K": 64}, "bf16", 0, "meta")
    launches = spec.triton_launches(inputs, spec.alloc_out(inputs, "bf16"), 132)
    for cfg in launches[0].configs:
        text = configs_text(launches, [cfg])
        assert parse_configs(launches, text) == [cfg]
        assert config_str(cfg) in text
    with pytest.raises(ValueError, match="no config"):
        parse_configs(launches, "matmul_kernel[BLOCK_M=1]")


# ---- pytest-benchmark rates from device time ------------------------------------------

def test_bench_rates_come_from_device_time_not_host_latency():
    spec = REGISTRY["matmul"]
    shape = {"M": 1024, "N": 1024, "K": 1024}
    ceil = Ceilings({"tflops": {"bf16": 989.4}, "hbm_gbps": 3350.0}, None)
    m = bench_metrics(spec, "bf16", shape, device_ms=0.004, host_ms=0.05, ceilings=ceil)
    assert m["tflops"] == pytest.approx(2 * 1024**3 / 4e-6 / 1e12)
    assert m["ms_device"] == 0.004 and m["host_latency_ms"] == 0.05
    assert m["mfu"] == pytest.approx(m["tflops"] / 989.4)
