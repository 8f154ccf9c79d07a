"""One verdict per row of two runs joined on their key (judge has the exact rule), and
the comparison's result object with the gate's exit code.

Rows of the two runs are joined on schema.ROW_ID (kernel, provider, dtype, shape and the
cache mode: a warm row is never compared with a cold one; a row written before the
`cache` column has its device's native mode, schema.native_cache) and each gets one
verdict (`judge` has the exact rule):

    slower, failed, now-skipped, invalid   regressions: exit code 1 (slower rows
                                           reported only with --allow slower)
    missing, method-changed                changed rows: exit 1 unless --allow missing /
                                           --allow method-change
    throttled                              timed while the GPU throttled (either run):
                                           exit 1 unless --allow throttled
    not-confirmed                          looked slower, not slower again when re-timed
    ambiguous                              past the threshold, but not significant
    faster, same                           timing verdicts
    new, fixed, skipped, still-failed      bookkeeping

The gate also fails (exit 1) on a run that was interrupted, aborted or is incomplete
(--allow incomplete) and on a baseline newer than the run, e.g. swapped arguments
(--allow newer-baseline).  Runs of different devices are refused (exit 2) unless
--allow-device-mismatch.  Usage errors (unreadable or malformed file, a baseline row with
a non-positive, NaN or non-numeric time, a bad threshold) are one `error: ...` line and
exit code 2, never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import astuple, dataclass, field, fields
from typing import Any

import pandas as pd

from contract.rows import is_throttled
from contract.run_meta import RunMeta
from contract.schema import (
    CACHE,
    KEY,
    ROW_ID,
    SAMPLES,
    RowKey,
    RunDoc,
    cache_column,
    row_key,
    row_name,
)
from roofline.gate.rules import (
    ALLOWABLE_VERDICTS,
    DEFAULT_THRESHOLD,
    FP8_DTYPES,
    NUMERIC_COLUMNS,
    REGRESSION_VERDICTS,
    ROW_ALPHA_MAX,
    VERDICT_ORDER,
    CompareError,
    check_threshold,
    is_missing,
    parse_samples,
    status_column,
    time_problem,
)
from roofline.gate.stats import (
    Timing,
    fast_end_ratio,
    gross_ratio,
    min_p_value,
    row_alpha,
    shift_p_value,
)


def judge(base: Timing | None, new: Timing | None,
          threshold_pct: float = DEFAULT_THRESHOLD,
          alpha: float = ROW_ALPHA_MAX) -> tuple[str, str]:
    """Verdict and a short note for one row; None means the row is absent from that run.

    Status rules, by the new run's status:
      * absent:  missing (fails the gate unless --allow missing)
      * failed:  still-failed if the baseline row failed too, else failed (a regression,
        also for a row new to this run: a wrong kernel must not pass the gate)
      * skipped: now-skipped if the baseline row was ok (a regression: a lost
        measurement may hide one), else skipped
      * ok:      fixed if the baseline row failed, new if it was skipped or absent;
        invalid (a regression) if its own times are not positive finite numbers.
    A baseline ok row with unusable times raises CompareError: that is a broken baseline,
    not a verdict.  Both ok with different `timer`s (both known): method-changed, never a
    speed verdict (a CUDA-graph time and a flushed do_bench time are different numbers).

    Speed, with r = new median / base median and t = threshold / 100:
      * 1/(1+t) <= r <= 1+t -> same.  The faster bound is 1/(1+t), so "5% faster" and
        "5% slower" are the same distance in log-time.
      * r > 1+t (r < 1/(1+t)), both sides with raw samples: slower (faster) only when
        the fast end (second-fastest sample) moved past the threshold the same way too,
        and a one-sided Mann-Whitney U test says the change is beyond the threshold, i.e. of
        the new samples against the baseline's scaled by 1+t, at p < alpha (compare_frames
        passes alpha = min(0.001, 0.01 / rows compared): a 1% chance per comparison that
        identical code fails the gate).  Testing against the threshold rather than zero
        keeps the few percent by which an idle machine drifts between runs from becoming
        a verdict; a rank test ignores how far one outlier sample is, and the median
        ignores it too, so one outlier never flips a verdict.  The fast end: contention
        on a shared machine only adds time, in spells of seconds that can cover most of
        a row's samples and move its median, while a slower kernel is slower in every
        sample, its fastest ones included (the second-fastest, so that one fast outlier
        cannot hide a slowdown).  Otherwise -> ambiguous (reported, not a failure).
      * Too few samples for the test to reach alpha at all (min_p_value >= alpha, e.g.
        6 vs 6 at alpha 0.001; 25 vs 3 is enough): a side with a single sample ->
        ambiguous (one sample may be one outlier); otherwise slower (faster) only when
        the change is gross (r >= G, G = max(1.5, 1 + 2t)) AND the sample sets do not
        overlap at all (every new sample slower than every baseline sample), else
        ambiguous.
      * No raw samples on a side (runs written before samples_ms): judged conservatively
        on the quantiles: slower (faster) only when r >= G and the p20..p80 spreads are
        disjoint, with at least 2 samples a side when n_samples is known; else ambiguous.
    """
    by_status = _status_verdict(base, new)
    if by_status is not None:
        return by_status
    assert base is not None and new is not None  # both ok: _status_verdict's None
    base_problem = base.problem()
    if base_problem:
        raise CompareError(f"baseline row has unusable times: {base_problem}")
    new_problem = new.problem()
    if new_problem:
        return "invalid", f"the run's {new_problem}"
    if base.timer and new.timer and base.timer != new.timer:
        return "method-changed", f"timed by {base.timer} -> {new.timer}"
    return _speed_verdict(base, new, threshold_pct, alpha)


def _status_verdict(base: Timing | None, new: Timing | None) -> tuple[str, str] | None:
    """judge's status rules; None when both sides are ok (a verdict on their times)."""
    if new is None:
        return "missing", "" if base is None or base.status == "ok" else f"was {base.status}"
    if new.status == "failed":
        if base is not None and base.status == "failed":
            return "still-failed", new.reason
        return "failed", new.reason
    if new.status != "ok":
        if base is not None and base.status == "ok":
            return "now-skipped", new.reason
        return "skipped", new.reason
    if base is None:
        return "new", ""
    if base.status == "failed":
        return "fixed", ""
    if base.status != "ok":
        return "new", f"was {base.status}"
    return None


