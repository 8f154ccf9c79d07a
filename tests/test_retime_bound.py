"""The re-timing bound (`python -m roofline compare --retime --retime-budget S`, .ci/gpu's
compare step): the rows that look slower go worst first, each round within its share of
the budget (the child stopped at its deadline, what it timed kept), as many rounds as
fit (3 to 5), and compare.md names the rows left out and why.  The children here are
fakes on a fake clock: a start-up and a cost per row, as the H200's were (6-9 s a round
for 7-8 suspects, one slow row a round of its own)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import benches.sweep.retime as retime
from contract.retimed import Retimed
from contract.run_meta import parse_meta
from contract.schema import COLUMNS
from roofline.gate import runs as gate_runs
from roofline.gate.cli import main
from roofline.gate.render import render_markdown
from roofline.gate.runs import compare_runs, confirm_slower

SETTINGS = retime.RetimeSettings()
KEYS = [("gelu", "torch", "fp8", f"n={4096 * (i + 1)}", "cold") for i in range(8)]


class Clock:
    """time.monotonic/time.time/sleep/perf_counter on a clock that only moves when a
    fake child runs or the client sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    time = perf_counter = monotonic

    def sleep(self, s: float) -> None:
        self.now += max(0.0, s)


class FakeChild:
    """subprocess.run of `python -m benches.sweep.retime`: start-up seconds, then each
    asked case's seconds in turn; past the timeout it is killed and raises
    TimeoutExpired with the lines it had flushed (bytes, as subprocess gives them)."""

    def __init__(self, clock: Clock, startup_s: float, cost_s: dict[str, float]) -> None:
        self.clock, self.startup_s, self.cost_s = clock, startup_s, cost_s
        self.asked: list[list[str]] = []
        self.timeouts: list[float | None] = []

    def __call__(self, cmd: list[str], *, input: str, timeout: float | None = None,
                 **kw: Any) -> subprocess.CompletedProcess:
        spec = json.loads(input)
        ids = [retime.case_id(c) for c in spec["cases"]]
        self.asked.append(ids)
        self.timeouts.append(timeout)
        t, lines, answer = self.startup_s, [], {}
        if timeout is None or t <= timeout:
            lines.append(json.dumps({"ready_s": t}))
            for cid in ids:
                t += self.cost_s[cid]
                if timeout is not None and t > timeout:
                    break
                answer[cid] = [1.0, 1.0, 1.0]
                lines.append(json.dumps({"case": cid, "s": self.cost_s[cid],
                                         "samples": answer[cid]}))
        if timeout is not None and t > timeout:
            self.clock.now += timeout
            raise subprocess.TimeoutExpired(cmd, timeout, output="\n".join(lines).encode())
        self.clock.now += t
        lines.append(json.dumps(answer))
        return subprocess.CompletedProcess(cmd, 0, "\n".join(lines) + "\n", "")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(retime, "time", c)
    return c


def _child(monkeypatch: pytest.MonkeyPatch, clock: Clock, startup_s: float,
           costs: list[float]) -> FakeChild:
    child = FakeChild(clock, startup_s, {retime.case_id(k): c for k, c in
                                         zip(KEYS, costs, strict=False)})
    monkeypatch.setattr(retime.subprocess, "run", child)
    return child


def test_the_gates_fewest_rounds_are_the_retimers() -> None:
    assert retime.RETIME_MIN_ROUNDS == gate_runs.CONFIRM_MIN_ROUNDS
    assert retime.RETIME_MIN_ROUNDS < retime.RETIME_ROUNDS


def test_fit_keeps_the_worst_first_and_steps_over_a_row_too_slow_for_the_round() -> None:
    costs = retime.Costs(startup_s=4.0, row_s={KEYS[0]: 1.0, KEYS[1]: 12.0, KEYS[2]: 1.0,
                                               KEYS[3]: 3.0})
    kept, out = costs.fit(KEYS[:5], 9.0)
    # 4 s start-up + 1 + 1 + 3 fit 9 s; the 12 s row does not; the unknown one is kept
    assert kept == [KEYS[0], KEYS[2], KEYS[3], KEYS[4]]
    assert list(out) == [KEYS[1]]
    assert out[KEYS[1]] == ("about 12.0 s a round, 4.0 s of the round's 9.0 s were left "
                            "after the child's start-up and 1 worse rows")
    kept, out = retime.Costs(startup_s=10.0, row_s={KEYS[0]: 1.0}).fit(KEYS[:1], 9.0)
    assert kept == [] and "under a re-timing child's start-up (10.0 s)" in out[KEYS[0]]


