"""Where a run's time went, from its metadata: the time split's line (the console's last
line and summary.md's `time` fact), the Triton compiles and the compile-ahead workers'
facts, and summary.md's table of the rows' own time by kernel and provider
(metadata.row_split_s, benches/sweep/job.py), which says what a sweep spends beside its
samples, and on which rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.phases import PHASES
from contract.rows import TritonBuilds
from contract.schema import ROW_SPLIT
from roofline.report.findings import as_dict, finite_or_none

# The pairs listed by their rows' time, at most; the rest are summed in one line.
ROW_TIME_TOP = 12


def time_split_line(meta: dict[str, Any]) -> str | None:
    """"timing N s of M s", then the run's other phases of half a second or more,
    largest first (metadata.time_split_s, benches/sweep/phases.py); None for a run that did
    not record its split.  The console's last line and summary.md's `time` fact."""
    split, wall = as_dict(meta.get("time_split_s")), finite_or_none(meta.get("wall_s"))
    if not split or wall is None:
        return None
    rest = sorted(((f, k) for k, v in split.items()
                   if k != "timing" and (f := finite_or_none(v)) is not None and f >= 0.5),
                  reverse=True)
    tail = ", ".join(f"{k} {v:.0f}" for v, k in rest)
    return (f"timing {finite_or_none(split.get('timing')) or 0.0:.0f} s of {wall:.0f} s"
            + (f" ({tail})" if tail else ""))


def compiles_line(meta: dict[str, Any]) -> str | None:
    """The Triton compiles a run asked for: built or loaded from Triton's cache
    (metadata.triton_compiles), and those its compile-ahead workers built
    (compiled_ahead.kernels_built): a cold cache or a warm one.  None when it recorded
    none (a CPU run, an older run)."""
    b = TritonBuilds.of(meta)
    if not (b.built or b.from_cache or b.built_ahead):
        return None
    return (f"{b.built} built, {b.from_cache} loaded from Triton's cache"
            + (f"; {b.built_ahead} built ahead by the compile workers" if b.built_ahead
               else ""))


def compiled_ahead_line(meta: dict[str, Any]) -> str | None:
    """What the compile-ahead workers did (metadata.compiled_ahead): cases done of
    those given, kernels built, the seconds the sweep waited for them after its
    ceilings, and their errors, which say why they compiled less (the H200's runs of
    2026-11-27 recorded 0 of 183 and nothing else).  None where no worker ran."""
    ahead = meta.get("compiled_ahead")
    if not isinstance(ahead, dict) or not ahead.get("workers"):
        return None
    line = (f"{ahead.get('cases_done', 0)} of {ahead.get('cases', 0)} cases by "
            f"{ahead['workers']} workers ({ahead.get('kernels_compiled', 0)} kernels, "
            f"{ahead.get('kernels_built', 0)} built)")
    if isinstance(ahead.get("waited_s"), int | float):
        line += f", {ahead['waited_s']:.1f} s waited for after the ceilings"
        if ahead.get("wait_ended") not in (None, "done"):
            line += f" (ended: {ahead['wait_ended']})"
    errors = [str(e) for e in ahead.get("worker_errors") or []]
    return line + (f"; errors: {'; '.join(errors)}" if errors else "")


def row_time_sections(meta: dict[str, Any],
                      md_table: Callable[[list[str], list[list[Any]], str], str]
                      ) -> list[str]:
    """summary.md's "Where the rows' time went": each (kernel, provider)'s rows' own
    seconds per phase (metadata.row_split_s: a serial sweep's), the largest totals
    first, ROW_TIME_TOP of them and the rest in one line, then all rows; [] for a run
    that recorded none (a CPU sweep whose rounds interleave, a run made before
    2026-11-28)."""
    entries = meta.get(ROW_SPLIT)
    if not isinstance(entries, list) or not entries:
        return []
    by: dict[tuple[str, str], dict[str, float]] = {}
    rows: dict[tuple[str, str], int] = {}
    for e in entries:
        key = e.get("row") if isinstance(e, dict) else None
        split = as_dict(e.get("s")) if isinstance(e, dict) else {}
        if not isinstance(key, list) or len(key) < 2:
            continue
        pair = (str(key[0]), str(key[1]))
        rows[pair] = rows.get(pair, 0) + 1
        acc = by.setdefault(pair, {})
        for phase, v in split.items():
            if (f := finite_or_none(v)) is not None:
                acc[phase] = acc.get(phase, 0.0) + f
    if not by:
        return []
    phases = [p for p in PHASES if any(p in acc for acc in by.values())]
    ranked = sorted(by, key=lambda k: -sum(by[k].values()))

    def line(label: str, n: int, acc: dict[str, float]) -> list[Any]:
        return [label, n, *(f"{acc.get(p, 0.0):.2f}" for p in phases),
                f"{sum(acc.values()):.2f}"]

    def total(keys: list[tuple[str, str]]) -> dict[str, float]:
        return {p: sum(by[k].get(p, 0.0) for k in keys) for p in phases}

    body = [line(f"{k} {p}", rows[(k, p)], by[(k, p)]) for k, p in ranked[:ROW_TIME_TOP]]
    rest = ranked[ROW_TIME_TOP:]
    if rest:
        body.append(line(f"{len(rest)} more", sum(rows[k] for k in rest), total(rest)))
    body.append(line("all rows", sum(rows.values()), total(ranked)))
    return ["## Where the rows' time went",
            "Each row's own seconds by phase (benches/sweep/phases.py), summed by kernel and "
            "provider: what the sweep spends beside the samples (`timing`), and on which "
            "rows.\n\n" + md_table(["kernel provider", "rows", *phases, "total"], body,
                      "l" + "r" * (len(phases) + 2))]

