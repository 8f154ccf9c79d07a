"""The physics check (contract/physics.py): each bound on a made-up row, what a failing
value takes with it, idempotence, the writer that applies it before a row is written,
and what it finds in the committed runs (found by walking results/, not listed)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from contract import physics
from contract.physics import (
    CLOCK,
    ENERGY,
    GBPS,
    KERNEL_TIME,
    POWER,
    TFLOPS,
    UNEQUAL_CLOCKS,
    Withheld,
    check,
    withheld_of,
)
from contract.record import RunRow, parse_row
from contract.run_meta import parse_meta
from contract.schema import ALL_COLUMNS, RESULTS_CSV, row_name
from tests.run_docs import load_run

ROOT = Path(__file__).resolve().parents[1]

# An H200 run's metadata, as its sweep writes the keys the check reads.
META = {
    "device_key": "h200", "detected_key": "h200", "device_kind": "cuda",
    "ceilings": {"datasheet": {"tflops": {"fp32": 66.9, "bf16": 989.4}, "hbm_gbps": 4800.0},
                 "measured": {"tflops": {"bf16": 753.0}, "hbm_gbps": 4258.0,
                              "l2_gbps": 4957.0}},
    "ceilings_ready": True,
    "nvml_start": {"max_sm_clock_mhz": 1980, "power_limit_w": 700.0},
    "power": {"max_w": 700.996, "limit_w": 700.0},
    "request": {"baseline_provider": "torch"},
    # The energy meter's runs state their power's precision: the bound is the limit x 1.05.
    "energy": {"source": "nvml", "precision": 0.05},
}
# A run before the meter (a timing window's counter rise, no precision): the limit itself.
OLD_META = {k: v for k, v in META.items() if k != "energy"}


def _row(**kw) -> dict:
    """An ok cold add row of 2^20 fp32 elements (12 MiB) at 0.004 ms, every number
    within its bound; `kw` overrides."""
    r = dict.fromkeys(ALL_COLUMNS)
    nbytes, ms = 3 * 4 * 2**20, 0.004
    r |= {"kernel": "add", "provider": "torch", "dtype": "fp32", "shape": "n=1048576",
          "flops": 2**20, "bytes": nbytes, "ms_median": ms, "status": "ok",
          "tflops": 2**20 / ms / 1e9, "gbps": nbytes / ms / 1e6, "mfu": 0.004,
          "pct_roof": 60.0, "roof_class": "fp32", "peak_tflops": 66.9, "cache": "cold",
          "timer": "cudagraph", "device": "h200", "sm_clock_mhz": 1980.0,
          "kernel_ms": 0.0035, "power_w": 500.0, "power_limit_w": 700.0,
          "energy_j": 500.0 * ms / 1e3, "tflop_per_j": 1e-3, "gb_per_j": 5.0,
          "speedup": 1.0, "meas_peak_gbps": 4258.0}
    r |= kw
    if "energy_j" not in kw and r["power_w"] is not None:  # consistent unless given
        r["energy_j"] = r["power_w"] * r["ms_median"] / 1e3
    return r


def _kinds(records: list[Withheld] | tuple[Withheld, ...]) -> dict[str, str]:
    return {w.column: w.kind for w in records}


def apply(rows: list[dict], meta: dict) -> int:
    """The check on rows as the files hold them, in place: each withheld value emptied in
    its column and recorded in WITHHELD, as load_doc's rows show them; how many values it
    withheld now.  It checks their records (physics.checked)."""
    got, n = physics.checked([parse_row(r, lenient=True) for r in rows], parse_meta(meta))
    for d, row in zip(rows, got, strict=True):
        for w in row.withheld:
            d[w.column] = None
        if row.withheld:
            d[physics.WITHHELD] = [w.to_json() for w in row.withheld]
    return n


def records(*rows: dict, meta: dict = META) -> list[RunRow]:
    """The rows as records, checked (physics.apply: the writer's and load_doc's path)."""
    return physics.apply([parse_row(r) for r in rows], parse_meta(meta))


def test_a_row_within_every_bound_keeps_every_value():
    rows = [_row()]
    assert apply(rows, META) == 0
    assert physics.WITHHELD not in rows[0] or rows[0][physics.WITHHELD] is None
    assert rows[0]["power_w"] == 500.0


def test_power_above_the_limit_goes_with_what_it_made():
    rows = [_row(power_w=3594.0, energy_j=3594.0 * 0.004 / 1e3)]
    assert apply(rows, META) == 4
    r = rows[0]
    assert _kinds(withheld_of(r)) == {"power_w": POWER, "energy_j": POWER,
                                      "tflop_per_j": POWER, "gb_per_j": POWER}
    assert all(r[c] is None for c in ("power_w", "energy_j", "tflop_per_j", "gb_per_j"))
    first = withheld_of(r)[0]
    assert (first.value, first.bound) == (3594.0, pytest.approx(735.0))
    assert first.derived_from is None and withheld_of(r)[1].derived_from == "power_w"
    # The time and its rates are the kernel's, not the power reading's: kept.
    assert r["ms_median"] == 0.004 and r["gbps"] is not None


@pytest.mark.parametrize("watts,kept", [(735.0, True), (735.5, False), (0.0, False),
                                        (-3.0, False), (700.996, True)])
def test_the_power_bound_is_the_limit_times_1_05(watts, kept):
    rows = [_row(power_w=watts, energy_j=watts * 0.004 / 1e3)]
    apply(rows, META)
    assert (rows[0]["power_w"] is not None) == kept


@pytest.mark.parametrize("watts,kept", [(700.0, True), (700.996, False), (734.0, False)])
def test_a_power_without_a_stated_precision_is_held_to_the_limit(watts, kept):
    """A run before the energy meter took its power from a timing window's counter rise,
    whose error is a whole counter step: no margin for it."""
    rows = [_row(power_w=watts, energy_j=watts * 0.004 / 1e3)]
    apply(rows, OLD_META)
    assert (rows[0]["power_w"] is not None) == kept


def test_the_row_limit_is_preferred_and_the_metadata_stands_in():
    assert apply([_row(power_w=800.0, energy_j=800 * 4e-6, power_limit_w=1000.0)], META) == 0
    rows = [_row(power_w=800.0, energy_j=800 * 4e-6, power_limit_w=None)]
    assert apply(rows, META) and rows[0]["power_w"] is None


def test_energy_that_is_not_power_times_time():
    rows = [_row(energy_j=0.01)]
    apply(rows, META)
    assert _kinds(withheld_of(rows[0])) == {"energy_j": ENERGY, "tflop_per_j": ENERGY,
                                            "gb_per_j": ENERGY}
    assert withheld_of(rows[0])[0].bound == pytest.approx(500.0 * 0.004 / 1e3)


def test_a_clock_above_the_devices_maximum():
    rows = [_row(sm_clock_mhz=2100.0)]
    apply(rows, META)
    assert _kinds(withheld_of(rows[0])) == {"sm_clock_mhz": CLOCK}


def test_a_cold_kernel_time_faster_than_the_copy_allows():
    """add fp32 at 2^20: 12 MiB in 2.37 us is 5.3 TB/s, over the copy's 4,258 x 1.1."""
    rows = [_row(kernel_ms=0.00237)]
    apply(rows, META)
    (w,) = withheld_of(rows[0])
    assert (w.column, w.kind) == ("kernel_ms", KERNEL_TIME)
    assert w.bound == pytest.approx(3 * 4 * 2**20 / (4258.0 * 1.1) / 1e6)
    assert rows[0]["kernel_ms"] is None and rows[0]["ms_median"] == 0.004
    # The same time on a warm row is held against the L2 copy (4,957 x 1.1 = 5,453).
    warm = [_row(kernel_ms=0.00237, cache="warm")]
    assert apply(warm, META) == 0


