"""The sweep waits after its ceilings for its compile-ahead workers, up to
GPUBENCH_COMPILE_WAIT_S, and its metadata says why a worker compiled nothing
(benches/sweep/triton_cache.after_ceilings).  The workers run fake compile functions
(tests/compile_wait_fakes.py, tests/compile_ahead_fakes.py): no GPU, no Triton."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benches.sweep import triton_cache
from benches.sweep.time_split import TimeSplit
from contract.request import RequestError

FAKES = "tests.compile_wait_fakes"


def _jobs(*ms: int) -> list[triton_cache.Job]:
    return [("add", "fp32", {"ms": m}, 132, (9, 0)) for m in ms]


def _after_ceilings(ahead: triton_cache.CompileAhead) -> tuple[dict, TimeSplit, list[str],
                                                                float]:
    """The sweep's wait: its record, time split, console lines and seconds taken."""
    split, said = TimeSplit(), []
    t0 = time.monotonic()
    record = triton_cache.after_ceilings(ahead, split, say=said.append)
    return record, split, said, time.monotonic() - t0


def _ready_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int
                   ) -> triton_cache.CompileAhead:
    """Early workers that have started and wait for their jobs (each preloaded the
    marker module and called it), so a test's deadline times jobs, not start-ups."""
    marker = tmp_path / "preloaded"
    monkeypatch.setenv("COMPILE_AHEAD_MARKER", str(marker))
    spawned = triton_cache.CompileAhead(n, ("tests.compile_ahead_fakes_preload:mark",),
                                        early=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            not marker.exists() or marker.read_text().count("called") < n):
        time.sleep(0.02)
    assert marker.read_text().count("called") == n
    return spawned


def test_the_wait_ends_once_the_workers_have_done_every_job(monkeypatch):
    """6 jobs of 0.2 s on 2 workers: all 6 compiled, the wait over about 0.6 s after the
    workers start, not at the 90 s deadline; booked as compile time and said in one line."""
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    ahead = triton_cache.CompileAhead(2).submit(_jobs(*[200] * 6), "fast",
                                                compile_fn=f"{FAKES}:slept")
    record, split, said, took = _after_ceilings(ahead)
    assert record["cases_done"] == 6 and record["kernels_compiled"] == 6
    assert record["worker_errors"] == [] and record["cases_failed"] == 0
    assert 0.5 <= record["waited_s"] < 10 and took < 15
    assert split.seconds["compile"] == pytest.approx(ahead.waited_s, abs=0.05)
    assert said == [f"compiled ahead: 6 of 6 cases (6 kernels, 6 built) by 2 workers, "
                    f"{record['waited_s']:.1f} s after the ceilings"]
    assert record["wait_ended"] == "done"


def test_the_deadline_holds_and_what_was_done_counts(tmp_path, monkeypatch):
    """Two short jobs, then four of 5 s, on 2 ready workers with a 0.5 s deadline: the
    wait and the stop are over within 1.5 s, the two short jobs counted."""
    spawned = _ready_workers(tmp_path, monkeypatch, 2)
    monkeypatch.setenv(triton_cache.WAIT_ENV, "0.5")
    ahead = spawned.submit(_jobs(20, 20, 5000, 5000, 5000, 5000), "fast",
                           compile_fn=f"{FAKES}:slept")
    record, split, said, took = _after_ceilings(ahead)
    assert took < 1.5 and 0.45 <= record["waited_s"] <= 1.0
    assert record["cases_done"] == 2 and record["kernels_compiled"] == 2
    assert record["worker_errors"] == []  # stopped by the sweep: no failure
    assert 0.45 <= split.seconds["compile"] < 1.0
    assert said[0].startswith("compiled ahead: 2 of 6 cases (2 kernels, 2 built) by 2 "
                              "workers, ")
    assert said[0].endswith(" s after the ceilings (ended: deadline)")
    assert record["wait_ended"] == "deadline"


