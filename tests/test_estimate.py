"""`run_bench.py --estimate` (benches/estimate*.py): the sweep's plan priced without
running it.  Held against the one GPU run on record (the H200's quick sweep, cut after
219 rows at about 150 s), and against a CPU run's own time split."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import run_bench
from benches.estimate.calibrate import (
    calibrate,
    calibration,
    calibration_runs,
)
from benches.estimate.price import PLANS, Pricer, estimate
from benches.estimate.report import target_device
from benches.estimate.rows import Reference, find_reference, load_reference, row_speed
from benches.estimate.speeds import CPU, GPU
from benches.sweep import job
from benches.sweep.cases import Case, build_cases
from contract.ceilings import Ceilings, datasheet_of
from contract.devices import DEVICES
from contract.phases import PHASES
from contract.rows import TritonBuilds
from kernels import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def _gpu_plan(device: str, *flags: str):
    args = run_bench.request_of(run_bench.parse_args(["--estimate", "--device", device,
                                                      *flags]))
    # The H200's first session (2026-11-26; an H100's estimate scales its rows, as
    # find_reference does where a GPU has no runs of its own): the figures below are
    # that session's, which later sessions' runs committed beside it would move.
    ref = load_reference(sorted(RESULTS.glob("h200/2026-11-26/**/results.json")))
    meta = json.loads(ref.paths[-1].read_text())["metadata"]
    model, present = target_device(args, meta)
    cfg = job.run_config(args, model, present, interpret=False)
    cfg.ceilings = Ceilings(datasheet_of(model), None)
    return cfg, build_cases(cfg), ref


@pytest.fixture(scope="module")
def h200_quick():
    cfg, cases, ref = _gpu_plan("h200", "--sizes", "quick")
    return cfg, cases, ref, estimate(cfg, cases, ref, GPU, ceilings_cached=False)


def test_the_method_before_comes_out_near_what_the_h200_took(h200_quick):
    """results/h200/2026-11-26/quick: 219 of the quick sweep's 406 rows in the 150 s
    its step was given (ceilings measured, Triton's cache cold)."""
    cfg, cases, ref, walks = h200_quick
    assert len(cases) == 406 and ref.cut is not None and ref.cut[1] == 219
    assert ref.cut[0].parent.name == "quick"
    before = walks[("before", False)].per_case[218]
    assert 130 <= before <= 170, before


def test_the_method_now_costs_less_where_it_changed(h200_quick):
    *_, walks = h200_quick
    before, cold, warm = walks[("before", False)], walks[("now", False)], walks[("now", True)]
    for phase in ("timing", "capture", "inputs"):
        assert cold.phases[phase] < before.phases[phase], phase
    assert cold.phases["timing"] < 0.5 * before.phases["timing"]
    # the graph rows' replays: time-sized, not 25 of each whole rotation
    assert cold.counts["replays"] < 0.5 * before.counts["replays"]
    # the copies: one set per case, not one per provider
    assert cold.counts["copies made"] < 0.7 * before.counts["copies made"]
    # the compile workers, started 2 s into the process and up 4 s later, compile 8 at
    # a time from the last 2.8 s of the H200's 3.8 s of ceilings on, and the sweep waits
    # for what they have left, then loads each kernel from Triton's cache; tuning kept
    # on disk when warm
    n = cold.counts["compiles"]
    assert cold.phases["compile"] == pytest.approx(
        n * GPU.compile_s / GPU.compile_workers - (5.0 + 3.795 - 6.0)
        + n * GPU.cached_compile_s)
    assert cold.phases["compile"] < 0.1 * before.phases["compile"]
    assert warm.phases["tune"] == 0 < cold.phases["tune"]
    assert warm.total < cold.total < before.total
    assert warm.counts.get("tunings", 0) == 0 < cold.counts["tunings"]


def test_an_h100_estimate_scales_the_h200_rows_by_the_roofline():
    cfg, cases, ref = _gpu_plan("h100", "--sizes", "quick", "--kernels", "add",
                                "--dtypes", "bf16")
    big = next(c for c in cases if c.shape == {"n": 1 << 26} and c.provider == "torch")
    h200 = ref.rows[("add", "torch", "bf16", "n=67108864", "cold")]["ms_median"]
    # bandwidth-bound: 4.8 / 3.35 TB/s slower on the H100's datasheet
    assert row_speed(big, cfg, ref, GPU).call_ms == pytest.approx(h200 * 4.8 / 3.35)
    # the rotation past twice the H100's 50 MB L2, not the H200's 60
    assert ref.model is DEVICES["h200"] and cfg.present.l2_mb == 50


def test_a_rows_speed_is_interpolated_along_its_series():
    spec = REGISTRY["add"]

    def row(n: int, ms: float) -> dict:
        return {"kernel": "add", "provider": "torch", "dtype": "fp32", "shape": f"n={n}",
                "cache": "cold", "flops": n, "bytes": 12 * n, "ms_median": ms,
                "host_us": 7.0, "status": "ok"}

    ref = Reference(rows={("add", "torch", "fp32", f"n={n}", "cold"): row(n, ms)
                          for n, ms in ((1 << 12, 0.002), (1 << 24, 0.052))},
                    model=DEVICES["h200"])
    cfg, *_ = _gpu_plan("h200", "--kernels", "add", "--dtypes", "fp32", "--sizes", "quick")

    def ms(n: int) -> float:
        return row_speed(Case(spec, "torch", "fp32", {"n": n}), cfg, ref, GPU).call_ms

    assert ms(1 << 10) == 0.002  # under the smallest row: its latency
    assert ms(1 << 26) == pytest.approx(0.052 * 4)  # past the largest: its rate
    mid = (1 << 12) + ((1 << 24) - (1 << 12)) // 2
    assert ms(mid) == pytest.approx(0.027, rel=1e-3)  # the line between them
    assert row_speed(Case(spec, "torch", "fp32", {"n": 4096}), cfg, ref, GPU).host_us == 7.0


def test_the_command_prints_every_phase_and_writes_nothing(capsys, tmp_path):
    code = run_bench.main(["--estimate", "--device", "h200", "--sizes", "quick",
                           "--kernels", "add,matvec"])
    out = capsys.readouterr().out
    assert code == 0
    for phase in ("ceilings", "compile", "tune", "inputs", "check", "capture", "timing", "profile",
                  "write", "other", "total"):
        assert f"│ {phase}" in out, phase
    for m, warm in PLANS:
        assert f"{m}, Triton cache {'warm' if warm else 'cold'}: timing " in out
    assert run_bench.main(["--estimate", "--out", str(tmp_path), "--kernels", "add",
                           "--sizes", "n=4096"]) == 0
    assert list(tmp_path.iterdir()) == []  # nothing made, not even a ceiling cache


def _cpu_run(tmp: Path, split: dict[str, float], name: str = "r1", **meta_extra) -> Path:
    """A CPU run's results.json: its rows (add fp32 at two sizes) and its time split."""
    rows = [{"kernel": "add", "provider": "torch", "dtype": "fp32", "shape": f"n={n}",
             "cache": "warm", "flops": n, "bytes": 12 * n, "ms_median": ms,
             "status": "ok", "timer": "timeit blocks"}
            for n, ms in ((2048, 0.003), (1 << 22, 4.0))]
    meta = {"device_key": "cpu", "device_kind": "cpu", "kernels": ["add"],
            "dtypes": ["fp32"], "providers": ["torch"], "sizes": "explicit",
            "explicit_shapes": ["n=2048", "n=4194304"], "cache": ["warm"],
            "run_budget_s": 90.0, "created": "2026-11-26T00:00:00+00:00",
            "complete": True, "time_split_s": split, "wall_s": sum(split.values()),
            "run_id": name, **meta_extra}
    path = tmp / "cpu" / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"metadata": meta, "rows": rows}))
    return path


