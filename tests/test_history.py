"""The history store (append-only, a run added once, concurrent appends, bad input),
change points and `history report` (issue 29)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from roofline.history.cli import main as history
from roofline.history.errors import HistoryError
from roofline.history.store import MARKER, add_run, load_store

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "results" / "cpu" / "example" / "results.json"
# Rows of the committed example run used as templates: two add shapes, a matmul, and a
# skipped Triton row (kept in the store, never a point of a series).
TEMPLATE = [("add", "torch", "fp32", "n=4096"), ("add", "torch", "fp32", "n=65536"),
            ("matmul", "torch", "fp32", "M=256,N=256,K=256"),
            ("add", "triton", "fp32", "n=4096")]
SERIES = [k for k in TEMPLATE if k[1] == "torch"]


def write_run(folder: Path, i: int, factors: dict[tuple, float] | None = None,
              noise: float = 0.01, seed: int | None = None, skip: tuple = (),
              **meta) -> Path:
    """A run folder like run_bench.py's: the template rows with 25 samples each around
    the template's median x factor (log-normal noise of `noise`); rows keyed in `skip`
    are skipped."""
    doc = json.loads(EXAMPLE.read_text())
    rng = np.random.default_rng(i if seed is None else seed)
    by_key = {(r["kernel"], r["provider"], r["dtype"], r["shape"]): r for r in doc["rows"]}
    rows = []
    for key in TEMPLATE:
        r = dict(by_key[key])
        if key in skip:
            r.update(status="skipped", reason="skipped by the test")
        if r["status"] == "ok":
            f = (factors or {}).get(key, 1.0)
            s = r["ms_median"] * f * np.exp(rng.normal(0, noise, 25))
            r["samples_ms"] = s.tolist()
            r["ms_median"] = float(np.median(s))
            r["ms_p20"], r["ms_p80"] = (float(x) for x in np.percentile(s, [20, 80]))
            r["n_samples"] = 25
            r["tflops"], r["gbps"] = r["tflops"] / f, r["gbps"] / f
        rows.append(r)
    doc["rows"] = rows
    doc["metadata"].update({"run_id": f"r{i:03d}", "created": f"2026-11-{1 + i // 24:02d}T"
                            f"{i % 24:02d}:00:00+00:00", "git_commit": f"{i:04x}" + "c0ffee" * 6,
                            "complete": True, "interrupted": False, **meta})
    run = folder / f"r{i:03d}"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(doc))
    return run


def make_store(tmp: Path, runs: int, step_at: int | None = None, step: float = 1.3,
               key: tuple = SERIES[2], noise: float = 0.01) -> Path:
    """A store of `runs` runs; from run `step_at` on, series `key` is `step` x slower."""
    store = tmp / "store"
    for i in range(runs):
        factors = {key: step} if step_at is not None and i >= step_at else {}
        add_run(write_run(tmp / "runs", i, factors, noise), store)
    return store


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def one_error(capsys, needle: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err, err
    assert len(err.splitlines()) == 1, err
    return err


# ---- the store ---------------------------------------------------------------------------


def test_add_keeps_each_rows_times_and_samples_summary(tmp_path):
    run = write_run(tmp_path / "runs", 0)
    assert history(["add", str(run), "--store", str(tmp_path / "s")]) == 0
    (h,) = load_store(tmp_path / "s")
    assert h.device == "cpu" and len(h.runs) == 1 and len(h.rows) == len(TEMPLATE)
    doc = json.loads((run / "results.json").read_text())
    src = {(r["kernel"], r["provider"]): r for r in doc["rows"]}
    got = h.rows.set_index(["kernel", "provider", "shape"])
    mm = got.loc[("matmul", "torch", "M=256,N=256,K=256")]
    s = sorted(src[("matmul", "torch")]["samples_ms"])
    assert mm["median"] == pytest.approx(src[("matmul", "torch")]["ms_median"])
    assert mm["p20"] == pytest.approx(src[("matmul", "torch")]["ms_p20"])
    assert mm["fast_end"] == pytest.approx(s[1])  # the second-fastest sample
    assert (mm["fastest"], mm["slowest"], mm["n"]) == (pytest.approx(s[0]),
                                                       pytest.approx(s[-1]), 25)
    assert mm["cache"] == "warm"  # no cache column: a CPU row's native mode
    assert got.loc[("add", "triton", "n=4096")]["status"] == "skipped"
    assert h.runs["git_commit"].iloc[0] == doc["metadata"]["git_commit"]
    assert json.loads(h.runs["versions"].iloc[0])["torch"] == doc["metadata"]["torch"]


def test_a_run_is_added_once_and_the_store_is_unchanged(tmp_path, capsys):
    run = write_run(tmp_path / "runs", 0)
    store = tmp_path / "s"
    assert history(["add", str(run), "--store", str(store)]) == 0
    before = digest(store)
    capsys.readouterr()
    assert history(["add", str(run), "--store", str(store)]) == 2
    one_error(capsys, "already in")
    # A copy of the run folder elsewhere is the same run.
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.json").write_bytes((run / "results.json").read_bytes())
    assert history(["add", str(copy), "--store", str(store)]) == 2
    one_error(capsys, "already in")
    assert digest(store) == before
    assert len(load_store(store)[0].runs) == 1


def test_the_store_is_append_only(tmp_path):
    store = make_store(tmp_path, 2)
    db = sqlite3.connect(store / "cpu.sqlite")
    for sql in ("UPDATE rows SET median = 1", "DELETE FROM rows", "DELETE FROM runs",
                "UPDATE runs SET run_id = 'x'"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(sql)
    db.close()
    assert len(load_store(store)[0].rows) == 2 * len(TEMPLATE)


def _add_many(store: str, runs: list[str], barrier) -> None:
    barrier.wait()
    for r in runs:
        add_run(r, store)


def test_concurrent_appends_never_lose_a_row(tmp_path):
    procs, per = 6, 4
    runs = [str(write_run(tmp_path / "runs", i)) for i in range(procs * per)]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(procs)
    workers = [ctx.Process(target=_add_many, args=(str(tmp_path / "s"), runs[p::procs],
                                                   barrier)) for p in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * procs
    (h,) = load_store(tmp_path / "s")
    assert sorted(h.runs["run_id"]) == [f"r{i:03d}" for i in range(procs * per)]
    assert len(h.rows) == procs * per * len(TEMPLATE)


def _add_same(store: str, run: str, barrier, results) -> None:
    barrier.wait()
    try:
        add_run(run, store)
        results.put("added")
    except Exception as e:
        results.put(type(e).__name__)


def test_the_same_run_added_at_once_by_several_processes_is_kept_once(tmp_path):
    run = str(write_run(tmp_path / "runs", 0))
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    workers = [ctx.Process(target=_add_same, args=(str(tmp_path / "s"), run, barrier,
                                                   results)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    got = sorted(results.get(timeout=5) for _ in workers)
    # Three refused with the history commands' error (the one usage-error type).
    assert got == [HistoryError.__name__] * 3 + ["added"]
    assert len(load_store(tmp_path / "s")[0].runs) == 1


def test_a_folder_or_file_that_is_not_a_store_is_refused_untouched(tmp_path, capsys):
    run = write_run(tmp_path / "runs", 0)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    before = digest(other)
    assert history(["add", str(run), "--store", str(other)]) == 2
    one_error(capsys, "not a history store")
    assert history(["report", str(other)]) == 2
    one_error(capsys, "not a history store")
    text = tmp_path / "cpu.sqlite"
    text.write_text("not a database")
    assert history(["report", str(text)]) == 2
    one_error(capsys, "not an SQLite file")
    foreign = tmp_path / "foreign.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    raw = foreign.read_bytes()
    assert history(["html", str(foreign), "--out", str(tmp_path / "d")]) == 2
    one_error(capsys, "another program")
    assert digest(other) == before and foreign.read_bytes() == raw
    # A store folder whose device file is another program's: add refuses, touching nothing.
    store = tmp_path / "store"
    store.mkdir()
    (store / MARKER).write_text("")
    shutil.copyfile(foreign, store / "cpu.sqlite")
    assert history(["add", str(run), "--store", str(store)]) == 2
    one_error(capsys, "another program")
    assert (store / "cpu.sqlite").read_bytes() == raw
    assert history(["report", str(tmp_path / "absent")]) == 2
    one_error(capsys, "no history store")


def test_an_empty_store_is_refused(tmp_path, capsys):
    store = tmp_path / "s"
    store.mkdir()
    (store / MARKER).write_text("")
    assert history(["report", str(store)]) == 2
    one_error(capsys, "is empty")
    assert history(["html", str(store), "--out", str(tmp_path / "d")]) == 2
    one_error(capsys, "is empty")
    assert not (tmp_path / "d").exists()


def test_a_corrupt_row_is_named_and_the_store_left_as_it_was(tmp_path, capsys):
    store = make_store(tmp_path, 3)
    db = sqlite3.connect(store / "cpu.sqlite")
    db.execute("INSERT INTO rows (seq, kernel, provider, dtype, shape, cache, status, median,"
               " p20, p80, n) VALUES (2, 'dot', 'torch', 'fp32', 'n=8', 'warm', 'ok', 'abc',"
               " 1, 2, 25)")
    db.commit()
    db.close()
    before = digest(store)
    assert history(["report", str(store)]) == 2
    err = one_error(capsys, "corrupt row")
    assert "dot/torch/fp32/n=8" in err and "'median' is 'abc'" in err
    assert history(["html", str(store), "--out", str(tmp_path / "d")]) == 2
    one_error(capsys, "corrupt row")
    # Adding to it is refused nowhere, and never changes its old rows.
    assert history(["add", str(write_run(tmp_path / "runs", 9)), "--store", str(store)]) == 0
    db = sqlite3.connect(store / "cpu.sqlite")
    assert db.execute("SELECT count(*) FROM rows WHERE seq <= 3").fetchone()[0] == \
        3 * len(TEMPLATE) + 1
    db.close()
    assert before != digest(store)  # the new run went in


def test_runs_that_are_not_whole_are_refused(tmp_path, capsys):
    store = tmp_path / "s"
    run = write_run(tmp_path / "runs", 0, interrupted=True, complete=False)
    assert history(["add", str(run), "--store", str(store)]) == 2
    one_error(capsys, "interrupted")
    assert history(["add", str(run), "--store", str(store), "--allow-incomplete"]) == 0
    check = write_run(tmp_path / "runs", 1, check_only=True)
    assert history(["add", str(check), "--store", str(store)]) == 2
    one_error(capsys, "check-only")
    bad = write_run(tmp_path / "runs", 2)
    doc = json.loads((bad / "results.json").read_text())
    doc["rows"][0]["ms_median"] = -1.0
    (bad / "results.json").write_text(json.dumps(doc))
    assert history(["add", str(bad), "--store", str(store)]) == 2
    one_error(capsys, "ms_median")
    assert len(load_store(store)[0].runs) == 1


def test_without_the_libraries_report_says_so_and_add_still_works(tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ruptures", None)
    store = make_store(tmp_path, 1)
    assert history(["report", str(store)]) == 2
    one_error(capsys, "pip install -e '.[history]'")
    monkeypatch.setitem(__import__("sys").modules, "plotly", None)
    assert history(["html", str(store), "--out", str(tmp_path / "d")]) == 2
    one_error(capsys, "needs the Python package")
    assert not (tmp_path / "d").exists()
    assert history(["add", str(write_run(tmp_path / "runs", 5)), "--store", str(store)]) == 0


# ---- change points -------------------------------------------------------------------------


def _series(n: int, step_at: int, step: float, noise: float = 0.01, seed: int = 0):
    v = np.exp(np.random.default_rng(seed).normal(0, noise, n))
    v[step_at:] *= step
    return v


def test_a_step_is_found_where_it_begins_with_its_size_and_sign():
    pytest.importorskip("ruptures")
    from roofline.history.changepoints import detect

    (c,) = detect(_series(40, 25, 1.3))
    assert c.index == 25 and c.slower and c.change == pytest.approx(0.3, abs=0.02)
    assert (c.n_before, c.n_after) == (25, 15) and c.p_value < 0.001
    (c,) = detect(_series(40, 25, 1 / 1.3))
    assert c.index == 25 and not c.slower and c.ratio == pytest.approx(1 / 1.3, rel=0.02)
    assert detect(_series(40, 40, 1.0)) == []


def test_min_change_alpha_and_min_size_are_honoured():
    pytest.importorskip("ruptures")
    from roofline.history.changepoints import detect

    v = _series(40, 25, 1.04, noise=0.002)
    assert detect(v, min_change=0.05) == []
    assert [c.index for c in detect(v, min_change=0.03)] == [25]
    # 3 runs at the new level: found with min_size 3 at alpha 1e-3 by ranks; at 1e-6 no
    # rank test of 3 runs against 37 can pass (2 / C(40, 3) = 2.0e-4), so the level test
    # decides; with min_size 4 there is no segment of 3 to test.
    v = _series(40, 37, 1.3)
    ((c,),) = [detect(v)]
    assert (c.index, c.test) == (37, "rank")
    assert detect(v, alpha=1e-6, previous=True) == []
    ((c,),) = [detect(v, alpha=1e-6)]
    assert (c.index, c.test) == (37, "level")
    assert detect(v, min_size=4) == []
    # The level test honours alpha: a step found at alpha just above its p, not below
    # (3 runs against 8: no rank test passes at 0.01).
    v = _series(11, 8, 1.08, seed=2)
    ((c,),) = [detect(v, alpha=0.01)]
    assert c.test == "level" and 1e-4 < c.p_value < 1e-3
    assert detect(v, alpha=c.p_value * 0.9) == []
    assert [x.index for x in detect(v, alpha=c.p_value * 1.1)] == [8]


def test_one_slow_outlier_is_not_a_change_point():
    pytest.importorskip("ruptures")
    from roofline.history.changepoints import detect

    v = _series(40, 40, 1.0)
    v[[10, 30]] *= 20.0  # a shared machine's slow spell, twice
    assert detect(v) == []


# ---- the report ------------------------------------------------------------------------------


def test_report_fails_on_a_new_slowdown_only(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ruptures")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    # matmul 1.3x from run 20 on: new with 3 runs at the new level (the level test: no
    # rank test of 3 runs against 20 can reach p < 0.001, 2 / C(23, 3) = 1.1e-3)
    store = make_store(tmp_path, 23, step_at=20)
    md = tmp_path / "report.md"
    assert history(["report", str(store), "--fail-on-new", "--md", str(md)]) == 1
    out = capsys.readouterr().out
    assert "**1 new slowdown**" in out
    line = next(x for x in out.splitlines() if x.startswith("| matmul/torch"))
    assert "+30." in line or "+29." in line or "+31." in line
    assert "`0013c0ffee`..`0014c0ffee`" in line and "`r020`" in line
    assert md.read_text() == out and out.strip() in summary.read_text()
    assert history(["report", str(store)]) == 0  # reported, not failed
    # One run later the step is no longer new (--since 1), unless --since covers it.
    add_run(write_run(tmp_path / "runs", 23, {SERIES[2]: 1.3}), store)
    assert history(["report", str(store), "--fail-on-new"]) == 0
    assert history(["report", str(store), "--fail-on-new", "--since", "2"]) == 1
    # Past --min-change only.
    assert history(["report", str(store), "--fail-on-new", "--since", "2",
                    "--min-change", "40"]) == 0


def test_a_new_speed_up_does_not_fail(tmp_path, capsys):
    pytest.importorskip("ruptures")
    store = make_store(tmp_path, 23, step_at=20, step=0.7)
    assert history(["report", str(store), "--fail-on-new"]) == 0
    assert "1 new speed-up" in capsys.readouterr().out


def test_report_refuses_bad_options(tmp_path, capsys):
    store = make_store(tmp_path, 2)
    for bad, needle in ((["--since", "0"], "--since"), (["--alpha", "2"], "--alpha"),
                        (["--min-change", "nan"], "--min-change"),
                        (["--md", str(store / "cpu.sqlite")], "overwrite")):
        assert history(["report", str(store), *bad]) == 2
        one_error(capsys, needle)


def test_retiming_confirms_or_clears_a_new_slowdown(tmp_path):
    pytest.importorskip("ruptures")
    from roofline.history.report import confirm, exit_code
    from roofline.history.series import Options, build_series

    store = make_store(tmp_path, 23, step_at=20)
    (h,) = load_store(store)
    d = build_series(h, Options())
    (s, c) = d.new_slower[0]
    base = float(np.median(s.runs["fast_end"].iloc[:20]))
    slow = {s.key: [[base * 1.3] * 5 for _ in range(5)]}
    kept = confirm(d, lambda keys: slow)
    assert "slower in 5 of 5" in kept.checked[s.key] and not kept.cleared
    assert exit_code([d], True, {"cpu": kept}) == 1
    # Fast again in one round of five: not confirmed (the gate's rule), so no failure.
    mixed = {s.key: [[base * 1.3] * 5 for _ in range(4)] + [[base] * 5]}
    cleared = confirm(d, lambda keys: mixed)
    assert s.key in cleared.cleared
    assert exit_code([d], True, {"cpu": cleared}) == 0
    broken = confirm(d, lambda keys: (_ for _ in ()).throw(RuntimeError("no GPU")))
    assert exit_code([d], True, {"cpu": broken}) == 1 and "failed" in broken.failed


def test_run_bench_adds_the_finished_run(tmp_path, capsys, monkeypatch):
    import run_bench
    from benches.sweep import job
    from contract.ceilings import Ceilings

    fake = {"tflops": {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0, "fp8": 1.0},
            "hbm_gbps": 10.0, "l2_gbps": 50.0, "method": {}}
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, fake))
    tiny = ["--device", "cpu", "--sizes", "n=2048", "--kernels", "add", "--dtypes", "fp32",
            "--providers", "torch", "--no-plots", "--out", str(tmp_path)]
    store = tmp_path / "store"
    assert run_bench.main([*tiny, "--history", str(store)]) == 0
    assert run_bench.main([*tiny, "--history", str(store), "--run-id", "second"]) == 0
    (h,) = load_store(store)
    assert len(h.runs) == 2 and h.runs["run_id"].iloc[-1] == "second"
    capsys.readouterr()
    # A bad store is refused before anything is measured.
    assert run_bench.main([*tiny, "--history", str(tmp_path / "cpu"), "--run-id", "x"]) == 2
    one_error(capsys, "not a history store")
    assert not (tmp_path / "cpu" / "x").exists()


def test_the_replay_catches_a_clear_step_in_three_runs_and_no_false_alarm():
    """The replay benchmark's machinery (benches/test_bench_history.py) on steady noise
    (0.5% run to run): a 30% step is an alarm after exactly 3 runs at its level (the
    minimum segment), unchanged code raises none, and a 0.2%/run drift is caught."""
    pytest.importorskip("ruptures")
    from roofline.history.replay import levels, measure

    assert levels("step", 0.3, runs=6, at=4).tolist() == [1, 1, 1, 1, 1.3, 1.3]
    assert levels("drift", 0.5, runs=4, at=2).tolist() == [1, 1, 1.5, 2.25]
    rng = np.random.default_rng(3)
    noise = [np.full(25, np.exp(rng.normal(0, 0.005))) for _ in range(20)]
    f = measure(noise, trials=2, null_trials=1, steps=(0.3,))
    assert f.false_per_100 == 0 and f.detected[0.3] == 1.0 and f.delay[0.3] == 3
    assert f.drift_detected == 1.0
