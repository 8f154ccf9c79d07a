"""What a history can see: for its length and noise, the smallest step its change points
can find and after how many runs at the new level, so that "no change" is not read as
"no regression" when the history was too short (or too noisy) to tell.

A step after the newest run is modelled: the store's runs are the old level, k runs
follow at the new one, and each run's log time scatters normally with the series'
spread (roofline.history.noise.spread: run to run, and at least each run's own noise).
The step is seen when both tests of the change point pass (changepoints.py):
- its size: the medians of the two segments are past --min-change apart (the difference
  of two medians of k and n runs has the variance of a mean of about 2 / pi as many);
- its significance, by the test the change point would use for those segment lengths
  in a history of n + k runs: the level test (every run of the shorter side beyond the
  other's level by Student's t at alpha; averaged over the error of that level, which
  all of them share, and over the spread as the runs estimate it, a chi-square with
  their degrees of freedom, but never below the runs' own noise), or the rank test
  (taken as needing complete separation, every new run slower than every old one: what
  its exact p needs at the shortest segments, and a lower bound on its power where
  more runs would allow an overlap).
The probability of both is solved for "seen in 9 of 10 such histories" (POWER).  It is a
model, checked against the replay benchmark (benches/test_bench_history.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.integrate import trapezoid
from scipy.stats import chi2, norm
from scipy.stats import t as student

from roofline.history.changepoints import rank_test_can_pass, young
from roofline.history.noise import level_scale

POWER = 0.9  # "can see": in 9 of 10 histories with this noise
MAX_RUNS = 10  # runs after a step the statement looks ahead
STEPS = (0.05, 0.10, 0.30)  # the steps the report states the runs needed for
# Grid of the old runs' largest value (in sds) for the complete-separation integral.
_GRID = np.linspace(-8.0, 12.0, 801)
# Quadrature of the level test's power: Gauss-Hermite nodes of the level's error (in its
# sds), and equal-probability bins of the chi-square of the estimated spread.
_LEVEL_NODES, _LEVEL_WEIGHTS = np.polynomial.hermite_e.hermegauss(24)
_LEVEL_WEIGHTS = _LEVEL_WEIGHTS / _LEVEL_WEIGHTS.sum()
_CHI_BINS = (np.arange(64) + 0.5) / 64


def _separated(delta: float, n_old: int, k: int) -> float:
    """P(every one of k runs at +delta sd is above all n_old runs at 0): the integral over
    the old runs' maximum u (density n phi(u) Phi(u)^(n-1)) of P(all k new runs > u)."""
    u = _GRID
    dens = n_old * norm.pdf(u) * norm.cdf(u) ** (n_old - 1)
    return float(trapezoid(dens * norm.sf(u - delta) ** k, u))


def _level_power(d: float, sd: float, own: float, n_short: int, n_long: int,
                 alpha: float) -> float:
    """P(every one of n_short runs d away from the other segment's level passes the
    level test), runs scattering with sd: E over the level's error e and the estimated
    spread s of Phi((d - e - t s c) / sd) ^ n_short."""
    df = n_short + n_long - 2
    t_c = student.ppf(1.0 - alpha / 2.0, df)
    c = level_scale(1.0, n_long)
    s = np.maximum(sd * np.sqrt(chi2.ppf(_CHI_BINS, df) / df), own)
    e = _LEVEL_NODES * sd * math.sqrt(0.5 * math.pi / n_long)
    z = (d - e[:, None] - t_c * c * s[None, :]) / sd
    return float((_LEVEL_WEIGHTS[:, None] * norm.cdf(z) ** n_short).sum() / len(s))


def seen_probability(step: float, var: float, n_old: int, k: int, alpha: float,
                     min_change: float, min_size: int, own: float = 0.0) -> float:
    """Probability that a step (relative, 0.10 = 10% slower) after n_old runs is a change
    point once k runs are at its level, for a variance `var` of a run's log time about
    its level (noise.spread) of which `own` is the runs' own noise (an sd)."""
    if k < min_size or n_old < min_size or math.isnan(var):
        return 0.0
    d = math.log1p(step)
    if var <= 0.0:
        return float(d >= math.log1p(min_change))
    sd = math.sqrt(var)
    size = norm.cdf((d - math.log1p(min_change))
                    / (sd * math.sqrt(0.5 * math.pi * (1.0 / k + 1.0 / n_old))))
    if rank_test_can_pass(n_old, k, alpha) or not young(n_old + k, min_size, alpha):
        return size * _separated(d / sd, n_old, k)
    return size * _level_power(d, sd, own, min(k, n_old), max(k, n_old), alpha)


def runs_needed(step: float, var: float, n_old: int, alpha: float, min_change: float,
                min_size: int, window: int | None = None, own: float = 0.0) -> int | None:
    """The fewest runs after a step that see it in POWER of histories (None: more than
    MAX_RUNS); the old level holds at most window - k runs."""
    for k in range(min_size, MAX_RUNS + 1):
        old = n_old if window is None else min(n_old, window - k)
        if seen_probability(step, var, old, k, alpha, min_change, min_size, own) >= POWER:
            return k
    return None


def smallest_step(var: float, n_old: int, k: int, alpha: float, min_change: float,
                  min_size: int, own: float = 0.0) -> float:
    """The smallest step seen in POWER of histories with k runs after it (inf: none up to
    a 10x slowdown)."""
    def seen(s: float) -> bool:
        return seen_probability(s, var, n_old, k, alpha, min_change, min_size,
                                own) >= POWER

    lo, hi = min_change, 9.0
    if not seen(hi):
        return math.inf
    for _ in range(40):  # bisection to well under 0.1% of a step
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if seen(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class Sight:
    """What a device's history can see, for noise like its median series'."""

    runs: int  # runs the search holds (the store's, at most the window)
    spread: float  # median series' sd of log time (run to run, floored by own noise)
    own: float  # median series' own noise (median_noise), nan if none
    needed: dict[float, int | None]  # step -> runs after it to see it (None: > MAX_RUNS)
    smallest: float  # smallest step seen with min_size runs after it
    too_noisy: list[str]  # series that cannot see a 10% step within MAX_RUNS runs
    series: int  # series considered


def sight(variances: dict[str, float], own: dict[str, float], runs: int, alpha: float,
          min_change: float, min_size: int, window: int | None) -> Sight:
    """The statement for a device: `variances` per series name (noise.spread of its runs
    about its levels), `own` its median own noise; `runs` in the store."""
    held = runs if window is None else min(runs, window)
    known = {k: v for k, v in variances.items() if math.isfinite(v)}
    var = float(np.median(list(known.values()))) if known else math.nan
    owns = [v for v in own.values() if math.isfinite(v)]
    typical = float(np.median(owns)) if owns else math.nan
    floor = typical if owns else 0.0
    needed = {s: runs_needed(s, var, held, alpha, min_change, min_size, window, floor)
              for s in STEPS} if known else {s: None for s in STEPS}
    smallest = smallest_step(var, held, min_size, alpha, min_change, min_size, floor) \
        if known else math.inf
    noisy = sorted(name for name, v in known.items()
                   if runs_needed(0.10, v, held, alpha, min_change, min_size, window,
                                  own.get(name, 0.0) if math.isfinite(own.get(name, 0.0))
                                  else 0.0) is None)
    return Sight(runs=held, spread=math.sqrt(var) if known else math.nan, own=typical,
                 needed=needed, smallest=smallest, too_noisy=noisy, series=len(known))
