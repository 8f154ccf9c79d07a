"""Cold and warm side by side (docs/measurement.md): `--cache
cold,warm` times each row both ways, records `cache` per row, the gate never compares a
cold row with a warm one, re-timing times a warm row warm, the CPU's cold timer really
rotates over copies past twice the last-level cache, the GPU's warm timers run back to
back on one set of buffers, the roofline marks warm points and summary.md lists the
largest gaps."""

from __future__ import annotations

import dataclasses
import gc
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

import run_bench
from benches.sweep import job, retime, runner, timers
from benches.sweep import retime as retime_client
from benches.sweep.cases import Case, InputCache, Scratch, make_copies
from benches.sweep.runner import run_case, time_case
from benches.timing import clock as timing
from benches.timing import graphs as graph_timing
from benches.timing import plan as timing_plan
from benches.timing.clock import Dispatch, Rotation, flush_padding_us
from benches.timing.graphs import GraphProbe, GraphSampler
from benches.timing.plan import TimingConfig
from contract.ceilings import Ceilings
from contract.record import parse_row
from contract.request import RunRequest, Selection
from contract.run_meta import DeviceFacts, RunMeta, parse_meta
from contract.schema import ALL_COLUMNS, load_doc, row_key
from kernels import REGISTRY
from roofline.gate.render import benchmark_entries, render_markdown
from roofline.gate.verdicts import CompareResult, compare_frames
from roofline.report.plot import plot_roofline
from roofline.report.summary import render_summary
from tests.run_docs import doc_of
from tests.test_dispatch import FakeGpu
from tests.test_measurement import (
    FAST,
    case,
    cpu_cfg,
    fake_cuda,
    gpu_cfg,
    steady_sampler,
    with_torch_fn,
)

TINY = ["--device", "cpu", "--sizes", "n=4096", "--kernels", "add", "--providers", "torch",
        "--dtypes", "fp32", "--no-plots"]
# A small last-level cache for the rotations made here: fewer, cheaper copies, the same
# rule (test_cpu_cold_calls_rotate_over_copies_past_twice_the_cache pins it).
SMALL_LLC = 256 * 2**10


@pytest.fixture(autouse=True)
def _small_llc_and_fake_ceilings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timers, "host_llc_bytes", lambda: SMALL_LLC)
    fake = {"tflops": {"fp32": 1.0}, "hbm_gbps": 10.0, "l2_gbps": 50.0, "method": {}}
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, fake))


def _one_run(root: Path) -> tuple[RunMeta, pd.DataFrame]:
    (run,) = (root / "cpu").iterdir()
    doc = load_doc(run)
    return doc.meta, doc.frame()


# ---- a cold + warm CPU run --------------------------------------------------------------

def test_a_cold_and_warm_cpu_run_writes_both_rows(tmp_path: Path) -> None:
    assert run_bench.main([*TINY, "--cache", "cold,warm", "--out", str(tmp_path)]) == 0
    meta, df = _one_run(tmp_path)
    assert RunRequest.from_json(meta.request).selection.cache == ("cold", "warm")
    rows = {r["cache"]: r for r in df.to_dict("records")}
    assert set(rows) == {"cold", "warm"} and len(df) == 2
    assert all(r["status"] == "ok" and r["shape"] == "n=4096" for r in rows.values())
    assert rows["cold"]["timer"] == timing_plan.TIMER_CPU_ROTATED
    assert rows["warm"]["timer"] == timing_plan.TIMER_CPU
    (run,) = (tmp_path / "cpu").iterdir()
    assert "cache" in (run / "results.csv").read_text().splitlines()[0].split(",")
    assert "## Warm vs cold" in (run / "summary.md").read_text()


def test_the_default_cpu_run_is_warm_only_and_a_gpus_cold(tmp_path: Path) -> None:
    from benches.sweep.cases import SweepContext
    from contract.devices import DEVICES, Present, host_cpu
    from kernels import Target

    h100 = Present("h100", "H100", "cuda", (9, 0))
    assert SweepContext(RunRequest(), DEVICES["h100"], h100,
                        Target("cuda", (9, 0))).cache_modes == ("cold",)
    assert SweepContext(RunRequest(), DEVICES["cpu"], host_cpu(),
                        Target("cpu")).cache_modes == ("warm",)
    assert run_bench.main([*TINY, "--out", str(tmp_path)]) == 0
    meta, df = _one_run(tmp_path)
    # A CPU's default is what its timer always measured: blocks on the same buffers.
    assert RunRequest.from_json(meta.request).selection.cache is None  # the default
    assert list(df["cache"]) == ["warm"]
    (run,) = (tmp_path / "cpu").iterdir()
    assert "| warm |" not in (run / "summary.md").read_text()  # no gap: one mode