def test_a_cpu_estimate_reproduces_the_split_of_the_run_it_is_scaled_to(tmp_path):
    split = {"ceilings": 0.0, "compile": 0.0, "tune": 0.0, "inputs": 3.0, "check": 1.5,
             "capture": 0.0, "timing": 0.3, "write": 0.8, "other": 6.0}
    ref = load_reference([_cpu_run(tmp_path, split)])
    args = run_bench.parse_args(["--estimate", "--device", "cpu", "--kernels", "add",
                                 "--dtypes", "fp32", "--providers", "torch",
                                 "--sizes", "n=2048;n=4194304"])
    args = run_bench.request_of(args)
    model, present = target_device(args)
    cfg = job.run_config(args, model, present, interpret=False)
    cases = build_cases(cfg)
    walk = estimate(cfg, cases, ref, CPU, True, (("now", True),))[("now", True)]
    # unscaled: the plan's arithmetic; the 4 ms calls take a round of 5 samples each
    assert walk.counts["rows"] == 2 and walk.phases["timing"] > 5 * 5 * 0.004
    scaled = calibration(cfg, ref, CPU)
    factors = scaled.factors
    assert set(factors) == {"inputs", "check", "timing", "write", "other"}
    assert scaled.runs == ["r1 (warm)"]
    calibrate(walk, factors)
    for phase, want in split.items():
        assert walk.phases[phase] == pytest.approx(want, rel=1e-6), phase
    # another selection is priced by the same factors, not copied from the run
    more = dataclasses.replace(cfg, explicit_shapes=[{"n": 2048}, {"n": 1 << 22},
                                                     {"n": 1 << 23}])
    bigger = calibrate(estimate(more, build_cases(more), ref, CPU, True,
                                (("now", True),))[("now", True)], factors)
    assert bigger.phases["timing"] > walk.phases["timing"] > 0


