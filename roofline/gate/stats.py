"""Statistics of two rows' raw timing samples: the centre and spread compared, the
fast end, and the one-sided Mann-Whitney test of a shift past the threshold."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from roofline.gate.rules import FAMILY_ALPHA, GROSS_RATIO_FLOOR, ROW_ALPHA_MAX, as_time


@dataclass(frozen=True)
class Timing:
    """One side of a row as the verdict needs it."""

    status: str  # ok, failed, skipped (anything else is treated like skipped)
    median: float = math.nan
    p20: float = math.nan
    p80: float = math.nan
    reason: str = ""
    samples: tuple[float, ...] = ()  # raw per-sample times (ms); () in runs before them
    timer: str = ""  # timing method; "" when unknown (older runs)
    n_samples: float = math.nan

    @property
    def center(self) -> float:
        """The median time the verdict uses: of the samples when there are any."""
        return float(np.median(self.samples)) if self.samples else self.median

    @property
    def count(self) -> float:
        return float(len(self.samples)) if self.samples else self.n_samples

    @property
    def spread(self) -> tuple[float, float]:
        """The p20..p80 interval; a missing percentile collapses onto the median."""
        if self.samples:
            lo, hi = np.percentile(self.samples, [20, 80])
            return float(lo), float(hi)
        lo = self.p20 if math.isfinite(self.p20) else self.median
        hi = self.p80 if math.isfinite(self.p80) else self.median
        return (lo, hi) if lo <= hi else (hi, lo)

    def problem(self) -> str | None:
        """Why the times of an ok side are unusable, or None."""
        if as_time(self.median) is None:
            return f"median time is {self.median!r}"
        bad = next((x for x in self.samples if as_time(x) is None), None)
        return None if bad is None else f"a sample is {bad!r}"


def gross_ratio(threshold_pct: float) -> float:
    """The time ratio beyond which too few samples for a rank test may still be a verdict
    (when the sample sets do not overlap)."""
    return max(GROSS_RATIO_FLOOR, 1.0 + 2.0 * threshold_pct / 100.0)


def row_alpha(n_rows: int) -> float:
    """Per-row significance level when n_rows rows are compared: min(0.001, 0.01 / n)."""
    return min(ROW_ALPHA_MAX, FAMILY_ALPHA / max(1, n_rows))


def min_p_value(n_base: int, n_new: int) -> float:
    """The smallest one-sided p-value a rank test of n_base vs n_new samples can give
    (complete separation, no ties): 1 / C(n_base + n_new, n_new)."""
    # In logs: C(871 + 871, 871) does not fit in a float.
    log_comb = (math.lgamma(n_base + n_new + 1) - math.lgamma(n_base + 1)
                - math.lgamma(n_new + 1))
    return math.exp(-log_comb)


def fast_end(samples: Sequence[float]) -> float:
    """The second-fastest sample: the fast end of a timing, robust to one outlier."""
    return float(np.partition(np.asarray(samples, dtype=np.float64), 1)[1])


def fast_end_ratio(base: Sequence[float], new: Sequence[float]) -> float:
    """new / base of fast_end (each side needs at least 2 samples)."""
    return fast_end(new) / fast_end(base)


def shift_p_value(base: Iterable[float], new: Iterable[float], threshold_pct: float,
                  slower: bool) -> float:
    """One-sided Mann-Whitney U p-value that `new` is slower (faster) than `base` by MORE
    than the threshold: the baseline samples are scaled by (1 + t) (the new ones, for
    faster) before the test, so H0 is "the change is within the threshold"."""
    b = np.asarray(list(base), dtype=np.float64)
    # Imported here: scipy.stats is slow to import (docs/measurement.md), and every run
    # imports this module (its fast-end helpers) but only a comparison needs the test.
    from scipy.stats import mannwhitneyu

    n = np.asarray(list(new), dtype=np.float64)
    s = 1.0 + threshold_pct / 100.0
    if slower:
        p = mannwhitneyu(n, b * s, alternative="greater").pvalue
    else:
        p = mannwhitneyu(n * s, b, alternative="less").pvalue
    p = float(p)
    return p if math.isfinite(p) else 1.0  # all samples tied: no evidence either way