def _speed_verdict(base: Timing, new: Timing, threshold_pct: float,
                   alpha: float) -> tuple[str, str]:
    t = threshold_pct / 100.0
    ratio = new.center / base.center
    if 1.0 / (1.0 + t) <= ratio <= 1.0 + t:
        return "same", ""
    slower = ratio > 1.0 + t
    word = "slower" if slower else "faster"
    gross = gross_ratio(threshold_pct)
    is_gross = ratio >= gross if slower else ratio <= 1.0 / gross
    if base.samples and new.samples:
        bs, ns = base.samples, new.samples
        nb, nn = len(bs), len(ns)
        if min(nb, nn) < 2:
            return "ambiguous", f"{word}, but {nb} vs {nn} samples: one sample cannot tell"
        if min_p_value(nb, nn) >= alpha:
            disjoint = min(ns) > max(bs) if slower else max(ns) < min(bs)
            if is_gross and disjoint:
                return word, f"{nb} vs {nn} samples, but >= {gross:g}x and no overlap"
            return "ambiguous", (f"{word}, but {nb} vs {nn} samples are too few for a rank "
                                 f"test at p < {alpha:.2g}")
        fast = fast_end_ratio(bs, ns)
        if not (fast > 1.0 + t if slower else fast < 1.0 / (1.0 + t)):
            return "ambiguous", (f"median {word} past the threshold, but the fast end only "
                                 f"{fast:.3g}x (contention, not the code?)")
        p = shift_p_value(bs, ns, threshold_pct, slower)
        if p < alpha:
            return word, f"p = {p:.1e}"
        return "ambiguous", f"{word} past the threshold, not significant (p = {p:.2g})"
    # Runs without raw samples: three quantiles cannot carry a test, so only a gross,
    # clearly separated change counts.
    if min(base.count, new.count) < 2:  # NaN (unknown) compares False
        return "ambiguous", f"{word}, but a single sample (no raw samples to test)"
    (b_lo, b_hi), (n_lo, n_hi) = base.spread, new.spread
    disjoint = n_lo > b_hi if slower else n_hi < b_lo
    if is_gross and disjoint:
        return word, f"no raw samples; >= {gross:g}x, spreads disjoint"
    return "ambiguous", f"{word}, but no raw samples to test (judged on quantiles)"