def test_a_warm_cache_ends_the_wait_at_the_workers_first_results(tmp_path, monkeypatch):
    """Workers whose first results (one a worker) all found their kernels in Triton's
    cache end the wait there: the sweep loads the rest as fast itself, so a warm run
    waits for the workers' start-up at most, not for their 10 jobs of 0.5 s.  One build
    among them keeps it waiting."""
    spawned = _ready_workers(tmp_path, monkeypatch, 2)
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    ahead = spawned.submit(_jobs(20, 20, *[500] * 10), "fast", compile_fn=f"{FAKES}:loaded")
    record, _, said, took = _after_ceilings(ahead)
    # not the 2.5 s the ten jobs take on two workers (a busy machine delays the first
    # results, never the rule)
    assert record["wait_ended"] == "cache warm" and record["cases_done"] < 12
    assert record["waited_s"] < 2.0 and took < 3.0 and record["kernels_built"] == 0
    assert said[0].endswith(" s after the ceilings (ended: cache warm)")

    # a kernel or a launcher built among the first results, or an error: cold
    for fake in ("slept", "boom"):
        (tmp_path / fake).mkdir()
        spawned = _ready_workers(tmp_path / fake, monkeypatch, 2)
        ahead = spawned.submit(_jobs(20, 20, *[300] * 6), "fast",
                               compile_fn=f"{FAKES}:{fake}")
        assert _after_ceilings(ahead)[0]["wait_ended"] == "done"


def test_no_wait_stops_the_workers_when_the_ceilings_end(tmp_path, monkeypatch):
    """GPUBENCH_COMPILE_WAIT_S=0, the old way: stopped at once, nothing waited or booked."""
    spawned = _ready_workers(tmp_path, monkeypatch, 2)
    monkeypatch.setenv(triton_cache.WAIT_ENV, "0")
    ahead = spawned.submit(_jobs(5000, 5000, 5000), "fast", compile_fn=f"{FAKES}:slept")
    record, split, _, took = _after_ceilings(ahead)
    assert took < 1.0 and record["waited_s"] == 0.0 and split.seconds["compile"] == 0.0
    assert record["cases_done"] == 0


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "90s"])
def test_a_bad_wait_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv(triton_cache.WAIT_ENV, value)
    with pytest.raises(RequestError) as e:
        triton_cache.wait_s()
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"{triton_cache.WAIT_ENV}={value!r}: ")


@pytest.mark.parametrize(("value", "seconds"), [(None, 90.0), ("", 90.0), ("0", 0.0),
                                                 (" 2.5 ", 2.5)])
