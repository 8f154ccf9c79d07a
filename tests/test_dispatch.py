"""Fair and cheap GPU timing, checked on a CPU: host dispatch measured per call (host_us)
and kept out of the device time, CUDA-graph captures bounded, launch-bound rows reported,
each Triton row's config recorded and reused by re-timing, and the pytest-benchmark
suite's rates taken from device time.  The GPU is played by fakes: a host/stream
timeline for the flushed timer, a fake clock for captures, fake kernels for launches."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import triton
import triton.testing

from benches.sweep import job, retime, runner, timers
from benches.sweep import retime as retime_client
from benches.sweep.cases import Case, InputCache
from benches.sweep.runner import run_case
from benches.test_bench_kernels import bench_metrics
from benches.timing import clock as timing
from benches.timing import graphs as graph_timing
from benches.timing import plan as timing_plan
from benches.timing.clock import (
    Dispatch,
    flush_padding_us,
    host_dispatch_us,
    measure_dispatch,
)
from benches.timing.graphs import GraphProbe, GraphSampler
from benches.timing.plan import TimingConfig, graph_plan
from benches.timing.stopping import STOP_CAP
from contract.ceilings import Ceilings
from contract.record import Build, CaseId, RunRow, Timing
from contract.schema import ALL_COLUMNS
from kernels import REGISTRY, Target, triton_utils
from kernels.spec import TritonLaunch
from kernels.triton_utils import (
    config_str,
    configs_text,
    parse_configs,
    prepared_call,
    run_launch,
)
from roofline.report.findings import launch_bound_rows
from roofline.report.summary import render_summary
from tests.run_docs import doc_of
from tests.test_measurement import cpu_cfg, gpu_cfg, steady_sampler


def _busy(us: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < us * 1e-6:
        pass


# ---- host dispatch ----------------------------------------------------------------------

def test_host_dispatch_is_the_time_per_call_without_syncs():
    log = []

    def slow_dispatch():  # 200 us of "Python" per call
        log.append("c")
        _busy(200)

    us = host_dispatch_us(slow_dispatch, lambda: log.append("s"), reps=10, repeats=5)
    # At least the 200 us each call spins; under 10x it (a burst of 10 not divided by its
    # calls would be 2000+), with room for a loaded machine's preemptions.
    assert 200 <= us < 2000
    # warm call and a timed single call, each synchronized; then bursts of 10 calls with
    # no sync inside a burst, one after each
    assert "".join(log) == "scscs" + ("c" * 10 + "s") * 5


def test_host_dispatch_of_a_slow_call_costs_few_calls_and_no_device_time():
    pending = []
    log = []

    def call():  # 50 us to dispatch, 10 ms on the "device"
        log.append("c")
        pending.append(1)
        _busy(50)

    def sync():
        log.append("s")
        time.sleep(0.01 * len(pending))
        pending.clear()

    # 3 bursts of 2 fit 0.2 s of 10 ms calls: 8 calls in all, not 102
    us = host_dispatch_us(call, sync, reps=20, repeats=5, budget_s=0.2)
    assert "".join(log).startswith("scscs")
    bursts = "".join(log)[5:].split("s")[:-1]
    assert len(bursts) == 3 and len(set(bursts)) == 1 and 2 <= len(bursts[0]) <= 6
    assert 50 <= us < 1000  # the dispatch, not the 10 ms of device time
    # 0.09 s has room for 6 (3 bursts of 2: 8 of these calls fit), not 12
    log.clear()
    fit = int(0.09 / (measure_dispatch(call, sync, reps=20, repeats=5,
                                       budget_s=0.09).once_ms * 1e-3))
    bursts = "".join(log)[5:].split("s")[:-1]
    assert bursts == (["c" * max(2, fit // 3)] * 3 if fit >= 6 else [])
    # 0.05 s has no room for 6 such calls: the two calls' own return times, no burst
    log.clear()
    got = measure_dispatch(call, sync, reps=20, repeats=5, budget_s=0.05)
    assert "".join(log) == "scscs"
    assert 50 <= got.host_us < 1000 and got.once_ms >= 10.0
    # returned before the device ran: the smaller of the two calls' dispatch
    log.clear()
    slow_first = iter([3000.0, 60.0])
    got = measure_dispatch(lambda: (log.append("c"), pending.append(1),
                                    _busy(next(slow_first))), sync, budget_s=0.05)
    assert "".join(log) == "scscs" and 60 <= got.host_us < 1000


def test_flush_padding_covers_the_dispatch():
    assert flush_padding_us(40.0) == 90.0  # 2 x dispatch + 10 us
    assert flush_padding_us(None) == 0.0


class FakeGpu:
    """One host thread and one GPU stream, in microseconds: an operation costs the host
    its dispatch time, then runs on the GPU once the GPU is free and it is enqueued."""

    def __init__(self) -> None:
        self.host = 0.0
        self.free = 0.0

    def op(self, host_us: float, dev_us: float) -> float:
        self.host += host_us
        start = max(self.free, self.host)
        self.free = start + dev_us
        return start

    def sync(self) -> None:
        self.host = max(self.host, self.free)

    def install(self, monkeypatch: pytest.MonkeyPatch, flush_us: float) -> None:
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = None

            def record(self) -> None:
                self.t = gpu.op(1.0, 0.0)

            def elapsed_time(self, end: Event) -> float:
                return (end.t - self.t) / 1e3

        flush = SimpleNamespace(zero_=lambda: gpu.op(5.0, flush_us))
        monkeypatch.setattr(timing, "flush_buffer", lambda: flush)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", gpu.sync)
        monkeypatch.setattr(torch.cuda, "_sleep",
                            lambda cycles: gpu.op(2.0, cycles / timing.PAD_CYCLES_PER_US))


def test_flushed_samples_count_device_time_only_when_the_gpu_is_kept_busy(monkeypatch):
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=85.0)  # an H100's 256 MB flush

    def triton_call():  # 300 us of Python before a 5 us kernel
        gpu.op(300.0, 5.0)

    # As do_bench does it: the start event runs when the flush ends (85 us after it was
    # enqueued), the kernel is enqueued 303 us after the flush (event, call): every
    # sample is 218 us of waiting for the host plus the 5 us kernel.
    # (the stopping rule off: every sample the time cap allows)
    cfg = TimingConfig(rep_ms=10.0, warmup_ms=1.0, min_samples=3, ci_rel_width=0.0)
    plain = timing.padded_flushed_samples(triton_call, cfg, 0.0).samples
    assert plain == [pytest.approx(0.223)] * len(plain)
    # Kept busy for 2 x 300 + 10 us after each flush: the kernel's 5 us, every sample.
    padded = timing.padded_flushed_samples(triton_call, cfg, flush_padding_us(300.0))
    assert padded.samples == [pytest.approx(0.005)] * 14  # 10 ms over 700 us a sample
    assert padded.stopped == STOP_CAP


def test_time_flushed_pads_by_the_dispatch_it_is_given(monkeypatch):
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=55.0)  # an H200
    monkeypatch.setattr(triton.testing, "do_bench", lambda *a, **k: pytest.fail("do_bench"))
    t = timing.time_flushed(lambda: gpu.op(300.0, 5.0), TimingConfig(ci_rel_width=0.0),
                            host_us=300.0)
    assert t.timer == timing_plan.TIMER_FLUSHED and t.ms_median == pytest.approx(0.005)
    assert t.n_samples == int(100.0 / ((55.0 + 610.0 + 5.0) / 1e3))  # rep over a sample


@pytest.mark.parametrize("timer", ["time_flushed", "time_warm"])
def test_a_slow_call_is_its_own_estimate_of_a_sample(monkeypatch, timer):
    """A call whose one synchronized call took at least a fifth of the warm-up (5 ms)
    skips do_bench's call and 5-sample estimate, and its warm-up by time (25 ms) counts
    that call: a 30 ms call takes the gate's 10 samples only, 10 calls instead of 17, the
    same samples.  A faster one, or one whose caller did not time it, is estimated and
    warmed up as before."""
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=55.0)
    calls: list[int] = []

    def call(dev_us: float) -> Callable[[], None]:
        return lambda: (calls.append(1), gpu.op(50.0, dev_us))[0]

    run = getattr(timing, timer)
    cfg = TimingConfig()
    # A warm timer's batch starts with an untimed call (its buffers back in the L2 after
    # another provider's batch); these samples settle in one batch.
    rewarm = 1 if timer == "time_warm" else 0
    assert not timing.estimate_needed(5.0, cfg) and timing.estimate_needed(4.9, cfg)
    assert timing.estimate_needed(None, cfg)
    skipped = run(call(30_000.0), cfg, 50.0, once_ms=30.05)
    assert len(calls) == 10 + rewarm
    assert timing.warmup_calls(30.16, cfg, 30.05) == 0
    calls.clear()
    estimated = run(call(30_000.0), cfg, 50.0)
    assert len(calls) == 1 + 5 + 1 + 10 + rewarm
    assert skipped.samples_ms == estimated.samples_ms == (pytest.approx(30.0),) * 10
    calls.clear()
    run(call(1_000.0), cfg, 50.0, once_ms=1.05)  # 1 ms: 5 samples are under the warm-up
    assert calls[:7] == [1] * 7 and len(calls) > 1 + 5 + int(25 / 1.2)
    # 8 ms: no estimate; the warm-up's 25 ms less the caller's 8 ms call: 2 calls of
    # 8.16 ms (once_ms + padding), not 3
    calls.clear()
    t = run(call(8_000.0), cfg, 50.0, once_ms=8.05)
    assert len(calls) == 2 + t.n_samples + rewarm
    assert timing.warmup_calls(8.16, cfg, 8.05) == 2
    assert timing.warmup_calls(8.16, cfg, None) == 3  # the caller timed nothing
    assert timing.warmup_calls(1.16, cfg, 1.05) == 21  # short: do_bench's warm-up
    assert timing.warmup_calls(100.0, cfg, None) == 1  # at least one call
    assert t.n_samples == timing_plan.sample_count(8.05 + 0.11, cfg) or \
        t.n_samples == cfg.gate_min_samples


def test_time_gpu_measures_the_dispatch_and_pads_by_it(monkeypatch):
    got = {}

    def flushed(fn, cfg, host_us=None, once_ms=None):
        got["host_us"] = host_us
        return timing.summarize([0.01] * cfg.min_samples, timing_plan.TIMER_FLUSHED)

    monkeypatch.setattr(timing, "host_dispatch_us", lambda fn, sync: 42.0)
    monkeypatch.setattr(timing, "time_flushed", flushed)
    t = timing.time_gpu(lambda: None, TimingConfig())
    assert got["host_us"] == 42.0 and t.host_us == 42.0 and t.ms_median == 0.01


def test_gpu_rows_carry_host_us_and_the_flushed_timer_gets_it(monkeypatch):
    got = {}

    def flushed(fn, cfg, pad_us, once_ms=None):
        got["pad_us"] = pad_us
        return steady_sampler(1.0, cfg.min_samples)

    monkeypatch.setattr(timers, "flushed_sampler", flushed)
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(123.0, 0.01))
    spec = REGISTRY["add"]
    shape = {"n": 1 << 24}  # long enough for the flushed timer on an H100
    inputs = spec.make_inputs(shape, "fp32", 0, "cpu")
    t, _ = runner.time_case(Case(spec, "torch", "fp32", shape), gpu_cfg(), inputs,
                             spec.alloc_out(inputs, "fp32"))
    assert got["pad_us"] == flush_padding_us(123.0) and t.host_us == 123.0


def test_cpu_rows_have_no_host_us():
    row = run_case(Case(REGISTRY["add"], "torch", "fp32", {"n": 4096}), cpu_cfg(),
                   InputCache())
    assert row.status == "ok" and row.timing.host_us is None


# ---- CUDA-graph bounds -----------------------------------------------------------------

@pytest.mark.parametrize("copies, launches, host_us, calls, needle", [
    (500, 14, 5.0, 500, ""),  # 7,000 nodes: the full graph
    (100, 600, 5.0, 100, "one round over the 100 copies instead of 200"),  # 120k nodes
    (12_800, 14, 5.0, None, "12,800 calls x 14 launches a call = 179,200 graph nodes > "
                            "100,000"),  # fp8 dot at 2^12
    (1000, 1, 6000.0, None, "~12 s of capture for 1,000 calls > 10 s"),
])
def test_graph_plan_bounds_nodes_and_capture_time(copies, launches, host_us, calls, needle):
    got, note = graph_plan(copies, launches, host_us, TimingConfig())
    assert got == calls
    assert needle in note
    assert bool(note) == (calls != 200 and calls != 500)


def _gpu_case(monkeypatch, kernel, dtype, shape, launches):
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(5.0, 0.01))
    monkeypatch.setattr(timers, "probe_call", lambda call: GraphProbe(launches, 0.01))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "cpu")
    return Case(spec, "torch", dtype, shape), inputs, spec.alloc_out(inputs, dtype)


def _fake_flushed(seen):
    def flushed(fn, cfg, pad_us, once_ms=None):
        seen.append("flushed")
        return steady_sampler(1.0, 25)
    return flushed


def test_a_graph_too_large_is_timed_flushed_and_says_so(monkeypatch):
    seen = []
    monkeypatch.setattr(timers, "flushed_sampler", _fake_flushed(seen))
    monkeypatch.setattr(timers, "cudagraph_sampler", lambda *a, **k: pytest.fail("captured"))
    case, inputs, out = _gpu_case(monkeypatch, "dot", "fp8", {"n": 1 << 12}, 14)
    t, note = runner.time_case(case, gpu_cfg(), inputs, out)
    assert seen == ["flushed"] and t.timer == timing_plan.TIMER_GRAPH_FALLBACK
    assert note.startswith("timed with L2 flushes instead of CUDA graphs: CUDA graph too "
                           "large even for one round")
    assert "x 14 launches a call = " in note


def test_launches_that_cannot_be_counted_are_assumed_and_said(monkeypatch):
    seen = []
    monkeypatch.setattr(timers, "flushed_sampler", _fake_flushed(seen))
    case, inputs, out = _gpu_case(monkeypatch, "add", "fp8", {"n": 1 << 12}, None)
    t, note = runner.time_case(case, gpu_cfg(), inputs, out)
    # 8,534 copies x 16 assumed nodes is past 100,000 even for one round
    assert seen == ["flushed"] and "16 launches a call, assumed: not counted" in note


def test_a_capture_cut_short_is_said_and_a_slow_first_round_falls_back(monkeypatch):
    seen = []
    monkeypatch.setattr(timers, "flushed_sampler", _fake_flushed(seen))
    case, inputs, out = _gpu_case(monkeypatch, "add", "fp32", {"n": 1 << 20}, 1)
    cut = GraphSampler(steady_sampler(1e-3, 25), "capture stopped after 8 of 12 calls", 0.0)
    monkeypatch.setattr(timers, "cudagraph_sampler",
                        lambda calls, cfg, total, call_ms=None: cut)
    t, note = runner.time_case(case, gpu_cfg(), inputs, out)
    assert t.timer == timing_plan.TIMER_GRAPH and note == "capture stopped after 8 of 12 calls"

    def too_slow(calls, cfg, total, call_ms=None):
        raise graph_timing.CaptureTooSlow("capture passed 10 s after 4 of the 10 calls")

    monkeypatch.setattr(timers, "cudagraph_sampler", too_slow)
    t, note = runner.time_case(case, gpu_cfg(), inputs, out)
    assert seen == ["flushed"] and t.timer == timing_plan.TIMER_GRAPH_FALLBACK
    assert note == ("timed with L2 flushes instead of CUDA graphs: capture passed 10 s "
                    "after 4 of the 10 calls")


class FakeCapture:
    """torch.cuda's stream, graph and event calls for time_cudagraph, on a fake clock
    that each captured call advances by `call_s`; every replay takes 1 ms."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.captured = 0
        capturing = [False]
        stream = SimpleNamespace(wait_stream=lambda s: None)

        @contextlib.contextmanager
        def graph(g, *a, **k):
            capturing[0] = True
            yield
            capturing[0] = False

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                pass

            def elapsed_time(self, end):
                return 1.0

            def synchronize(self):
                pass

        self.capturing = capturing
        monkeypatch.setattr(graph_timing, "time",
                            SimpleNamespace(perf_counter=lambda: self.now,
                                            monotonic=lambda: self.now))
        monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(torch.cuda, "CUDAGraph",
                            lambda *a, **k: SimpleNamespace(replay=lambda: None,
                                                            pool=lambda: (0, 1)))
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "Event", Event)

    def calls(self, n: int, call_s: float) -> list:
        def call():
            if self.capturing[0]:
                self.captured += 1
                self.now += call_s
        return [call] * n


