"""Replaying synthetic histories through the change-point detection, as CI would run it
(one detection per new run), to measure false alarms and detection delays.

Noise comes from real runs: a noise fixture holds, for a few rows, the raw samples of
several identical runs (same code, same machine).  A synthetic run of a row picks one of
those runs at random and bootstraps its samples (so run-to-run spells and within-run
spread are both the machine's own), then scales them by the level the scenario injects
(a step of +x% from one run on, or a drift of +d% per run).  It keeps what the store
keeps of a run: the median, and the uncertainty of the median its p20, p80 and sample
count give (roofline.history.noise).

Two kinds of history: long ones (`measure`: 200 runs, a step at run 100, detection after
every run from run 20) and young ones (`measure_short`: a step with 3 runs after it when
the history is `length` runs long, as a CI user meets it in a project's first weeks).

An alarm is what `history report --since 1 --fail-on-new` fails on: a slower change
point found after run t that the detection without run t did not have.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contract.schema import load_doc
from roofline.history.changepoints import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_CHANGE,
    DEFAULT_MIN_SIZE,
    DEFAULT_WINDOW,
    KNOWN_RUNS,
    SAME_CHANGE_RUNS,
    ChangePoint,
    detect,
    new_changes,
)
from roofline.history.noise import median_noise

RUNS = 200
STEPS = (0.03, 0.05, 0.10, 0.30)
SHORT_LENGTHS = (6, 8, 12, 20)  # young histories: runs in the store when a step has 3
SHORT_STEPS = (0.05, 0.10, 0.30)
SHORT_AFTER = 3  # runs after the step when a young history is `length` runs long
HORIZON = 20  # runs after a step within which an alarm counts as its detection
DRIFT_PER_RUN = 0.002
STEP_AT = 100  # the first run at the new level
WARMUP = 20  # runs before the first detection


def record_noise(runs: Sequence[str | os.PathLike], note: str = "") -> dict[str, Any]:
    """A noise fixture from identical runs: {row name: [samples of each run]}, the ok
    rows present in every run, samples rounded to 4 significant digits.  The fixture's
    JSON document (load_noise reads it back)."""
    per_run = []
    for run in runs:
        per_run.append({r.label(): [float(f"{x:.4g}") for x in r.timing.samples_ms]
                        for r in load_doc(run).rows if r.ok and r.timing.samples_ms})
    names = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    return {"note": note, "runs": len(per_run),
            "rows": {n: [p[n] for p in per_run] for n in names}}


def load_noise(path: str | os.PathLike) -> dict[str, list[np.ndarray]]:
    doc = json.loads(Path(path).read_text())
    return {name: [np.asarray(s, dtype=np.float64) for s in runs]
            for name, runs in doc["rows"].items()}


Stat = Callable[[np.ndarray], float]


def median_stat(samples: np.ndarray) -> float:
    return float(np.median(samples))


def synthetic(noise_runs: Sequence[np.ndarray], levels: np.ndarray,
              rng: np.random.Generator, stat: Stat = median_stat
              ) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic series: per run, a random real run's samples bootstrapped, times
    its level, reduced by `stat` (the median, as the store keeps); and each run's own
    noise (the standard error of its log median from its p20, p80 and count)."""
    out, p20, p80, n = (np.empty(len(levels)) for _ in range(4))
    for j, level in enumerate(levels):
        s = noise_runs[rng.integers(len(noise_runs))]
        b = rng.choice(s, size=len(s), replace=True)
        out[j] = stat(b) * level
        p20[j], p80[j] = np.percentile(b, [20, 80])
        n[j] = len(b)
    return out, median_noise(p20, p80, n)


def levels(kind: str, size: float = 0.0, runs: int = RUNS, at: int = STEP_AT) -> np.ndarray:
    """The injected level per run: 'none', 'step' (1 + size from run `at` on) or 'drift'
    ((1 + size) ** (runs since `at`) from `at` on)."""
    lv = np.ones(runs)
    if kind == "step":
        lv[at:] = 1.0 + size
    elif kind == "drift":
        lv[at:] = (1.0 + size) ** np.arange(1, runs - at + 1)
    elif kind != "none":
        raise ValueError(f"unknown scenario {kind!r}")
    return lv


@dataclass
class Replay:
    """Alarms of one replayed series: (run count t when raised, change point)."""

    alarms: list[tuple[int, ChangePoint]] = field(default_factory=list)
    evaluated: int = 0


@dataclass(frozen=True)
class Detection:
    """The detection a replay runs after each run (changepoints.detect's settings, its
    defaults the report's)."""

    min_change: float = DEFAULT_MIN_CHANGE
    alpha: float = DEFAULT_ALPHA
    min_size: int = DEFAULT_MIN_SIZE
    window: int | None = DEFAULT_WINDOW
    previous: bool = False

    def __call__(self, series: tuple[np.ndarray, np.ndarray], t: int) -> list[ChangePoint]:
        """The change points of the first t runs of a synthetic series."""
        values, noise = series
        return detect(values[:t], self.min_change, self.alpha, self.min_size, self.window,
                      noise=noise[:t], previous=self.previous)


Alarm = Callable[[int, ChangePoint], bool]