def test_the_wait_s_default_and_values(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    else:
        monkeypatch.setenv(triton_cache.WAIT_ENV, value)
    assert triton_cache.wait_s() == seconds


@pytest.mark.parametrize("env, value", [
    (triton_cache.WAIT_ENV, "soon"),
    # a count that is not one used to mean no worker, silently
    (triton_cache.WORKERS_ENV, "many"), (triton_cache.WORKERS_ENV, "-1"),
    (triton_cache.WORKERS_ENV, "2.5")])
def test_the_command_refuses_a_bad_setting_before_anything_runs(
        monkeypatch, tmp_path, capsys, env, value):
    import run_bench

    for name in (triton_cache.WAIT_ENV, triton_cache.WORKERS_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(env, value)
    code = run_bench.main(["--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
                           "--sizes", "4096", "--out", str(tmp_path), "--no-plots"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"error: {env}={value!r}: ")
    assert not list(tmp_path.iterdir())  # no run folder: refused before the run


def test_a_blank_worker_count_is_the_default_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv(triton_cache.WORKERS_ENV, " ")
    assert triton_cache.default_workers() >= 0
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "-3")
    with pytest.raises(ValueError, match="give the number of compile-ahead worker"):
        triton_cache.default_workers()


def test_a_compile_function_that_cannot_be_imported_is_named(monkeypatch):
    """A compile function whose module is missing fails every job at once, said once
    for all; the workers' logs are gone after."""
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    ahead = triton_cache.CompileAhead(2).submit(_jobs(10, 10, 10), "fast",
                                                compile_fn="tests.no_such_fakes:slept")
    record, _, said, took = _after_ceilings(ahead)
    assert took < 30 and record["cases_done"] == 0 and record["cases_failed"] == 3
    assert record["worker_errors"] == [
        "add fp32: compile function tests.no_such_fakes:slept: ModuleNotFoundError: No "
        "module named 'tests.no_such_fakes' (and 2 more cases)"]
    assert said[1] == ("[yellow]warning[/yellow]: a compile-ahead worker: "
                       + record["worker_errors"][0])
    assert not os.path.exists(ahead.logs)  # read, then removed


def test_a_failed_preload_and_an_early_worker_that_died_are_named(monkeypatch):
    """Early workers whose preload failed still compile (their jobs' own imports say
    more), and the preload line is kept; a worker that died before its jobs (its import
    ended the process) leaves its exit code and last line, and the sweep compiles the
    jobs itself (a pool whose worker died takes none)."""
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    # a preload stops at its first failure: one line for one cause, not one per name
    spawned = triton_cache.CompileAhead(2, (f"{FAKES}:broken_preload", "tests.no_such_fakes"),
                                        early=True)
    ahead = spawned.submit(_jobs(10, 10, 10, 10), "fast", compile_fn=f"{FAKES}:slept")
    record, _, _, _ = _after_ceilings(ahead)
    assert record["cases_done"] == 4
    assert record["worker_errors"] == [
        f"preload {FAKES}:broken_preload: ImportError: libcuda.so.1: cannot open shared "
        "object file"]
    dying = triton_cache.CompileAhead(1, (f"{FAKES}:dies",), early=True)
    dying.procs[0].join(30)
    ahead = dying.submit(_jobs(10, 10), "fast", compile_fn=f"{FAKES}:slept")
    record, _, _, took = _after_ceilings(ahead)
    assert record["cases_done"] == 0 and record["cases"] == 2 and took < 10
    assert record["worker_errors"] == [
        "worker exited with code 3: Fatal Python error: the fake's import aborted"]


def test_the_jobs_errors_are_named_once_each(monkeypatch):
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    jobs = [("boom", d, {"n": 1}, 132, None) for d in ("bf16", "fp16", "fp32")] + [
        ("add", "fp32", {"n": 1}, 132, None)]
    ahead = triton_cache.CompileAhead(2).submit(jobs, "fast",
                                                compile_fn="tests.compile_ahead_fakes:counted")
    record, _, said, _ = _after_ceilings(ahead)
    assert record["cases_done"] == 1 and record["cases_failed"] == 3
    assert record["worker_errors"] == [
        "boom bf16: RuntimeError: ptxas failed (and 2 more cases)"]
    assert said[0].startswith("compiled ahead: 1 of 4 cases (1 kernel, 0 built, 3 cases "
                              "failed) by 2 workers, ")


def test_worker_errors_are_few_short_and_distinct(tmp_path):
    """At most MAX_ERRORS distinct lines of ERROR_CHARS, the exits first; a log's preload
    lines found at its head and its last line at its tail, with PTX-sized output
    between."""
    with contextlib.ExitStack():
        logs = str(tmp_path)
        for pid in range(8):
            (tmp_path / f"{pid}.log").write_bytes((
                "noise\n" * 3 + f"preload m{pid}: ImportError: {'x' * 400}\n"
                + "y" * 200_000 + f"\nlast words of {pid}\n\n").encode())
        got = triton_cache.worker_errors(logs, {0: 1, 1: -11, 2: 0}, ["e", "e"])
        assert got[:2] == ["worker exited with code 1: last words of 0",
                           "worker exited with code -11: last words of 1"]
        assert len(got) == triton_cache.MAX_ERRORS and len(set(got)) == len(got)
        assert all(len(e) <= triton_cache.ERROR_CHARS for e in got)
        assert got[2].startswith("preload m0: ImportError: xxx")
        # a worker that exited with 0 is no failure; its preload lines still are
        assert triton_cache.worker_errors(logs, {pid: 0 for pid in logs}, []) == [
            f"preload m{pid}: ImportError: {'x' * 400}"[:triton_cache.ERROR_CHARS]
            for pid in range(triton_cache.MAX_ERRORS)]


def test_the_sweep_waits_for_its_workers_after_the_ceilings(monkeypatch, tmp_path, capsys):
    """The command's sweep (on this CPU, its ceilings and compile-ahead stand-ins):
    after the ceilings it waits until the workers have done every job, books the wait
    as compile time, says so, and records it."""
    import run_bench
    from benches.sweep import job
    from contract.ceilings import Ceilings

    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    started = []

    def start(cases, cfg, fp8_mode, workers=None, spawned=None):
        started.append(triton_cache.CompileAhead(2).submit(_jobs(*[200] * 6), fp8_mode,
                                                           compile_fn=f"{FAKES}:slept"))
        return started[-1]

    monkeypatch.setattr(triton_cache, "start", start)
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, None))
    code = run_bench.main(["--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
                           "--sizes", "4096", "--out", str(tmp_path), "--no-plots",
                           "--check-only"])
    out = capsys.readouterr().out
    assert code == 0 and len(started) == 1
    meta = json.loads(next(tmp_path.glob("cpu/*/results.json")).read_text())["metadata"]
    ahead = meta["compiled_ahead"]
    assert ahead["cases_done"] == 6 and ahead["worker_errors"] == []
    assert 0.5 <= ahead["waited_s"] < 10
    assert meta["time_split_s"]["compile"] >= ahead["waited_s"] - 0.1
    assert (f"compiled ahead: 6 of 6 cases (6 kernels, 6 built) by 2 workers, "
            f"{ahead['waited_s']:.1f} s after the ceilings") in out


