"""Runs that are never lost: exclusive run folders, checks before measuring, signals,
aborted sweeps and --resume (docs/design.md, Reliability)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import run_bench
from benches.sweep import job, run_folder, runner
from contract.schema import ROWS_JOURNAL, journal_rows, load_doc
from tests.run_docs import load_run

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--device", "cpu", "--sizes", "n=2048", "--kernels", "add,mul", "--dtypes", "fp32",
        "--providers", "torch", "--no-plots"]


def _fake_ceilings(monkeypatch) -> None:
    """Ceilings take seconds to measure on a CPU; these tests are about the run's files."""
    from contract.ceilings import Ceilings

    fake = {"tflops": {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0, "fp8": 1.0},
            "hbm_gbps": 10.0, "l2_gbps": 50.0, "method": {}}
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, fake))


@pytest.fixture(autouse=True)
def _no_ceiling_measurement(monkeypatch):
    _fake_ceilings(monkeypatch)


def _run(tmp_path: Path, *extra: str) -> int:
    return run_bench.main([*TINY, "--out", str(tmp_path), *extra])


def _one_line_error(capsys, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err, err
    assert len(err.splitlines()) == 1


def test_reused_run_id_is_refused_and_the_run_kept(tmp_path, capsys):
    assert _run(tmp_path, "--run-id", "r") == 0
    before = (tmp_path / "cpu" / "r" / "results.json").read_text()
    assert _run(tmp_path, "--run-id", "r", "--kernels", "add") == 2
    _one_line_error(capsys, "already exists")
    assert (tmp_path / "cpu" / "r" / "results.json").read_text() == before


def test_comparing_with_itself_by_run_id_cannot_overwrite_the_baseline(tmp_path, capsys):
    assert _run(tmp_path, "--run-id", "ref") == 0
    before = (tmp_path / "cpu" / "ref" / "results.json").read_text()
    code = _run(tmp_path, "--run-id", "ref", "--compare", str(tmp_path / "cpu" / "ref"))
    assert code == 2
    assert (tmp_path / "cpu" / "ref" / "results.json").read_text() == before


def test_automatic_ids_never_collide(tmp_path, monkeypatch):
    class Frozen:
        @staticmethod
        def now(tz=None):
            import datetime as dt

            return dt.datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_folder, "datetime", Frozen)
    assert _run(tmp_path) == 0
    assert _run(tmp_path) == 0
    names = sorted(p.name for p in (tmp_path / "cpu").iterdir())
    assert names == ["20260102-030405", "20260102-030405-2"]
    for n in names:
        assert len(load_run(tmp_path / "cpu" / n)[1]) == 2


@pytest.mark.parametrize("run_id", ["../../escape", "a/b", "..", ".hidden", ""])
def test_run_ids_are_plain_names(tmp_path, capsys, run_id):
    assert _run(tmp_path / "out", "--run-id", run_id) == 2
    _one_line_error(capsys, "plain name")
    assert not (tmp_path / "escape").exists() and not (tmp_path / "out").exists()


def test_unusable_output_paths_are_one_line_errors(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    for out, needle in [(f, "not a folder"), ("/dev/null/x", "cannot create"),
                        ("/proc/x", "cannot create")]:
        assert run_bench.main([*TINY, "--out", str(out)]) == 2
        _one_line_error(capsys, needle)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "cpu").write_text("x")
    assert run_bench.main([*TINY, "--out", str(tmp_path / "o")]) == 2
    _one_line_error(capsys, "not a folder")