@pytest.mark.parametrize("value", ["hot", "", "cold,tepid", " , "])
def test_bad_cache_values_are_one_line_and_exit_2(value: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench.main([*TINY, "--cache", value, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "cache" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "cpu").exists()  # refused before anything was measured


def test_a_resumed_run_keeps_its_cache_modes() -> None:
    from contract.request import resumed_request

    req = run_bench.request_of(run_bench.parse_args([*TINY, "--cache", "warm"]))
    meta = {"kernels": ["add"], "dtypes": ["fp32"], "providers": ["torch"], "seed": 0,
            "device_key": "cpu", "sizes": "quick"}
    assert resumed_request(req, parse_meta({**meta, "cache": ["cold", "warm"]})
                           ).selection.cache == ("cold", "warm")
    # written before --cache: cold
    assert resumed_request(req, parse_meta(meta)).selection.cache == ("cold",)
    stored = parse_meta({"request": RunRequest(Selection(cache=("warm",))).to_json()})
    assert resumed_request(req, stored).selection.cache == ("warm",)
    # ... and its rows written before the column count as cold cases
    spec = REGISTRY["add"]
    old_row = {"kernel": "add", "provider": "torch", "dtype": "fp32", "shape": "n=4096"}
    assert row_key(old_row) == Case(spec, "torch", "fp32", {"n": 4096}).key
    assert row_key({**old_row, "cache": "warm"}) == \
        Case(spec, "torch", "fp32", {"n": 4096}, "warm").key


# ---- the gate keeps cold and warm apart ---------------------------------------------------

def _row(shape: str, ms: float, cache: str | None = "cold", n: int = 25,
         device: str = "h100", timer: str = timing_plan.TIMER_FLUSHED) -> dict[str, Any]:
    samples = list(ms * np.linspace(0.98, 1.02, n))
    row: dict[str, Any] = {"kernel": "add", "provider": "torch", "dtype": "fp32",
                           "shape": shape, "status": "ok", "ms_median": ms,
                           "ms_p20": ms * 0.99, "ms_p80": ms * 1.01, "n_samples": n,
                           "timer": timer, "samples_ms": samples, "reason": "",
                           "tflops": 1.0, "gbps": 1.0, "device": device}
    if cache is not None:
        row["cache"] = cache
    return row


def _verdicts(base: list[dict[str, Any]], run: list[dict[str, Any]]) -> dict[tuple, str]:
    out = compare_frames(pd.DataFrame(base), pd.DataFrame(run), 10.0)
    return {(r["shape"], r["cache"]): r["verdict"] for r in out.to_dict("records")}


def test_the_gate_never_compares_a_warm_row_with_a_cold_one() -> None:
    cold_only = [_row("n=4096", 1.0), _row("n=65536", 2.0)]
    both = cold_only + [_row("n=4096", 0.2, "warm"), _row("n=65536", 0.4, "warm")]
    # Warm rows 5x faster than the cold ones: new in the run, not "faster"...
    assert _verdicts(cold_only, both) == {
        ("n=4096", "cold"): "same", ("n=65536", "cold"): "same",
        ("n=4096", "warm"): "new", ("n=65536", "warm"): "new"}
    # ... missing from a run without them, never "slower"
    assert _verdicts(both, cold_only) == {
        ("n=4096", "cold"): "same", ("n=65536", "cold"): "same",
        ("n=4096", "warm"): "missing", ("n=65536", "warm"): "missing"}
    # Warm against warm is judged: 3x slower is slower, the cold row beside it the same.
    slower = cold_only + [_row("n=4096", 0.6, "warm"), _row("n=65536", 0.4, "warm")]
    got = _verdicts(both, slower)
    assert got[("n=4096", "warm")] == "slower" and got[("n=4096", "cold")] == "same"


def test_rows_written_before_the_cache_column_keep_their_devices_mode() -> None:
    # A GPU baseline from before the column: flushed, cold.
    legacy = [_row("n=4096", 1.0, cache=None)]
    run = [_row("n=4096", 1.0), _row("n=4096", 0.2, "warm")]
    assert _verdicts(legacy, run) == {("n=4096", "cold"): "same",
                                      ("n=4096", "warm"): "new"}
    assert _verdicts(legacy, [_row("n=4096", 1.0, cache=None)]) == {
        ("n=4096", "cold"): "same"}
    # A CPU baseline from before it: blocks of calls on the same buffers, warm.
    cpu = {"device": "cpu", "timer": timing_plan.TIMER_CPU}
    legacy = [_row("n=4096", 0.2, cache=None, **cpu)]
    run = [_row("n=4096", 0.2, "warm", **cpu),
           _row("n=4096", 1.0, "cold", device="cpu", timer=timing_plan.TIMER_CPU_ROTATED)]
    assert _verdicts(legacy, run) == {("n=4096", "warm"): "same",
                                      ("n=4096", "cold"): "new"}


def test_reports_name_warm_rows_and_keep_cold_names() -> None:
    base = [_row("n=4096", 1.0), _row("n=4096", 0.2, "warm")]
    run = [_row("n=4096", 1.0), _row("n=4096", 0.6, "warm")]
    verdicts = compare_frames(pd.DataFrame(base), pd.DataFrame(run), 10.0)
    entries = benchmark_entries([parse_row(r) for r in run], verdicts)
    names = {e.name: e.extra for e in entries}
    # A cold row's series keeps its name (github-action-benchmark tracks it by name).
    assert set(names) == {"add/torch/fp32/n=4096", "add/torch/fp32/n=4096/warm"}
    assert "slower" in names["add/torch/fp32/n=4096/warm"]
    assert "same" in names["add/torch/fp32/n=4096"]
    md = render_markdown(CompareResult(rows=verdicts, threshold=10.0, run_meta=RunMeta(
        device=DeviceFacts(device_key="h100"))))
    assert "| n=4096 (warm) | **slower** |" in md
    # On a CPU the native mode is warm: its rows keep their names, cold ones say so.
    cpu = {"device": "cpu", "timer": timing_plan.TIMER_CPU}
    run = [_row("n=4096", 0.2, "warm", **cpu), _row("n=4096", 1.0, "cold", **cpu)]
    names = {e.name for e in benchmark_entries([parse_row(r) for r in run])}
    assert names == {"add/torch/fp32/n=4096", "add/torch/fp32/n=4096/cold"}


# ---- re-timing times a warm row warm ------------------------------------------------------

def test_retiming_times_a_warm_row_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = timing.time_cpu

    def spy(fn, cfg, plan=None):
        seen.append("rotated" if isinstance(fn, Rotation) else "same buffers")
        return real(fn, cfg, plan)

    monkeypatch.setattr(timing, "time_cpu", spy)
    monkeypatch.setattr(retime_client, "RETIME_ROUNDS", 1)
    monkeypatch.setattr(retime_client, "RETIME_SPACING_S", 0.0)
    sent: list[dict[str, Any]] = []

    def child(*a: Any, input: str, **k: Any) -> SimpleNamespace:
        # The child process, in this process: the spec it gets, its answer as it prints it.
        sent.append(json.loads(input))
        asked = retime.RetimeSpec.from_json({**sent[-1], "device": "cpu"})
        answer = retime.retime(asked).to_json()
        return SimpleNamespace(returncode=0, stdout=json.dumps(answer), stderr="")

    monkeypatch.setattr(retime_client.subprocess, "run", child)
    spec = REGISTRY["add"]
    cases = [Case(spec, "torch", "fp32", {"n": 4096}, mode) for mode in ("cold", "warm")]
    cfg = cpu_cfg(timing=FAST)
    warm_key = ("add", "torch", "fp32", "n=4096", "warm")
    got = job.compare_retimer(cases, cfg, [])([warm_key])
    assert sent[0]["cases"] == [list(warm_key)]
    assert len(got[warm_key]) == 1 and len(got[warm_key][0]) >= FAST.gate_min_samples
    assert seen and set(seen) == {"same buffers"}  # every round warm
    seen.clear()
    cold_key = warm_key[:4] + ("cold",)
    got = job.compare_retimer(cases, cfg, [])([cold_key])
    assert got[cold_key] and set(seen) == {"rotated"}
    # A cold case keeps the id it had before cache modes existed.
    assert retime.case_id(cold_key) == "add|torch|fp32|n=4096"
    assert retime.case_id(warm_key) == "add|torch|fp32|n=4096|warm"


# ---- the CPU's cold timer rotates over copies past twice the last-level cache ------------

def _recording_add(log: list[tuple[int, int, float]]) -> Any:
    def fn(inputs: dict[str, Any], out: torch.Tensor) -> torch.Tensor:
        x = inputs["x"]
        log.append((x.data_ptr(), out.data_ptr(), float(x[-1])))
        return torch.add(x, inputs["y"], out=out)
    return fn


def test_cpu_cold_calls_rotate_over_copies_past_twice_the_cache() -> None:
    log: list[tuple[int, int, float]] = []
    c = case(fn=_recording_add(log), shape={"n": 4096})
    inputs = c.spec.make_inputs(c.shape, "fp32", 0, "cpu")
    out = c.spec.alloc_out(inputs, "fp32")
    footprint = c.spec.nbytes(c.shape, "fp32")  # x, y and out: 48 KiB
    one_round = dataclasses.replace(FAST, cpu_rounds=1)
    t, note = time_case(c, cpu_cfg(timing=one_round), inputs, out)
    assert t.timer == timing_plan.TIMER_CPU_ROTATED and note == ""
    xs = [x for x, _, _ in log]
    outs = {o for _, o, _ in log}
    copies = 2 * SMALL_LLC // footprint + 1  # the case's buffers and 10 copies
    assert len(set(xs)) == len(outs) == copies and len(xs) > 2 * copies
    assert copies * footprint > 2 * SMALL_LLC
    # Call after call on other buffers: no call finds the last one's inputs in cache.
    assert all(a != b for a, b in zip(xs, xs[1:], strict=False))
    # Each copy holds the inputs' values.
    assert {v for _, _, v in log} == {float(inputs["x"][-1])}


def test_cpu_warm_calls_run_on_the_same_buffers() -> None:
    log: list[tuple[int, int, float]] = []
    c = Case(case(fn=_recording_add(log)).spec, "torch", "fp32", {"n": 4096}, "warm")
    inputs = c.spec.make_inputs(c.shape, "fp32", 0, "cpu")
    one_round = dataclasses.replace(FAST, cpu_rounds=1)
    t, note = time_case(c, cpu_cfg(timing=one_round), inputs,
                         c.spec.alloc_out(inputs, "fp32"))
    assert t.timer == timing_plan.TIMER_CPU and note == ""
    assert len(log) > 2 and {x for x, _, _ in log} == {inputs["x"].data_ptr()}


def test_a_footprint_past_twice_the_cache_is_cold_by_size(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(timers, "host_llc_bytes", lambda: 16 * 2**10)  # 48 KiB > 2 x 16
    log: list[tuple[int, int, float]] = []
    row = run_case(case(fn=_recording_add(log), shape={"n": 4096}),
                   cpu_cfg(timing=FAST), InputCache())
    assert row.status == "ok" and row.timing.timer == timing_plan.TIMER_CPU
    assert row.case.cache == "cold" and "cold by size" in row.reason
    assert len({x for x, _, _ in log}) <= FAST.cpu_rounds + 1  # no copies made


def test_the_sweep_keeps_a_rows_copies_for_its_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = timers.make_copies
    monkeypatch.setattr(timers, "make_copies", lambda ins, out, n, scratch=None: (
        made.append(n), real(ins, out, n, scratch))[1])
    spec = with_torch_fn("add", _recording_add([]))
    cases = [Case(spec, "torch", "fp32", {"n": n}, mode) for n in (4096, 8192)
             for mode in ("cold", "warm")]
    # (the stopping rule off: every round is taken)
    timing = dataclasses.replace(FAST, ci_rel_width=0.0)
    rows = [row for _, row in runner.iterate(cases, cpu_cfg(timing=timing))]
    rotated, blocks = timing_plan.TIMER_CPU_ROTATED, timing_plan.TIMER_CPU
    assert [(r.case.shape, r.case.cache, r.timing.timer) for r in rows] == [
        ("n=4096", "cold", rotated), ("n=4096", "warm", blocks),
        ("n=8192", "cold", rotated), ("n=8192", "warm", blocks)]
    per_round = timing_plan.cpu_round_config(FAST).min_samples
    assert all(r.timing.n_samples >= FAST.cpu_rounds * per_round for r in rows)
    assert len(made) == 2  # once per cold row, not once per round


def test_interleaved_cold_rows_share_memory_and_time_their_own_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Four cold rows in one chunk, their rounds interleaved: their copies share one block
    # of memory, and every timed call sees its own row's input values.
    seen: dict[int, set[float]] = {}

    def fn(inputs: dict[str, Any], out: torch.Tensor) -> torch.Tensor:
        x = inputs["x"]
        seen.setdefault(x.numel(), set()).add(float(x[-1]))
        return torch.add(x, inputs["y"], out=out)

    spec = with_torch_fn("add", fn)
    cfg = cpu_cfg(timing=dataclasses.replace(FAST, cpu_chunk_s=60.0))
    sizes = (4096, 8192, 16384, 32768)
    cases = [Case(spec, "torch", "fp32", {"n": n}) for n in sizes]
    starts = []
    real = timers.make_copies
    monkeypatch.setattr(timers, "make_copies", lambda ins, out, n, scratch=None: (
        starts.append(scratch.block.data_ptr() if scratch and scratch.block is not None
                      else None), real(ins, out, n, scratch))[1])
    frozen: list[int] = []
    rows = []
    for _, row in runner.iterate(cases, cfg):
        frozen.append(gc.get_freeze_count())
        rows.append(row)
    assert all(r.status == "ok" and r.timing.timer == timing_plan.TIMER_CPU_ROTATED for r in rows)
    assert len(set(starts[1:])) == 1  # one block for all the rows' copies
    # The copies' objects were frozen out of the collector's way, and are unfrozen after.
    assert min(frozen) > 0 and gc.get_freeze_count() == 0
    for n in sizes:
        x = spec.make_inputs({"n": n}, "fp32", case_seed_of(spec, n), "cpu")["x"]
        assert seen[n] == {float(x[-1])}, n


def case_seed_of(spec: Any, n: int) -> int:
    from benches.sweep.cases import case_seed

    return case_seed(0, spec, "fp32", {"n": n})


def test_a_rotation_cycles_and_carries_on() -> None:
    ran: list[int] = []
    rot = Rotation([lambda i=i: ran.append(i) for i in range(3)])
    assert [f() for f in rot.block(5)] and ran == [0, 1, 2, 0, 1]
    rot()
    assert ran[-1] == 2
    for f in rot.block(2):
        f()
    assert ran[-2:] == [0, 1]


def test_copies_keep_values_strides_and_alignment() -> None:
    b = torch.randn(7, 50).t()  # column-major, as matmul's B
    inputs = {"a": torch.randn(3, 50), "b": b, "s": torch.tensor(2.0), "k": 3}
    out = torch.randn(3, 7)
    copies = make_copies(inputs, out, 4)
    assert len(copies.pairs) == 4 and copies.nbytes >= 4 * (150 + 350 + 21) * 4
    ptrs = set()
    for ins, o in copies.pairs:
        for name in ("a", "b"):
            assert torch.equal(ins[name], inputs[name])
            assert ins[name].stride() == inputs[name].stride()
            assert ins[name].data_ptr() % 64 == 0
            ptrs.add(ins[name].data_ptr())
        assert o.shape == out.shape and o.stride() == out.stride()
        assert o.data_ptr() % 64 == 0
        assert ins["s"] is inputs["s"] and ins["k"] == 3  # a scale is shared
    assert len(ptrs) == 8


def test_a_scratch_is_shared_and_refilled_per_row() -> None:
    scratch = Scratch(capacity=2**20)
    x, y = torch.randn(4096), torch.randn(4096)
    first = make_copies({"x": x}, torch.zeros(4096), 10, scratch)
    second = make_copies({"x": y}, torch.zeros(4096), 10, scratch)
    assert first.pairs[0][0]["x"].data_ptr() == second.pairs[0][0]["x"].data_ptr()
    assert all(torch.equal(ins["x"], y) for ins, _ in second.pairs)
    first.ready()  # its values back before its round
    assert all(torch.equal(ins["x"], x) for ins, _ in first.pairs)
    assert scratch.touched >= first.nbytes and scratch.block is not None
    assert scratch.block.numel() == 2**20  # one block, of its capacity
    # The row whose values the memory holds is not written again.
    first.pairs[0][0]["x"].fill_(0.0)
    first.ready()
    assert float(first.pairs[0][0]["x"].abs().sum()) == 0.0


# ---- the last-level cache, from sysfs ---------------------------------------------------

def _sysfs(root: Path, cpus: dict[int, list[tuple[int, str, str, str]]]) -> Path:
    for cpu, caches in cpus.items():
        for i, (level, kind, size, shared) in enumerate(caches):
            d = root / f"cpu{cpu}" / "cache" / f"index{i}"
            d.mkdir(parents=True)
            for name, value in (("level", level), ("type", kind), ("size", size),
                                ("shared_cpu_list", shared)):
                (d / name).write_text(f"{value}\n")
    return root


def test_the_last_level_cache_is_read_from_sysfs(tmp_path: Path) -> None:
    def l1(c: int) -> list[tuple[int, str, str, str]]:
        return [(1, "Data", "32K", str(c)), (1, "Instruction", "32K", str(c)),
                (2, "Unified", "1024K", str(c))]

    one = _sysfs(tmp_path / "one", {c: l1(c) + [(3, "Unified", "32768K", "0-1")]
                                    for c in (0, 1)})
    assert timing_plan.read_llc(one, {0, 1}) == (32 * 2**20, 1)
    # Two sockets (or chiplets), one L3 each: an op on both CPUs can use both.
    two = _sysfs(tmp_path / "two", {c: l1(c) + [(3, "Unified", "16M", str(c))]
                                    for c in (0, 1)})
    assert timing_plan.read_llc(two, {0, 1}) == (16 * 2**20, 2)
    assert timing_plan.read_llc(two, {1}) == (16 * 2**20, 1)  # this process on one CPU
    no_l3 = _sysfs(tmp_path / "no_l3", {0: l1(0)})  # the largest: L2
    assert timing_plan.read_llc(no_l3, {0}) == (2**20, 1)
    assert timing_plan.read_llc(tmp_path / "none") == (None, 0)
    assert timing_plan.cpu_cache_bytes(tmp_path / "none") == timing_plan.FALLBACK_LLC_BYTES


def test_cpu_rotation_sizes_and_caps_the_copies() -> None:
    llc = 32 * 2**20
    for footprint in (12 * 2**10, 3 * 2**20, 48 * 2**20, 64 * 2**20):
        copies, note = timing_plan.cpu_rotation(footprint, llc)
        assert note == "" and copies is not None
        assert 2 * llc < copies * footprint <= 2 * llc + footprint <= 4 * llc
    copies, note = timing_plan.cpu_rotation(64 * 2**20 + 1, llc)
    assert copies is None and note.startswith("cold by size")


# ---- GPU warm paths (torch.cuda faked) ---------------------------------------------------

def test_time_warm_pads_without_flushing(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu()
    gpu.install(monkeypatch, flush_us=85.0)
    monkeypatch.setattr(timing, "flush_buffer", lambda: pytest.fail("flushed"))

    def triton_call() -> None:  # 300 us of Python before a 5 us kernel
        gpu.op(300.0, 5.0)

    # (the stopping rule off: the count is the time cap's)
    cfg = TimingConfig(rep_ms=10.0, warmup_ms=1.0, min_samples=3, ci_rel_width=0.0)
    # Back to back without padding, the GPU waits for the host inside every sample...
    plain = timing.time_warm(triton_call, cfg)
    assert plain.timer == timing_plan.TIMER_WARM and min(plain.samples_ms) > 0.2
    # ... kept busy for 2 x 300 + 10 us before each start event: the kernel's 5 us.
    padded = timing.time_warm(triton_call, cfg, host_us=300.0)
    assert padded.samples_ms == (pytest.approx(0.005),) * padded.n_samples
    assert padded.n_samples == timing_plan.sample_count(0.615, cfg)


def _gpu_warm_case(kernel: str, shape: dict[str, int]) -> tuple[Case, dict, torch.Tensor]:
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, "fp32", 0, "cpu")
    return Case(spec, "torch", "fp32", shape, "warm"), inputs, spec.alloc_out(inputs, "fp32")


def test_a_warm_graph_case_is_a_graph_of_one_set_of_buffers(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    seen: list[list[Any]] = []

    def graph(calls: list[Any], cfg: TimingConfig, total: int,
              call_ms: float | None = None) -> GraphSampler:
        seen.append(list(calls))
        return GraphSampler(steady_sampler(0.001, 25), "", 0.0)

    monkeypatch.setattr(timers, "cudagraph_sampler", graph)
    monkeypatch.setattr(timers, "flushed_sampler", lambda *a, **k: pytest.fail("flushed"))
    monkeypatch.setattr(timers, "padded_sampler", lambda *a, **k: pytest.fail("not a graph"))
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(5.0, 0.01))
    monkeypatch.setattr(timers, "probe_call", lambda call: GraphProbe(1, 0.01))
    c, inputs, out = _gpu_warm_case("add", {"n": 4096})  # a few us at the roof: graph
    cfg = gpu_cfg()
    assert timers.timing_method(c, cfg) == timing_plan.TIMER_GRAPH
    t, note = time_case(c, cfg, inputs, out)
    assert t.timer == timing_plan.TIMER_GRAPH and t.host_us == 5.0 and note == ""
    assert len(seen) == 1 and len(seen[0]) == 1  # no rotated copies
    seen[0][0]()
    assert torch.equal(out, inputs["x"] + inputs["y"])  # on the case's own buffers
    # The cold twin rotates over copies past twice the L2.
    cold = Case(c.spec, "torch", "fp32", c.shape)
    time_case(cold, cfg, inputs, out)
    assert len(seen[1]) == timing_plan.rotation_copies(c.spec.nbytes(c.shape, "fp32"),
                                                  timers.l2_bytes(cfg))


def test_a_warm_flushed_class_case_uses_back_to_back_events(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    got: list[float | None] = []
    monkeypatch.setattr(timers, "flushed_sampler", lambda *a, **k: pytest.fail("flushed"))
    monkeypatch.setattr(timers, "padded_sampler",
                        lambda call, cfg, pad_us, flush, once_ms=None: (
                            got.append(pad_us), steady_sampler(0.5, 25))[1])
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(7.0, 0.01))
    c, inputs, out = _gpu_warm_case("add", {"n": 2**24})  # 200 MB: flushed class
    cfg = gpu_cfg()
    assert timers.timing_method(c, cfg) == timing_plan.TIMER_FLUSHED
    t, _ = time_case(c, cfg, inputs, out)
    assert t.timer == timing_plan.TIMER_WARM and got == [flush_padding_us(7.0)]


def test_a_warm_graph_that_cannot_be_captured_falls_back_to_events(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(call: Any) -> int:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(timers, "probe_call", broken)
    monkeypatch.setattr(timers, "measure_dispatch", lambda call, sync: Dispatch(5.0, 0.01))
    monkeypatch.setattr(timers, "padded_sampler",
                        lambda call, cfg, pad_us, flush, once_ms=None: steady_sampler(0.5, 25))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    c, inputs, out = _gpu_warm_case("add", {"n": 4096})
    t, note = time_case(c, gpu_cfg(), inputs, out)
    assert t.timer == timing_plan.TIMER_WARM_FALLBACK
    assert note.startswith("timed back to back without a CUDA graph") and "capturing" in note


def test_a_warm_cudagraph_replays_one_calls_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch)
    calls: list[int] = []
    cfg = TimingConfig(graph_min_calls=50, min_samples=25, rep_ms=10.0)
    total = timing_plan.graph_calls(1, cfg)
    t = graph_timing.time_cudagraph([lambda: calls.append(1)], cfg, total)
    assert t.timer == timing_plan.TIMER_GRAPH and total == cfg.graph_min_calls
    assert len(calls) == 1 + total  # the warm-up call, then the captured ones


# ---- the roofline and summary.md ---------------------------------------------------------

def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    full = []
    for r in rows:
        full.append(dict.fromkeys(ALL_COLUMNS) | {
            "kernel": "add", "dtype": "fp32", "status": "ok", "flops": r["n"],
            "bytes": 12 * r["n"], "intensity": 1 / 12, "roof_class": "fp32",
            "tflops": r["n"] / (r["ms"] * 1e-3) / 1e12, "gbps": 12 * r["n"] / r["ms"] / 1e6,
            "ms_median": r["ms"], "shape": f"n={r['n']}", "provider": r.get("p", "torch"),
            "cache": r.get("cache", "cold")})
    return pd.DataFrame(full, columns=ALL_COLUMNS)


META = {"device_key": "h100", "device_kind": "cuda", "l2_mb": 50,
        "ceilings": {"measured": {"tflops": {"fp32": 50.0}, "hbm_gbps": 3000.0,
                                  "l2_gbps": 9000.0}}}


def test_the_roofline_marks_warm_points_hollow_and_draws_the_l2_roof() -> None:
    df = _frame([{"n": 2**20, "ms": 0.02}, {"n": 2**20, "ms": 0.006, "cache": "warm"}])
    fig = plot_roofline(doc_of(META, df))
    ax = fig.axes[0]
    pts = {c.get_gid(): c for c in ax.collections}
    assert set(pts) == {"points:fp32:add:torch", "points:fp32:add:torch:warm"}
    assert pts["points:fp32:add:torch:warm"].get_facecolors().size == 0  # hollow
    assert pts["points:fp32:add:torch"].get_facecolors()[0][3] > 0  # filled
    assert "roof:measured:l2" in {ln.get_gid() for ln in ax.lines}
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any(t.startswith("warm") for t in labels)
    # A cold-only run has no warm legend entry.
    cold = plot_roofline(doc_of(META, _frame([{"n": 2**20, "ms": 0.02}])))
    assert not any(t.get_text().startswith("warm") for leg in cold.legends
                   for t in leg.get_texts())


def test_a_baseline_overlay_pairs_warm_with_warm_only() -> None:
    old = _frame([{"n": 2**20, "ms": 0.02}])
    new = _frame([{"n": 2**20, "ms": 0.02}, {"n": 2**20, "ms": 0.004, "cache": "warm"}])
    fig = plot_roofline(doc_of(META, new), baseline=doc_of({}, old))
    arrows = [t.get_gid() for t in fig.axes[0].texts if str(t.get_gid()).startswith("arrow")]
    assert arrows == []  # the cold row did not move; the warm one has no baseline


def test_the_summary_lists_the_largest_warm_cold_gaps() -> None:
    df = _frame([{"n": 2**10, "ms": 0.010}, {"n": 2**10, "ms": 0.008, "cache": "warm"},
                 {"n": 2**20, "ms": 0.020}, {"n": 2**20, "ms": 0.005, "cache": "warm"},
                 {"n": 2**25, "ms": 0.200}, {"n": 2**25, "ms": 0.190, "cache": "warm"},
                 {"n": 2**20, "ms": 0.010, "p": "triton"},
                 {"n": 2**20, "ms": 0.001, "p": "triton", "cache": "warm"}])
    md = render_summary(doc_of(META, df))
    gap = md[md.index("## Warm vs cold"):]
    gap = gap[:gap.index("\n## ")]
    lines = [ln for ln in gap.splitlines() if ln.startswith("| add")]
    assert [ln.split(" | ")[1] for ln in lines] == ["triton", "torch", "torch", "torch"]
    assert "`n=1048576` | 12 | 0.01 | 0.001 | 10.00x | yes" in lines[0]
    assert lines[-1].endswith("| no |")  # 384 MiB does not fit in the 50 MiB L2
    # Triton vs torch holds cold against cold only: one ratio, 2.00x.
    ratios = md[md.index("## Triton vs torch"):md.index("## Warm vs cold")]
    assert "2.00x" in ratios and "0.20x" not in ratios and "20.00x" not in ratios


def test_warm_rows_that_fit_are_held_against_the_cache_roof() -> None:
    from contract.run_meta import parse_meta
    from roofline.report.findings import effective_roofs

    df = _frame([{"n": 2**16, "ms": 0.001}, {"n": 2**16, "ms": 0.0005, "cache": "warm"},
                 {"n": 2**25, "ms": 0.2, "cache": "warm"}])
    df["roof_tflops"] = df["intensity"] * 3000.0 / 1e3
    df["peak_tflops"] = 50.0
    roofs = list(effective_roofs(df, parse_meta(META))["roof"])
    # Cold (the L2 flushed): the HBM roof; warm and inside the 50 MiB L2: the L2 roof;
    # warm but 384 MiB: HBM again.
    assert roofs == ["HBM", "cache", "HBM"]
    cpu = parse_meta({"device_kind": "cpu", "device_key": "cpu", "llc_mb": 32,
                      "ceilings": {"measured": {"tflops": {"fp32": 1.0}, "hbm_gbps": 20.0,
                                                "l2_gbps": 150.0}}})
    # A cold CPU row now rotates past the cache: the DRAM roof; a row written before the
    # cache column ran on the same buffers: the cache roof, as before.
    legacy = df.iloc[:1].assign(cache=None, device="cpu")
    assert list(effective_roofs(df.iloc[:2], cpu)["roof"]) == ["DRAM", "cache"]
    assert list(effective_roofs(legacy, cpu)["roof"]) == ["cache"]