def test_the_runs_scaled_to_are_the_newest_sessions_whole_runs(tmp_path):
    """Runs within a day of the newest, complete, in one process (not resumed, not
    --check-only, not a fleet), of the estimated kind; their seconds are summed phase by
    phase."""
    split = {"inputs": 3.0, "check": 1.5, "timing": 0.3, "write": 0.8, "other": 6.0}
    twice = {k: 2 * v for k, v in split.items()}
    paths = [_cpu_run(tmp_path, split, "a", created="2026-11-27T10:00:00+00:00"),
             # a time without its zone is UTC's
             _cpu_run(tmp_path, twice, "b", created="2026-11-27T02:00:00"),
             # left out: a day and more before the newest, cut short, resumed, checks
             # only, a fleet's
             _cpu_run(tmp_path, split, "old", created="2026-11-26T09:59:00+00:00"),
             _cpu_run(tmp_path, twice, "cut", complete=False),
             _cpu_run(tmp_path, twice, "resumed", resumed=[{"rows_before": 1}]),
             _cpu_run(tmp_path, twice, "checks", check_only=True),
             _cpu_run(tmp_path, twice, "fleet", fleet={"world": 1, "ranks": []})]
    ref = load_reference(paths)
    assert [m["run_id"] for m in calibration_runs(ref, "cpu")] == ["b", "a"]
    assert calibration_runs(ref, "cuda") == []
    args = run_bench.request_of(run_bench.parse_args(
        ["--estimate", "--device", "cpu", "--kernels", "add", "--dtypes", "fp32",
         "--providers", "torch", "--sizes", "n=2048;n=4194304"]))
    model, present = target_device(args)
    cfg = job.run_config(args, model, present, interpret=False)
    both = calibration(cfg, ref, CPU)
    alone = calibration(cfg, load_reference(paths[:1]), CPU)
    assert both.runs == ["b (warm)", "a (warm)"]
    for phase, f in alone.factors.items():  # 3 runs' worth over 2 runs of the model
        assert both.factors[phase] == pytest.approx(min(4.0, 1.5 * f)), phase


def _cold(meta: dict) -> bool:
    return TritonBuilds.of(meta).cold