def test_a_capture_past_its_time_stops_at_a_round_and_says_so(monkeypatch):
    fake = FakeCapture(monkeypatch)
    cfg = TimingConfig(max_capture_s=0.045)
    t = graph_timing.time_cudagraph(fake.calls(4, 0.01), cfg, total=12)
    # 40 ms after the first round (under 45), 80 ms after the second: stop there
    assert fake.captured == 8
    assert t.ms_median == pytest.approx(1.0 / 8)  # a replay over the calls it holds
    assert t.note == "capture stopped after 8 of 12 calls (0.1 s > 0.045 s)"
    fake.captured = 0
    assert graph_timing.time_cudagraph(fake.calls(4, 0.001), cfg, total=12).note == ""
    assert fake.captured == 12


def test_a_capture_past_its_time_within_one_round_raises(monkeypatch):
    fake = FakeCapture(monkeypatch)
    with pytest.raises(graph_timing.CaptureTooSlow, match="after 4 of the 10 calls"):
        graph_timing.time_cudagraph(fake.calls(10, 0.01), TimingConfig(max_capture_s=0.035),
                              total=20)


def test_a_probe_counts_one_calls_nodes_and_times_its_replay(monkeypatch):
    fake = FakeCapture(monkeypatch)
    made, replays = [], []

    def cuda_graph(keep_graph=False):
        made.append(keep_graph)
        return SimpleNamespace(raw_cuda_graph=lambda: 0xABC,
                               replay=lambda: replays.append(1))

    monkeypatch.setattr(torch.cuda, "CUDAGraph", cuda_graph)
    monkeypatch.setattr(graph_timing, "graph_nodes", lambda raw: 7 if raw == 0xABC else 0)
    probe = graph_timing.probe_call(fake.calls(1, 0.0)[0])
    assert probe == graph_timing.GraphProbe(7, 1.0)  # the fake events' 1 ms
    assert made == [True] and fake.captured == 1  # one call, captured, graph kept
    assert len(replays) == 4  # the uploading replay, then the fastest of three

    def no_driver(raw):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(graph_timing, "graph_nodes", no_driver)
    assert graph_timing.probe_call(fake.calls(1, 0.0)[0]).nodes is None


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
    md = render_summary(doc_of({"device_key": "h100"}, rows))
    assert "## Launch-bound rows (1)" in md
    section = md.split("## Launch-bound rows (1)")[1].split("\n## ")[0]
    assert "| add | triton | bf16 | `n=4096` | 22.0 | 4.0 | 5.5x |" in section
    assert "torch" not in section
    rows["host_us"] = None  # CPU rows: no dispatch measured, no section
    assert "Launch-bound" not in render_summary(doc_of({"device_key": "h100"}, rows))