def test_without_a_bound_every_row_gets_every_round(monkeypatch: pytest.MonkeyPatch,
                                                    clock: Clock) -> None:
    child = _child(monkeypatch, clock, 4.0, [0.5] * 8)
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None)(KEYS)
    assert len(child.asked) == retime.RETIME_ROUNDS and child.timeouts == [None] * 5
    assert all(len(got[k]) == 5 for k in KEYS) and not got.left_out


def test_eight_suspects_in_a_bound_get_the_rounds_that_fit(monkeypatch: pytest.MonkeyPatch,
                                                           clock: Clock) -> None:
    """8 rows of 0.5 s after a 4 s start-up (8 s a round) in 28 s: 3 rounds of every
    row (5 would take 40 s), within the bound."""
    child = _child(monkeypatch, clock, 4.0, [0.5] * 8)
    t0 = clock.now
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None, budget_s=28.0)(KEYS)
    assert clock.now - t0 <= 28.0
    assert [len(a) for a in child.asked] == [8, 8, 8]
    assert all(len(got[k]) == 3 for k in KEYS) and not got.left_out
    assert got.budget_s == 28.0
    # the first round may take a third of the budget, each later one its share of the rest
    assert child.timeouts[0] == pytest.approx(28.0 / 3)


def test_a_tight_bound_keeps_the_worst_rows_and_says_why_of_the_others(
        monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """4 s start-up, 1 s rows, 18 s: the first round (6 s) reaches the two worst rows;
    the others are left out, each with why, and the two get 3 rounds."""
    child = _child(monkeypatch, clock, 4.0, [1.0] * 8)
    t0 = clock.now
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None, budget_s=18.0)(KEYS)
    assert clock.now - t0 <= 18.0
    assert [len(got[k]) for k in KEYS] == [3, 3, 0, 0, 0, 0, 0, 0]
    assert set(got.left_out) == set(KEYS[2:])
    assert got.left_out[KEYS[2]] == ("the first round's 6.0 s share of the budget ended "
                                     "before this row (re-timing bound 18 s)")
    assert child.asked[1] == [retime.case_id(k) for k in KEYS[:2]]


def test_a_row_slower_than_a_rounds_share_is_stepped_over(monkeypatch: pytest.MonkeyPatch,
                                                          clock: Clock) -> None:
    """The worst row takes 12 s a round (attention fp32 and its float64 check): the first
    round's deadline stops the child inside it; it is left out and the others get the
    first round anew, and their later rounds, within the bound."""
    child = _child(monkeypatch, clock, 4.0, [12.0] + [0.5] * 7)
    t0 = clock.now
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None, budget_s=30.0)(KEYS)
    assert clock.now - t0 <= 30.0
    assert got[KEYS[0]] == [] and "one round of it takes over 6.0 s" in got.left_out[KEYS[0]]
    timed = [k for k in KEYS if len(got[k]) >= retime.RETIME_MIN_ROUNDS]
    assert timed and timed == KEYS[1:1 + len(timed)]  # the worst of the rest first
    assert child.asked[1][0] == retime.case_id(KEYS[1])
    # known in advance (the run's own split of each row): never started
    child = _child(monkeypatch, clock, 4.0, [12.0] + [0.5] * 7)
    meta = parse_meta({"row_split_s": [{"row": list(KEYS[0]), "s": {
        "check": 9.0, "timing": 3.0, "compile": 30.0}}]})
    assert retime.row_costs(meta) == {KEYS[0]: 12.0}  # compile: from Triton's cache
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None, budget_s=30.0,
                         costs=retime.row_costs(meta))(KEYS)
    assert all(retime.case_id(KEYS[0]) not in a for a in child.asked)
    assert all(len(got[k]) >= retime.RETIME_MIN_ROUNDS for k in KEYS[1:])
    assert "about 12.0 s a round" in got.left_out[KEYS[0]]


