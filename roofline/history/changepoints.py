"""Change points of one series (a row's time across runs): where its level moved, by
how much, and whether the move is significant.

The method is Apache Otava's (formerly Hunter; MongoDB's change-point work before it):
a segmentation proposes candidate change points, then each candidate is tested against
the segments on either side of it, the weakest failing one is dropped and its neighbours
tested again, until every change point left passes (here each drop is followed by
moving the change points left onto their best split).  Here:

- candidates: ruptures' KernelCPD (its C implementation of optimal segmentation) with the
  linear kernel on the series' ranks, i.e. a least-squares fit of piecewise-constant
  ranks: a shared machine's slow spells put outliers of 10x and more into a CPU series,
  and ranks keep one such run from drawing a segment of its own;
- test, one value per run where the segments are long enough for it: a two-sided
  Mann-Whitney U test (scipy; exact when a segment has up to 8 runs) of the segment
  before against the segment after, at the significance level `alpha`.  Otava uses
  Student's t on the values, which a shared machine's outliers break (a slow spell's
  10x run is one rank to a rank test, not a variance that hides every step).  scipy's
  call costs milliseconds (docs/measurement.md) and a detection tests ~30 segments (the replay
  benchmark makes hundreds of thousands), so a cheap screen comes first: the t-test of
  the segments' ranks (Conover and Iman's rank-transform test, O(1) from prefix sums),
  and only a pair it gives p < SCREEN_P is tested exactly (its p is larger than
  Mann-Whitney's for small segments, never by 50x);
- test, in a young history (`young`: too short for a rank test to find a step at its
  newest end) where the segments are too short for ranks (3 runs against 8 cannot go
  below 2 / C(11, 3) = 0.012, whatever the step): every run of the shorter segment
  must stand off the other's level by more than both the run-to-run spread and the
  runs' own noise allow (roofline.history.noise.level_p_value, from each run's p20,
  p80 and sample count), at the same `alpha`;
- size: the ratio of the two segments' medians must be past `min_change` either way
  (symmetric in log-time as the gate's threshold: 1/(1 + m) faster or 1 + m slower).

A segment has at least `min_size` runs, so a step is visible after `min_size` runs at its
new level.  `new_changes` is what a CI report calls new: change points found in the whole
series that were not found before its newest runs were added (by the detections of the
KNOWN_RUNS histories before them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr
from scipy.stats import mannwhitneyu, rankdata

from roofline.gate.stats import min_p_value
from roofline.history.errors import require
from roofline.history.noise import level_p_value

# Defaults, tuned on the replay benchmark (benches/test_bench_history.py, which reports
# the false-alarm rate and detection delays they give on recorded CPU noise).
DEFAULT_MIN_CHANGE = 0.05  # relative change of the segment medians (5%)
DEFAULT_ALPHA = 0.001  # significance level of each change point's rank test
DEFAULT_MIN_SIZE = 3  # runs on each side of a change point
DEFAULT_WINDOW = 100  # newest runs the report searches (None: all; the dashboard's)
# Candidates proposed per window before testing: more than real changes ever are.
MAX_CANDIDATES = 12
# The smaller segment's size up to which the Mann-Whitney p-value is exact.
EXACT_MAX = 8
# Rank t-test p-value below which the Mann-Whitney test is run (see the module's text).
SCREEN_P = 0.05
# Two change points this close (in runs) and of the same sign are the same change.
SAME_CHANGE_RUNS = 2
# Detections a change point is known from: those of the series without its newest
# `since`, `since` + 1, ... runs.  A spurious change point of a noisy series can vanish
# for a run or two as runs are added and come back (the replay benchmark's two-thread
# matmul: found after runs 104-106, 109-110 and 112 of one history); compared with one
# detection only, each return was new again, an alarm of its own.
KNOWN_RUNS = 3


@dataclass(frozen=True)
class ChangePoint:
    """A change of level at `index`: the first value of the new level."""

    index: int
    before: float  # median of the segment before
    after: float  # median of the segment after
    p_value: float
    n_before: int
    n_after: int
    test: str = "rank"  # "rank": one value per run; "level": runs against their noise

    @property
    def ratio(self) -> float:
        """after / before: above 1 a time got longer (slower)."""
        return self.after / self.before

    @property
    def change(self) -> float:
        """The relative step, + slower, - faster (0.10 = 10% longer)."""
        return self.ratio - 1.0

    @property
    def slower(self) -> bool:
        return self.ratio > 1.0


def _candidates(x: np.ndarray, ranks: np.ndarray, min_size: int, young: bool) -> list[int]:
    """Splits to test.  In a young history (see `young`): the best split in log time
    with an L1 cost (ruptures' exact Dynp), as the least-squares split of ranks is not
    one there: ranks are evenly spread, and for 8 runs then 4 at a new level it prefers
    6 | 6 to the step at 8 (a sum of squares of 41 against 47), after which the step's
    runs cannot be split off again."""
    rpt = require("ruptures", "change-point detection")
    n = len(ranks)
    if n < 2 * min_size:
        return []
    # At most a third of the splits min_size allows: k segments of exactly min_size would
    # leave the optimum no freedom (24 runs, 7 splits: every third run).
    k = min(MAX_CANDIDATES, n // (3 * min_size))
    found: list[int] = []
    if young:
        algo = rpt.Dynp(model="l1", min_size=min_size, jump=1)
        found = [int(b) for b in
                 algo.fit(x.reshape(-1, 1)).predict(n_bkps=max(1, k))[:-1]]
    elif k >= 1:
        algo = rpt.KernelCPD(kernel="linear", min_size=min_size, jump=1)
        found = [int(b) for b in
                 algo.fit((ranks / n).reshape(-1, 1)).predict(n_bkps=k)[:-1]]
    # The newest possible change point always stands as a candidate: it is the one CI
    # waits for, and the optimal split of a window may pass it by a run or two (nothing
    # left for refinement to move); with no step there it is dropped as too small.
    last = n - min_size
    if found and found[-1] > last - min_size:
        found[-1] = last
    elif not found or found[-1] < last:
        found.append(last)
    return found


def _test(x: np.ndarray, sums: tuple[np.ndarray, np.ndarray], a: int, b: int, c: int,
          threshold: float) -> tuple[float, float]:
    """(p-value, log ratio of medians) of x[a:b] against x[b:c]: pooled two-sided t-test
    of their ranks (sums: prefix sums of the ranks and their squares) as a screen, then
    the medians, then (only for a step past `threshold`, in log-time) Mann-Whitney."""
    s1, s2 = sums
    n1, n2 = b - a, c - b
    m1, m2 = (s1[b] - s1[a]) / n1, (s1[c] - s1[b]) / n2
    ss = (s2[b] - s2[a] - n1 * m1 * m1) + (s2[c] - s2[b] - n2 * m2 * m2)
    df = n1 + n2 - 2
    if ss <= 1e-9:
        p = 1.0 if m1 == m2 else 0.0
    else:
        t = (m2 - m1) / math.sqrt(ss / df * (1.0 / n1 + 1.0 / n2))
        p = 2.0 * float(stdtr(df, -abs(t)))
        p = p if math.isfinite(p) else 1.0
    log_ratio = float(np.median(x[b:c]) - np.median(x[a:b]))
    if p >= SCREEN_P or abs(log_ratio) < threshold:  # fails either way: skip the exact test
        return p, log_ratio
    # Exact whenever a side is small: scipy's default falls back to the normal
    # approximation as soon as two values tie, which for 3 runs after 97 gives p >= 3e-3
    # (z <= 2.94) where the exact test gives 1.2e-5, so a 3-run step could never pass.
    # Ties inside a side do not change a complete separation's exact p.
    method = "exact" if min(b - a, c - b) <= EXACT_MAX else "asymptotic"
    p = float(mannwhitneyu(x[a:b], x[b:c], alternative="two-sided", method=method).pvalue)
    return (p if math.isfinite(p) else 1.0), log_ratio


def _l1(x: np.ndarray) -> float:
    return float(np.abs(x - np.median(x)).sum())


def _prune(kept: list[int], n: int, test, alpha: float, threshold: float,
           one: bool = False) -> list[int]:
    """Drop the weakest failing change point and test its neighbours again, until every
    one left passes (Otava's loop), or with `one` after the first drop.  Weakest: a step
    below the minimum first (smallest first), then the largest p.  Size before
    significance, because a real step next to a spurious candidate a few runs later is
    tested against that short segment and can fail on p alone (10 runs against 3:
    p >= 2 / C(13, 3) = 0.007); the spurious one has no step and must go first, so the
    real one is tested against its whole segment."""
    kept = list(kept)
    while kept:
        bounds = [0, *kept, n]
        scored = []
        for i in range(1, len(bounds) - 1):
            p, log_ratio = test(bounds[i - 1], bounds[i], bounds[i + 1])
            small = abs(log_ratio) < threshold
            fails = small or p >= alpha
            scored.append((fails, small, -abs(log_ratio) if small else p, i - 1))
        worst = max(scored)
        if not worst[0]:
            break
        del kept[worst[3]]
        if one:
            break
    return kept


def _refine(x: np.ndarray, kept: list[int], min_size: int, test, alpha: float,
            threshold: float, check: bool = True) -> list[int]:
    """Each change point moved (by up to min_size - 1 runs) to where the two segments'
    absolute deviations from their medians are least; dropped if it fails the test
    there (with `check`).  Why: on ranks, the least-squares split of a step at the end
    of a window takes the highest value before the step with it (its rank is next to
    the new level's), so the change point would land a run early, and with one more run
    at the new level its test passes sooner than the true split's can (2 / C(23, 3) =
    1.1e-3 for 3 runs after 20, but 4 after 19 pass at 9e-4); in log-time with a robust
    cost it does not."""
    out: list[int] = []
    for i, b0 in enumerate(kept):
        a = out[-1] if out else 0
        c = kept[i + 1] if i + 1 < len(kept) else len(x)
        lo, hi = max(a + min_size, b0 - min_size + 1), min(c - min_size, b0 + min_size - 1)
        best = min(range(lo, hi + 1), key=lambda b: (_l1(x[a:b]) + _l1(x[b:c]), abs(b - b0)))
        if best != b0 and check:
            p, log_ratio = test(a, best, c)
            if not (p < alpha and abs(log_ratio) >= threshold):
                continue
        out.append(best)
    return out


def rank_test_can_pass(n_before: int, n_after: int, alpha: float) -> bool:
    """Whether a two-sided rank test of n_before runs against n_after can reach p < alpha
    at all (complete separation gives p = 2 / C(n_before + n_after, n_after))."""
    return 2.0 * min_p_value(n_before, n_after) < alpha


def young(n: int, min_size: int, alpha: float) -> bool:
    """Whether a history of n runs is too short for one value per run alone: no rank
    test can find a step of min_size runs at its newest end (23 runs or fewer at the
    defaults, 2 / C(24, 3) = 9.9e-4).  A longer history keeps the rank test for every
    pair of segments, a short one between change points included: there a level test
    would also let spurious 3-run segments of a noisy CPU series stand and hide a real
    step behind them (the replay benchmark's long histories)."""
    return not rank_test_can_pass(n - min_size, min_size, alpha)


def young_runs(min_size: int, alpha: float) -> int:
    """The most runs a young history has (23 at the defaults)."""
    n = 2 * min_size
    while young(n, min_size, alpha):
        n += 1
    return n - 1


class _Tests:
    """The test of a change point at b between the segments x[a:b] and x[b:c] of one
    detection (log values `x`, each run's own noise `own`), cached: (p-value, log ratio
    of the medians).  In a young history (`short`), a pair of segments too short for a
    rank test is tested by level (noise.level_p_value)."""

    def __init__(self, x: np.ndarray, own: np.ndarray | None, threshold: float,
                 alpha: float, short: bool) -> None:
        self.x, self.own, self.threshold, self.alpha, self.short = (x, own, threshold,
                                                                    alpha, short)
        ranks = rankdata(x)
        self.ranks = ranks
        self.sums = (np.concatenate(([0.0], np.cumsum(ranks))),
                     np.concatenate(([0.0], np.cumsum(ranks * ranks))))
        self.cache: dict[tuple[int, int, int], tuple[float, float]] = {}

    def by_level(self, a: int, b: int, c: int) -> bool:
        return self.short and not rank_test_can_pass(b - a, c - b, self.alpha)

    def __call__(self, a: int, b: int, c: int) -> tuple[float, float]:
        if (a, b, c) not in self.cache:
            x = self.x
            if self.by_level(a, b, c):
                log_ratio = float(np.median(x[b:c]) - np.median(x[a:b]))
                self.cache[(a, b, c)] = (level_p_value(x, self.own, a, b, c), log_ratio)
            else:
                self.cache[(a, b, c)] = _test(x, self.sums, a, b, c, self.threshold)
        return self.cache[(a, b, c)]


def _search(test: _Tests, min_size: int, previous: bool) -> list[int]:
    """The change points that pass, from the candidates: refined once before any test
    too (a candidate a run or two off a step is tested against a segment holding both
    levels, fails and would be pruned before it moved).  Then one drop at a time, each
    followed by an unchecked refinement (a checked one drops every candidate whose
    better split fails, which with spurious neighbours still standing is most of them):
    the newest candidate can sit one segment behind a spurious one (balanced splits of
    ranks: 8 | 18 | 21 of 24 runs, a step at 20), and only once that one is gone can it
    move onto the step; pruning to the end first dropped it there and lost the step for
    a run or two.  Once all pass, the checked refinement as before."""
    x, n, alpha, threshold = test.x, len(test.x), test.alpha, test.threshold
    kept = _refine(x, _candidates(x, test.ranks, min_size, test.short), min_size, test,
                   alpha, threshold, check=False)
    for _ in range(3 * MAX_CANDIDATES):  # prune, refine, again until nothing moves
        pruned = _prune(kept, n, test, alpha, threshold, one=not previous)
        if pruned != kept and not previous:  # one dropped: the rest move, unchecked
            kept = _refine(x, pruned, min_size, test, alpha, threshold, check=False)
            continue
        refined = _refine(x, pruned, min_size, test, alpha, threshold)
        if refined == kept:
            break
        kept = refined
    if not previous:  # should the loop run out, only change points that pass are kept
        kept = _prune(kept, n, test, alpha, threshold)
    return kept


def detect(values: Sequence[float], min_change: float = DEFAULT_MIN_CHANGE,
           alpha: float = DEFAULT_ALPHA, min_size: int = DEFAULT_MIN_SIZE,
           window: int | None = DEFAULT_WINDOW, noise: Sequence[float] | None = None,
           previous: bool = False) -> list[ChangePoint]:
    """Change points of a series of positive values (times), oldest first.

    Only the newest `window` values are searched (None: all), each change point against
    its neighbours' segments.  `noise`: each run's own noise (median_noise of its p20,
    p80 and sample count; NaN where unknown).  `previous`: the detection as it was
    before young histories had their own (ranks alone for every pair of segments,
    KernelCPD's candidates at every length, every failing candidate pruned before any
    moves), the replay benchmark's "before".  A value that is not a positive finite
    number raises ValueError (the store checks its rows before they get here)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) and not (np.isfinite(v).all() and (v > 0).all()):
        raise ValueError("change points need positive, finite values")
    if noise is not None and len(noise) != len(v):
        raise ValueError("noise needs one value per run")
    offset = 0 if window is None or len(v) <= window else len(v) - window
    x = np.log(v[offset:])
    own = None if noise is None else np.asarray(noise, dtype=np.float64)[offset:]
    n = len(x)
    if n < 2 * min_size:
        return []
    test = _Tests(x, own, math.log1p(min_change), alpha,
                  not previous and young(n, min_size, alpha))
    bounds = [0, *_search(test, min_size, previous), n]
    out = []
    for i in range(1, len(bounds) - 1):
        a, b, c = bounds[i - 1], bounds[i], bounds[i + 1]
        p, _ = test(a, b, c)
        out.append(ChangePoint(index=offset + b, before=float(np.exp(np.median(x[a:b]))),
                               after=float(np.exp(np.median(x[b:c]))), p_value=p,
                               n_before=b - a, n_after=c - b,
                               test="level" if test.by_level(a, b, c) else "rank"))
    return out


def same_change(a: ChangePoint, b: ChangePoint) -> bool:
    """Whether two change points (of detections with and without the newest runs) are
    one change: the same sign, within SAME_CHANGE_RUNS runs of each other."""
    return a.slower == b.slower and abs(a.index - b.index) <= SAME_CHANGE_RUNS


def new_changes(now: Sequence[ChangePoint], *before: Sequence[ChangePoint]
                ) -> list[ChangePoint]:
    """The change points of `now` that none of the detections `before` (of the series
    without its newest runs: see KNOWN_RUNS) had."""
    return [c for c in now if not any(same_change(c, b) for d in before for b in d)]
