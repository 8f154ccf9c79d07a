"""Where a run's time went, from its metadata: the time split's line (the console's last
line and summary.md's `time` fact), the Triton compile facts, and summary.md's table of
the rows' own time.  parse_meta keeps an old run's values as they came: an odd one is
left out here, never fatal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from contract.markdown import md_table_lines
from contract.meta_parts import RowSplit
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


def compile_facts(meta: RunMeta) -> list[tuple[str, str | None]]:
    """summary.md's `Triton compiles`, built or loaded from Triton's cache by the run and
    built by its compile-ahead workers (a cold cache or a warm one), and `compiled ahead`,
    what the workers did with their errors (why they did less); None where not recorded."""
    b, ahead = TritonBuilds.of(meta), as_dict(meta.compiles.compiled_ahead)
    built = did = None
    if b.built or b.from_cache or b.built_ahead:
        built = f"{b.built} built, {b.from_cache} loaded from Triton's cache" + (
            f"; {b.built_ahead} built ahead by the compile workers" if b.built_ahead else "")
    if ahead.get("workers"):
        errors = "; ".join(str(e) for e in ahead.get("worker_errors") or [])
        did = compiled_ahead_text(ahead) + (f"; errors: {errors}" if errors else "")
    return [("Triton compiles", built), ("compiled ahead", did)]


def row_time_sections(entries: Sequence[RowSplit]) -> list[str]:
    """summary.md's "Where the rows' time went" (metadata.row_split_s): each (kernel,
    provider)'s rows' own seconds per phase, the ROW_TIME_TOP largest, the rest in one line,
    then all rows; [] where none was recorded (interleaved CPU rounds, an older run).  Plain
    Python sums, row by row: pandas' compensated ones would round a .xx5 total otherwise."""
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
