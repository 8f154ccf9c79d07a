"""Where a run's time went, from its metadata: the time split's line (the console's last
line and summary.md's `time` fact), the Triton compiles and the compile-ahead workers'
facts, and summary.md's table of the rows' own time by kernel and provider
(metadata.row_split_s): what a sweep spends beside its samples, and on which rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contract.markdown import md_table_lines
from contract.meta_parts import CompiledAhead, RowSplit
from contract.phases import PHASES
from contract.rows import TritonBuilds, compiled_ahead_text
from contract.run_meta import RunMeta
from roofline.report.findings import as_dict, finite_or_none

ROW_TIME_TOP = 12  # the pairs listed by their rows' time, at most; the rest in one line


def time_split_line(split_s: Mapping[str, float] | None, wall_s: float | None) -> str | None:
    """"timing N s of M s", then the run's other phases of half a second or more, largest
    first (metadata.time_split_s, wall_s); None for a run that did not record its split."""
    split, wall = as_dict(split_s), finite_or_none(wall_s)
    if not split or wall is None:
        return None
    rest = sorted(((f, k) for k, v in split.items()
                   if k != "timing" and (f := finite_or_none(v)) is not None and f >= 0.5),
                  reverse=True)
    tail = ", ".join(f"{k} {v:.0f}" for v, k in rest)
    return (f"timing {finite_or_none(split.get('timing')) or 0.0:.0f} s of {wall:.0f} s"
            + (f" ({tail})" if tail else ""))


def compiles_line(meta: RunMeta) -> str | None:
    """The Triton compiles a run asked for, built or loaded from Triton's cache, and those
    its compile-ahead workers built: a cold cache or a warm one.  None where it recorded
    none (a CPU run, an older run)."""
    b = TritonBuilds.of(meta)
    if not (b.built or b.from_cache or b.built_ahead):
        return None
    return (f"{b.built} built, {b.from_cache} loaded from Triton's cache"
            + (f"; {b.built_ahead} built ahead by the compile workers" if b.built_ahead
               else ""))


def compiled_ahead_line(ahead: CompiledAhead) -> str | None:
    """What the compile-ahead workers did (metadata.compiled_ahead), and their errors,
    which say why they compiled less than they were given; None where no worker ran."""
    if not isinstance(ahead, dict) or not ahead.get("workers"):
        return None
    errors = "; ".join(str(e) for e in ahead.get("worker_errors") or [])
    return compiled_ahead_text(ahead) + (f"; errors: {errors}" if errors else "")


def row_time_sections(entries: Sequence[RowSplit]) -> list[str]:
    """summary.md's "Where the rows' time went": each (kernel, provider)'s rows' own
    seconds per phase, the largest totals first, ROW_TIME_TOP of them and the rest in one
    line, then all rows; [] for a run that recorded none (a CPU sweep whose rounds
    interleave, an older run): metadata.row_split_s."""
    by: dict[str, dict[str, float]] = {}
    rows: dict[str, int] = {}
    for e in entries if isinstance(entries, Sequence) else []:
        key = e.get("row") if isinstance(e, dict) else None
        if not isinstance(key, list) or len(key) < 2:
            continue
        pair = f"{key[0]} {key[1]}"
        rows[pair] = rows.get(pair, 0) + 1
        acc = by.setdefault(pair, {})
        for phase, v in as_dict(e.get("s")).items():
            if (f := finite_or_none(v)) is not None:
                acc[phase] = acc.get(phase, 0.0) + f
    if not by:
        return []
    phases = [p for p in PHASES if any(p in acc for acc in by.values())]
    ranked = sorted(by, key=lambda k: -sum(by[k].values()))
    rest = ranked[ROW_TIME_TOP:]
    groups = [(k, [k]) for k in ranked[:ROW_TIME_TOP]] + (
        [(f"{len(rest)} more", rest)] if rest else []) + [("all rows", ranked)]
    body = []
    for label, keys in groups:
        acc = {p: sum(by[k].get(p, 0.0) for k in keys) for p in phases}
        body.append([label, sum(rows[k] for k in keys), *(f"{v:.2f}" for v in acc.values()),
                     f"{sum(acc.values()):.2f}"])
    table = md_table_lines(["kernel provider", "rows", *phases, "total"], body,
                           "l" + "r" * (len(phases) + 2))
    return ["## Where the rows' time went",
            "Each row's own seconds by phase (benches/sweep/time_split.py), summed by kernel and "
            "provider: what the sweep spends beside the samples (`timing`), and on which "
            "rows.\n\n" + "\n".join(table)]