# ---- Triton configs -------------------------------------------------------------------

@pytest.mark.interpreter
def test_triton_rows_record_their_config():
    cfg = cpu_cfg(check_only=True, target=Target("cpu", None, True))
    row = run_case(Case(REGISTRY["matmul"], "triton", "fp32", {"M": 33, "N": 17, "K": 65}),
                   cfg, InputCache())
    assert row.status == "ok", row.reason
    # the interpreter's fixed config
    assert row.build.config == ("matmul_kernel[BLOCK_M=32,BLOCK_N=32,BLOCK_K=32,GROUP_M=4,"
                             "num_warps=4,num_stages=1]")
    row = run_case(Case(REGISTRY["dot"], "triton", "fp32", {"n": 1000}), cfg, InputCache())
    assert row.build.config == "dot_kernel[STAGES=3,num_warps=8,num_stages=3]"


@pytest.mark.interpreter
def test_a_forced_config_runs_instead_of_tuning(monkeypatch):
    spec = REGISTRY["matmul"]
    shape = {"M": 33, "N": 17, "K": 65}
    inputs = spec.make_inputs(shape, "fp32", 0, "cpu")
    launches = spec.triton_launches(inputs, spec.alloc_out(inputs, "fp32"), 0)
    forced = configs_text(launches, [launches[0].configs[-1]])
    assert forced != configs_text(launches, [launches[0].interp_config])
    ran = []
    real = triton_utils._launch_with
    monkeypatch.setattr(triton_utils, "_launch_with",
                        lambda ln, c, on_gpu: (ran.append(c), real(ln, c, on_gpu)))
    key = ("matmul", "triton", "fp32", "M=33,N=17,K=65", "cold")
    cfg = cpu_cfg(check_only=True, target=Target("cpu", None, True),
                  configs={key: forced})
    row = run_case(Case(spec, "triton", "fp32", shape), cfg, InputCache())
    assert row.status == "ok", row.reason  # correct with the forced tile too
    assert row.build.config == forced and ran == [launches[0].configs[-1]]


