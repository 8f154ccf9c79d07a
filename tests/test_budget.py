"""Time budgets (the new user's 30-minute main job): every row's timing has a budget, a
row that cannot fit the regression gate's minimum samples in it is skipped with the
reason, a path too slow for this device is skipped before it burns minutes, the run's
budget lowers sample counts and never drops a case, and a ceiling measured slower than
fp32 is no roof.  Slow kernels are played by sleeps (load only makes them slower, so
"over the budget" never depends on a quiet machine) or by given call times."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

import run_bench
from benches import measured_ceilings as ceil_mod
from benches.sweep import runner
from benches.sweep.budget import RowBudget, RunBudget, work
from benches.sweep.cases import InputCache
from benches.sweep.runner import iterate, run_case
from benches.timing import clock as timing
from benches.timing import plan as timing_plan
from benches.timing.plan import OverBudget, TimingConfig, plan_cpu
from contract.ceilings import Ceilings, no_roofs
from contract.record import RunRow, flat
from contract.rows import positive_float, run_ceilings
from contract.schema import ALL_COLUMNS
from roofline.gate.stats import min_p_value, row_alpha
from roofline.report.summary import render_summary
from tests.run_docs import doc_of
from tests.test_measurement import case, cpu_cfg

TWO_S = TimingConfig(row_budget_s=2.0)
ROUND = timing_plan.cpu_round_config(TWO_S)  # one of the 5 rounds of a CPU row, 2 s a row


# ---- the numbers ------------------------------------------------------------------------

def test_the_gates_minimum_is_what_a_1000_row_rank_test_needs():
    n = TimingConfig().gate_min_samples
    assert min_p_value(n, n) < row_alpha(1000)  # 10 vs 10 can reach p = 5.4e-6 < 1e-5
    assert min_p_value(n - 1, n - 1) > row_alpha(1000)  # 9 vs 9 cannot
    assert TimingConfig().row_budget_s == 5.0


# ---- one row's plan ----------------------------------------------------------------------

def test_a_fast_call_gets_its_samples_in_blocks_of_a_millisecond():
    plan = plan_cpu(5e-6, ROUND)
    # min_samples (5 a round) at least, and as many 1 ms blocks as fill 10 ms a round
    assert plan.samples == 10 and plan.number is None and plan.note == ""


def test_a_slow_call_takes_fewer_samples_but_never_fewer_than_the_gate_needs():
    plan = plan_cpu(0.1, ROUND)  # 25 samples would take 2.5 s of a 2 s budget
    assert plan.samples == 4 and plan.number == 1  # 0.4 s a round: 20 samples a row
    assert plan.note.startswith("row budget applied: 20 of 25 samples")
    assert plan_cpu(0.15, ROUND).samples == 2  # 10 samples: 1.5 s


def test_a_call_too_slow_for_the_gates_minimum_is_over_budget():
    with pytest.raises(OverBudget, match=r"one call takes 0.25 s here, so the 10 samples "
                                         r"the regression gate needs would take 2.5 s, past "
                                         r"the row budget of 2 s"):
        plan_cpu(0.25, ROUND)


def test_the_runs_share_lowers_samples_to_the_gates_minimum_only():
    assert plan_cpu(5e-6, ROUND, budget_s=0.0).samples == 2  # 10 a row
    assert plan_cpu(5e-6, ROUND, budget_s=1.0).samples == 10  # the row budget rules


# ---- rows ---------------------------------------------------------------------------------

def _sleeper(seconds: float, calls: list):
    def fn(inputs, out):
        calls.append(len(inputs["x"]))
        time.sleep(seconds)
        out.copy_(inputs["x"] + inputs["y"])
    return fn


def test_a_row_over_its_budget_is_checked_then_skipped_with_its_call_time():
    calls: list = []
    cfg = cpu_cfg(timing=dataclasses.replace(TWO_S, cpu_rounds=1))
    budget = RowBudget()
    row = run_case(case(fn=_sleeper(0.3, calls)), cfg, InputCache(), budget)
    assert row.status == "skipped" and row.check.correct is True
    assert row.reason.startswith("over the row budget: one call takes 0.3")
    assert len(calls) == 2  # the tuning call and the checked one, no timing
    assert budget.call_s >= 0.3


def test_a_path_over_budget_skips_its_larger_shapes_without_a_call():
    calls: list = []
    fn = _sleeper(0.3, calls)
    cases = [case(fn=fn, shape={"n": n}) for n in (1000, 2000, 4000)]
    rows = [r for _, r in iterate(cases, cpu_cfg(timing=TWO_S))]
    assert [r.status for r in rows] == ["skipped"] * 3
    assert calls == [1000, 1000]  # the smallest shape's two calls, nothing more
    assert rows[1].reason.startswith("over the row budget: the smaller n=1000 of this "
                                        "kernel, provider and dtype already takes 0.3")


def _ran(c) -> RunRow:
    """A row of `c` that ran (what RunBudget.record reads of it: its status)."""
    return RunRow(c.id, status="ok")


def test_a_warm_row_is_its_own_path_not_a_larger_shape_of_its_cold_twin():
    # Cases run cold then warm at each shape: the warm twin of an over-budget cold row
    # is checked and judged on its own call time, never skipped as "the smaller shape".
    calls: list = []
    fn = _sleeper(0.3, calls)
    cases = [dataclasses.replace(case(fn=fn, shape={"n": n}), cache=mode)
             for n in (1000, 2000) for mode in ("cold", "warm")]
    rows = [r for _, r in iterate(cases, cpu_cfg(timing=TWO_S, cache=["cold", "warm"]))]
    assert [(r.case.cache, r.status) for r in rows] == [
        ("cold", "skipped"), ("warm", "skipped"), ("cold", "skipped"), ("warm", "skipped")]
    for r in rows[:2]:
        assert r.reason.startswith("over the row budget: one call takes 0.3"), r
    for r in rows[2:]:
        assert r.reason.startswith("over the row budget: the smaller n=1000 "), r
    assert calls == [1000] * 4  # each mode's smallest shape: tuning call and check
    b = RunBudget(row_budget_s=2.0)
    cold, warm = case(shape={"n": 1000}), dataclasses.replace(case(shape={"n": 1000}),
                                                              cache="warm")
    b.record(cold, _ran(cold), RowBudget(call_s=1.5))
    assert b.skip_reason(dataclasses.replace(warm, shape={"n": 10**4})) is None  # unknown
    assert b.skip_reason(case(shape={"n": 10**4})) is not None  # 15 s predicted, cold


def test_a_larger_shape_predicted_past_the_whole_row_budget_is_not_run():
    b = RunBudget(row_budget_s=2.0)
    small, big = case(shape={"n": 1000}), case(shape={"n": 10**6})
    b.record(small, _ran(small), RowBudget(call_s=0.01))
    assert b.skip_reason(case(shape={"n": 100_000})) is None  # ~1 s a call: may run
    why = b.skip_reason(big)
    assert why is not None and why.startswith("over the row budget: about 10 s a call "
                                              "predicted (its n=1000 took 0.01 s")
    assert work(big) == 1000 * work(small)
    assert b.skip_reason(case(shape={"n": 10**6}, dtype="bf16")) is None  # another path


def test_a_spent_run_budget_keeps_every_case_at_the_gates_minimum():
    cfg = cpu_cfg(timing=TimingConfig(), run_budget_s=1e-9)
    cases = [case(shape={"n": n}) for n in (1000, 2000)]
    rows = [r for _, r in iterate(cases, cfg)]
    assert [r.status for r in rows] == ["ok", "ok"]
    assert [r.timing.n_samples for r in rows] == [10, 10]  # 2 in each of the 5 rounds
    assert all(r.reason.startswith("row budget applied: 10 of 50 samples") for r in rows)


def test_without_a_run_budget_a_fast_row_keeps_its_samples():
    # (the stopping rule off: it could end a quiet machine's row after 3 rounds)
    rows = [r for _, r in iterate([case()], cpu_cfg(timing=TimingConfig(ci_rel_width=0.0)))]
    assert rows[0].status == "ok" and rows[0].timing.n_samples == 50
    assert rows[0].reason == ""


def test_the_cli_refuses_a_budget_that_is_not_a_positive_time(capsys):
    for bad in ("0", "-1", "nan"):
        assert run_bench.main(["--row-budget", bad, "--list"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --row-budget must be a positive") and err.count("\n") == 1
    assert run_bench.main(["--run-budget", "0", "--list"]) == 2


def test_the_default_cpu_run_has_a_run_budget_and_a_gpu_run_none(monkeypatch):
    from benches.sweep import job
    from contract.devices import Present, host_cpu

    def req(*argv: str):
        return run_bench.request_of(run_bench.parse_args(list(argv)))

    assert job.run_budget_s_of(req(), host_cpu()) == 90.0
    gpu = Present(key="h100", name="H100", kind="cuda")
    assert job.run_budget_s_of(req(), gpu) is None
    assert job.run_budget_s_of(req("--run-budget", "inf"), host_cpu()) is None
    assert job.timing_config(req("--row-budget", "5")).row_budget_s == 5


# ---- ceilings -----------------------------------------------------------------------------

MEASURED = {"tflops": {"fp32": 0.2, "fp16": 0.003, "bf16": 0.4, "fp8": 3.8e-5},
            "hbm_gbps": 30.0}


def test_a_class_measured_slower_than_fp32_is_no_roof():
    assert set(no_roofs(MEASURED["tflops"])) == {"fp16", "fp8"}
    assert no_roofs({"fp32": 0.2, "fp8": 0.021, "bf16": 0.019}).keys() == {"bf16"}
    c = Ceilings(None, MEASURED)
    assert c.peak_tflops("fp8") is None and c.meas_tflops("fp16") is None
    assert c.peak_tflops("bf16") == 0.4 and c.peak_tflops("fp32") == 0.2
    assert set(run_ceilings({"ceilings": c.to_json()})["measured"].tflops) == {"fp32", "bf16"}


@pytest.mark.parametrize("raw, want", [
    (2, 2.0), ("1.5", 1.5), (float("nan"), None), (float("inf"), None), (0, None), (-3.0, None),
    (None, None), ("", None), ("fast", None), ([1.0], None),
])
def test_a_saved_figure_is_read_as_a_positive_finite_number_or_none(raw, want):
    # Ceilings, fleet figures and targets all read saved values through positive_float: a
    # zero, negative or non-finite figure is no figure (never a 0 GB/s roof or a ratio by 0).
    assert positive_float(raw) == want
    doc = {"ceilings": {"measured": {"tflops": {"fp32": 1.0, "bf16": raw}, "hbm_gbps": raw}}}
    ceiling = run_ceilings(doc)["measured"]
    assert ceiling.hbm_gbps == want and ceiling.tflops.get("bf16") == want


def test_which_class_is_no_roof_on_a_cpu_with_fast_bf16_and_on_one_without(cpu_ceilings):
    # The tests' two CPUs (tests/conftest.py): the Xeon's emulated fp8 (1/2,400 of fp32)
    # and the AVX2 EPYC's bf16 and fp16 (1/125) are no roof; the EPYC's fp8 at 0.46x
    # fp32's rate (torch._scaled_mm converting near fp32 speed) is one.
    want = {"fast-bf16": {"fp8"}, "slow-bf16": {"fp16", "bf16"}}[cpu_ceilings.kind]
    assert set(cpu_ceilings.no_roofs) == want
    c = Ceilings(None, cpu_ceilings.measured)
    for rc, tflops in cpu_ceilings.measured["tflops"].items():
        assert c.peak_tflops(rc) == (None if rc in want else tflops)


def test_rows_of_a_class_with_no_roof_report_no_mfu_and_say_why():
    cfg = cpu_cfg(timing=TimingConfig(), ceilings=Ceilings(None, MEASURED))
    mm = case("matmul", "fp16", {"M": 64, "N": 64, "K": 64})  # held against the fp16 roof
    row = [r for _, r in iterate([mm], cfg)][0]
    assert row.status == "ok" and row.metrics.mfu is None and row.metrics.tflops > 0
    assert "no fp16 compute roof here (measured under 0.1x fp32's): no MFU" in row.reason
    meta = {"device_name": "cpu", "ceilings": {"datasheet": None, "measured": MEASURED}}
    import pandas as pd

    text = render_summary(doc_of(meta, pd.DataFrame([flat(row, ALL_COLUMNS)])))
    assert "No fp8 roof: measured 3.8e-05 TFLOP/s, under 0.1x fp32's 0.2" in text


def test_a_slow_ceiling_call_is_timed_once_and_stops_the_sizes(monkeypatch):
    sizes: list[tuple[str, int]] = []

    def gemm(rc, n, device):
        sizes.append((rc, n))
        seconds = 0.6 if rc == "fp8" else 0.0
        return (lambda: time.sleep(seconds)), 2 * n**3

    monkeypatch.setattr(ceil_mod, "_gemm_fn", gemm)
    monkeypatch.setattr(ceil_mod, "_copy_fn", lambda nbytes, device, reps=1: lambda: None)
    monkeypatch.setattr(ceil_mod, "_time_ms", lambda fn, device: 1e-3)
    from contract.devices import host_cpu

    out = ceil_mod.measure(host_cpu(), log=lambda m: None)
    assert [n for rc, n in sizes if rc == "fp8"] == [256]  # 1024^3 would be 150 s a call
    assert [n for rc, n in sizes if rc == "fp32"] == [256, 512, 1024]
    assert out["tflops"]["fp8"] == pytest.approx(2 * 256**3 / 0.6 / 1e12, rel=0.5)
    assert out["method"]["fp8_sizes"].startswith("stopped at 256^3")
    json.dumps(out)


def test_a_ceiling_call_over_budget_runs_twice_only():
    calls: list[int] = []

    def slow():
        calls.append(1)
        time.sleep(ceil_mod.CEILING_CALL_BUDGET_S + 0.05)

    ms = ceil_mod._budgeted_ms(slow, "cpu")
    assert len(calls) == 2 and ms >= ceil_mod.CEILING_CALL_BUDGET_S * 1e3


def test_runner_keeps_the_plan_of_a_rows_rounds(monkeypatch):
    seen: list = []
    real = timing.time_cpu

    def spy(fn, cfg, plan=None):
        seen.append(plan)
        return real(fn, cfg, plan)

    monkeypatch.setattr(timing, "time_cpu", spy)
    list(iterate([case()], cpu_cfg(timing=TimingConfig())))
    assert len(seen) == 5 and len({id(p) for p in seen}) == 1 and seen[0] is not None
    assert runner.RowBudget is RowBudget
