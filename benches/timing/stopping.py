"""When a row has sampled enough: the stopping rule.

A row samples until the confidence interval of its median is narrower than
TimingConfig.ci_rel_width of the median, after at least TimingConfig.gate_min_samples
and at most the samples its time cap allows (rep_ms, graph_rep_ms, or a CPU row's
rounds); docs/measurement.md ("The timing settings, and why") gives the width.

The interval is distribution-free: the k-th smallest and k-th largest samples, k from
the binomial distribution of how many samples fall below the true median (each does
with probability 1/2 whatever the distribution), so its coverage holds for the skewed,
two-level and outlier-heavy samples a GPU gives (clock steps, a late flush), where a
normal approximation (median +- 1.25 x 1.96 sd / sqrt(n)) assumes a shape they do not
have and one outlier widens it.  Plain arithmetic on numbers: nothing here measures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

# The binomial CDF from scipy.special: importing scipy.stats for this one function would
# cost every run several times as long (docs/measurement.md, "Figures behind the code's
# choices").
from scipy.special import bdtr

from benches.timing.plan import TimingConfig

# Why a row stopped sampling (Timing.stopped).
STOP_NOISE = "noise"  # its median's interval was within the width
STOP_CAP = "time cap"  # it took all the samples its time allowed


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, level: float) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) of the order statistics bounding a `level` confidence
    interval of the median of n samples, [x(lo), x(hi)]: the largest lo with
    P(B < lo+1) <= (1 - level) / 2, B ~ Binomial(n, 1/2), and hi = n - 1 - lo (coverage
    1 - 2 P(B <= lo) >= level).  None when n is too small for any interval to reach the
    level (n < 6 at 95%)."""
    tail = (1.0 - level) / 2.0
    # lo: the largest k with P(B <= k) <= tail, searched from the normal approximation.
    k = max(-1, min(n - 1, math.floor(n / 2 + NormalDist().inv_cdf(tail) * math.sqrt(n) / 2)))
    while k + 1 < n and bdtr(k + 1, n, 0.5) <= tail:
        k += 1
    while k >= 0 and bdtr(k, n, 0.5) > tail:
        k -= 1
    if k < 0 or k >= n - 1 - k:
        return None
    return k, n - 1 - k


def median_ci(samples: Sequence[float], level: float) -> tuple[float, float] | None:
    """The distribution-free `level` confidence interval of the samples' median (see
    median_ci_ranks); None when there are too few samples for one."""
    ranks = median_ci_ranks(len(samples), level)
    if ranks is None:
        return None
    s = np.sort(np.asarray(samples, dtype=np.float64))
    return float(s[ranks[0]]), float(s[ranks[1]])


def ci_rel_width(samples: Sequence[float], level: float) -> float:
    """Width of the median's interval over the median (inf: too few samples, or a
    median of 0)."""
    ci = median_ci(samples, level)
    med = float(np.median(samples)) if len(samples) else 0.0
    if ci is None or med <= 0:
        return float("inf")
    return (ci[1] - ci[0]) / med


def settled(samples: Sequence[float], rel_width: float, level: float,
            min_samples: int) -> bool:
    """Whether a row may stop: at least min_samples, and its median's interval within
    rel_width of the median."""
    return len(samples) >= min_samples and ci_rel_width(samples, level) <= rel_width


def settled_count(samples: Sequence[float], rel_width: float, level: float,
                  min_samples: int, step: Callable[[int], int] | None = None) -> int:
    """How many of `samples` (in the order taken) the rule would have taken: the first
    checked count at which they settle, else all of them.  The counts checked are
    those a timer checks (next_batch): min_samples, then growing by `step(taken)`.
    Simulates the rule on a recorded row."""
    step = step or batch_step
    n = min(len(samples), max(min_samples, 1))
    while n < len(samples):
        if settled(samples[:n], rel_width, level, min_samples):
            return n
        n = min(len(samples), n + step(n))
    return len(samples)


def batch_step(taken: int) -> int:
    """Samples a GPU timer takes before it checks again, `taken` so far: a quarter
    more, at least 5, so that a row overshoots the count that settles it by at most
    about 25% while the checks (each a device synchronization) stay few: about 10 for a
    row of 1,000 samples."""
    return max(5, taken // 4)


def cpu_settled(samples: list[float], rounds: int, timing: TimingConfig) -> bool:
    """Whether a CPU row may skip its later rounds: `rounds` done, at least
    timing.cpu_min_rounds of them (so that its samples span more than one of a shared
    machine's slow and fast spells), at least timing.min_samples samples (a CPU row's
    floor, 25, stays), and its samples so far meet the stopping rule (above)."""
    return timing.ci_rel_width > 0 and rounds >= timing.cpu_min_rounds and settled(
        samples, timing.ci_rel_width, timing.ci_level,
        max(timing.gate_min_samples, timing.min_samples))


@dataclass(frozen=True)
class Sampled:
    """A timer's samples and why it stopped (STOP_NOISE or STOP_CAP)."""

    samples: list[float]
    stopped: str


def sample_until_settled(take: Callable[[int], list[float]], cap: int, rel_width: float,
                         level: float, min_samples: int) -> Sampled:
    """Samples from `take(k)` (k more samples; the caller's loop, synchronized at its
    end) in batches: first min(min_samples, cap), then batch_step more at a time, until
    the rule is met or `cap` samples are taken.  rel_width 0 turns the rule off (the
    cap is taken in one batch, as before it)."""
    if rel_width <= 0:
        return Sampled(list(take(cap)), STOP_CAP)
    samples = list(take(min(max(1, min_samples), cap)))
    while len(samples) < cap:
        if settled(samples, rel_width, level, min_samples):
            return Sampled(samples, STOP_NOISE)
        samples += take(min(batch_step(len(samples)), cap - len(samples)))
    return Sampled(samples, STOP_NOISE if settled(samples, rel_width, level, min_samples)
                   else STOP_CAP)
