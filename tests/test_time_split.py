"""Where a run's time goes (benches/sweep/time_split.py): the accounting object's arithmetic on a
fake clock, Triton's compiles booked out of the phase they happen in, a real CPU run's
split against its wall time measured from outside, summary.md's and the console's line,
and the work each case does once for both its providers and cache modes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benches.sweep import cases as cases_mod
from benches.sweep import runner, timers
from benches.sweep import time_split as phases
from benches.sweep.time_split import TimeSplit
from benches.timing.clock import Dispatch
from benches.timing.graphs import GraphProbe, GraphSampler
from contract.phases import PHASES
from contract.run_meta import parse_meta
from contract.schema import ROW_SPLIT, row_key
from kernels import REGISTRY
from roofline.report.run_time import compile_facts, row_time_sections, time_split_line
from roofline.report.summary import render_summary
from tests.run_docs import doc_of
from tests.test_measurement import FAST, cpu_cfg, gpu_cfg, gpu_faked, steady_sampler

# The timers' own set-up, where a test keeps it under gpu_faked's other fakes.
REAL_PREPARE = timers.GpuTimer.prepare

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_are_exclusive_and_add_up_to_the_wall_time():
    clock = Clock()
    split = TimeSplit(start=clock.now - 2.0, clock=clock)  # 2 s of start-up before
    with split.phase("check"):
        clock.now += 1.0
        with split.phase("inputs"):  # pauses check
            clock.now += 3.0
        clock.now += 0.5
        split.move(0.25, "compile")  # spent inside check, booked to compile
    clock.now += 4.0  # in no phase: other
    got = split.split()
    assert list(got) == list(PHASES)
    assert got["check"] == 1.25 and got["inputs"] == 3.0 and got["compile"] == 0.25
    assert got["other"] == 6.0 and sum(got.values()) == split.wall_s() == 10.5
    with pytest.raises(ValueError, match="unknown phase"), split.phase("lunch"):
        pass


def test_a_move_never_takes_more_than_the_open_phase_ran():
    clock = Clock()
    split = TimeSplit(clock=clock)
    with split.phase("tune"):
        clock.now += 1.0
        split.move(5.0, "compile")  # a listener's figure larger than the phase itself
    assert split.split()["tune"] == 0.0 and split.split()["compile"] == 1.0


def test_a_rows_own_split_is_what_the_phases_booked_since_its_mark():
    """TimeSplit.since: each phase's seconds since the mark (an open phase up to now),
    `other` the rest of the wall time between, zeros left out, 0.1 ms rounding."""
    clock = Clock()
    split = TimeSplit(clock=clock)
    with split.phase("check"):
        clock.now += 7.0  # before the mark: not the row's
        mark = split.mark()
        clock.now += 0.25
    with split.phase("capture"):
        clock.now += 0.5
        split.move(0.125, "compile")
    clock.now += 0.00004  # under 0.1 ms: rounds to nothing, left out
    with split.phase("timing"):
        clock.now += 1.0
        assert split.since(mark) == {"compile": 0.125, "check": 0.25, "capture": 0.375,
                                     "timing": 1.0}
    clock.now += 2.0
    got = split.since(mark)
    assert got == {"compile": 0.125, "check": 0.25, "capture": 0.375, "timing": 1.0,
                   "other": 2.0}
    assert list(got) == [p for p in PHASES if p in got]  # in the phases' order
    assert split.since(split.mark()) == {}


def test_a_serial_sweep_records_each_rows_own_split(tmp_path):
    """A sweep whose rows run one by one (here checks only) writes every row's own
    split in its metadata, in the rows' order, adding up to the run's phases; a CPU
    sweep whose rounds interleave over chunks records none (the time between two rows
    is then a chunk's)."""
    import run_bench

    code = run_bench.main(["--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
                           "--sizes", "n=4096;n=65536", "--check-only",
                           "--out", str(tmp_path / "a")])
    assert code == 0
    doc = json.loads(next((tmp_path / "a").glob("*/*/results.json")).read_text())
    own, meta = doc["metadata"][ROW_SPLIT], doc["metadata"]
    assert [e["row"] for e in own] == [list(row_key(r)) for r in doc["rows"]]
    for phase in ("inputs", "check"):
        assert sum(e["s"].get(phase, 0.0) for e in own) == pytest.approx(
            meta["time_split_s"][phase], abs=2e-3)
    assert all(e["s"]["check"] > 0 for e in own)
    code = run_bench.main(["--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
                           "--sizes", "n=4096", "--row-budget", "0.5",
                           "--out", str(tmp_path / "b")])
    assert code == 0
    doc = json.loads(next((tmp_path / "b").glob("*/*/results.json")).read_text())
    assert not doc["metadata"].get(ROW_SPLIT)  # interleaved CPU rounds: no row's own


def test_the_summary_says_where_the_rows_time_went():
    """summary.md's table of the rows' own split, by kernel and provider, the largest
    first; ROW_TIME_TOP pairs, the rest in one line, all rows last; none for a run that
    recorded no row split."""
    from roofline.report import run_time

    def entry(kernel, provider, **s):
        return {"row": [kernel, provider, "fp32", "n=1", "cold"], "s": s}

    own = [entry("add", "torch", check=0.5, timing=1.0),
           entry("add", "torch", check=0.5, capture=2.0),
           entry("attention_bwd", "torch", timing=9.0, profile=0.5),
           entry("dot", "triton", check=0.25)]
    title, text = row_time_sections(own)
    assert title == "## Where the rows' time went"
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| kernel provider | rows | check | capture | timing | profile | total |"
    assert lines[1] == "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"  # numbers right
    assert lines[2:] == [
        "| attention_bwd torch | 1 | 0.00 | 0.00 | 9.00 | 0.50 | 9.50 |",
        "| add torch | 2 | 1.00 | 2.00 | 1.00 | 0.00 | 4.00 |",
        "| dot triton | 1 | 0.25 | 0.00 | 0.00 | 0.00 | 0.25 |",
        "| all rows | 4 | 1.25 | 2.00 | 10.00 | 0.50 | 13.75 |"]
    many = [entry(f"k{i}", "torch", timing=float(i + 1)) for i in range(run_time.ROW_TIME_TOP + 2)]
    _, text = row_time_sections(many)
    assert "| 2 more | 2 | 3.00 | 3.00 |" in text  # k0 and k1, the smallest
    assert row_time_sections([]) == []
    md = render_summary(doc_of({ROW_SPLIT: own, "device_key": "h200"}))
    assert "## Where the rows' time went" in md


def test_an_old_runs_odd_time_values_are_left_out_not_fatal():
    """parse_meta keeps the metadata's values as they came: a split, a row's entry or the
    workers' record that is not what this version writes renders without it."""
    odd = {"time_split_s": {"timing": "12.4", "check": float("inf"), "write": None,
                            "other": 3}, "wall_s": "30",
           "row_split_s": [5, {"row": "ab"}, {"row": ["a"]}, {"row": ["dot", "triton"]},
                           {"row": ["add", "torch"], "s": {"check": "0.5", "tune": None}}],
           "compiled_ahead": [1, 2], "triton_compiles": "many", "device_key": "h200"}
    md = render_summary(doc_of(odd))
    assert "- **time**: timing 12 s of 30 s (other 3)" in md
    assert "| add torch | 1 | 0.50 | 0.50 |" in md and "| dot triton | 1 | 0.00 | 0.00 |" in md
    assert "| all rows | 2 | 0.50 | 0.50 |" in md
    assert "Triton compiles" not in md and "compiled ahead" not in md
    for entries in ({"row": ["a", "b"]}, "abc", 7):
        assert row_time_sections(entries) == []


def test_an_open_phase_counts_up_to_now():
    clock = Clock()
    split = TimeSplit(clock=clock)
    with split.phase("timing"):
        clock.now += 2.0
        assert split.split()["timing"] == 2.0 and split.split()["other"] == 0.0


def test_the_process_start_is_before_now():
    started = phases.process_start()
    assert 0 <= time.perf_counter() - started < 3600


def test_compiles_are_booked_from_tritons_listener(monkeypatch):
    from triton import knobs

    clock = Clock()
    split = TimeSplit(clock=clock)
    heard: list[bool] = []
    prior = lambda **kw: heard.append(kw["cache_hit"])  # noqa: E731
    monkeypatch.setattr(knobs.compilation, "listener", prior)
    with phases.compiles_booked(split), split.phase("tune"):
        clock.now += 3.0
        # what triton.compile reports after a compile: its own timer, microseconds
        knobs.compilation.listener(src=None, metadata={}, metadata_group={},
                                   times=SimpleNamespace(total=2_000_000),
                                   cache_hit=False)
        # one found in Triton's cache: counted apart, its (small) time booked alike
        knobs.compilation.listener(src=None, metadata={}, metadata_group={},
                                   times=SimpleNamespace(total=0), cache_hit=True)
    assert knobs.compilation.listener is prior and heard == [False, True]
    got = split.split()
    assert got["compile"] == 2.0 and got["tune"] == 1.0
    assert split.compiles == {"compiled": 1, "from_cache": 1}


def test_the_split_line_says_timing_of_wall():
    meta = {"time_split_s": {"ceilings": 9.6, "timing": 12.4, "inputs": 0.2,
                             "write": 2.5, "other": 5.3}, "wall_s": 30.0}
    assert time_split_line(meta["time_split_s"], meta["wall_s"]) == \
        "timing 12 s of 30 s (ceilings 10, other 5, write 2)"
    assert time_split_line(None, None) is None
    md = render_summary(doc_of({**meta, "device_key": "cpu"}))
    assert "- **time**: timing 12 s of 30 s (ceilings 10, other 5, write 2)" in md


def compiles_line(meta: dict) -> str | None:
    return dict(compile_facts(parse_meta(meta)))["Triton compiles"]


def compiled_ahead_line(ahead) -> str | None:
    return dict(compile_facts(parse_meta({"compiled_ahead": ahead})))["compiled ahead"]


def test_the_summary_says_how_many_kernels_were_built_or_loaded_from_the_cache():
    assert compiles_line({}) is None  # a CPU run, an older run
    none = {"triton_compiles": {"compiled": 0, "from_cache": 0}}
    assert compiles_line(none) is None
    warm = {"triton_compiles": {"compiled": 0, "from_cache": 47},
            "compiled_ahead": {"kernels_compiled": 40, "kernels_built": 0}}
    assert compiles_line(warm) == "0 built, 47 loaded from Triton's cache"
    cold = {"triton_compiles": {"compiled": 93, "from_cache": 40},
            "compiled_ahead": {"kernels_built": 40}}
    assert compiles_line(cold) == ("93 built, 40 loaded from Triton's cache; 40 "
                                   "built ahead by the compile workers")
    md = render_summary(doc_of({**cold, "device_key": "h200"}))
    assert "- **Triton compiles**: 93 built, 40 loaded from Triton's cache; 40" in md


def pd_rows():
    import pandas as pd

    from contract.schema import ALL_COLUMNS

    return pd.DataFrame(columns=ALL_COLUMNS)


def test_a_cpu_runs_split_adds_up_to_its_wall_time(tmp_path):
    """The command as a user runs it, its wall time taken from outside the process."""
    out = tmp_path / "results"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "run_bench.py", "--kernels", "add,matmul",
                           "--dtypes", "fp32", "--sizes", "n=65536;M=64,N=64,K=64",
                           "--no-plots", "--out", str(out), "--run-id", "r"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((out / "cpu" / "r" / "results.json").read_text())["metadata"]
    split = meta["time_split_s"]
    assert list(split) == list(PHASES)
    assert split["timing"] > 0 and split["inputs"] > 0 and split["check"] > 0
    assert abs(sum(split.values()) - wall) <= 0.05 * wall, (split, wall)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"timing {split['timing']:.0f} s of ")
    assert "- **time**: timing " in (out / "cpu" / "r" / "summary.md").read_text()


