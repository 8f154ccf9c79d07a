"""What a row cost the device: energy per call from NVML's energy counter (a stand-in
NVML here) or RAPL (a fake sysfs tree; the host's own where readable), kernel-only time
from a recorded torch.profiler trace, the launch-gap flag, the summary's energy table
and `roofline plot RUN --energy`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from torch.autograd import DeviceType

import run_bench
from benches.sweep import gpu_monitor, kernel_time, timers
from benches.sweep import row_energy as energy
from benches.sweep.cases import Case, InputCache
from benches.sweep.energy_counter import energy_metadata
from benches.sweep.gpu_monitor import GpuMonitor
from benches.sweep.row_energy import Rapl, RaplMeter
from benches.sweep.runner import run_case
from benches.timing import clock as timing
from benches.timing import plan as timing_plan
from contract.record import Accounting, CaseId, Profile, RunRow, Timing
from kernels import REGISTRY, Target
from roofline.__main__ import main as roofline_main
from roofline.report.energy import at_power_limit, best_energy, launch_gap_rows
from roofline.report.plot_energy import plot_energy
from roofline.report.summary import render_summary
from tests.run_docs import doc_of, load_run
from tests.test_measurement import FakeNVML, _cuda_props, gpu_cfg

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "profiler-trace-add.json"
GEMM_FLOPS = 2 * 8192**3
GEMM_BYTES = 3 * 8192 * 8192 * 2


class EnergyNVML(FakeNVML):
    """FakeNVML whose total energy counter (mJ) advances by `step_mj` at every read."""

    def __init__(self, step_mj: int = 70_000) -> None:
        super().__init__()
        self.energy_mj, self.step_mj = 1_000_000, step_mj

    def nvmlDeviceGetTotalEnergyConsumption(self, h):  # noqa: N802
        self.energy_mj += self.step_mj
        return self.energy_mj


class Ticks:
    """A clock that reads 10.0, 10.1, 10.2, ... one step per call."""

    def __init__(self, start: float = 10.0, step: float = 0.1) -> None:
        self.t, self.step = start - step, step

    def __call__(self) -> float:
        self.t += self.step
        return round(self.t, 9)


def _gemm_timing(span=(10.0, 10.15)) -> timing.Timing:
    t = timing.summarize([1.5] * 25, timing_plan.TIMER_FLUSHED)
    return timing.Timing(**{**t.__dict__, "span": span})


# ---- energy per call: the stand-in NVML ------------------------------------------------

@pytest.mark.parametrize("timer", [timing_plan.TIMER_FLUSHED, timing_plan.TIMER_GRAPH])
def test_a_metered_gpu_row_carries_energy_kernel_time_and_power_limit(monkeypatch, timer):
    """A row picked for an energy window (--energy) replays its own call for the meter,
    after its samples and without its timer's flushes and padding: an events row its call
    back to back, a CUDA-graph row its graphs (its sampler); the meter's power x the
    row's median time is its energy per call."""
    import dataclasses

    from benches.sweep import gpu_case
    from benches.timing.interleave import Sampler
    from tests.test_measurement import ClockMonitor, gpu_faked

    real_profile = kernel_time.row_profile
    gpu_faked(monkeypatch, ClockMonitor(1900.0), ms=1.5)
    monkeypatch.setattr(kernel_time, "row_profile", real_profile)  # the profile faked
    monkeypatch.setattr(kernel_time, "profile_calls", lambda call, n, flush=None:
                        kernel_time.kernel_time(kernel_time.read_trace(TRACE), 5))
    monkeypatch.setattr(gpu_case.torch.cuda, "synchronize", lambda: None)
    log: list[str] = []
    spec = REGISTRY["add"]
    provs = dict(spec.providers)
    real = provs["torch"].fn
    provs["torch"] = dataclasses.replace(provs["torch"], fn=lambda ins, o: (
        log.append("call"), real(ins, o))[1])
    counted = dataclasses.replace(spec, providers=provs)

    class Meter:
        def measure(self, run_for):
            log.append("window")
            run_for(0.001)
            log.append("end")
            return energy.RowEnergy(500.0, "nvml counter", power_limit_w=700.0)

    def prepare(self, row):
        def take(k):
            log.extend(["sample"] * k)
            return [1.5] * k
        return timers.Prepared(Sampler(take, 25, 1.5), timer, "", 5.0)

    monkeypatch.setattr(timers.GpuTimer, "prepare", prepare)
    monkeypatch.setattr(gpu_case, "energy_meter", lambda monitor: Meter())

    class CpuInputs(InputCache):  # the "GPU" case's tensors live on the CPU
        def get(self, c, cfg):
            return super().get(c, dataclasses.replace(cfg, target=Target("cpu")))

    row = run_case(Case(counted, "torch", "fp32", {"n": 4096}), gpu_cfg(), CpuInputs())
    assert row.status == "ok"
    window = log[log.index("window") + 1:log.index("end")]
    assert log[:log.index("window")].count("sample") == row.timing.n_samples
    assert window and set(window) == {"call" if timer == timing_plan.TIMER_FLUSHED
                                      else "sample"}
    assert row.energy.power_w == 500.0 and row.energy.power_limit_w == 700.0
    assert row.energy.energy_j == pytest.approx(500.0 * 1.5e-3)
    assert row.profile.kernel_ms == pytest.approx(0.042)
    assert row.profile.kernels == "at::native::vectorized_elementwise_kernel; Memset (Device)"
    # --energy off: no window, the columns empty
    log.clear()
    off = run_case(Case(counted, "torch", "fp32", {"n": 4096}),
                   gpu_cfg(energy="off"), CpuInputs())
    assert off.energy.power_w is None and "window" not in log