def normalise_rows(df: pd.DataFrame) -> pd.DataFrame:
    """RowKey columns as strings, timing columns as floats, samples as tuples, one row per
    key (last wins)."""
    df = df.copy()
    for col in KEY:
        df[col] = df[col].astype(str) if col in df.columns else ""
    df[CACHE] = cache_column(df)
    for col in NUMERIC_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df.columns else math.nan
    # Older runs and hand-made frames may lack the GPU clock columns.
    df["sm_clock_mhz"] = pd.to_numeric(df["sm_clock_mhz"], errors="coerce") \
        if "sm_clock_mhz" in df.columns else math.nan
    if "throttled" not in df.columns:
        df["throttled"] = None
    for col in ("status", "reason", "timer"):
        if col in df.columns:
            df[col] = [("" if is_missing(v) else str(v)) for v in df[col]]
        else:
            df[col] = ""
    df["status"] = df["status"].str.strip().str.lower()
    raw = df[SAMPLES] if SAMPLES in df.columns else [None] * len(df)
    df[SAMPLES] = [parse_samples(v)[0] for v in raw]
    return df.drop_duplicates(subset=ROW_ID, keep="last").reset_index(drop=True)


def _sides(merged: pd.DataFrame, suffix: str, fp8_mode: str | None) -> list[Timing | None]:
    """Each joined row's side `suffix` ("_b" the baseline's, "_n" the run's) as the verdict
    reads it; None where that run lacks the row.  With `fp8_mode` (the runs' modes
    differ), an fp8 row's timer names the mode: fp8 rows of runs with different
    accumulation modes measure different kernels, a method change, not a speed change."""
    def col(name: str) -> pd.Series:
        return merged[f"{name}{suffix}"]

    timers = list(col("timer"))
    if fp8_mode:
        tag = f"fp8 accumulation {fp8_mode}"
        timers = [(f"{t}, {tag}" if t else tag) if fp8 else t
                  for t, fp8 in zip(timers, merged["dtype"].isin(FP8_DTYPES), strict=True)]
    return [Timing(status=status, median=float(med), p20=float(lo), p80=float(hi),
                   reason=why, samples=samples, timer=timer, n_samples=float(n))
            if present else None
            for present, status, med, lo, hi, why, samples, timer, n in zip(
                col("_in"), col("status"), col("ms_median"), col("ms_p20"), col("ms_p80"),
                col("reason"), col(SAMPLES), timers, col("n_samples"), strict=True)]


@dataclass(frozen=True)
class RowVerdict:
    """One row of compare_frames' answer: the row's key (ROW_ID), its verdict and note,
    the time ratio (new / base median), each side's median, p20 and p80 (ms), sample
    count and status, and each side's SM clock (MHz, for the report)."""

    kernel: str
    provider: str
    dtype: str
    shape: str
    cache: str
    verdict: str
    note: str
    ratio: float
    base_ms: float
    new_ms: float
    base_p20: float
    base_p80: float
    new_p20: float
    new_p80: float
    n_base: float
    n_new: float
    base_status: str
    new_status: str
    base_mhz: float
    new_mhz: float


_OUT_COLUMNS = [f.name for f in fields(RowVerdict)]


def verdict_rows(df: pd.DataFrame) -> list[RowVerdict]:
    """compare_frames' rows (or some of them) as records, in their order."""
    return [RowVerdict(*t) for t in df[_OUT_COLUMNS].itertuples(index=False, name=None)]


def sort_by_verdict(df: pd.DataFrame) -> pd.DataFrame:
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    df = df.assign(_order=df["verdict"].map(order).fillna(len(order)))
    return df.sort_values(["_order", *ROW_ID]).drop(columns="_order").reset_index(drop=True)


# The columns of each run's rows the join keeps (each side's gets its suffix).
_JOINED = ["status", "reason", "ms_median", "ms_p20", "ms_p80", "n_samples", "timer",
           SAMPLES, "throttled", "sm_clock_mhz"]


def _time_problems(df: pd.DataFrame) -> dict[RowKey, str]:
    """The ok rows of a frame whose times are unusable, by key (the last row of a key
    written twice wins)."""
    return {row_key(r): problem for r in df[status_column(df) == "ok"].to_dict("records")
            if (problem := time_problem(r))}


def _joined(base_df: pd.DataFrame, run_df: pd.DataFrame) -> pd.DataFrame:
    """The two runs' rows joined on ROW_ID (outer), each side's columns suffixed "_b" and
    "_n", and "_in_b" / "_in_n" saying which run has the row."""
    b = normalise_rows(base_df)[ROW_ID + _JOINED].assign(_in=True)
    n = normalise_rows(run_df)[ROW_ID + _JOINED].assign(_in=True)
    merged = b.merge(n, on=ROW_ID, how="outer", suffixes=("_b", "_n"))
    # After the outer join, a row absent from one side has NaN in that side's marker.
    merged["_in_b"] = merged["_in_b"].eq(True)
    merged["_in_n"] = merged["_in_n"].eq(True)
    return merged