def test_a_run_that_built_kernels_had_a_cold_cache():
    assert not _cold({})  # recorded nothing: a CPU run, or an older one
    assert not _cold({"triton_compiles": {"compiled": 0, "from_cache": 40},
                         "compiled_ahead": {"kernels_compiled": 40, "kernels_built": 0}})
    assert _cold({"triton_compiles": {"compiled": 3, "from_cache": 0}})
    # the workers built them all: the sweep itself only loaded them
    assert _cold({"triton_compiles": {"compiled": 0, "from_cache": 40},
                     "compiled_ahead": {"kernels_compiled": 40, "kernels_built": 40}})
    # the sweep's wait for its workers, where recorded
    assert TritonBuilds.of({"compiled_ahead": {"waited_s": 9.4}}).waited_s == 9.4
    assert TritonBuilds.of({"compiled_ahead": {"kernels_built": 3}}).waited_s == 0.0


@pytest.mark.parametrize("compiled", [True, False])
def test_a_gpu_run_is_modelled_as_its_triton_cache_was(compiled, monkeypatch):
    """A fresh runner's run (kernels built) is priced cold, compiles and tunings
    included, so that its split scales the phases by what they cost, not by how much
    more a cold run costs than a warm one.  (Retuned: the H200's shipped file covers
    these buckets, and a run that tunes nothing has no tuning to scale.)"""
    monkeypatch.setenv("GPUBENCH_RETUNE", "1")
    cfg, cases, ref = _gpu_plan("h200", "--kernels", "add,softmax", "--dtypes", "fp16",
                                "--sizes", "quick")
    walks = estimate(cfg, cases, ref, GPU, ceilings_cached=True,
                     plans=(("now", False), ("now", True)))
    ran = walks[("now", not compiled)]
    meta = {"device_kind": "cuda", "complete": True, "run_id": "quick",
            "created": "2026-11-28T00:00:00+00:00", "kernels": ["add", "softmax"],
            "dtypes": ["fp16"], "providers": cfg.providers, "sizes": "quick",
            "cache": cfg.cache, "run_budget_s": cfg.run_budget_s,
            "triton_compiles": {"compiled": 5 if compiled else 0, "from_cache": 4},
            "time_split_s": {p: 1.5 * v for p, v in ran.phases.items()} | {"ceilings": 0}}
    # its compiles are priced as its own process counted them (5 built, 4 loaded), not
    # as the model would have compiled its cases
    own = (5 if compiled else 0) * GPU.compile_s + 4 * GPU.cached_compile_s
    meta["time_split_s"]["compile"] = 1.5 * own
    if compiled:  # the seconds it waited for its workers are no build of its own
        meta["compiled_ahead"] = {"workers": 8, "kernels_built": 40, "waited_s": 7.0}
        meta["time_split_s"]["compile"] += 7.0
    scaled = calibration(cfg, dataclasses.replace(ref, splits=[meta]), GPU)
    assert scaled.runs == [f"quick ({'cold' if compiled else 'warm'})"]
    # a warm run's compiles (loads from Triton's cache) and tunings (none) are too
    # small to scale by
    assert {"compile", "tune"} <= set(scaled.factors) if compiled \
        else not {"compile", "tune"} & set(scaled.factors)
    assert {"capture", "timing", "profile", "write", "other"} <= set(scaled.factors)
    for phase, f in scaled.factors.items():
        assert f == pytest.approx(1.5), phase


