"""A GPU sweep times the providers of a case together (benches/sweep/gpu_case.py,
runner.blocks): every case of a (kernel, dtype, shape) is checked first, then the rows
of each cache mode sample in turns; rows come out in case order, each with its own time
split; a provider that raises while the case samples fails alone.  The GPU's stages are
faked (tests/test_measurement.py: gpu_faked); the tensors live on the CPU."""

from __future__ import annotations

import dataclasses

import pytest

from benches.sweep import runner, timers
from benches.sweep.cases import Case, InputCache
from benches.sweep.gpu_case import compute_bound
from benches.sweep.row_check import Checked
from benches.sweep.time_split import RowSplits, TimeSplit
from benches.timing import plan as timing_plan
from benches.timing.interleave import Sampler
from kernels import REGISTRY, Target
from tests.test_measurement import ClockMonitor, gpu_cfg, gpu_faked


def _two_providers(kernel: str = "add"):
    """The kernel's spec with a second provider ("compile") that runs torch's code."""
    spec = REGISTRY[kernel]
    provs = dict(spec.providers)
    provs["compile"] = provs["torch"]
    return dataclasses.replace(spec, providers=provs)


class CpuInputs(InputCache):  # the "GPU" cases' tensors live on the CPU
    def get(self, c, cfg):
        return super().get(c, dataclasses.replace(cfg, target=Target("cpu")))


def _sweep(monkeypatch, cases, fail: str | None = None):
    log: list[str] = []

    def prepare(self, row):
        name = f"{row.case.provider}/{row.case.cache}"
        log.append(f"ready {name}")

        def take(k):
            if name == fail:
                raise RuntimeError("an illegal instruction, but not a sticky one")
            log.append(name)
            return [0.5 + 0.05 * (i % 3) for i in range(k)]  # never settles: to the cap
        return timers.Prepared(Sampler(take, 60, 0.5), timing_plan.TIMER_FLUSHED, "", 5.0)

    gpu_faked(monkeypatch, ClockMonitor(1900.0))
    monkeypatch.setattr(timers.GpuTimer, "prepare", prepare)
    monkeypatch.setattr(runner, "sweep_cache", lambda cfg: CpuInputs())
    splits = RowSplits()
    rows = list(runner.iterate(cases, gpu_cfg(cache=["cold", "warm"]), TimeSplit(), splits))
    return rows, log, splits


def test_the_providers_of_a_case_sample_in_turns_and_rows_come_in_case_order(monkeypatch):
    spec = _two_providers()
    cases = [Case(spec, p, "fp32", {"n": n}, mode) for n in (4096, 8192)
             for p in ("torch", "compile") for mode in ("cold", "warm")]
    rows, log, splits = _sweep(monkeypatch, cases)
    assert [c.key for c, _ in rows] == [c.key for c in cases]
    assert all(r.status == "ok" and r.clocks.sm_clock_mhz == 1900.0 for _, r in rows)
    # The first shape's four cases are made ready before any of them samples, the cold
    # pair then the warm pair, and each pair's batches alternate.
    first = log[:log.index("ready torch/cold", 1)] if log.count("ready torch/cold") > 1 \
        else log
    assert first[:2] == ["ready torch/cold", "ready compile/cold"]
    cold = [x for x in first if x in ("torch/cold", "compile/cold")]
    assert cold[:4] == ["torch/cold", "compile/cold"] * 2
    assert first.index("ready torch/warm") > first.index("compile/cold")
    # Every row has its own split: its check, its timer's set-up, its share of sampling.
    for case in cases:
        got = splits.pop(case.key)
        assert got.get("check", 0) > 0 and got.get("timing", 0) > 0, (case.key, got)


def test_a_provider_that_raises_while_sampling_fails_alone(monkeypatch):
    spec = _two_providers()
    cases = [Case(spec, p, "fp32", {"n": 4096}) for p in ("torch", "compile")]
    rows, log, _ = _sweep(monkeypatch, cases, fail="compile/cold")
    by = {r.case.provider: r for _, r in rows}
    assert by["torch"].status == "ok" and by["torch"].timing.n_samples >= 10
    assert by["compile"].status == "failed"
    assert (by["compile"].reason or "").startswith("kernel raised while timing")
    assert by["compile"].key == cases[1].key


def test_an_interrupt_keeps_the_rows_finished_before_it(monkeypatch):
    spec = _two_providers()
    cases = [Case(spec, p, "fp32", {"n": 4096}, mode) for p in ("torch", "compile")
             for mode in ("cold", "warm")]
    calls = {"n": 0}

    def prepare(self, row):
        def take(k):
            if row.case.cache == "warm":
                raise KeyboardInterrupt
            return [0.5] * k
        return timers.Prepared(Sampler(take, 25, 0.5), timing_plan.TIMER_FLUSHED, "", 5.0)

    gpu_faked(monkeypatch, ClockMonitor(1900.0))
    monkeypatch.setattr(timers.GpuTimer, "prepare", prepare)
    monkeypatch.setattr(runner, "sweep_cache", lambda cfg: CpuInputs())
    got = []
    it = runner.iterate(cases, gpu_cfg(cache=["cold", "warm"]), TimeSplit())
    with pytest.raises(KeyboardInterrupt):
        for case, row in it:
            got.append((case.key, row.status))
            calls["n"] += 1
    # The cold pair was timed whole before the warm pair's interrupt: both kept.
    assert got == [(cases[0].key, "ok"), (cases[2].key, "ok")]


@pytest.mark.parametrize("kernel, shape, bound", [
    ("matmul", {"M": 8192, "N": 8192, "K": 8192}, True),
    ("add", {"n": 1 << 24}, False),
    ("matvec", {"M": 8192, "K": 8192}, False),
])
def test_a_case_is_compute_bound_by_its_roofline(kernel, shape, bound):
    item = Checked(Case(REGISTRY[kernel], "torch", "bf16", shape), {}, {}, None, None,  # type: ignore[arg-type]
                   None, "")
    assert compute_bound(item, gpu_cfg()) is bound
