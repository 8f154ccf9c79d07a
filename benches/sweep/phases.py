"""Where a run's wall time goes: one accounting object (TimeSplit) that the job and the
runner open phases on, recorded in results.json as `metadata.time_split_s`.

The phases, in the order a row meets them:

- ceilings: measuring (or loading) the device's ceilings;
- compile: Triton compiles, as Triton's compilation listener reports them, taken out of
  whatever phase they happened in (the first call of a row, an autotuner's candidates);
- tune: the rest of an autotuned Triton row's first call (its candidates timed);
- inputs: a case's inputs, its float64 reference, the rotated copies its cold rows use,
  and the fresh buffers of a CPU row's later rounds;
- check: the first call of a row that is not tuned, the checked call and the comparison;
- capture: what a CUDA-graph row spends outside its samples (its launches counted, the
  warm-up round, the captures and the graphs' first replays);
- timing: the timers themselves (samples, their warm-up and estimates, host dispatch);
- profile: a GPU row's torch.profiler pass after its timing (kernel_ms, kernels): the
  profiler's start and stop, its few calls and the events read (booked in timing by the
  runs made before 2026-11-28);
- energy: a GPU row's energy window after its profile: its timed loop replayed long
  enough for NVML's energy counter (benches/sweep/energy_counter.py; --energy says
  which rows get one);
- write: the run's files (rows journal, results, figures, summary);
- other: everything else (start-up and imports, case building, the console).

Phases are exclusive: one opened inside another pauses it, so the phases and `other`
add up to the wall time since the process started (on Linux; since the split was made
elsewhere).  The phase names are contract.phases.PHASES (the readers of saved runs use
them too); `TimeSplit.mark` and `since` give one row's own split (metadata.row_split_s).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from contract.phases import PHASES

# The phases a run books explicitly; `other` is what is left of the wall time.
BOOKED = PHASES[:-1]


def process_start(clock: Callable[[], float] = time.perf_counter) -> float:
    """`clock`'s reading when this process started: its age from /proc/self/stat (start
    time in clock ticks since boot) against CLOCK_BOOTTIME, so that interpreter start-up
    and imports are counted; `clock()` now where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # Fields after the command's closing parenthesis start at field 3 (state);
            # starttime is field 22.
            after = f.read().rsplit(")", 1)[1].split()
        started = int(after[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return clock()
    return clock() - max(0.0, age)


@dataclass(eq=False)  # removed by identity: see TimeSplit.phase
class _Open:
    """An open phase: its name, and since when it has run (started or resumed)."""

    name: str
    since: float


@dataclass(frozen=True)
class Mark:
    """A TimeSplit's state at one moment (TimeSplit.mark): its clock's reading and the
    seconds booked per phase by then."""

    at: float
    booked: dict[str, float]


class TimeSplit:
    """Seconds per phase of one process's run (see the module's docstring).

    `phase(name)` books the time spent in its block to `name`; a phase opened inside
    another pauses the outer one.  `move(seconds, name)` books seconds that were spent
    inside the open phase to `name` instead (a compile reported by Triton's listener,
    a timer's capture).  `split()` is the record: every phase, `other` the rest."""

    def __init__(self, start: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = clock() if start is None else start
        self.seconds = dict.fromkeys(BOOKED, 0.0)
        # Triton's compiles this process asked for: built ("compiled") or loaded from
        # Triton's on-disk cache ("from_cache"), as its compilation listener says; what
        # tells an estimate whether the run had a cold or a warm cache.
        self.compiles = {"compiled": 0, "from_cache": 0}
        self._open: list[_Open] = []  # innermost last

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r} (one of {', '.join(BOOKED)})")
        now = self.clock()
        if self._open:  # the outer phase pauses
            outer = self._open[-1]
            self.seconds[outer.name] += now - outer.since
        entry = _Open(name, now)
        self._open.append(entry)
        try:
            yield
        finally:
            now = self.clock()
            self.seconds[name] += now - entry.since
            # Removed by identity: a generator closed out of order must not pop another.
            self._open = [e for e in self._open if e is not entry]
            if self._open:
                self._open[-1].since = now  # the outer phase resumes

    def move(self, seconds: float, to: str) -> None:
        """Book `seconds` spent inside the open phase to `to` instead (at most what the
        open phase has run since it last started or resumed)."""
        if seconds <= 0:
            return
        if self._open:
            top = self._open[-1]
            seconds = min(seconds, self.clock() - top.since)
            top.since += seconds
        self.seconds[to] += seconds

    def mark(self) -> Mark:
        """Where the split stands now: the clock and the seconds booked per phase (open
        phases up to now), for `since`."""
        now = self.clock()
        got = dict(self.seconds)
        for entry in self._open:
            got[entry.name] += now - entry.since
        return Mark(now, got)

    def since(self, mark: Mark) -> dict[str, float]:
        """Seconds per phase since `mark`, `other` the rest of the wall time between
        them, rounded to 0.1 ms; the phases that took none left out (a row's own split:
        benches/sweep/job.py records one per row of a serial sweep)."""
        now = self.mark()
        got = {k: now.booked[k] - mark.booked.get(k, 0.0) for k in BOOKED}
        got["other"] = max(0.0, now.at - mark.at - sum(got.values()))
        return {k: r for k in PHASES if (r := round(got[k], 4)) > 0}

    def split(self) -> dict[str, float]:
        """Seconds per phase so far (open phases up to now), `other` the rest of the wall
        time, rounded to milliseconds."""
        now = self.mark()
        got = dict(now.booked)
        got["other"] = max(0.0, now.at - self.start - sum(got.values()))
        return {k: round(got[k], 3) for k in PHASES}

    def wall_s(self) -> float:
        return round(self.clock() - self.start, 3)


class RowSplits:
    """Each row's own split (metadata.row_split_s) where the rows of a case share stages:
    the runner adds each row's own stages (its check, its timer's set-up, its profile)
    and its share of the case's sampling; the job takes a row's split as it writes it."""

    def __init__(self) -> None:
        self.by_row: dict[tuple[str, ...], dict[str, float]] = {}

    def add(self, key: tuple[str, ...], seconds: dict[str, float], share: float = 1.0
            ) -> None:
        mine = self.by_row.setdefault(key, {})
        for phase, s in seconds.items():
            mine[phase] = mine.get(phase, 0.0) + s * share

    def pop(self, key: tuple[str, ...]) -> dict[str, float]:
        """The row's split, phases in PHASES order, rounded to 0.1 ms (empty phases left
        out); {} for a row none was added for."""
        got = self.by_row.pop(key, {})
        return {k: r for k in PHASES if (r := round(got.get(k, 0.0), 4)) > 0}


@contextlib.contextmanager
def compiles_booked(split: TimeSplit) -> Iterator[None]:
    """Triton's compilation listener books every compile's time (Triton's own timer of
    it, in microseconds) to `compile`, out of the phase it happened in, and counts it in
    `split.compiles` (built, or loaded from Triton's cache: its `cache_hit`); a listener
    set before is kept and called first, and put back at the end.  A Triton without the
    listener (or none at all) leaves compiles where they happened."""
    try:
        from triton import knobs

        comp = knobs.compilation
        prior = comp.listener
    except (ImportError, AttributeError):
        yield
        return

    def listener(*, times: Any = None, **kwargs: Any) -> None:
        if prior is not None:
            prior(times=times, **kwargs)
        hit = kwargs.get("cache_hit")
        if isinstance(hit, bool):
            split.compiles["from_cache" if hit else "compiled"] += 1
        total = getattr(times, "total", None)
        if isinstance(total, int | float):
            split.move(total * 1e-6, "compile")

    comp.listener = listener
    try:
        yield
    finally:
        comp.listener = prior
