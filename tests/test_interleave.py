"""CPU timing rounds interleaved over chunks of cases (runner.iterate): rounds of one row
are taken seconds apart, each on fresh buffers; a failure in a later round fails the
row; an interrupt keeps the rows timed so far."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from benches.sweep import runner
from benches.sweep.cases import Case
from benches.timing import clock as timing
from benches.timing import plan as timing_plan
from tests.test_measurement import FAST, cpu_cfg, with_torch_fn


def _cases(fn: Any, sizes: tuple[int, ...] = (1000, 2000)) -> list[Case]:
    spec = with_torch_fn("add", fn)
    return [Case(spec, "torch", "fp32", {"n": n}) for n in sizes]


def _recorder() -> tuple[list[tuple[int, int]], Any]:
    calls: list[tuple[int, int]] = []

    def fn(inputs: dict[str, Any], out: Any) -> Any:
        calls.append((out.numel(), id(out)))
        return out.copy_(inputs["x"] + inputs["y"])

    return calls, fn


def _order(calls: list[tuple[int, int]]) -> list[int]:
    """The case (its size) of each run of consecutive calls."""
    return [n for n, _ in itertools.groupby(n for n, _ in calls)]


def test_round_defaults_are_pinned() -> None:
    # 5 rounds of 5 samples (the 25-sample floor), rounds of a chunk about 3 s apart:
    # the spacing measured to sample several spells of the shared CI VM.
    cfg = timing_plan.TimingConfig()
    assert (cfg.cpu_rounds, cfg.cpu_chunk_s, cfg.min_samples) == (5, 3.0, 25)
    assert timing_plan.cpu_round_config(cfg).min_samples == 5


def test_rounds_alternate_between_the_cases_of_a_chunk() -> None:
    calls, fn = _recorder()
    # (the stopping rule off: every round is taken)
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0, ci_rel_width=0.0))
    rows = [row for _, row in runner.iterate(_cases(fn), cfg)]
    rounds = cfg.timing.cpu_rounds
    assert _order(calls) == [1000, 2000] * rounds
    for row in rows:
        assert row.status == "ok", row.reason
        assert row.timing.n_samples == len(row.timing.samples_ms) >= cfg.timing.min_samples
    # Each round of a case on its own output buffer (fresh inputs and output).
    outs_a = {i for n, i in calls if n == 1000}
    assert len(outs_a) >= 2


def test_a_zero_chunk_times_each_case_alone() -> None:
    calls, fn = _recorder()
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=0.0))
    rows = [row for _, row in runner.iterate(_cases(fn), cfg)]
    assert _order(calls) == [1000, 2000]
    assert all(r.timing.n_samples >= cfg.timing.min_samples for r in rows)


def test_one_round_is_the_old_serial_sweep() -> None:
    calls, fn = _recorder()
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_rounds=1, cpu_chunk_s=60.0))
    rows = [row for _, row in runner.iterate(_cases(fn), cfg)]
    assert _order(calls) == [1000, 2000]
    assert all(r.timing.n_samples >= cfg.timing.min_samples for r in rows)


def test_a_kernel_raising_in_a_later_round_fails_its_row_only() -> None:
    seen = {"n": 0}

    def fn(inputs: dict[str, Any], out: Any) -> Any:
        if out.numel() == 1000 and id(out) not in seen:
            seen[id(out)] = 1
            seen["n"] += 1
            if seen["n"] == 3:  # the third output buffer: a later round
                raise RuntimeError("boom")
        return out.copy_(inputs["x"] + inputs["y"])

    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0))
    rows = {row.case.shape: row for _, row in runner.iterate(_cases(fn), cfg)}
    bad, good = rows["n=1000"], rows["n=2000"]
    assert bad.status == "failed" and "while timing" in bad.reason
    assert bad.timing.ms_median is None and not bad.timing.samples_ms
    assert bad.check.correct is True  # it was checked fine before it raised
    assert good.status == "ok" and good.timing.n_samples >= cfg.timing.min_samples


def test_an_interrupt_yields_the_rows_timed_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    # One call and exactly per-round samples per round, so counts say how many rounds.
    def one_call(fn: Any, cfg: timing_plan.TimingConfig, plan: Any = None) -> timing.Timing:
        fn()
        return timing.summarize([0.01] * cfg.min_samples, timing_plan.TIMER_CPU)

    monkeypatch.setattr(timing, "time_cpu", one_call)
    calls, fn0 = _recorder()

    def fn(inputs: dict[str, Any], out: Any) -> Any:
        # Calls of the first case: the check's 2 and round 1's, then one per round.
        if out.numel() == 1000 and sum(n == 1000 for n, _ in calls) == 4:
            raise KeyboardInterrupt  # round 3 of the first case
        return fn0(inputs, out)

    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0))
    got: list[dict[str, Any]] = []
    with pytest.raises(KeyboardInterrupt):
        for _, row in runner.iterate(_cases(fn), cfg):
            got.append(row)
    per_round = timing_plan.cpu_round_config(cfg.timing).min_samples
    assert [r.case.shape for r in got] == ["n=1000", "n=2000"]
    for row in got:  # both cases finished rounds 1 and 2, neither round 3
        assert row.status == "ok"
        assert row.timing.n_samples == len(row.timing.samples_ms) == 2 * per_round
        assert row.reason == "timed in 2 of 5 rounds only (stopped by SIGINT)"
        assert row.timing.cut_short == "2/5" and runner.cut_short(row)
    # The state is the field, never read back out of the reason.
    assert not runner.cut_short(dataclasses.replace(
        got[0], timing=dataclasses.replace(got[0].timing, cut_short=None)))


def test_an_interrupt_while_the_caller_writes_a_row_keeps_the_chunk() -> None:
    # The interrupt lands in the caller (writing the first row of a chunk): thrown into
    # the sweep, it yields the chunk's other rows, all fully timed, and nothing twice.
    from benches.sweep import job

    _, fn = _recorder()
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0))
    rows = runner.iterate(_cases(fn, (1000, 2000, 3000)), cfg)
    got = []
    with pytest.raises(KeyboardInterrupt):
        try:
            for _, row in rows:
                got.append(row.case.shape)
                raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            got += [row.case.shape for _, row in job.drain_rows(rows, e)]
            raise
    assert got == ["n=1000", "n=2000", "n=3000"]