def replay(series: tuple[np.ndarray, np.ndarray], start: int = WARMUP,
           stop: int | None = None, until: Alarm | None = None,
           detection: Detection | None = None, **options: Any) -> Replay:
    """Detect after each run, with t = start .. stop runs seen, and keep every new
    slower change point as an alarm; with `until`, stop after the first run that raises
    an alarm it accepts (a delay needs no later run, and a replay of CPU noise costs
    ~20 ms a detection).  The detection: `detection`, else one of `options`
    (Detection's fields)."""
    stop = len(series[0]) if stop is None else stop
    out = Replay()
    detection = detection or Detection(**options)
    # The detections a change point is known from, newest first (one for the
    # detection before, as it was).
    known = 1 if detection.previous else KNOWN_RUNS
    before = [detection(series, max(0, start - k)) for k in range(1, known + 1)]
    for t in range(start, stop + 1):
        now = detection(series, t)
        raised = [(t, c) for c in new_changes(now, *before) if c.slower]
        out.alarms += raised
        before = [now, *before[:-1]]
        out.evaluated += 1
        if until is not None and any(until(*a) for a in raised):
            break
    return out


@dataclass
class Figures:
    """What the benchmark reports, per scenario."""

    false_per_100: float = float("nan")  # unchanged code: alarms per 100 runs
    detected: dict[float, float] = field(default_factory=dict)  # step -> rate within 3 runs
    detected_ever: dict[float, float] = field(default_factory=dict)  # within 20 runs
    delay: dict[float, float] = field(default_factory=dict)  # median runs until alarm
    drift_delay: float = float("nan")  # median runs of drift until alarm
    drift_detected: float = float("nan")  # share of trials with an alarm in 100 runs


def _delay(series: tuple[np.ndarray, np.ndarray], at: int, detection: Detection
           ) -> float:
    """Runs after the step at `at` until the first alarm at it (inf: none within
    HORIZON runs)."""
    def at_step(t: int, c: ChangePoint) -> bool:
        return abs(c.index - at) <= SAME_CHANGE_RUNS and t > at

    r = replay(series, start=at, stop=at + HORIZON, until=at_step, detection=detection)
    hit = [t - at for t, c in r.alarms if at_step(t, c)]
    return min(hit) if hit else np.inf


def measure(noise_runs: Sequence[np.ndarray], trials: int, seed: int = 0,
            null_trials: int | None = None, steps: Sequence[float] = STEPS,
            within: int = 3, **options: Any) -> Figures:
    """Replay `trials` synthetic series per scenario (null_trials of unchanged code,
    default `trials`) from one row's noise; options go to detect() (Detection)."""
    detection = Detection(**options)
    rng = np.random.default_rng(seed)
    fig = Figures()
    alarms = runs = 0
    for _ in range(null_trials if null_trials is not None else trials):
        r = replay(synthetic(noise_runs, levels("none"), rng), detection=detection)
        alarms += len(r.alarms)
        runs += r.evaluated
    fig.false_per_100 = 100.0 * alarms / max(1, runs)
    for size in steps:
        d = np.asarray([_delay(synthetic(noise_runs, levels("step", size), rng), STEP_AT,
                               detection) for _ in range(trials)])
        fig.detected[size] = float(np.mean(d <= within))
        fig.detected_ever[size] = float(np.mean(np.isfinite(d)))
        fig.delay[size] = float(np.median(d))
    delays = []
    for _ in range(trials):
        s = synthetic(noise_runs, levels("drift", DRIFT_PER_RUN), rng)
        r = replay(s, start=STEP_AT - 5, until=lambda t, _: t > STEP_AT,
                   detection=detection)
        hit = [t - STEP_AT for t, _ in r.alarms if t > STEP_AT]
        delays.append(min(hit) if hit else np.inf)
    d = np.asarray(delays)
    fig.drift_detected = float(np.mean(np.isfinite(d)))
    fig.drift_delay = float(np.median(d))
    return fig


def measure_short(noise_runs: Sequence[np.ndarray], length: int, trials: int,
                  null_trials: int, seed: int = 0, steps: Sequence[float] = SHORT_STEPS,
                  **options: Any) -> Figures:
    """A young history of `length` runs: false alarms per 100 runs are the alarms the
    `length`-th run of unchanged code raises (null_trials histories); a step has
    SHORT_AFTER runs after it when the history is `length` runs long, `detected` is the
    share seen by then, `detected_ever` within HORIZON runs, `delay` the median."""
    detection = Detection(**options)
    rng = np.random.default_rng(seed)
    fig = Figures()
    alarms = 0
    for _ in range(null_trials):
        r = replay(synthetic(noise_runs, levels("none", runs=length), rng), start=length,
                   detection=detection)
        alarms += len(r.alarms)
    fig.false_per_100 = 100.0 * alarms / max(1, null_trials)
    at = length - SHORT_AFTER
    for size in steps:
        lv = levels("step", size, runs=at + HORIZON, at=at)
        d = np.asarray([_delay(synthetic(noise_runs, lv, rng), at, detection)
                        for _ in range(trials)])
        fig.detected[size] = float(np.mean(d <= SHORT_AFTER))
        fig.detected_ever[size] = float(np.mean(np.isfinite(d)))
        fig.delay[size] = float(np.median(d))
    return fig