def test_an_impossible_time_takes_every_rate_of_it():
    rows = [_row(ms_median=0.002, gbps=3 * 4 * 2**20 / 0.002 / 1e6)]  # 6.3 TB/s cold
    apply(rows, META)
    got = _kinds(withheld_of(rows[0]))
    assert got["gbps"] == GBPS and set(got) == {"gbps", "tflops", "mfu", "pct_roof",
                                                "tflop_per_j", "gb_per_j", "speedup"}
    assert rows[0]["ms_median"] == 0.002  # the measurement stays


def test_tflops_above_the_datasheet_peak_times_1_1():
    big = {"kernel": "matmul", "dtype": "bf16", "roof_class": "bf16", "bytes": 3 * 2**27,
           "gbps": 100.0, "kernel_ms": None}
    assert apply([_row(**big, tflops=1088.0)], META) == 0  # 1.0997 x 989.4
    rows = [_row(**big, tflops=1090.0)]
    apply(rows, META)
    assert _kinds(withheld_of(rows[0]))["tflops"] == TFLOPS
    # Another model's peaks (--device h100 on another GPU) bound nothing.
    other = dict(META, detected_key="b200")
    assert apply([_row(**big, tflops=1090.0)], other) == 0


def test_providers_at_unequal_clocks_lose_their_speedup():
    torch_row = _row(kernel="matmul", sm_clock_mhz=1770.0, speedup=1.0)
    triton = _row(kernel="matmul", provider="triton", sm_clock_mhz=1545.0, speedup=0.863)
    near = _row(kernel="matmul", provider="compile", sm_clock_mhz=1736.0, speedup=0.97)
    rows = [triton, torch_row, near]  # the baseline row may come after
    apply(rows, META)
    (w,) = withheld_of(triton)
    assert (w.column, w.kind, w.value) == ("speedup", UNEQUAL_CLOCKS, 0.863)
    assert w.reason == "unequal clocks (1,545 vs 1,770 MHz)"
    assert triton["speedup"] is None
    assert near["speedup"] == 0.97 and torch_row["speedup"] == 1.0  # 1.96% apart: equal