def test_energy_windows_go_to_each_series_largest_shape():
    from benches.sweep.cases import Case, energy_keys
    from kernels import REGISTRY

    add = REGISTRY["add"]
    cases = [Case(add, p, "fp32", {"n": n}, m) for n in (1 << 20, 1 << 24, 1 << 22)
             for p in ("torch", "triton") for m in ("cold", "warm")]
    largest = energy_keys(cases, "largest")
    assert largest == {c.key for c in cases if c.shape["n"] == 1 << 24}
    assert energy_keys(cases, "all") == {c.key for c in cases}
    assert energy_keys(cases, "off") == frozenset()


def test_energy_metadata_says_where_the_energy_comes_from(monkeypatch, tmp_path):
    _cuda_props(monkeypatch)
    assert energy_metadata("cuda", EnergyNVML())["source"] == "nvml"
    no_counter = energy_metadata("cuda", FakeNVML())
    assert no_counter["source"] is None and "total energy counter" in no_counter["reason"]
    cpu = energy_metadata("cpu", rapl_root=tmp_path)
    assert cpu["source"] is None and "no RAPL package domain" in cpu["reason"]


def test_a_cpu_run_carries_the_columns_empty_with_the_reason(tmp_path, monkeypatch,
                                                             cpu_ceilings):
    monkeypatch.setattr(energy, "host_rapl", lambda: (None, "no RAPL here (test)"))
    code = run_bench.main(["--device", "cpu", "--sizes", "n=4099", "--kernels", "add",
                           "--dtypes", "fp32", "--out", str(tmp_path), "--run-id", "e1",
                           "--no-plots"])
    assert code == 0
    meta, df = load_run(tmp_path / "cpu" / "e1")
    ok = df[df["status"] == "ok"]
    assert len(ok)
    for col in ("energy_j", "tflop_per_j", "gb_per_j", "power_w", "power_limit_w",
                "kernel_ms", "kernels", "throttled_samples"):
        assert col in df.columns and ok[col].isna().all(), col
    assert meta["energy"] == {"source": None, "reason": "CPU: no RAPL here (test)"}
    assert meta["kernel_time"]["source"] is None and "no GPU" in meta["kernel_time"]["reason"]
    summary = (tmp_path / "cpu" / "e1" / "summary.md").read_text()
    assert "No energy per call in this run: CPU: no RAPL here (test)." in summary


# ---- RAPL --------------------------------------------------------------------------------

def _rapl_tree(root: Path, values: dict[str, int], max_uj: int = 1_000_000) -> None:
    for name, uj in values.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_sums_packages_and_counts_through_a_wrap(tmp_path):
    _rapl_tree(tmp_path, {"intel-rapl:0": 900_000, "intel-rapl:0:0": 5, "intel-rapl:1": 0})
    rapl, why = Rapl.find(tmp_path)
    assert rapl is not None and why == ""
    assert [d.path.name for d in rapl.domains] == ["intel-rapl:0", "intel-rapl:1"]
    before = rapl.read()
    _rapl_tree(tmp_path, {"intel-rapl:0": 100_000, "intel-rapl:1": 300_000})  # 0 wrapped
    assert rapl.joules(before, rapl.read()) == pytest.approx(0.2 + 0.3)
    meter = RaplMeter(rapl, clock=Ticks(0.0, 0.5))
    _rapl_tree(tmp_path, {"intel-rapl:0": 0, "intel-rapl:1": 0})

    def timed():
        _rapl_tree(tmp_path, {"intel-rapl:0": 25_000, "intel-rapl:1": 25_000})
        return "timing", ""

    assert meter.around(timed) == ("timing", "")
    got = meter.group(RunRow(CaseId("add", "torch", "fp32", "n=1"),
                             Accounting(flops=4 * 10**9, bytes=10**9),
                             timing=Timing(ms_median=2.0)))
    assert got.power_w == pytest.approx(0.05 / 0.5)
    assert got.energy_j == pytest.approx(0.1 * 2e-3)
    assert got.power_limit_w is None
    assert energy_metadata("cpu", rapl_root=tmp_path)["source"] == "rapl"