def test_a_run_made_before_the_profile_phase_is_priced_as_it_ran(monkeypatch):
    """The H200's runs of 2026-11-27 booked the profiler pass in timing, and ran a
    warm-up call after a long timed call and an unprofiled call before each pass: the
    model prices them so, folds its profile into their timing, and scales the profile
    by the timing's factor, so that those calls are not counted as time the code now
    spends elsewhere."""
    monkeypatch.setenv("GPUBENCH_RETUNE", "1")
    cfg, cases, ref = _gpu_plan("h200", "--kernels", "add,attention_bwd", "--dtypes",
                                "fp32", "--sizes", "quick")
    old = Pricer(cfg, ref, GPU, "now", True, True, calls_before_profile_phase=True).run(cases)
    new = Pricer(cfg, ref, GPU, "now", True, True).run(cases)
    # the unprofiled call, each row's (backward passes of 12-200 ms among them)
    assert old.phases["profile"] - new.phases["profile"] > 0.3
    assert old.phases["timing"] > new.phases["timing"]  # the warm-up calls after them
    split = {p: 1.5 * v for p, v in old.phases.items() if p != "profile"}
    split["timing"] = 1.5 * (old.phases["timing"] + old.phases["profile"])
    meta = {"device_kind": "cuda", "complete": True, "run_id": "older",
            "created": "2026-11-27T08:00:00+00:00", "kernels": ["add", "attention_bwd"],
            "dtypes": ["fp32"], "providers": cfg.providers, "sizes": "quick",
            "cache": cfg.cache, "run_budget_s": cfg.run_budget_s,
            "triton_compiles": {"compiled": 0, "from_cache": 0},
            "time_split_s": split | {"ceilings": 0}}
    scaled = calibration(cfg, dataclasses.replace(ref, splits=[meta]), GPU)
    assert scaled.factors["timing"] == pytest.approx(1.5)
    assert scaled.factors["profile"] == pytest.approx(1.5)


# ---- the ceilings' measured time and what the compile workers can hide -------------------

def test_the_ceilings_are_priced_at_the_reference_runs_measured_time(h200_quick):
    """The H200's runs record how long their ceilings took (3.88 s and 3.71 s in the
    committed ones): the estimate prices that, not an assumption; another measured time
    gives another estimate."""
    cfg, cases, ref, walks = h200_quick
    assert sorted(ref.ceilings_measured_s.values()) == [3.71, 3.88]
    assert ref.ceilings_s == pytest.approx(3.795)
    assert walks[("now", False)].phases["ceilings"] == pytest.approx(3.795)
    slower = dataclasses.replace(ref, ceilings_measured_s={"a": 9.0, "b": 11.0, "c": 30.0})
    again = estimate(cfg, cases, slower, GPU, ceilings_cached=False)
    assert again[("now", True)].phases["ceilings"] == 11.0  # the median
    assert again[("now", True)].total == pytest.approx(walks[("now", True)].total + 11.0 - 3.795)
    # without any recorded time: the assumption (the H200's measurements)
    none = dataclasses.replace(ref, ceilings_measured_s={})
    assert estimate(cfg, cases, none, GPU, ceilings_cached=False)[
        ("now", True)].phases["ceilings"] == GPU.ceilings_s
    # cached ceilings cost nothing: the sweep waits for its workers from its start-up's
    # end (5 s; the workers are up at 6 s) until they are done, then loads every kernel
    cached = estimate(cfg, cases, ref, GPU, ceilings_cached=True)[("now", False)]
    assert cached.phases["ceilings"] == 0.0
    n = cached.counts["compiles"]
    assert cached.phases["compile"] == pytest.approx(
        1.0 + n * GPU.compile_s / GPU.compile_workers + n * GPU.cached_compile_s)


def test_load_reference_reads_each_ceilings_measurement_once(tmp_path):
    """Runs sharing one ceiling cache share one measurement (its measured_at)."""
    paths = []
    for i, (at, s) in enumerate([("t1", 3.5), ("t1", 3.5), ("t2", 4.5), (None, None)]):
        measured = {"hbm_gbps": 1.0, "measured_at": at, "seconds": s} if at else None
        p = tmp_path / f"r{i}" / "results.json"
        p.parent.mkdir()
        p.write_text(json.dumps({"metadata": {"device_key": "h200", "ceilings": {
            "datasheet": None, "measured": measured}}, "rows": []}))
        paths.append(p)
    ref = load_reference(paths)
    assert ref.ceilings_measured_s == {"t1": 3.5, "t2": 4.5}
    assert ref.ceilings_s == 4.0
    assert load_reference(paths[3:]).ceilings_s is None