def test_each_group_checks_the_numbers_it_owns():
    """The records' own checks: the clock, the energy (power first), the rates, the
    kernel-only time, the speedup against its baseline row."""
    b = physics.RunBounds.of(parse_meta(META))
    hot = parse_row(_row(power_w=3594.0, energy_j=3594.0 * 0.004 / 1e3))
    assert hot.energy.withheld(b, hot.timing.ms_median).kind == POWER
    assert parse_row(_row(sm_clock_mhz=2100.0)).clocks.withheld(b).kind == CLOCK
    fast = parse_row(_row(kernel_ms=0.00237))
    assert fast.profile.withheld(b, fast.accounting, fast.case).kind == KERNEL_TIME
    quick = parse_row(_row(ms_median=0.002, gbps=3 * 4 * 2**20 / 0.002 / 1e6))
    assert quick.metrics.withheld(b, quick.accounting, quick.case).kind == GBPS
    base = parse_row(_row(kernel="matmul", sm_clock_mhz=1770.0))
    triton = parse_row(_row(kernel="matmul", provider="triton", sm_clock_mhz=1545.0,
                            speedup=0.863))
    assert triton.comparison.withheld(1545.0, base).kind == UNEQUAL_CLOCKS
    # physics.apply on records: the value emptied in its group, the record on the row
    (checked, torch_row) = records(_row(kernel="matmul", provider="triton",
                                        sm_clock_mhz=1545.0, speedup=0.863),
                                   _row(kernel="matmul", sm_clock_mhz=1770.0))
    assert checked.comparison.speedup is None and torch_row.comparison.speedup == 1.0
    assert _kinds(checked.withheld) == {"speedup": UNEQUAL_CLOCKS}
    assert records(*[dict(_row())]) == [parse_row(_row())]  # within every bound


def test_a_cpu_run_has_no_bound_it_lacks():
    meta = {"device_key": "cpu", "detected_key": "cpu", "device_kind": "cpu",
            "ceilings": {"datasheet": None, "measured": {"tflops": {"fp32": 0.35},
                                                         "hbm_gbps": 32.0, "l2_gbps": 116.0}}}
    row = _row(device="cpu", timer="torch.utils.benchmark", cache=None, kernel_ms=None,
               sm_clock_mhz=None, power_w=None, power_limit_w=None, energy_j=None,
               gbps=150.0, tflops=2.0, peak_tflops=0.35)
    assert apply([row], meta) == 0


def test_idempotent_and_the_records_survive_the_csv(tmp_path):
    rows = [_row(power_w=3594.0, energy_j=3594 * 4e-6, kernel_ms=0.00237),
            _row(provider="triton", sm_clock_mhz=1500.0, speedup=0.9)]
    first = apply(rows, META)
    assert first == 6
    again = json.loads(json.dumps(rows))
    assert apply(again, META) == 0 and again == rows
    assert check(rows, META) == [withheld_of(r) for r in rows]
    # A speedup set again from the times (the writer's flush) is withheld again, once.
    rows[1]["speedup"] = 0.9
    assert apply(rows, META) == 0 and rows[1]["speedup"] is None
    assert len(withheld_of(rows[1])) == 1
    text = physics.withheld_text(rows[0][physics.WITHHELD])
    assert withheld_of({physics.WITHHELD: text}) == withheld_of(rows[0])