# A sweep waiting for its workers after the ceilings, inside its signal handling, as
# job._measure waits: the record is made whatever ends the wait.
WAITING = """
import json
from benches.sweep import triton_cache
from benches.sweep.interrupt import Terminated, signals_raise
from benches.sweep.time_split import TimeSplit

ahead = triton_cache.CompileAhead(2).submit([("add", "fp32", {"ms": 60000}, 132, None)] * 4,
                                           "fast", compile_fn="tests.compile_wait_fakes:slept")
split = TimeSplit()
try:
    with signals_raise():
        try:
            print(json.dumps([p.pid for p in ahead.procs]), flush=True)
            triton_cache.after_ceilings(ahead, split, say=lambda _: None)
        finally:
            record = ahead.record()
except Terminated:
    print("signalled", flush=True)
print(json.dumps({"record": record, "compile": split.seconds["compile"]}), flush=True)
"""


def test_a_sigterm_ends_the_wait_and_stops_the_workers(monkeypatch):
    """A CI runner's cancel during the 90 s wait: the wait ends at once, the workers are
    stopped, and what was waited is still booked and recorded."""
    monkeypatch.delenv(triton_cache.WAIT_ENV, raising=False)
    root = Path(__file__).resolve().parents[1]
    child = subprocess.Popen([sys.executable, "-c", WAITING], cwd=root, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        workers = json.loads(child.stdout.readline() or "null")
        assert workers, child.stderr.read() if child.stderr else ""
        time.sleep(0.5)
        t0 = time.monotonic()
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
    assert time.monotonic() - t0 < triton_cache.STOP_GRACE_S and child.returncode == 0, err
    lines = out.splitlines()
    assert lines[0] == "signalled"
    got = json.loads(lines[1])
    assert 0.3 <= got["record"]["waited_s"] < 5 and got["record"]["cases_done"] == 0
    assert got["compile"] == pytest.approx(got["record"]["waited_s"], abs=0.1)
    for pid in workers:  # reaped by stop(): gone
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(
            f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_worker_error_is_printed_as_it_is_not_as_markup(monkeypatch):
    """The sweep's console reads rich markup: an error's own brackets (a closing tag
    that matches nothing would raise) are printed as they are."""
    import io

    from rich.console import Console

    class Ahead:
        def wait(self, seconds: float) -> float:
            return 0.0

        def record(self) -> dict:
            return {"workers": 1, "cases": 1, "cases_done": 0, "cases_failed": 1,
                    "kernels_compiled": 0, "kernels_built": 0, "waited_s": 0.0,
                    "worker_errors": ["add fp32: RuntimeError: [/x] bad [bold]"]}

    monkeypatch.setenv(triton_cache.WAIT_ENV, "1")
    out = io.StringIO()
    triton_cache.after_ceilings(Ahead(), TimeSplit(), say=Console(file=out, width=200).print)
    assert out.getvalue().splitlines() == [
        "compiled ahead: 0 of 1 case (0 kernels, 0 built, 1 case failed) by 1 worker, "
        "0.0 s after the ceilings",
        "warning: a compile-ahead worker: add fp32: RuntimeError: [/x] bad [bold]"]