def _throttled_sides(merged: pd.DataFrame) -> list[list[tuple[str, Any]]]:
    """Per joined row, the sides ("baseline", "run") that timed it while the GPU
    throttled (the row's `throttled` cell, set by the sweep after its re-timing), each
    with its SM clock."""
    return [[(name, clock) for name, throttled, clock in
             (("baseline", b_thr, b_mhz), ("run", n_thr, n_mhz)) if is_throttled(throttled)]
            for b_thr, b_mhz, n_thr, n_mhz in zip(
                merged["throttled_b"], merged["sm_clock_mhz_b"], merged["throttled_n"],
                merged["sm_clock_mhz_n"], strict=True)]


def judge_frames(base_df: pd.DataFrame, run_df: pd.DataFrame, threshold: float,
                 alpha: float | None, fp8_accum: tuple[str | None, str | None],
                 unusable: Mapping[RowKey, str] | None = None,
                 ) -> tuple[pd.DataFrame, dict[RowKey, Timing], float]:
    """compare_frames' verdicts, with each baseline row's Timing and the alpha used.
    `unusable`: the run's ok rows whose times as its file holds them are unusable
    (runs.GateRun), invalid as those run_df's cells show."""
    for row in base_df[status_column(base_df) == "ok"].to_dict("records"):
        problem = time_problem(row)
        if problem:
            raise CompareError(f"baseline row {row_name(row)}: {problem}")
    invalid = {**_time_problems(run_df), **(unusable or {})}
    merged = _joined(base_df, run_df)
    both_ok = int((merged["_in_b"] & merged["_in_n"] & merged["status_b"].eq("ok")
                   & merged["status_n"].eq("ok")).sum())
    if alpha is None:
        alpha = row_alpha(both_ok)
    base_mode, run_mode = fp8_accum
    differ = bool(base_mode and run_mode and base_mode != run_mode)
    bases = _sides(merged, "_b", base_mode if differ else None)
    news = _sides(merged, "_n", run_mode if differ else None)
    keys: list[RowKey] = list(zip(*(merged[k].astype(str) for k in ROW_ID), strict=True))
    out = [_row_verdict(key, base, new, invalid.get(key), throttled, threshold, alpha,
                        clocks)
           for key, base, new, throttled, clocks in zip(
               keys, bases, news, _throttled_sides(merged),
               zip(merged["sm_clock_mhz_b"], merged["sm_clock_mhz_n"], strict=True),
               strict=True)]
    base_timings = {key: b for key, b in zip(keys, bases, strict=True) if b is not None}
    frame = pd.DataFrame([astuple(v) for v in out], columns=_OUT_COLUMNS)
    return sort_by_verdict(frame), base_timings, alpha


def _row_verdict(key: RowKey, base: Timing | None, new: Timing | None, invalid: str | None,
                 throttled: list[tuple[str, Any]], threshold: float, alpha: float,
                 clocks: tuple[float, float]) -> RowVerdict:
    """One joined row's verdict (judge, then the throttle rule) with its figures;
    `invalid`: why the run's times of the row are unusable, if they are."""
    if new is not None and new.status == "ok" and invalid is not None and (
            base is None or base.status == "ok"):
        verdict, note = "invalid", f"the run's {invalid}"
    else:
        verdict, note = judge(base, new, threshold, alpha)
        verdict, note = _throttle_verdict(throttled, verdict, note)
    ratio = math.nan
    if base and new and base.status == new.status == "ok" and verdict != "invalid":
        ratio = new.center / base.center
    b_lo, b_hi = base.spread if base else (math.nan, math.nan)
    n_lo, n_hi = new.spread if new else (math.nan, math.nan)
    return RowVerdict(
        *key, verdict=verdict, note=note, ratio=ratio,
        base_ms=base.center if base else math.nan, new_ms=new.center if new else math.nan,
        base_p20=b_lo, base_p80=b_hi, new_p20=n_lo, new_p80=n_hi,
        n_base=base.count if base else math.nan, n_new=new.count if new else math.nan,
        base_status=base.status if base else "", new_status=new.status if new else "",
        base_mhz=clocks[0], new_mhz=clocks[1])


# Timing verdicts that a throttled GPU makes meaningless: the clock, not the code, may
# have moved the time, so the row gets verdict `throttled` instead, never a silent pass
# and never a plain "slower".
_TIMING_VERDICTS = frozenset({"slower", "faster", "same", "ambiguous"})


def _throttle_verdict(sides: list[tuple[str, Any]], verdict: str, note: str
                      ) -> tuple[str, str]:
    """`throttled` for a timing verdict of a row that either run timed while the GPU
    throttled (`sides`: which, each with its SM clock)."""
    if verdict not in _TIMING_VERDICTS or not sides:
        return verdict, note
    where = " and ".join(
        f"the {name}'s" + (f" (SM clock {float(clk):.0f} MHz)"
                           if isinstance(clk, int | float) and math.isfinite(clk) else "")
        for name, clk in sides)
    said = f"GPU throttled while {where} row was timed; timing said {verdict}"
    return "throttled", f"{said}: {note}" if note else said