def test_the_writer_writes_no_failing_value(tmp_path):
    from benches.sweep.results import ResultWriter

    w = ResultWriter(tmp_path / "run", parse_meta(META))
    w.add(parse_row(_row(provider="triton", sm_clock_mhz=1545.0, ms_median=0.0046)))
    w.add(parse_row(_row(power_w=4365.0, energy_j=4365 * 4e-6, sm_clock_mhz=1770.0)))
    # A row after its baseline row: its speedup checked before its line is written.
    w.add(parse_row(_row(provider="compile", sm_clock_mhz=1500.0, ms_median=0.0042)))
    journal = [json.loads(x) for x in (tmp_path / "run/rows.jsonl").read_text().splitlines()]
    assert journal[1]["power_w"] is None and journal[1]["withheld"]
    assert journal[2]["speedup"] is None
    assert journal[2]["withheld"][0]["reason"] == "unequal clocks (1,500 vs 1,770 MHz)"
    w.close()
    doc = json.loads((tmp_path / "run/results.json").read_text())
    triton, torch_row, _ = doc["rows"]
    assert triton["speedup"] is None  # set at the flush, withheld there: unequal clocks
    assert [r["kind"] for r in triton["withheld"]] == [UNEQUAL_CLOCKS]
    assert torch_row["power_w"] is None and torch_row["energy_j"] is None
    csv = pd.read_csv(tmp_path / "run" / RESULTS_CSV)
    assert json.loads(csv["withheld"][1])[0]["value"] == 4365.0
    assert pd.isna(csv["power_w"][1])
    _, df = load_run(tmp_path / "run")  # read back: the same records, nothing more
    assert [withheld_of(r) for r in df.to_dict("records")] == \
        [withheld_of(r) for r in doc["rows"]]


def test_the_graph_timer_name_is_the_harness_one():
    from benches.timing.plan import TIMER_GRAPH
    from contract.modes import GRAPH_TIMER, launches_from_host

    assert GRAPH_TIMER == TIMER_GRAPH
    assert not launches_from_host(TIMER_GRAPH) and launches_from_host("do_bench")


# ---- The committed runs ----

def _runs(device: str) -> list[Path]:
    return sorted(p.parent for p in (ROOT / "results" / device).rglob("results.json"))


def _found(run: Path) -> list[tuple[str, Withheld]]:
    _, df = load_run(run)
    return [(row_name(r), w) for r in df.to_dict("records") for w in withheld_of(r)]


def _primary(found, kind):
    return [(name, w) for name, w in found if w.kind == kind and w.derived_from is None]


def test_the_committed_gpu_runs_power_readings_above_the_limit():
    runs = _runs("h200")
    assert len(runs) >= 10
    power = {run.name: _primary(_found(run), POWER) for run in runs}
    assert sum(len(v) for v in power.values()) >= 100
    # Held to the 700 W limit itself: their powers came from a timing window's counter
    # rise, with no stated precision (the 11-27 runs were before the energy meter).
    assert {k: len(power[k]) for k in ("quick", "quick-warm", "quick-warm2")} == \
        {"quick": 21, "quick-warm": 41, "quick-warm2": 35}
    top = max(w.value for v in power.values() for _, w in v)
    assert top > 4000  # quick's mul torch fp8 n=16777216: 4,365 W of a 700 W card
    # Every one of them above 700 W, and none left in what a reader sees.
    for run in runs:
        _, df = load_run(run)
        assert not (pd.to_numeric(df.get("power_w"), errors="coerce") > 700).any()


@pytest.mark.parametrize("run", ["quick", "quick-warm", "quick-warm2"])
def test_each_quick_sweep_has_six_cold_kernel_times_faster_than_the_copy(run):
    found = _primary(_found(ROOT / "results/h200/2026-11-27" / run), KERNEL_TIME)
    assert sorted(name for name, _ in found) == [
        "add/torch/fp32/n=1048576", "layernorm/triton/fp32/M=4096,N=1024",
        "matvec/triton/bf16/M=4096,K=4096", "matvec/triton/fp16/M=4096,K=4096",
        "mul/torch/fp32/n=1048576", "rmsnorm/triton/fp32/M=4096,N=1024"]


