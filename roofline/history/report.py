"""`history report`: the change points of each device's newest runs as markdown (printed,
optionally written, appended to $GITHUB_STEP_SUMMARY), new slowdowns confirmed by
re-timing where asked, and the exit code."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from contract.markdown import md_table_lines
from contract.schema import RowKey
from roofline.gate.rules import Retime
from roofline.gate.runs import CONFIRM_MIN_ROUNDS
from roofline.gate.stats import fast_end
from roofline.history.changepoints import ChangePoint, young_runs
from roofline.history.detectable import MAX_RUNS
from roofline.history.series import DeviceSeries, Series


@dataclass
class Confirmation:
    """Re-timing of the new slowdowns (Retime rounds against the old level's fast end)."""

    checked: dict[RowKey, str] = field(default_factory=dict)  # key -> note
    cleared: set[RowKey] = field(default_factory=set)  # not slower when re-timed
    failed: str = ""  # why re-timing did not run


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%" if math.isfinite(x) else "-"


def _ms(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "-"


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _commit(c: str) -> str:
    return f"`{c[:10]}`" if c != "?" else "?"


def _run(s: Series, i: int) -> str:
    v = s.runs["run_id"].iloc[i]
    return f"`{v}`" if isinstance(v, str) and v else f"#{int(s.runs['seq'].iloc[i])}"


def _row(s: Series, c: ChangePoint, note: str = "") -> list[object]:
    before, after = s.commit_range(c)
    if s.timer_changed(c):
        note = "; ".join(x for x in (note, "timer changed here") if x)
    return [_cell(s.name), "slower" if c.slower else "faster", _pct(c.change), _ms(c.before),
            _ms(c.after), f"{_commit(before)}..{_commit(after)}", _run(s, c.index),
            c.n_after, f"{c.p_value:.1e}", _cell(note)]


def _newest(since: int) -> str:
    return "the newest run was added" if since == 1 else \
        f"the newest {since} runs were added"


_HEAD = ["series", "step", "change", "ms before", "ms after", "commits (last old..first new)",
         "first run at new level", "runs since", "p", "note"]
_STATE_HEAD = ["series", "state", "change", "ms before", "ms after", "first run at new level",
               "runs since", "p (test)", "commits (last old..first new)"]


def _state_rows(s: Series, window: int | None) -> list[list[object]]:
    """Every change point of a series in the window, newest first, marked new or known;
    a series without one: steady, its level and the runs it holds."""
    if not s.changes:
        held = s.runs["median"].iloc[-window:] if window else s.runs["median"]
        return [[_cell(s.name), "steady", "-", "-", _ms(float(held.median())), "-", len(held),
                 "-", "-"]]
    out = []
    for c in reversed(s.changes):
        state = f"{'new' if c in s.new else 'known'} {'slowdown' if c.slower else 'speed-up'}"
        before, after = s.commit_range(c)
        out.append([_cell(s.name), state, _pct(c.change), _ms(c.before), _ms(c.after),
                    _run(s, c.index), len(s.runs) - c.index, f"{c.p_value:.1e} ({c.test})",
                    f"{_commit(before)}..{_commit(after)}"])
    return out


def _state_order(s: Series) -> tuple:
    """New change points first, then the series whose last change is newest, then steady
    series by name."""
    newest = max((c.index - len(s.runs) for c in s.changes), default=None)
    return (not s.new, newest is None, -(newest or 0), s.name)


def _needs(step: float, k: int | None, min_change: float) -> str:
    if k is not None:
        return f"{step * 100:g}%: {k}"
    if step <= min_change * (1 + 1e-9):
        return f"{step * 100:g}%: none (at --min-change, half such steps measure below it)"
    return f"{step * 100:g}%: more than {MAX_RUNS}"


def _sight(d: DeviceSeries) -> list[str]:
    """What the history could and could not see, for its length and noise."""
    o, sg = d.options, d.sight()
    if not sg.series:
        return []
    own = f", {sg.own * 100:.2g}% within a run" if math.isfinite(sg.own) else ""
    needs = "; ".join(_needs(s, k, o.min_change) for s, k in sg.needed.items())
    smallest = (f"a step of at least {sg.smallest * 100:.3g}% is seen"
                if math.isfinite(sg.smallest) else "no step up to 10x is seen")
    lines = [f"**What this history can see.** With {sg.runs} runs and noise like its median "
             f"series' ({sg.spread * 100:.2g}% run to run{own}; sd of log time), the runs a "
             "slowdown after the newest run needs at its new level to be a change point in "
             f"9 of 10 such histories: {needs}. With {o.min_size} runs after it (the "
             f"fewest), {smallest}. "
             f"A step in the newest {o.min_size - 1} runs cannot show yet: no change point "
             "means no step this large, not no regression."]
    if sg.too_noisy:
        shown = ", ".join(sg.too_noisy[:10])
        more = f" and {len(sg.too_noisy) - 10} more" if len(sg.too_noisy) > 10 else ""
        lines.append(f"Too noisy to show a 10% step within {MAX_RUNS} runs: "
                     f"{len(sg.too_noisy)} of {sg.series} series ({shown}{more}).")
    return [" ".join(lines), ""]


def render(devices: Sequence[DeviceSeries], confirmation: Confirmation | None = None
           ) -> str:
    """The report's markdown, one section per device."""
    out: list[str] = []
    for d in devices:
        runs = d.runs
        newest = d.newest()
        o = d.options
        window = f"the newest {o.window} runs" if o.window else "every run"
        commit = newest.git_commit
        where = f"commit `{str(commit)[:10]}`, " if isinstance(commit, str) else ""
        out += [f"## Performance history: {d.device}", "",
                f"{len(runs)} run{'s' if len(runs) != 1 else ''} in `{d.history.path}`; "
                f"newest `{newest.run_id}` ({where}{newest.created}). "
                f"{len(d.series)} series. Change points: a step of at least "
                f"{o.min_change * 100:g}% between the medians of at least {o.min_size} runs "
                f"on each side, significant at p < {o.alpha:g} (rank: a rank test of one "
                "value per run; level: in a history of up to "
                f"{young_runs(o.min_size, o.alpha)} runs, where segments are too short for "
                "ranks, every run of the shorter one off the other's level, past the "
                f"run-to-run spread and its own noise), searched in {window}.", ""]
        new = [(s, c) for s in d.series for c in s.new]
        slow = [(s, c) for s, c in new if c.slower]
        if new:
            out += [f"**{len(slow)} new slowdown{'s' if len(slow) != 1 else ''}**, "
                    f"{len(new) - len(slow)} new speed-up"
                    f"{'s' if len(new) - len(slow) != 1 else ''} since {_newest(d.since)}:",
                    ""]
            rows = []
            for s, c in sorted(new, key=lambda sc: (not sc[1].slower, -abs(sc[1].change))):
                note = ""
                if confirmation is not None and c.slower:
                    note = confirmation.checked.get(s.key, confirmation.failed)
                rows.append(_row(s, c, note))
            out += [*md_table_lines(_HEAD, rows, "llrrrllrrl"), ""]
        else:
            out += [f"No new change point since {_newest(d.since)}.", ""]
        out += _sight(d)
        changed = sum(1 for s in d.series if s.changes)
        out += [f"Every series ({changed} with a change point in {window}, "
                f"{len(d.series) - changed} steady):", "",
                *md_table_lines(_STATE_HEAD, [r for s in sorted(d.series, key=_state_order)
                                              for r in _state_rows(s, o.window)], "llrrrlrll"),
                ""]
        gone = [s.name for s in d.series if s.status not in ("ok", "absent")]
        if gone:
            out += [f"Not ok in the newest run: {', '.join(gone[:20])}"
                    + (f" and {len(gone) - 20} more" if len(gone) > 20 else ""), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def confirm(d: DeviceSeries, retime: Retime) -> Confirmation:
    """Re-time the series with a new slowdown (the gate's rule, run_bench --compare's
    re-timing): confirmed only when the fast end of EVERY re-timed round is past the
    minimum change against the old level's fast end (the median of the fast ends of
    the runs before the change point; their medians where a run kept no samples);
    fewer than CONFIRM_MIN_ROUNDS valid rounds neither confirm nor clear."""
    result = Confirmation()
    todo = {s.key: (s, c) for s, c in d.new_slower}
    if not todo:
        return result
    try:
        fresh = retime(list(todo)) or {}
    except Exception as e:  # a re-timing failure must not hide a slowdown
        result.failed = f"re-timing failed ({' '.join(str(e).split())}): kept as found"
        return result
    limit = 1.0 + d.options.min_change
    for key, (s, c) in todo.items():
        before = s.runs.iloc[c.index - c.n_before:c.index]
        ends = before["fast_end"].where(before["fast_end"].notna(), before["median"])
        base = float(np.median(ends))
        rounds = [r for r in (fresh.get(key) or []) if len(r) >= 2]
        ratios = [fast_end(r) / base for r in rounds]
        hits = sum(x > limit for x in ratios)
        note = (f"fast end slower in {hits} of {len(ratios)} re-timed rounds"
                + (f" ({', '.join(f'{x:.3g}x' for x in ratios)})" if ratios else ""))
        if len(ratios) >= CONFIRM_MIN_ROUNDS and hits < len(ratios):
            result.cleared.add(key)
            note += ": not confirmed"
        elif len(ratios) < CONFIRM_MIN_ROUNDS:
            note += ": too few rounds, kept as found"
        else:
            note += ": confirmed"
        result.checked[key] = note
    return result


def exit_code(devices: Sequence[DeviceSeries], fail_on_new: bool,
              confirmation: dict[str, Confirmation] | None = None) -> int:
    """1 when --fail-on-new and a device has a new slowdown that re-timing (if any) did
    not clear; else 0."""
    if not fail_on_new:
        return 0
    for d in devices:
        cleared = (confirmation or {}).get(d.device, Confirmation()).cleared
        if any(s.key not in cleared for s, _ in d.new_slower):
            return 1
    return 0
