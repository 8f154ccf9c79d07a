"""Where a run's wall time goes, phase by phase (metadata.time_split_s) and row by row
(metadata.row_split_s); what each phase books: docs/measurement.md."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from contract.phases import PHASES

BOOKED = PHASES[:-1]  # the phases booked explicitly; `other` is the rest of the wall time


def process_start() -> float:
    """time.perf_counter's reading when this process started (/proc/self/stat against
    CLOCK_BOOTTIME: start-up and imports counted), else now."""
    try:  # starttime, field 22, in ticks since boot; the name before it may hold ")"
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        age = 0.0
    return time.perf_counter() - max(0.0, age)


def _kept(got: dict[str, float]) -> dict[str, float]:
    """A row's split: PHASES order, rounded to 0.1 ms, the phases that took none left out."""
    return {k: r for k in PHASES if (r := round(got.get(k, 0.0), 4)) > 0}


class TimeSplit:
    """Seconds per phase of one process's run: `phase(name)` books its block's time to
    `name`, pausing the phase it was opened in (phases are exclusive: they and `other`
    add up to the wall time); `split()` is the record."""

    def __init__(self, start: float | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = clock() if start is None else start
        self.seconds = dict.fromkeys(BOOKED, 0.0)
        # Triton's compiles, built or loaded (compiles_booked): a cold cache or a warm one
        self.compiles = {"compiled": 0, "from_cache": 0}
        self._open: list[str] = []  # the phases open, innermost last: it alone runs
        self._since = self.start  # since it started or resumed

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r} (one of {', '.join(BOOKED)})")
        self._book()  # the outer phase pauses
        self._open.append(name)
        try:
            yield
        finally:
            self._book()  # then resumes
            # its own entry: a generator closed out of order must not pop another's
            del self._open[max(i for i, n in enumerate(self._open) if n == name)]

    def _book(self) -> None:
        now = self.clock()
        if self._open:
            self.seconds[self._open[-1]] += now - self._since
        self._since = now

    def move(self, seconds: float, to: str) -> None:
        """Book `seconds` spent inside the open phase (at most what it has run since it
        last started or resumed) to `to` instead: a compile, a timer's capture."""
        if seconds <= 0:
            return
        if self._open:
            seconds = min(seconds, self.clock() - self._since)
            self._since += seconds
        self.seconds[to] += seconds

    def mark(self) -> dict[str, float]:
        """Seconds per phase so far, unrounded (PHASES; an open phase up to now, `other`
        the rest of the wall time): where a row's own split starts (`since`)."""
        now, got = self.clock(), dict(self.seconds)
        if self._open:
            got[self._open[-1]] += now - self._since
        return {**got, "other": max(0.0, now - self.start - sum(got.values()))}

    def since(self, mark: dict[str, float]) -> dict[str, float]:
        """A row's own split: seconds per phase since `mark` (_kept's form)."""
        now = self.mark()
        return _kept({k: now[k] - mark[k] for k in PHASES})

    def split(self) -> dict[str, float]:
        """Seconds per phase so far (PHASES), `other` the rest of the wall time, in ms."""
        return {k: round(v, 3) for k, v in self.mark().items()}

    def wall_s(self) -> float:
        return round(self.clock() - self.start, 3)


class RowSplits:
    """Each row's own split where a case's rows share stages: the runner adds each row's
    stages and share of the sampling, the job pops it (_kept's form) as it writes the row."""

    def __init__(self) -> None:
        self.by_row: dict[tuple[str, ...], dict[str, float]] = {}

    def add(self, key: tuple[str, ...], seconds: dict[str, float], share: float = 1.0
            ) -> None:
        mine = self.by_row.setdefault(key, {})
        for phase, s in seconds.items():
            mine[phase] = mine.get(phase, 0.0) + s * share

    def pop(self, key: tuple[str, ...]) -> dict[str, float]:
        return _kept(self.by_row.pop(key, {}))


@contextlib.contextmanager
def compiles_booked(split: TimeSplit) -> Iterator[None]:
    """Each compile Triton's listener reports (a listener set before is called first) moved
    to `compile` by Triton's own timer and counted in `split.compiles` by its `cache_hit`."""
    try:
        from triton import knobs
    except ImportError:  # no Triton on this platform: nothing compiles
        yield
        return
    prior = knobs.compilation.listener

    def listener(*, times: Any, cache_hit: bool, **kwargs: Any) -> None:
        if prior is not None:
            prior(times=times, cache_hit=cache_hit, **kwargs)
        split.compiles["from_cache" if cache_hit else "compiled"] += 1
        if times is not None:  # Triton's CompileTimes, in microseconds
            split.move(times.total * 1e-6, "compile")

    knobs.compilation.listener = listener
    try:
        yield
    finally:
        knobs.compilation.listener = prior