# ---- work done once per case ------------------------------------------------------------

def _counting(spec, made: list[str]):
    """`spec` with make_inputs and reference counted (the inputs made on the CPU, where
    a faked GPU's case would ask for CUDA), and a second provider ("twin") that is the
    torch one again: two providers of one case without a GPU."""
    def make_inputs(shape, dtype, seed, device):
        made.append("inputs")
        return spec.make_inputs(shape, dtype, seed, "cpu")

    def reference(*a, **k):
        made.append("reference")
        return spec.reference(*a, **k)

    provs = dict(spec.providers)
    provs["twin"] = provs["torch"]
    return dataclasses.replace(spec, make_inputs=make_inputs, reference=reference,
                               providers=provs, triton_launches=None)


def test_inputs_and_reference_are_made_once_for_every_row_of_a_case():
    made: list[str] = []
    spec = _counting(REGISTRY["add"], made)
    shape = {"n": 4096}
    cases = [runner.Case(spec, p, "fp32", shape, mode)
             for p in ("torch", "twin") for mode in ("cold", "warm")]
    # a chunk of no time at all: every row ends a chunk (its later rounds run between)
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_rounds=2, cpu_chunk_s=0.0),
                  cache=["cold", "warm"])
    rows = [row for _, row in runner.iterate(cases, cfg)]
    assert [r.status for r in rows] == ["ok"] * 4
    assert made == ["inputs", "reference"]


