"""`history report`: the change points of each device's newest runs as markdown (printed,
optionally written, appended to $GITHUB_STEP_SUMMARY), new slowdowns confirmed by
re-timing where asked, and the exit code."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from roofline.gate import CONFIRM_MIN_ROUNDS, Key, Retime, fast_end
from roofline.history.changepoints import ChangePoint
from roofline.history.series import DeviceSeries, Series

ALL_LIMIT = 20  # change points listed per device besides the new ones


@dataclass
class Confirmation:
    """Re-timing of the new slowdowns (Retime rounds against the old level's fast end)."""

    checked: dict[Key, str] = field(default_factory=dict)  # key -> note
    cleared: set[Key] = field(default_factory=set)  # not slower when re-timed
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


def _row(s: Series, c: ChangePoint, note: str = "") -> str:
    before, after = s.commit_range(c)
    name = s.name
    if s.timer_changed(c):
        note = "; ".join(x for x in (note, "timer changed here") if x)
    return (f"| {_cell(name)} | {'slower' if c.slower else 'faster'} | {_pct(c.change)} "
            f"| {_ms(c.before)} | {_ms(c.after)} | {_commit(before)}..{_commit(after)} "
            f"| {_run(s, c.index)} | {c.n_after} | {c.p_value:.1e} | {_cell(note)} |")


def _newest(since: int) -> str:
    return "the newest run was added" if since == 1 else \
        f"the newest {since} runs were added"


_HEAD = ("| series | step | change | ms before | ms after | commits (last old..first new) "
         "| first run at new level | runs since | p | note |\n"
         "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | --- |")


def render(devices: Sequence[DeviceSeries], confirmation: Confirmation | None = None
           ) -> str:
    """The report's markdown, one section per device."""
    out: list[str] = []
    for d in devices:
        runs = d.runs
        newest = d.newest()
        o = d.options
        window = f"the newest {o.window} runs" if o.window else "every run"
        commit = newest.get("git_commit")
        where = f"commit `{str(commit)[:10]}`, " if isinstance(commit, str) else ""
        out += [f"## Performance history: {d.device}", "",
                f"{len(runs)} run{'s' if len(runs) != 1 else ''} in `{d.history.path}`; "
                f"newest `{newest.get('run_id')}` ({where}{newest.get('created')}). "
                f"{len(d.series)} series. Change points: a step of at least "
                f"{o.min_change * 100:g}% between the medians of at least {o.min_size} runs "
                f"on each side, rank test p < {o.alpha:g}, searched in {window}.", ""]
        new = [(s, c) for s in d.series for c in s.new]
        slow = [(s, c) for s, c in new if c.slower]
        if new:
            out += [f"**{len(slow)} new slowdown{'s' if len(slow) != 1 else ''}**, "
                    f"{len(new) - len(slow)} new speed-up"
                    f"{'s' if len(new) - len(slow) != 1 else ''} since {_newest(d.since)}:",
                    "", _HEAD]
            for s, c in sorted(new, key=lambda sc: (not sc[1].slower, -abs(sc[1].change))):
                note = ""
                if confirmation is not None and c.slower:
                    note = confirmation.checked.get(s.key, confirmation.failed)
                out.append(_row(s, c, note))
            out.append("")
        else:
            out += [f"No new change point since {_newest(d.since)}.", ""]
        old = sorted(((s, c) for s in d.series for c in s.changes if c not in s.new),
                     key=lambda sc: -sc[1].index)
        if old:
            out += [f"Earlier change points ({min(len(old), ALL_LIMIT)} of {len(old)}, "
                    "newest first):", "", _HEAD]
            out += [_row(s, c) for s, c in old[:ALL_LIMIT]]
            out.append("")
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