class FakeKernel:
    """A @triton.jit function as the launch code sees it: kernel[grid](*args, **kw)."""

    __name__ = "fake_kernel"
    arg_names = ["n", "OP", "BLOCK"]  # its parameters, as a JITFunction lists them

    def __init__(self) -> None:
        self.bound = 0
        self.launched: list[tuple] = []

    def __getitem__(self, grid):
        self.bound += 1
        return lambda *args, **kw: self.launched.append((grid, args, kw))


def _fake_launch() -> TritonLaunch:
    configs = (triton.Config({"BLOCK": 64}, num_warps=4),
               triton.Config({"BLOCK": 128}, num_warps=8, num_stages=2))
    return TritonLaunch(fn=FakeKernel(), args=(1000,), constexprs={"OP": 1}, configs=configs,
                        grid=lambda meta: (triton.cdiv(1000, meta["BLOCK"]),),
                        tune_key=("n",), tuner="fake")


def test_run_launch_on_a_gpu_runs_a_forced_config_without_the_autotuner(monkeypatch):
    monkeypatch.setattr(triton_utils, "_on_gpu", lambda launch: True)
    monkeypatch.setattr(triton_utils, "_TUNERS", {})
    monkeypatch.setattr(triton, "autotune", lambda *a, **k: pytest.fail("tuned again"))
    launch = _fake_launch()
    forced = launch.configs[1]
    assert run_launch(launch, forced) is forced
    assert launch.fn.launched == [((8,), (1000,), {"OP": 1, **forced.all_kwargs()})]