def test_output_paths_are_checked_before_the_ceilings(tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise AssertionError("ceilings measured before the paths were checked")

    monkeypatch.setattr(job, "get_ceilings", boom)
    (tmp_path / "cpu").write_text("x")
    assert run_bench.main([*TINY, "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "not a folder")


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_bad_threshold_fails_first(tmp_path, capsys, value):
    assert _run(tmp_path, "--threshold", value) == 2
    _one_line_error(capsys, "threshold")
    assert not (tmp_path / "cpu").exists()


@pytest.mark.parametrize("content,needle", [
    ("{not json", ""),
    ("", ""),
    ('{"metadata": [], "rows": []}', "metadata"),
    ('[1, 2]', ""),
])
def test_bad_baseline_fails_before_measuring(tmp_path, capsys, content, needle):
    base = tmp_path / "base.json"
    base.write_text(content)
    assert _run(tmp_path / "o", "--compare", str(base)) == 2
    _one_line_error(capsys, needle)
    assert not (tmp_path / "o" / "cpu").exists()  # no run folder, nothing measured


def test_files_get_the_umask_mode(tmp_path):
    assert _run(tmp_path, "--run-id", "m") == 0
    mask = os.umask(0)
    os.umask(mask)
    for p in (tmp_path / "cpu" / "m").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p


def test_rows_keep_their_raw_samples(tmp_path):
    assert _run(tmp_path, "--run-id", "s") == 0
    doc = json.loads((tmp_path / "cpu" / "s" / "results.json").read_text())
    for row in doc["rows"]:
        assert row["status"] == "ok"
        assert len(row["samples_ms"]) == row["n_samples"] >= 1
        assert min(row["samples_ms"]) <= row["ms_median"] <= max(row["samples_ms"])
    assert "samples_ms" not in (tmp_path / "cpu" / "s" / "results.csv").read_text()


@pytest.fixture(autouse=True)
def _sigint_raises():
    """SIGINT raises KeyboardInterrupt in these tests even where the test process was
    started with SIGINT ignored (a background job of a non-interactive shell)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_at(monkeypatch, n: int, sig: int) -> None:
    real = runner.run_case
    calls = {"n": 0}

    def flaky(case, cfg, cache, *rest):
        calls["n"] += 1
        if calls["n"] == n:
            signal.raise_signal(sig)
        return real(case, cfg, cache, *rest)

    monkeypatch.setattr(runner, "run_case", flaky)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_keep_rows_and_mark_the_run(tmp_path, monkeypatch, sig, code):
    _interrupt_at(monkeypatch, 2, sig)
    assert _run(tmp_path, "--run-id", "i") == code
    meta, df = load_run(tmp_path / "cpu" / "i")
    assert len(df) == 1 and meta["interrupted"] is True and meta["complete"] is False


def test_interrupt_during_ceilings_exits_130_and_can_resume(tmp_path, monkeypatch):
    good = job.get_ceilings

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "get_ceilings", interrupted)
    assert _run(tmp_path, "--run-id", "c") == 130
    meta, df = load_run(tmp_path / "cpu" / "c")
    assert meta["interrupted"] is True and len(df) == 0
    monkeypatch.setattr(job, "get_ceilings", good)
    # the ceilings were never measured: a resume of this run must not hold rows against
    # nothing, so it measures them
    assert run_bench.main(["--resume", str(tmp_path / "cpu" / "c")]) == 0
    meta, df = load_run(tmp_path / "cpu" / "c")
    assert len(df) == 2 and meta["complete"] is True
    assert (df.peak_gbps > 0).all()


def test_interrupt_while_plotting_keeps_rows(tmp_path, monkeypatch):
    def slow_plot(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "finish_run", slow_plot)
    assert _run(tmp_path, "--run-id", "p") == 130
    meta, df = load_run(tmp_path / "cpu" / "p")
    assert len(df) == 2 and meta["interrupted"] is True


def test_resume_finishes_only_the_missing_cases(tmp_path, monkeypatch):
    argv = ["--device", "cpu", "--sizes", "n=2048;n=4096", "--kernels", "add,mul",
            "--dtypes", "fp32,bf16", "--providers", "torch", "--no-plots", "--out",
            str(tmp_path), "--run-id", "x"]
    _interrupt_at(monkeypatch, 4, signal.SIGINT)
    assert run_bench.main(argv) == 130
    _, first = load_run(tmp_path / "cpu" / "x")
    # Interrupted in the first round of the chunk: 3 rows kept, timed in 1 round of 5.
    rows = load_doc(tmp_path / "cpu" / "x").rows
    assert len(first) == 3 and all(runner.cut_short(r) for r in rows)
    assert set(first["reason"]) == {"timed in 1 of 5 rounds only (stopped by SIGINT)"}
    monkeypatch.undo()
    _fake_ceilings(monkeypatch)
    seen = []
    real = runner.run_case
    monkeypatch.setattr(runner, "run_case", lambda c, cfg, cache, *rest:
                        seen.append(c.label) or real(c, cfg, cache, *rest))
    assert run_bench.main(["--resume", str(tmp_path / "cpu" / "x"), "--no-plots"]) == 0
    meta, df = load_run(tmp_path / "cpu" / "x")
    # The 5 missing cases and the 3 cut short, once each; the short rows are replaced.
    assert len(df) == 8 and len(seen) == 8
    assert not df.duplicated(["kernel", "provider", "dtype", "shape"]).any()
    assert not any(runner.cut_short(r) for r in load_doc(tmp_path / "cpu" / "x").rows)
    assert (df["n_samples"] >= 25).all()
    assert meta["complete"] is True and len(meta["resumed"]) == 1
    assert meta["resumed"][0]["rows_before"] == 3
    assert meta["resumed"][0]["retimed_cut_short"] == 3
    assert run_bench.main(["--resume", str(tmp_path / "cpu" / "x")]) == 2  # complete now


def test_aborted_sweep_stops_at_once(tmp_path, monkeypatch):
    real = runner.run_case
    calls = {"n": 0}

    def dies(case, cfg, cache, *rest):
        calls["n"] += 1
        if calls["n"] == 2:
            row = dataclasses.replace(
                runner.base_row(case, cfg), status="failed",
                reason="AcceleratorError: CUDA error: an illegal memory access was "
                       "encountered")
            raise runner.SweepAborted(row, row.reason)
        return real(case, cfg, cache, *rest)

    monkeypatch.setattr(runner, "run_case", dies)
    code = run_bench.main(["--device", "cpu", "--sizes", "n=2048;n=4096", "--kernels", "add",
                           "--dtypes", "fp32,bf16", "--providers", "torch", "--no-plots",
                           "--out", str(tmp_path), "--run-id", "ab"])
    assert code != 0 and calls["n"] == 2
    meta, df = load_run(tmp_path / "cpu" / "ab")
    assert len(df) == 2 and df.iloc[1].status == "failed"
    assert meta["aborted"] is True and "illegal memory access" in meta["abort_reason"]
    assert meta["complete"] is False
    summary = (tmp_path / "cpu" / "ab" / "summary.md").read_text()
    assert "abort" in summary.lower()


# A hang guard only: a run that has made no row in this long is hung, not slow.  The
# tests wait for the state they need, never a time in which a quiet machine reaches it.
HANG_GUARD_S = 1800


def test_sigterm_from_outside_exits_143_without_traceback(tmp_path):
    """A real SIGTERM to a running process: exit 143, rows kept, no traceback.  Sent once
    the run's journal holds a row, however long the ceilings take on a busy machine; the
    run has 2,000 rows, far more than pass before the signal lands (with fast CPU timing
    400 rows once finished before it, under load)."""
    log = tmp_path / "stderr.txt"  # a file, not a pipe nobody reads while waiting
    with open(log, "w") as stderr:
        p = subprocess.Popen(
            [sys.executable, "run_bench.py", "--device", "cpu", "--sizes",
             ";".join(f"n={2048 + i}" for i in range(2000)), "--kernels", "add",
             "--dtypes", "fp32", "--providers", "torch", "--no-plots", "--out",
             str(tmp_path / "out"), "--run-id", "t", "--no-measure-ceilings"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        _wait_for_a_journal_row(p, tmp_path / "out" / "cpu" / "t" / ROWS_JOURNAL, log)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=HANG_GUARD_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = log.read_text()
    assert p.returncode == 143, err
    assert "Traceback" not in err
    meta, df = load_run(tmp_path / "out" / "cpu" / "t")
    assert meta["interrupted"] is True and meta.get("signal") == "SIGTERM" and len(df) >= 1


def _wait_for_a_journal_row(p: subprocess.Popen, journal: Path, log: Path) -> None:
    import time

    guard = time.monotonic() + HANG_GUARD_S
    while not (journal.exists() and journal_rows(journal)):
        if p.poll() is not None:
            pytest.fail(f"the run ended (exit {p.returncode}) before its first row: "
                        f"{log.read_text()[-2000:]}")
        assert time.monotonic() < guard, f"no row in {HANG_GUARD_S} s: the run hangs"
        time.sleep(0.05)


@pytest.mark.parametrize("cached", [
    [1, 2], {"tflops": [], "hbm_gbps": 5.0}, {"tflops": {"fp32": "fast"}, "hbm_gbps": 5.0},
    {"tflops": {"fp32": 1.0}, "hbm_gbps": -3}, {"tflops": {"fp32": 1.0}, "hbm_gbps": 5.0,
                                                 "l2_gbps": "x"}, "text"])
def test_a_bad_ceiling_cache_is_measured_again(tmp_path, monkeypatch, cached):
    from benches import measured_ceilings as ceilings
    from contract.devices import DEVICES, host_cpu

    monkeypatch.delenv(ceilings.CACHE_DIR_ENV, raising=False)  # the cache is tmp_path
    present = host_cpu()
    path = tmp_path / f"ceilings-{ceilings.cache_key(present)}.json"
    path.write_text(json.dumps(cached))
    fresh = {"tflops": {"fp32": 0.5}, "hbm_gbps": 20.0, "l2_gbps": None, "method": {}}
    monkeypatch.setattr(ceilings, "measure", lambda present, log=print: fresh)
    got = ceilings.get_ceilings(DEVICES["cpu"], present, tmp_path, log=lambda m: None)
    assert got.peak_tflops("fp32") == 0.5 and got.peak_gbps() == 20.0
    assert json.loads(path.read_text()) == fresh  # the bad cache is replaced


def test_the_ceiling_cache_folder_can_be_set_for_every_command(tmp_path, monkeypatch):
    """$GPUBENCH_CEILINGS_DIR replaces the folder a command passes (<out>/.ceilings,
    results/.ceilings): the suite points it at a temporary cache, so tests never write
    a user's measured peaks."""
    from benches import measured_ceilings as ceilings
    from contract.devices import DEVICES, host_cpu

    fresh = {"tflops": {"fp32": 0.5}, "hbm_gbps": 20.0, "l2_gbps": None, "method": {}}
    monkeypatch.setattr(ceilings, "measure", lambda present, log=print: fresh)
    monkeypatch.setenv(ceilings.CACHE_DIR_ENV, str(tmp_path / "session"))
    got = ceilings.get_ceilings(DEVICES["cpu"], host_cpu(), tmp_path / "results" / ".ceilings",
                                log=lambda m: None)
    assert got.peak_gbps() == 20.0 and not (tmp_path / "results").exists()
    assert [f.name for f in (tmp_path / "session").iterdir()] == \
        [f"ceilings-{ceilings.cache_key(host_cpu())}.json"]


def test_compare_confirms_a_real_slowdown_in_fresh_processes(tmp_path, capsys):
    """A baseline row made 3x faster: the run looks slower there, the re-timing rounds
    (child processes) confirm it, and the gate fails naming that row only."""
    assert _run(tmp_path, "--run-id", "base") == 0
    doc = json.loads((tmp_path / "cpu" / "base" / "results.json").read_text())
    row = next(r for r in doc["rows"] if r["kernel"] == "mul")
    row["samples_ms"] = [x / 3 for x in row["samples_ms"]]
    for k in ("ms_median", "ms_p20", "ms_p80"):
        row[k] /= 3
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    capsys.readouterr()
    assert _run(tmp_path, "--run-id", "new", "--compare", str(base)) == 1
    out = capsys.readouterr().out
    assert "each in a fresh process" in out
    report = (tmp_path / "cpu" / "new" / "compare.md").read_text()
    slower = [line for line in report.splitlines() if "**slower**" in line]
    assert len(slower) == 1 and "| mul |" in slower[0]
    assert "1 confirmed" in report