def test_an_interrupt_keeps_what_was_timed(monkeypatch: pytest.MonkeyPatch,
                                           clock: Clock) -> None:
    child = _child(monkeypatch, clock, 1.0, [0.5] * 8)
    calls = []

    def run(*a: Any, **k: Any) -> subprocess.CompletedProcess:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return child(*a, **k)

    monkeypatch.setattr(retime.subprocess, "run", run)
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None)(KEYS[:2])
    assert got.interrupted and [len(got[k]) for k in KEYS[:2]] == [1, 1]
    calls[:] = [1]  # the next call (the first round) is interrupted
    got = retime.Retimer("h200", SETTINGS, [], say=lambda _: None)(KEYS[:2])
    assert got.interrupted and "interrupted (SIGINT)" in got.left_out[KEYS[0]]


# ---- the gate: worst first, the rows left out in compare.md ---------------------------

def _write(path: Path, scale: dict[int, float], created: str) -> Path:
    rows = []
    for i, k in enumerate(KEYS):
        ms = 0.02 * scale.get(i, 1.0)
        samples = [ms * (1 + 0.001 * q) for q in range(30)]
        rows.append({**dict.fromkeys(COLUMNS), "kernel": k[0], "provider": k[1],
                     "dtype": k[2], "shape": k[3],
                     "status": "ok", "ms_median": samples[15], "ms_p20": samples[6],
                     "ms_p80": samples[24], "n_samples": 30, "samples_ms": samples,
                     "timer": "cudagraph", "reason": "", "device": "h100"})
    path.mkdir()
    (path / "results.json").write_text(json.dumps({"metadata": {
        "device_key": "h100", "created": created, "run_id": path.name}, "rows": rows}))
    return path


def test_the_gate_asks_worst_first_and_names_the_rows_left_out(tmp_path: Path) -> None:
    base = _write(tmp_path / "base", {}, "2026-11-26T00:00:00+00:00")
    run = _write(tmp_path / "run", {1: 1.2, 4: 1.6, 6: 1.4}, "2026-11-27T00:00:00+00:00")
    result = compare_runs(base, run)
    asked: list[list[tuple]] = []

    def bounded(keys: list) -> Retimed:
        asked.append(list(keys))
        return Retimed({keys[0]: [[0.032] * 5] * 3}, budget_s=20.0,
                       left_out={k: "the first round's 6.7 s share of the budget "
                                    "ended before this row" for k in keys[1:]})

    confirm_slower(result, bounded)
    assert asked == [[KEYS[4], KEYS[6], KEYS[1]]]  # 1.6x, 1.4x, 1.2x
    md = render_markdown(result)
    assert "re-timed 1 row that looked slower (3 rounds) within a 20 s bound, worst " \
           "first: 1 confirmed, 0 not" in md
    assert "- not re-timed: 2 rows that looked slower, their verdicts unconfirmed: " \
           f"gelu torch fp8 {KEYS[6][3]}" in md
    slow = result.rows.set_index("shape").loc[KEYS[1][3]]
    assert slow["verdict"] == "slower" and "not re-timed: the first round's" in slow["note"]


def test_compare_passes_its_bound_to_the_retimer_and_writes_the_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = _write(tmp_path / "base", {}, "2026-11-26T00:00:00+00:00")
    run = _write(tmp_path / "run", {4: 1.6}, "2026-11-27T00:00:00+00:00")
    given: list[dict] = []

    def factory(device: str, meta: dict, rows: list, **kw: Any) -> Any:
        given.append(kw)
        return lambda keys: Retimed({}, budget_s=kw.get("budget_s"), left_out={
            k: "the bound ran out" for k in keys})

    md = tmp_path / "compare.md"
    code = main(["compare", str(base), str(run), "--retime", "--retime-budget", "22",
                 "--md", str(md)], retimer=factory)
    assert code == 1 and given == [{"budget_s": 22.0}]
    assert "not re-timed: 1 row that looked slower" in md.read_text()
    # without the bound: the factory is called as before (no budget_s)
    assert main(["compare", str(base), str(run), "--retime"], retimer=factory) == 1
    assert given[-1] == {}
    capsys.readouterr()
    for bad in (["--retime-budget", "0", "--retime"], ["--retime-budget", "5"]):
        assert main(["compare", str(base), str(run), *bad], retimer=factory) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "--retime-budget" in err