def test_run_launch_on_a_gpu_autotunes_and_returns_the_tuned_config(monkeypatch):
    launch = _fake_launch()
    asked = []

    class Tuner:  # what run_launch uses of Triton's Autotuner
        best_config = launch.configs[1]
        cache: dict = {}

        def __getitem__(self, grid):
            return lambda *args, **kw: asked.append((args, kw))

        def check_disk_cache(self, key, configs, bench_fn):
            return False

    def autotune(configs, key):
        asked.append((configs, key))
        return lambda fn: Tuner()

    monkeypatch.setattr(triton_utils, "_on_gpu", lambda launch: True)
    monkeypatch.setattr(triton_utils, "_TUNERS", {})
    monkeypatch.setattr(triton, "autotune", autotune)
    assert run_launch(launch) is launch.configs[1]
    # The tuner is keyed by the declared key and then every constexpr (kernels/tuning.py).
    assert asked == [(list(launch.configs), ["n", "OP"]), ((1000,), {"OP": 1})]


def test_a_prepared_call_binds_grid_and_config_once(monkeypatch):
    monkeypatch.setattr(triton_utils, "_on_gpu", lambda launch: True)
    launch = _fake_launch()
    call = prepared_call([launch], [launch.configs[0]])
    for _ in range(3):
        call()
    assert launch.fn.bound == 1  # kernel[grid] once, at preparation
    assert launch.fn.launched == [((16,), (1000,), {"OP": 1, **launch.configs[0].all_kwargs()})
                                  ] * 3


