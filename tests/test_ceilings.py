"""The ceilings phase never aborts a run (a slow call takes fewer samples; a ceiling
whose timing fails is left out, its reason recorded in the metadata and summary.md, in
one line), and the cache copy of a GPU is timed in CUDA-graph replays, where the
stream's per-launch cost cannot push it under the DRAM copy."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import torch

import run_bench
from benches import measured_ceilings as ceil_mod
from benches.sweep import timers
from benches.timing.plan import (
    TIMER_CPU,
    TIMER_FLUSHED,
    OverBudget,
    TimingConfig,
    plan_best_of_cpu,
    plan_cpu,
)
from contract.devices import DEVICES, Present, host_cpu
from tests.run_docs import load_run

COPY_BYTES_CPU = 1 << 28  # the DRAM copy measure() makes on a CPU
# A ceiling's CPU timing in miniature: 5 samples or 10 ms of them, within 0.06 s.
TINY_BUDGET = TimingConfig(min_samples=5, cpu_min_run_time_s=0.01, row_budget_s=0.06)


def _spin(seconds: float) -> None:
    """A slow stand-in call that does not sleep (the tests stub time.sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _stand_ins(monkeypatch: pytest.MonkeyPatch, copy_call) -> None:
    """measure() on stand-ins: `copy_call(nbytes)` is the copy of nbytes; the matmuls
    and the cache copy cost nothing, timed within TINY_BUDGET; the retries' 1 s pauses
    are skipped."""
    monkeypatch.setattr(ceil_mod, "CEILING_TIMING", TINY_BUDGET)
    monkeypatch.setattr(ceil_mod, "_copy_fn",
                        lambda nbytes, device, reps=1: (lambda: copy_call(nbytes)))
    monkeypatch.setattr(ceil_mod, "_gemm_fn", lambda rc, n, device: ((lambda: None),
                                                                     2 * n**3))
    monkeypatch.setattr(ceil_mod.time, "sleep", lambda s: None)


# ---- a slow call on a busy CPU: fewer samples, never OverBudget ---------------------------

def test_a_best_of_plan_fits_the_budget_and_keeps_one_sample() -> None:
    cfg = TimingConfig(cpu_min_run_time_s=0.3, row_budget_s=5.0)
    with pytest.raises(OverBudget):  # the sweep's rows: 10 samples of 3.8 s do not fit
        plan_cpu(3.82, cfg)
    assert plan_best_of_cpu(3.82, cfg).samples == 1  # a ceiling: one does
    assert "1 of 25 samples" in plan_best_of_cpu(3.82, cfg).note
    assert plan_best_of_cpu(0.3, cfg).samples == 16  # 5 s / 0.3 s
    # A quiet machine's copy (0.05 s) is planned as before: 25 samples, no note.
    assert plan_best_of_cpu(0.05, cfg) == plan_cpu(0.05, cfg)
    fast = plan_best_of_cpu(1e-5, cfg)  # blocks sized to cpu_block_s, 0.3 s of them
    assert fast.number is None and fast.samples == 300 and not fast.note


def test_a_ceiling_call_past_its_budget_is_timed_fewer_times(monkeypatch) -> None:
    # One call takes 0.025 s (more on a busy host) against a 0.06 s budget: the gate's 10
    # samples do not fit, which raised OverBudget out of the ceilings phase and aborted
    # the run.
    calls: list[int] = []

    def copy(nbytes: int) -> None:
        if nbytes == COPY_BYTES_CPU:
            calls.append(1)
            _spin(0.025)

    _stand_ins(monkeypatch, copy)
    out = ceil_mod.measure(host_cpu(), log=lambda m: None)
    assert 1 + 1 <= len(calls) <= 1 + 2  # the warm-up call, then the samples that fit
    assert 0 < out["hbm_gbps"] <= 2 * COPY_BYTES_CPU / 0.025 / 1e9
    assert out["left_out"] == {} and ceil_mod.cache_problem(out) is None


# ---- a ceiling that fails: left out, with its reason, in one line -----------------------

def _overbudget_copy(nbytes: int) -> None:
    if nbytes == COPY_BYTES_CPU:
        raise OverBudget("over the row budget: one call takes 3.82 s here, so the 10 "
                         "samples the regression gate needs would take 38.2 s\n(detail)")


def test_a_failing_ceiling_is_left_out_with_its_reason(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ceil_mod.CACHE_DIR_ENV, str(tmp_path))
    _stand_ins(monkeypatch, _overbudget_copy)
    logged: list[str] = []
    got = ceil_mod.get_ceilings(DEVICES["cpu"], host_cpu(), tmp_path, log=logged.append)
    m = got.measured
    assert m is not None and m["hbm_gbps"] is None and got.peak_gbps() is None
    assert m["left_out"]["hbm"].startswith("the copy of 256 MiB failed: OverBudget: over "
                                           "the row budget: one call takes 3.82 s")
    assert "(detail)" not in m["left_out"]["hbm"]  # one line
    assert m["method"]["hbm"] == f"left out: {m['left_out']['hbm']}"
    # The cache copy has no DRAM copy to be checked against; the matmuls still ran.
    assert "no DRAM copy" in m["left_out"]["l2"] and m["l2_gbps"] is None
    assert got.peak_tflops("fp32") is not None and set(m["left_out"]) == {"hbm", "l2"}
    assert all("\n" not in line and "Traceback" not in line for line in logged)
    assert any(line.startswith("  hbm ceiling left out: the copy") for line in logged)
    # Not cached: the next run measures again (and a cached entry like it is refused).
    assert not list(tmp_path.glob("ceilings-*.json"))
    assert "hbm, l2 left out" in (ceil_mod.cache_problem(m) or "")


def test_a_measurement_that_raises_is_one_line_and_no_ceilings(monkeypatch, tmp_path):
    monkeypatch.setenv(ceil_mod.CACHE_DIR_ENV, str(tmp_path))

    def broken(present, log=print):
        raise RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be ...")

    monkeypatch.setattr(ceil_mod, "measure", broken)
    logged: list[str] = []
    got = ceil_mod.get_ceilings(DEVICES["cpu"], host_cpu(), tmp_path, log=logged.append)
    assert got.measured["left_out"] == {
        "all": "the measurement failed: RuntimeError: CUDA error: out of memory"}
    assert "ceilings not measured: the measurement failed: RuntimeError: CUDA error: out " \
           "of memory" in logged
    assert got.peak_gbps() is None and not list(tmp_path.glob("ceilings-*.json"))


def test_a_run_whose_dram_ceiling_fails_writes_every_row(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(ceil_mod.CACHE_DIR_ENV, str(tmp_path / "ceilings"))
    monkeypatch.setattr(timers, "host_llc_bytes", lambda: 256 * 2**10)
    _stand_ins(monkeypatch, _overbudget_copy)
    argv = ["--device", "cpu", "--sizes", "n=4096", "--kernels", "add", "--providers",
            "torch", "--dtypes", "fp32", "--no-plots", "--out", str(tmp_path / "out")]
    assert run_bench.main(argv) == 0
    assert "Traceback" not in capsys.readouterr().err
    (run,) = (tmp_path / "out" / "cpu").iterdir()
    meta, df = load_run(run)
    assert len(df) == 1 and (df["status"] == "ok").all()
    measured: dict[str, Any] = meta["ceilings"]["measured"]
    assert measured["left_out"]["hbm"].startswith("the copy of 256 MiB failed: OverBudget")
    assert df["meas_peak_gbps"].isna().all()  # the rows have no measured memory roof...
    summary = (run / "summary.md").read_text()
    assert "hbm: left out: the copy of 256 MiB failed: OverBudget" in summary  # ...and why
    json.dumps(measured)


# ---- the cache ceiling on a GPU: one long kernel (benches/l2_probe.py) -------------------

def test_each_ceiling_has_its_timer() -> None:
    assert ceil_mod.ceiling_timer("cuda") == TIMER_FLUSHED
    assert ceil_mod.ceiling_timer("cpu") == TIMER_CPU


# An H200: the DRAM copy of 1 GiB at 4,260 GB/s (2026-11-26); the L2 probe stood in for
# (its figure only a GPU gives): one call of 16 GiB in PROBE_MS.
H200 = Present("h200", "NVIDIA H200", "cuda", capability=(9, 0), sms=132, l2_mb=60.0)
COPY_MS = 2 * 2**30 / 4260e9 * 1e3
PROBE_MS = 2.5


def test_an_h200_cache_ceiling_is_the_probes(monkeypatch) -> None:
    from benches import l2_probe
    from benches.timing.clock import Timing

    _stand_ins(monkeypatch, lambda nbytes: None)
    probe = l2_probe.L2Copy(lambda: None, torch.empty(0), torch.empty(0), 16 << 30,
                            6 << 20, 1365, 528)
    monkeypatch.setattr(l2_probe, "l2_copy", lambda cache_bytes, sms, device="cuda": probe)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (140 * 2**30, 141 * 2**30))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(ceil_mod, "host_dispatch_us", lambda fn, sync: 250.0)

    def flushed(fn, cfg, host_us=None):
        ms = PROBE_MS if fn is probe.fn else COPY_MS
        return Timing(ms, ms, ms, 1, "fake", (ms,))

    monkeypatch.setattr(ceil_mod, "time_flushed", flushed)
    out = ceil_mod.measure(H200, log=lambda m: None)
    assert out["hbm_gbps"] == pytest.approx(4260, rel=1e-3)
    assert out["l2_gbps"] == pytest.approx((16 << 30) / (PROBE_MS * 1e-3) / 1e9)
    assert "l2" not in out["left_out"] and out["method"]["l2"] == probe.method




def test_a_runs_ceilings_read_back_typed(tmp_path, monkeypatch) -> None:
    """contract.ceilings.Ceilings from a run's metadata["ceilings"]: a source it lacks is
    None; the measurement's seconds and time; and the cache entry a run reads."""
    from contract.ceilings import Ceilings

    doc = {"datasheet": None, "measured": {"tflops": {"fp32": 1.0}, "hbm_gbps": 20.0,
                                           "seconds": 12.5, "measured_at": "2026-11-27T10"}}
    c = Ceilings.from_json(doc)
    assert (c.datasheet, c.measured_s, c.measured_at) == (None, 12.5, "2026-11-27T10")
    assert c.meas_gbps() == 20.0 and c.to_json() == doc
    empty = Ceilings.from_json(None)
    assert (empty.measured, empty.measured_s, empty.measured_at) == (None, 0.0, "")
    assert Ceilings.from_json({"measured": "x"}).measured is None
    monkeypatch.delenv(ceil_mod.CACHE_DIR_ENV, raising=False)
    cpu = host_cpu()
    path, cached = ceil_mod.cached_entry(tmp_path, cpu)
    assert cached is None and path.parent == tmp_path and not path.exists()
    path.write_text("{not json")
    assert ceil_mod.cached_entry(tmp_path, cpu) == (path, None)
    path.write_text(json.dumps(doc["measured"]))
    assert ceil_mod.cached_entry(tmp_path, cpu) == (path, doc["measured"])
