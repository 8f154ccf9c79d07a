"""A series' noise: what each run knows about its own (the uncertainty of its median,
from its p20, p80 and sample count: the store keeps these, not the raw samples), the
spread of runs about their level, and the test of a step against both that the change
points use where segments are too short for a rank test."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.special import stdtr

# The p20..p80 interval holds 60% of a run's samples.
CENTRAL_MASS = 0.6


def median_noise(p20: np.ndarray, p80: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Standard error of each run's log median from its own samples (NaN where unknown:
    no sample count, or a single sample).

    The median of n samples has a standard error of 1 / (2 f sqrt(n)), f the density at
    the median (its asymptotic variance); f is taken as the mean density over p20..p80
    (60% of the samples over ln p80 - ln p20), which needs no model of the
    distribution: a CPU run's samples are heavy-tailed (slow spells of 10x), and its
    density at the median is if anything higher than that mean, so the error is not
    underestimated.  For normal samples it gives 1.40 sd / sqrt(n) (the exact 1.25)."""
    p20, p80 = np.asarray(p20, dtype=np.float64), np.asarray(p80, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = np.log(p80) - np.log(p20)
        se = width / (2.0 * CENTRAL_MASS * np.sqrt(n))
    ok = np.isfinite(se) & (width >= 0) & (n >= 2)  # one sample: no spread to read
    return np.where(ok, se, np.nan)


def spread(x: np.ndarray, noise: np.ndarray | None, bounds: Sequence[int]
           ) -> tuple[float, int]:
    """(variance, degrees of freedom) of a run's log median about its level, from the runs
    x[bounds[0]:bounds[-1]] split into segments at the inner bounds: the pooled variance
    of the runs about their segments' means, and at least the runs' own noise (the mean
    of their median_noise squared, which does not count as degrees of freedom): a few
    runs that agree by chance, closer than their samples allow, do not make the noise
    look smaller than it is."""
    ss = sum(float(((x[a:b] - x[a:b].mean()) ** 2).sum())
             for a, b in zip(bounds[:-1], bounds[1:], strict=False) if b > a)
    df = bounds[-1] - bounds[0] - (len(bounds) - 1)
    var = ss / df if df > 0 else math.nan
    if noise is not None:
        own = noise[bounds[0]:bounds[-1]]
        own = own[np.isfinite(own)]
        if len(own):
            var = max(var, float(np.mean(own * own))) if math.isfinite(var) else \
                float(np.mean(own * own))
    return var, df


def level_scale(var: float, n_level: int) -> float:
    """The standard deviation of one run's distance to a level that is the median of
    n_level runs (the median of n runs has the variance of a mean of 2n / pi runs)."""
    return math.sqrt(var * (1.0 + 0.5 * math.pi / n_level))


def level_p_value(x: np.ndarray, noise: np.ndarray | None, a: int, b: int, c: int
                  ) -> float:
    """Two-sided p-value that the runs of the shorter of x[a:b], x[b:c] (log medians; the
    newer on a tie) all moved off the other segment's level (its median), in the
    direction of the step between the two medians.

    Each run of the short side is tested on its own, Student's t of its distance to the
    level in units of level_scale(spread of the two segments), with nA + nB - 2 degrees
    of freedom, and p is the largest of their p-values (an intersection-union test): one
    run caught in a slow spell cannot make a step, while every run that moved counts
    with its size, which a rank test ignores (with 3 runs against 5, no rank test can go
    below 2 / C(8, 3) = 0.036)."""
    xa, xb = x[a:b], x[b:c]
    newer_short = len(xb) <= len(xa)
    short, long_ = (xb, xa) if newer_short else (xa, xb)
    step = float(np.median(xb) - np.median(xa))
    var, df = spread(x, noise, (a, b, c))
    if step == 0.0 or df < 1:
        return 1.0
    if var <= 0.0:
        return 0.0
    # The step seen from the short side: B's runs moved by +step from A's level, A's
    # runs by -step from B's.
    sign = math.copysign(1.0, step) if newer_short else -math.copysign(1.0, step)
    t = sign * (short - np.median(long_)) / level_scale(var, len(long_))
    return float(min(1.0, 2.0 * stdtr(df, -t.min())))