def test_a_graph_cases_copies_are_one_block_shared_by_its_providers(monkeypatch):
    made: list[str] = []
    spec = _counting(REGISTRY["add"], made)
    seen: list[list] = []

    def graph(calls, cfg, total=None, call_ms=None):
        seen.append(list(calls))
        return GraphSampler(steady_sampler(1e-3, 10), "", 0.0)

    gpu_faked(monkeypatch)
    monkeypatch.setattr(timers.GpuTimer, "prepare", REAL_PREPARE)
    monkeypatch.setattr(timers, "cudagraph_sampler", graph)
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(5.0, 0.01))
    monkeypatch.setattr(timers, "probe_call", lambda call: GraphProbe(1, 0.01))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    blocks: list[int] = []
    real = cases_mod._make_copies
    monkeypatch.setattr(cases_mod, "_make_copies", lambda *a: (blocks.append(a[2]),
                                                               real(*a))[1])
    cfg = gpu_cfg()
    cache = runner.InputCache()
    for prov in ("torch", "twin"):
        row = runner.run_case(runner.Case(spec, prov, "fp32", {"n": 4096}), cfg, cache)
        assert row.status == "ok", row.reason
    copies = timers.rotation_of(runner.Case(spec, "torch", "fp32", {"n": 4096}), cfg) - 1
    assert blocks == [copies] and made == ["inputs", "reference"]
    assert len(seen) == 2 and len(seen[0]) == len(seen[1]) == copies + 1
    # the same copies, each provider's own calls on them
    assert cache.copies is not None and set(cache.copies.calls) == {"torch", "twin"}
    assert seen[0][1:] == cache.copies.calls["torch"]
    assert seen[1][1:] == cache.copies.calls["twin"]