def compare_frames(base_df: pd.DataFrame, run_df: pd.DataFrame,
                   threshold: float = DEFAULT_THRESHOLD, *, alpha: float | None = None,
                   fp8_accum: tuple[str | None, str | None] = (None, None)) -> pd.DataFrame:
    """One row per key of either run: ROW_ID (KEY and cache), verdict, note, ratio, both
    sides' median and p20/p80 (base_ms, new_ms, base_p20, ...), sample counts (n_base,
    n_new) and statuses, sorted by verdict (regressions first), then key.

    alpha defaults to row_alpha(rows ok in both); fp8_accum = (baseline mode, run mode):
    when both are known and differ, fp8 rows are method-changed.  A baseline ok row with
    unusable times raises CompareError naming it.
    """
    t = check_threshold(threshold)
    return judge_frames(base_df, run_df, DEFAULT_THRESHOLD if t is None else t, alpha,
                    fp8_accum)[0]


@dataclass(frozen=True)
class Problem:
    """A run-level reason for the gate to fail: `kind` is the --allow name."""

    kind: str
    short: str  # for the headline
    detail: str  # for the report


@dataclass
class CompareResult:
    """The outcome of comparing a run with a baseline."""

    rows: pd.DataFrame  # compare_frames() output
    threshold: float
    alpha: float = ROW_ALPHA_MAX
    base_meta: RunMeta = field(default_factory=RunMeta)
    run_meta: RunMeta = field(default_factory=RunMeta)
    base_label: str = "baseline"
    run_label: str = "run"
    run_doc: RunDoc | None = None  # the run, for benchmark.json and re-timing
    warnings: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    allow: frozenset[str] = frozenset()
    retimed: int = 0  # rows that looked slower and were re-timed
    confirmed: int = 0  # of those, still slower
    rounds: int = 0  # most re-timed rounds any row got
    # rows that looked slower and were not re-timed: "row name (why)", worst first
    not_retimed: list[str] = field(default_factory=list)
    retime_budget_s: float | None = None  # the re-timing's time bound, if it had one
    base_timings: dict[RowKey, Timing] = field(default_factory=dict, repr=False)

    @property
    def counts(self) -> dict[str, int]:
        """Verdict -> number of rows, in VERDICT_ORDER, zero counts left out."""
        vc = self.rows["verdict"].value_counts()
        return {v: int(vc[v]) for v in VERDICT_ORDER if v in vc}

    def failing_verdicts(self) -> tuple[str, ...]:
        """Verdicts that fail the gate: regressions (slower ones unless --allow slower),
        plus missing / method-changed / throttled rows unless allowed."""
        regressions = tuple(v for v in REGRESSION_VERDICTS
                            if not (v == "slower" and "slower" in self.allow))
        extra = tuple(v for v, name in ALLOWABLE_VERDICTS.items() if name not in self.allow)
        return regressions + extra

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows["verdict"].isin(REGRESSION_VERDICTS)]

    @property
    def failing_rows(self) -> pd.DataFrame:
        return self.rows[self.rows["verdict"].isin(self.failing_verdicts())]

    @property
    def failing_problems(self) -> list[Problem]:
        return [p for p in self.problems if p.kind not in self.allow]

    @property
    def exit_code(self) -> int:
        return 1 if len(self.failing_rows) or self.failing_problems else 0

    def headline(self) -> str:
        """'REGRESSION (1 slower; 10 same)', 'FAIL (run interrupted; 12 missing; 2 same)'
        or 'OK (12 same)'.  REGRESSION while a regression fails the gate; then FAIL for
        any other failure (the gate's own checks); else REGRESSION for slower rows it
        was told to allow (reported, exit 0), else OK."""
        counts = self.counts
        failing = self.failing_verdicts()
        bad = [p.short for p in self.failing_problems]
        bad += [f"{counts[v]} {v}" for v in VERDICT_ORDER if v in counts and v in failing]
        rest = [f"{c} {v}" for v, c in counts.items() if v not in failing]
        regressions = self.regressions["verdict"]
        word = "REGRESSION" if regressions.isin(failing).any() else "FAIL" if bad else \
            "REGRESSION" if len(regressions) else "OK"
        parts = [", ".join(bad), ", ".join(rest)]
        return f"{word} ({'; '.join(p for p in parts if p) or 'no rows'})"