def test_the_unequal_clock_cases_of_the_matmul_runs():
    def cases(run: str) -> dict[str, str]:
        found = _primary(_found(ROOT / "results/h200/2026-11-27" / run), UNEQUAL_CLOCKS)
        return {name: w.reason for name, w in found}

    assert cases("matmul-8192") == {
        "matmul/triton/bf16/M=8192,N=8192,K=8192": "unequal clocks (1,545 vs 1,770 MHz)",
        "matmul/triton/fp8/M=8192,N=8192,K=8192": "unequal clocks (1,500 vs 1,935 MHz)"}
    assert cases("fp8-precise") == {
        "matmul/triton/fp8/M=8192,N=8192,K=8192": "unequal clocks (1,560 vs 1,980 MHz)"}
    many = _primary(_found(ROOT / "results/h200/2026-11-27/quick-warm2"), UNEQUAL_CLOCKS)
    assert len(many) == 18 and {n.split("/")[0] for n, _ in many} <= {
        "matmul", "attention", "attention_bwd"}


def test_the_cpu_example_is_clean():
    assert _runs("cpu") and all(_found(run) == [] for run in _runs("cpu"))


# ---- python -m roofline check ----

def test_the_check_command_over_every_committed_gpu_run(capsys):
    from roofline.report.check_cli import main

    runs = [str(p) for p in _runs("h200")]
    assert main(runs) == 0
    lines = capsys.readouterr().out.splitlines()
    last = lines[-1]
    n = int(last.split()[0])
    assert len(lines) == n + 1 and last.startswith(f"{n} values withheld: power ")
    by_kind = dict((k, int(v)) for k, v in
                   (part.rsplit(" ", 1) for part in
                    last.split(": ", 1)[1].split(" (")[0].split(", ")))
    assert list(by_kind) == list(physics.KINDS)

    def primary(column: str, kind: str) -> list[str]:
        return [x for x in lines[:-1] if f": {column} " in x and f"({kind}: " in x
                and "bound derived from" not in x]

    assert len(primary("power_w", POWER)) >= 100
    kernel = primary("kernel_ms", KERNEL_TIME)
    assert len(kernel) == 18
    for sweep in ("quick", "quick-warm", "quick-warm2"):
        assert sum(x.startswith(str(ROOT / "results/h200/2026-11-27" / sweep) + ":")
                   for x in kernel) == 6
    assert any("2026-11-27/quick: add/torch/fp32/n=1048576: kernel_ms 0.00" in x
               for x in kernel)
    clocks = primary("speedup", UNEQUAL_CLOCKS)
    assert any("2026-11-27/matmul-8192: matmul/triton/bf16/M=8192,N=8192,K=8192: speedup "
               "0.8632x, bound clocks within 2% (unequal_clocks: unequal clocks (1,545 vs "
               "1,770 MHz))" in x for x in clocks)
    assert by_kind[UNEQUAL_CLOCKS] == len(clocks) >= 55
    assert by_kind[KERNEL_TIME] == 18 and by_kind[POWER] >= 400  # each with 3 derived


def test_the_check_command_on_the_cpu_example_and_bad_input(capsys):
    from roofline.report.check_cli import main

    assert main([str(ROOT / "results/cpu/example")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "0 values withheld: power 0, energy 0, kernel_time 0, clock 0, unequal_clocks 0, "
        "tflops 0, gbps 0 (0 rows; 0 of the values computed from another withheld one)"]
    assert main(["no/such/run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: no results found at no/such/run")


def test_finalize_writes_a_killed_runs_rows_checked(tmp_path):
    """A run killed before its last write: its journal's rows go into results.json and
    results.csv through the same check as the sweep's writer."""
    from roofline.report.finalize_run import finalize

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"metadata": dict(META, complete=False),
                                                  "rows": []}))
    rows = [_row(power_w=3594.0, energy_j=3594 * 4e-6), _row(provider="triton",
                                                               sm_clock_mhz=1545.0)]
    (run / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    finalize(run, plots=False)
    doc = json.loads((run / "results.json").read_text())
    assert doc["rows"][0]["power_w"] is None
    assert [w["kind"] for w in doc["rows"][1]["withheld"]] == [UNEQUAL_CLOCKS]
    csv = pd.read_csv(run / RESULTS_CSV)
    assert json.loads(csv["withheld"][0])[0]["column"] == "power_w"