def test_unreadable_rapl_says_why(tmp_path):
    (tmp_path / "intel-rapl:0" / "energy_uj").mkdir(parents=True)  # cannot be read
    rapl, why = Rapl.find(tmp_path)
    assert rapl is None and "is not readable" in why and "CVE-2020-8694" in why


def test_the_hosts_own_rapl_where_readable():
    rapl, why = Rapl.find()
    if rapl is None:
        pytest.skip(f"no readable RAPL on this host: {why}")
    first = rapl.read()
    time.sleep(0.05)
    assert rapl.joules(first, rapl.read()) >= 0


# ---- kernel-only time: the recorded trace ------------------------------------------------

def test_a_recorded_trace_gives_kernel_ms_and_the_kernels():
    events = kernel_time.read_trace(TRACE)
    got = kernel_time.kernel_time(events, calls=5)
    # 5 calls of a 40 us add kernel and a 2 us memset; CPU ops, the runtime's launches
    # and the GPU user annotation spanning them are not device work
    assert got is not None and got.kernel_ms == pytest.approx(0.042)
    assert got.kernels == "at::native::vectorized_elementwise_kernel; Memset (Device)"
    # The row's library from the same pass (no extra profiled call): PyTorch's own kernel
    assert got.library == "aten"


def test_the_library_column_comes_from_the_kernel_time_pass(monkeypatch):
    got = kernel_time.kernel_time(kernel_time.read_trace(TRACE), calls=5)
    monkeypatch.setattr(kernel_time, "profile_calls", lambda call, n, flush=None: got)
    assert kernel_time.row_profile(lambda: None, 1e-4, "torch")[0].library == "aten"
    # A Triton row is this project's Triton whatever else its call launched.
    assert kernel_time.row_profile(lambda: None, 1e-4, "triton")[0].library == "triton"
    monkeypatch.setattr(kernel_time, "profile_calls", lambda call, n, flush=None: None)
    assert kernel_time.row_profile(lambda: None, 1e-4, "triton")[0].library == "triton"
    assert kernel_time.row_profile(lambda: None, 1e-4, "torch")[0].library is None


def test_the_live_profilers_events_read_as_the_trace_does():
    doc = json.loads(TRACE.read_text())
    live = [SimpleNamespace(name=e["name"], device_type=DeviceType.CUDA,
                            time_range=SimpleNamespace(elapsed_us=lambda d=e["dur"]: d),
                            is_user_annotation=e["cat"] == "gpu_user_annotation")
            for e in doc["traceEvents"] if e.get("pid") == 0 and e.get("ph") == "X"]
    live += [SimpleNamespace(name="aten::add", device_type=DeviceType.CPU,
                             time_range=SimpleNamespace(elapsed_us=lambda: 9.0))]
    assert kernel_time.kernel_time(kernel_time.events_from_profiler(live), 5) == \
        kernel_time.kernel_time(kernel_time.read_trace(TRACE), 5)


def test_calls_profiled_fit_their_budget():
    assert kernel_time.calls_to_profile(None) == kernel_time.PROFILED_CALLS
    assert kernel_time.calls_to_profile(1e-5) == kernel_time.PROFILED_CALLS
    assert kernel_time.calls_to_profile(0.004) == 2
    assert kernel_time.calls_to_profile(0.5) == 1


def _gap_frame(ratio: float) -> pd.DataFrame:
    k = kernel_time.kernel_time(kernel_time.read_trace(TRACE), 5)
    assert k is not None
    return pd.DataFrame([{"kernel": "add", "provider": "torch", "dtype": "fp32",
                          "shape": "n=1048576", "status": "ok", "ms_median": ratio * k.kernel_ms,
                          "kernel_ms": k.kernel_ms, "kernels": k.kernels}])


def test_events_at_1_5x_the_kernels_time_are_a_launch_gap():
    assert len(launch_gap_rows(_gap_frame(1.5))) == 1
    assert launch_gap_rows(_gap_frame(1.05)).empty
    # The 10% bound itself: 15% over is a gap, 8% over is not (a bound of 20% or of 5%
    # would say otherwise).
    assert len(launch_gap_rows(_gap_frame(1.15))) == 1
    assert launch_gap_rows(_gap_frame(1.08)).empty
    _, rows = load_run(ROOT / "results" / "cpu" / "example")
    gap = _gap_frame(1.5).iloc[0].to_dict()
    extra = {**rows.iloc[0].to_dict(), **gap, "flops": 1048576, "bytes": 12582912}
    text = render_summary(doc_of({}, pd.concat([rows, pd.DataFrame([extra])], ignore_index=True)))
    assert "## Launch gaps (1)" in text
    line = next(x for x in text.splitlines() if x.startswith("| add ") and "1.50x" in x)
    assert "0.063" in line and "0.042" in line