@pytest.mark.parametrize("spawn_s, startup_s, window_s", [
    # started 2 s in, up 4 s later: the last 2.795 s of the H200's 3.795 s of ceilings
    (2.0, GPU.compile_worker_startup_s, 5.0 + 3.795 - 6.0),
    (2.0, 10.0, 5.0 + 3.795 - 12.0),  # up 3.2 s after the ceilings: a wait holds that
    (0.5, 1.0, 3.795),  # up before the ceilings: all of them (the jobs come with them)
])
@pytest.mark.parametrize("wait", ["0", ""])
def test_the_sweep_pays_the_compiles_its_workers_have_not_done(
        h200_quick, monkeypatch, spawn_s, startup_s, window_s, wait):
    """The workers compile from their start-up (spawn_s into the process) and the
    ceilings' start (the jobs are sent then) on, 8 at a time.  Without the wait
    (GPUBENCH_COMPILE_WAIT_S=0) they are stopped when the ceilings end and the sweep
    compiles the rest itself; with it (the default) the sweep waits until they are done,
    what of their parallel time outlasts the ceilings.  Either way it loads from Triton's
    cache what they compiled."""
    monkeypatch.setenv("GPUBENCH_COMPILE_WAIT_S", wait)
    cfg, cases, ref, _ = h200_quick
    assert GPU.startup_s == 5.0 and ref.ceilings_s == pytest.approx(3.795)
    sp = dataclasses.replace(GPU, compile_worker_startup_s=startup_s,
                             compile_worker_spawn_s=spawn_s, compile_s=2.0)
    walks = estimate(cfg, cases, ref, sp, ceilings_cached=False,
                     plans=(("before", False), ("now", False)))
    before, cold = walks[("before", False)], walks[("now", False)]
    # never compiled ahead before
    assert before.phases["compile"] == pytest.approx(before.counts["compiles"] * sp.compile_s)
    serial = cold.counts["compiles"] * sp.compile_s
    if wait == "0":
        ahead = min(serial, max(0.0, window_s) * sp.compile_workers)
        waited = 0.0
    else:
        ahead = serial
        waited = max(0.0, serial / sp.compile_workers - window_s)
    loads = ahead / sp.compile_s * sp.cached_compile_s
    assert cold.phases["compile"] == pytest.approx(serial - ahead + waited + loads)
    assert cold.per_case[-1] + sp.write_end_s + sp.figure_row_s * cold.counts["rows"] \
        == pytest.approx(cold.total)


def test_the_total_is_the_sum_of_every_phase_other_included(h200_quick):
    """What the table prints: each phase, and a total that is their sum (start-up and
    the per-row Python booked to `other`, as the sweep books them)."""
    cfg, cases, _, walks = h200_quick
    for (method, warm), w in walks.items():
        assert list(w.phases) == list(PHASES), (method, warm)
        assert w.total == pytest.approx(sum(w.phases[p] for p in PHASES))
        assert w.phases["other"] == pytest.approx(GPU.startup_s + len(cases) * GPU.row_s)
        # the figures and summary grow with the rows that ran: 406 cases, 368 run, 0.8 +
        # 406 x 0.002 + 368 x 0.022 = 9.7 s, as the H200's 9.7-9.9 s
        end = GPU.write_end_s + GPU.figure_row_s * w.counts["rows"]
        if (method, warm) == ("now", True):
            assert w.phases["write"] == pytest.approx(9.7, abs=0.1)
        assert w.phases["write"] == pytest.approx(len(cases) * GPU.write_row_s + end)
        assert all(v >= 0 for v in w.phases.values())
        assert w.per_case == sorted(w.per_case)  # cumulative
        assert w.per_case[-1] + end == pytest.approx(w.total)
    # every GPU row has its profiler pass, CUPTI's start on the first
    now = walks[("now", True)]
    rows = now.counts["rows"]
    assert now.counts["profiled"] == rows
    assert now.phases["profile"] >= GPU.profile_first_s + rows * GPU.profile_s