def test_config_text_round_trips():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 64, "N": 64, "K": 64}, "bf16", 0, "meta")
    launches = spec.triton_launches(inputs, spec.alloc_out(inputs, "bf16"), 132)
    for cfg in launches[0].configs:
        text = configs_text(launches, [cfg])
        assert parse_configs(launches, text) == [cfg]
        assert config_str(cfg) in text
    assert config_str(launches[0].configs[0]) == \
        "BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=3"
    with pytest.raises(ValueError, match="no config"):
        parse_configs(launches, "matmul_kernel[BLOCK_M=1]")


def test_retiming_children_get_the_rows_configs(monkeypatch):
    key = ("matmul", "triton", "bf16", "M=64,N=64,K=64", "cold")
    text = "matmul_kernel[BLOCK_M=64,BLOCK_N=64,BLOCK_K=64,GROUP_M=8,num_warps=4,num_stages=4]"
    sent = []
    monkeypatch.setattr(retime_client, "RETIME_ROUNDS", 1)
    monkeypatch.setattr(retime_client, "RETIME_SPACING_S", 0.0)
    monkeypatch.setattr(retime_client.subprocess, "run", lambda *a, input, **k: (
        sent.append(json.loads(input)),
        SimpleNamespace(returncode=0, stdout=json.dumps({retime.case_id(key): [1.0]}),
                        stderr=""))[1])
    spec = REGISTRY["matmul"]
    case = Case(spec, "triton", "bf16", {"M": 64, "N": 64, "K": 64})
    rows = [RunRow(CaseId(*key), build=Build(config=text))]
    got = job.compare_retimer([case], cpu_cfg(), rows)([key])
    assert got == {key: [[1.0]]}
    assert sent[0]["configs"] == {retime.case_id(key): text}

    # ... and the child runs them: its context carries them by case key
    seen = {}

    def fake_run_case(case, cfg, cache):
        seen.update(cfg.configs)
        return RunRow(case.id, status="ok", timing=Timing(samples_ms=(2.0,)))

    monkeypatch.setattr(runner, "run_case", fake_run_case)
    out = retime.retime(retime.RetimeSpec.from_json({**sent[0], "device": "cpu"})).to_json()
    assert seen == {key: text} and out == {retime.case_id(key): [2.0]}