def test_a_gpu_rows_profiler_pass_is_booked_to_profile_with_no_call_before_it(monkeypatch):
    """kernel_time's pass after the timing is its own phase (the runs before booked it in
    timing), and runs only the profiled calls: the check and the timing ran the call."""
    from benches.sweep import kernel_time

    events: list[str] = []
    real_profile = kernel_time.row_profile
    gpu_faked(monkeypatch)
    monkeypatch.setattr(kernel_time, "row_profile", real_profile)  # the pass under test
    monkeypatch.setattr(timers.GpuTimer, "prepare", REAL_PREPARE)
    monkeypatch.setattr(timers, "cudagraph_sampler", lambda calls, cfg, total=None,
                        call_ms=None: GraphSampler(steady_sampler(1e-3, 10), "", 0.0))
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(5.0, 0.01))
    monkeypatch.setattr(timers, "probe_call", lambda call: GraphProbe(1, 0.01))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))

    def profiled(run, on_gpu):
        time.sleep(0.05)  # the profiler's own cost, booked with it
        events.append("profiled")
        run()
        return []

    monkeypatch.setattr(kernel_time, "profile_events", profiled)
    base = _counting(REGISTRY["add"], [])
    real = base.providers["torch"].fn
    calls: list[str] = []
    counted = dataclasses.replace(
        base.providers["torch"], fn=lambda ins, o: (calls.append("call"), real(ins, o))[1])
    spec = dataclasses.replace(base, providers={**base.providers, "torch": counted})
    split = TimeSplit()
    row = runner.run_case(runner.Case(spec, "torch", "fp32", {"n": 4096}), gpu_cfg(),
                          runner.InputCache(), split=split)
    assert row.status == "ok", row.reason
    got = split.split()
    assert got["profile"] >= 0.05 > got["timing"]
    # the pass: a sync, then the profiled calls only (5 at most, kernel_time); the
    # row's other calls are its first call and its checked call (the timers faked)
    assert events[events.index("profiled") - 1] == "sync"
    assert len(calls) == 2 + kernel_time.PROFILED_CALLS


def test_the_summary_says_what_the_compile_ahead_did_and_why_not_more():
    """A run with workers says what they did, what the sweep waited for them and what
    they said (their errors say why they compiled nothing); the console's line after
    the ceilings is the same text (contract.rows.compiled_ahead_text)."""
    assert compiled_ahead_line({}) is None
    assert compiled_ahead_line({"workers": 0, "cases": 5}) is None
    h200 = {"workers": 8, "cases": 183, "cases_done": 0, "cases_failed": 0,
            "kernels_compiled": 0, "kernels_built": 0, "started_early": 1}
    assert compiled_ahead_line(h200) == \
        "0 of 183 cases (0 kernels, 0 built) by 8 workers"
    now = {**h200, "cases_done": 183, "kernels_compiled": 178, "kernels_built": 170,
           "waited_s": 9.44, "worker_errors": ["preload torch: ImportError: x", "y"]}
    assert compiled_ahead_line(now) == (
        "183 of 183 cases (178 kernels, 170 built) by 8 workers, 9.4 s after the ceilings; "
        "errors: preload torch: ImportError: x; y")
    warm = {**now, "waited_s": 2.04, "wait_ended": "cache warm", "worker_errors": []}
    assert compiled_ahead_line(warm).endswith(
        "2.0 s after the ceilings (ended: cache warm)")
    md = render_summary(doc_of({"compiled_ahead": now, "device_key": "h200"}))
    assert "- **compiled ahead**: 183 of 183 cases (178 kernels, 170 built) by 8" in md