def _estimate_line(*env: str) -> dict[str, float]:
    """`run_bench.py --estimate --device h200 --sizes quick` in a process of its own
    (compiled kernels' launches: no interpreter, whose bf16 rounding constexpr puts a
    launch in another tuning bucket): the cold column's tune seconds and counts."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                                 "GPUBENCH_RETUNE")}
    environ.update(dict(e.split("=", 1) for e in env))
    p = subprocess.run([sys.executable, "run_bench.py", "--estimate", "--device", "h200",
                        "--sizes", "quick"], cwd=ROOT, env=environ,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    tune = re.search(r"│ tune\s+│\s+([\d.]+)\s+│\s+[\d.]+\s+│\s+([\d.]+)", p.stdout)
    out = p.stdout.splitlines()  # the console wraps a long line: the next one with it
    i = next(i for i, ln in enumerate(out) if ln.startswith("now, Triton cache cold"))
    line = " ".join(out[i:i + 2])
    counts = {k: int(v.replace(",", "")) for k, v in
              re.findall(r"(compiles|tunings) ([\d,]+)", line)}
    assert tune is not None, p.stdout
    return {"before_tune": float(tune.group(1)), "tune": float(tune.group(2)), **counts}


def test_a_shipped_config_is_priced_untuned_as_the_sweep_runs_it():
    """On the H200, whose tuned configs ship (kernels/configs/h200.json), a launch with a
    shipped config runs it untuned: the cold sweep pays one compile for it and no
    tuning; GPUBENCH_RETUNE=1 tunes anyway, as the method before did."""
    shipped, retuned = _estimate_line(), _estimate_line("GPUBENCH_RETUNE=1")
    assert retuned["tune"] == retuned["before_tune"] == shipped["before_tune"]
    assert shipped["tunings"] < retuned["tunings"]
    assert shipped["tune"] < retuned["tune"]
    assert shipped["compiles"] < retuned["compiles"]


def test_a_fleet_ranks_own_run_is_not_a_reference(tmp_path: Path) -> None:
    """A fleet rank's own folder (<fleet>/ranks/rank-<r>/...) holds a run whose split
    has the fleet's waits and collectives (the H200 job of 2026-11-27 put one beside
    the sweeps, and the calibration counted it as a warm quick sweep); the fleet's own
    results.json and the plain runs stay."""
    doc = {"metadata": {"device_key": "h200", "created": "2026-11-27T08:00:00+00:00"},
           "rows": []}
    wanted = [tmp_path / "h200" / "day" / "quick" / "results.json",
              tmp_path / "h200" / "day" / "fleet-run" / "fleet" / "quick" / "results.json"]
    rank = (tmp_path / "h200" / "day" / "fleet-run" / "fleet" / "quick" / "ranks" / "rank-0"
            / "h200" / "quick" / "results.json")
    for p in [*wanted, rank]:
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(doc))
    assert sorted(find_reference(tmp_path, DEVICES["h200"]).paths) == sorted(wanted)


def test_a_past_run_is_priced_with_the_configs_it_ran(h200_quick):
    """A calibration run is priced as its rows say it ran (config_source), not with
    today's shipped file: the H200's runs of 2026-11-27 tuned buckets its file of 92
    configs now ships, and priced untuned their 9.7 s of tuning came out 4x the model."""
    from benches.estimate.price import Pricer

    cfg, cases, ref = _gpu_plan("h200", "--kernels", "softmax", "--dtypes", "fp16",
                                "--sizes", "quick")
    triton = [c for c in cases if c.provider == "triton"]
    today = Pricer(cfg, ref, GPU, "now", False, True).run(cases)
    assert triton and today.counts.get("tunings", 0) == 0  # shipped today
    tuned = {c.key: "tuned" for c in triton}
    then = Pricer(cfg, ref, GPU, "now", False, True, sources=tuned).run(cases)
    assert then.counts["tunings"] >= 1 and then.phases["tune"] > 0
    assert then.counts["compiles"] > today.counts["compiles"]  # every candidate
    # a tuning found on disk ("cached"): no candidate timed, the chosen one compiled
    found = Pricer(cfg, ref, GPU, "now", False, True,
                   sources=dict.fromkeys(tuned, "cached")).run(cases)
    assert found.phases["tune"] == 0 and found.counts["compiles"] == today.counts["compiles"]