# ---- pytest-benchmark rates from device time ------------------------------------------

def test_bench_rates_come_from_device_time_not_host_latency():
    spec = REGISTRY["matmul"]
    shape = {"M": 1024, "N": 1024, "K": 1024}
    ceil = Ceilings({"tflops": {"bf16": 989.4}, "hbm_gbps": 3350.0}, None)
    m = bench_metrics(spec, "bf16", shape, device_ms=0.004, host_ms=0.05, ceilings=ceil)
    assert m["tflops"] == pytest.approx(2 * 1024**3 / 4e-6 / 1e12)
    assert m["ms_device"] == 0.004 and m["host_latency_ms"] == 0.05
    assert m["mfu"] == pytest.approx(m["tflops"] / 989.4)
    # a CPU has no device timer: the benchmark's own (synchronous) time
    m = bench_metrics(spec, "bf16", shape, device_ms=None, host_ms=0.05, ceilings=ceil)
    assert m["ms_device"] == 0.05 and m["tflops"] == pytest.approx(2 * 1024**3 / 5e-5 / 1e12)


# ---- on a GPU --------------------------------------------------------------------------

@pytest.mark.gpu
def test_flushed_timing_on_the_gpu_leaves_out_a_slow_dispatch():
    x = torch.zeros(1024, device="cuda")

    def slow_call():  # 300 us of Python, then a kernel of a few us
        _busy(300)
        x.add_(1)

    host_us = host_dispatch_us(slow_call, torch.cuda.synchronize)
    assert 300 <= host_us < 1000
    cfg = TimingConfig(rep_ms=20, warmup_ms=5, min_samples=10)
    padded = timing.time_flushed(slow_call, cfg, host_us)
    assert padded.ms_median < 0.05
    # do_bench as is: the start event runs at the flush's end, ~200 us before the kernel
    assert triton.testing.do_bench(slow_call, warmup=5, rep=20, return_mode="median") > 0.15


@pytest.mark.gpu
def test_launches_are_counted_on_the_gpu():
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    assert graph_timing.probe_call(lambda: torch.add(x, x, out=out)).nodes == 1
    three = graph_timing.probe_call(lambda: (out.copy_(x), out.mul_(2), out.add_(1)))
    assert three.nodes == 3 and 0 < three.replay_ms < 1.0


# ---- the NVML window is the timer's own samples -------------------------------------------

def test_the_graph_timers_span_leaves_the_capture_out(monkeypatch):
    from tests.test_measurement import fake_cuda

    fake_cuda(monkeypatch)
    captured_at: list[float] = []

    def call():
        captured_at.append(time.monotonic())
        return torch.empty(1)

    before = time.monotonic()
    t = graph_timing.time_cudagraph([call] * 3, TimingConfig(graph_min_calls=30, min_samples=5))
    assert t.span is not None and before <= t.span[0] <= t.span[1] <= time.monotonic()
    assert t.span[0] >= max(captured_at)  # every captured call came before the window


def test_the_flushed_timers_span_covers_its_samples(monkeypatch):
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=85.0)
    before = time.monotonic()
    t = timing.time_flushed(lambda: gpu.op(30.0, 5.0), TimingConfig(), host_us=30.0)
    assert t.span is not None and before <= t.span[0] <= t.span[1] <= time.monotonic()