def test_the_monitor_reads_light_and_often_while_a_row_is_timed():
    nv = EnergyNVML()
    mon = GpuMonitor(nv, nv.devs[1], interval_s=5.0, fast_interval_s=0.002).start()
    try:
        with mon.fast():
            guard = time.monotonic() + 600  # a hang guard only
            while len(mon.readings) < 3:
                assert time.monotonic() < guard
                time.sleep(0.002)
    finally:
        mon.stop()
    light = [r for r in mon.readings if r.light]
    assert len(light) >= 2  # at 5 s a full reading at most once
    assert [k for k in gpu_monitor.READ_KEYS if getattr(light[0], k) is not None] == \
        list(gpu_monitor.LIGHT_KEYS)


# ---- the summary's energy table and the energy figure ------------------------------------

def _doctored_run(tmp_path: Path) -> Path:
    """results/cpu/example with energy columns filled in: 100 W over every ok row, one
    matmul row throttled and one at its power limit."""
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "cpu" / "example", run)
    doc = json.loads((run / "results.json").read_text())
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    for r in ok:
        j = 100.0 * r["ms_median"] / 1e3
        r.update(energy_j=j, power_w=100.0, power_limit_w=105.0 if r is ok[-1] else 200.0,
                 tflop_per_j=r["flops"] / j / 1e12, gb_per_j=r["bytes"] / j / 1e9)
    next(r for r in ok if r["kernel"] == "matmul")["throttled"] = True
    (run / "results.json").write_text(json.dumps(doc))
    return run


def test_the_summary_has_the_best_tflop_per_joule_per_kernel_and_dtype(tmp_path):
    meta, df = load_run(_doctored_run(tmp_path))
    best = best_energy(df)
    assert len(best) == len(df[df["status"] == "ok"].groupby(["kernel", "dtype"]))
    mm = best[(best["kernel"] == "matmul")]
    for dtype, r in mm.set_index("dtype").iterrows():
        same = df[(df["kernel"] == "matmul") & (df["dtype"] == dtype) & (df["status"] == "ok")]
        assert r["tflop_per_j"] == pytest.approx(same["tflop_per_j"].astype(float).max())
    assert int(at_power_limit(df).sum()) == 1
    text = render_summary(doc_of(meta | {"energy": {"source": "rapl", "reason": "x"}}, df))
    assert "## Energy per call" in text and "1 of" in text and "| TFLOP/J |" in text
    assert "## Rows at the power limit (1)" in text
    capped = text.split("## Rows at the power limit (1)")[1].split("##")[0]
    assert "| 100 | 105 |" in capped  # its mean power and the limit


def test_plot_energy_draws_a_doctored_run(tmp_path, capsys):
    run = _doctored_run(tmp_path)
    assert roofline_main(["plot", str(run), "--energy"]) == 0
    png = run / "energy.png"
    assert capsys.readouterr().out.strip() == str(png) and png.stat().st_size > 10_000
    meta, df = load_run(run)
    fig = plot_energy(doc_of(meta, df))
    gids = {a.get_gid() for ax in fig.axes for a in [*ax.lines, *ax.collections]}
    assert {"energy:roof:gemm:fp32", "energy:roof:copy"} <= gids
    hollow = [c for c in fig.axes[0].collections if str(c.get_gid()).endswith(":throttled")]
    assert len(hollow) == 1 and len(hollow[0].get_offsets()) == 1
    assert hollow[0].get_facecolors().size == 0  # no fill


def test_plot_energy_refuses_a_run_without_energy_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(ROOT / "results" / "cpu" / "example", run)
    assert roofline_main(["plot", str(run), "--energy"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no ok row carries an energy per call" in err
    assert len(err.splitlines()) == 1
    assert roofline_main(["plot", str(run), str(run), "--energy", "--devices"]) == 2


def test_a_profiler_failure_is_a_note_and_a_sticky_cuda_error_aborts(monkeypatch):
    def fails(msg):
        def profile(call, n, flush=None):
            raise RuntimeError(msg)
        return profile

    monkeypatch.setattr(kernel_time, "profile_calls", fails("CUPTI_ERROR_NOT_INITIALIZED"))
    got, note = kernel_time.row_profile(lambda: None, 1e-4)
    assert got == Profile()
    assert note.startswith("kernel_ms: torch.profiler failed") and "CUPTI" in note
    monkeypatch.setattr(kernel_time, "profile_calls",
                        fails("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        kernel_time.row_profile(lambda: None, 1e-4)
