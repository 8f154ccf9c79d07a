"""A device's history as series (one per row key) with their change points, and which
of those change points are new since the newest runs were added."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from contract.schema import ROW_ID, RowKey, row_name
from roofline.history.changepoints import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_CHANGE,
    DEFAULT_MIN_SIZE,
    DEFAULT_WINDOW,
    KNOWN_RUNS,
    ChangePoint,
    detect,
    new_changes,
)
from roofline.history.detectable import Sight, sight
from roofline.history.errors import HistoryError
from roofline.history.noise import median_noise, spread
from roofline.history.store import History


@dataclass(frozen=True)
class Options:
    """The detection settings (the report's and the dashboard's command-line options)."""

    min_change: float = DEFAULT_MIN_CHANGE
    alpha: float = DEFAULT_ALPHA
    min_size: int = DEFAULT_MIN_SIZE
    window: int | None = DEFAULT_WINDOW

    def check(self) -> Options:
        """HistoryError (one line) for a value out of range (NaN included)."""
        if not (0 <= self.min_change < 10):
            raise HistoryError(f"--min-change must be a fraction in [0, 10), got "
                               f"{self.min_change:g}")
        if not (0 < self.alpha < 1):
            raise HistoryError(f"--alpha must be in (0, 1), got {self.alpha:g}")
        if self.min_size < 2:
            raise HistoryError(f"--min-size must be at least 2 runs, got {self.min_size}")
        if self.window is not None and self.window < 2 * self.min_size:
            raise HistoryError(f"--window must be at least 2 x --min-size "
                               f"({2 * self.min_size}) runs, got {self.window}")
        return self

    def detect(self, values: np.ndarray, noise: np.ndarray | None = None
               ) -> list[ChangePoint]:
        return detect(values, min_change=self.min_change, alpha=self.alpha,
                      min_size=self.min_size, window=self.window, noise=noise)


@dataclass
class Series:
    """One row key's ok, unthrottled times across a device's runs, oldest first."""

    key: RowKey
    device: str
    runs: pd.DataFrame  # per point: pos, seq, run_id, git_commit, created, median, p20,
    # p80, fast_end, n, timer, gbps, tflops
    changes: list[ChangePoint] = field(default_factory=list)  # indices into `runs`
    new: list[ChangePoint] = field(default_factory=list)  # of `changes`, new since N
    status: str = "ok"  # the key's status in the newest run ("absent" if not in it)

    @property
    def name(self) -> str:
        return row_name({**dict(zip(ROW_ID, self.key, strict=True)), "device": self.device})

    @property
    def family(self) -> str:
        return self.key[0]

    @property
    def noise(self) -> np.ndarray:
        """Each run's own noise: the standard error of its log median (NaN where the run
        kept no sample count)."""
        n = pd.to_numeric(self.runs["n"], errors="coerce").to_numpy(dtype=np.float64)
        return median_noise(self.runs["p20"].to_numpy(dtype=np.float64),
                            self.runs["p80"].to_numpy(dtype=np.float64), n)

    @property
    def latest(self) -> float:
        return float(self.runs["median"].iloc[-1]) if len(self.runs) else math.nan

    def commit_range(self, c: ChangePoint) -> tuple[str, str]:
        """(commit of the last run at the old level, commit of the first at the new)."""
        def commit(i: int) -> str:
            v = self.runs["git_commit"].iloc[i]
            return str(v) if isinstance(v, str) and v else "?"
        return commit(c.index - 1), commit(c.index)

    def trend(self) -> float:
        """The newest run's median against the median of the current segment's runs
        before it (the level since the last change point): + slower."""
        if len(self.runs) < 2:
            return math.nan
        start = self.changes[-1].index if self.changes else 0
        level = self.runs["median"].iloc[start:-1]
        if level.empty:
            level = self.runs["median"].iloc[:-1]
        return float(self.runs["median"].iloc[-1] / level.median() - 1.0)

    def variance(self, window: int | None) -> float:
        """The variance of a run's log median about its level in the runs the detection
        searched (the newest `window`), split at the change points: noise.spread, the
        run-to-run scatter and at least the runs' own noise."""
        x = np.log(self.runs["median"].to_numpy(dtype=np.float64))
        offset = 0 if window is None or len(x) <= window else len(x) - window
        bounds = [offset, *(c.index for c in self.changes if c.index > offset), len(x)]
        return spread(x, self.noise, bounds)[0]

    def timer_changed(self, c: ChangePoint) -> bool:
        t = self.runs["timer"]
        return bool(t.iloc[c.index - 1] != t.iloc[c.index])


@dataclass(frozen=True)
class StoredRun:
    """A run as the store lists it (table `runs`): its number in the device's file, its
    id, when it started and its commit, as stored (None where the run did not say)."""

    seq: int
    run_id: str | None
    created: str | None
    git_commit: str | None


@dataclass
class DeviceSeries:
    """A device's series and what the report needs about its runs."""

    history: History
    series: list[Series]
    since: int
    options: Options

    @property
    def device(self) -> str:
        return self.history.device

    @property
    def runs(self) -> pd.DataFrame:
        return self.history.runs

    def newest(self) -> StoredRun:
        """The device's newest run."""
        runs = self.history.runs
        return StoredRun(int(runs["seq"].iloc[-1]), runs["run_id"].iloc[-1],
                         runs["created"].iloc[-1], runs["git_commit"].iloc[-1])

    @property
    def new_slower(self) -> list[tuple[Series, ChangePoint]]:
        return [(s, c) for s in self.series for c in s.new if c.slower]

    def sight(self) -> Sight:
        """What this history can see (roofline.history.detectable), for noise like its
        median series'."""
        o = self.options
        return sight({s.name: s.variance(o.window) for s in self.series},
                     {s.name: float(np.nanmedian(s.noise)) if np.isfinite(s.noise).any()
                      else math.nan for s in self.series},
                     len(self.runs), o.alpha, o.min_change, o.min_size, o.window)


def build_series(history: History, options: Options, since: int = 1) -> DeviceSeries:
    """Every series of a device with its change points; `new` holds those not found
    without the newest `since` runs."""
    if since < 1:
        raise HistoryError(f"--since must be at least 1 run, got {since}")
    rows = history.rows.merge(
        history.runs[["seq", "run_id", "git_commit", "created"]], on="seq", how="left")
    last_pos = int(history.runs["pos"].max())
    cutoff = last_pos + 1 - since  # runs at pos >= cutoff are the newest `since`
    newest = rows[rows["pos"] == last_pos]
    newest_status = dict(zip(zip(*(newest[k] for k in ROW_ID), strict=True),
                             newest["status"], strict=True))
    out = []
    ok = rows[(rows["status"] == "ok") & (rows["throttled"].fillna(0) == 0)]
    for key, group in ok.groupby(ROW_ID, sort=True):
        g = group.sort_values("pos").reset_index(drop=True)
        s = Series(key=tuple(str(k) for k in key), device=history.device, runs=g,
                   status=newest_status.get(tuple(key), "absent"))
        values = g["median"].to_numpy(dtype=np.float64)
        noise = s.noise
        s.changes = options.detect(values, noise)
        older = int((g["pos"] < cutoff).sum())
        if older < len(g):  # the series has points among the newest runs
            # Known from any of KNOWN_RUNS earlier detections, each made only while
            # something is left new (most series have no change point to check).
            s.new = list(s.changes)
            for m in range(older, max(0, older - KNOWN_RUNS), -1):
                if not s.new:
                    break
                s.new = new_changes(s.new, options.detect(values[:m], noise[:m]))
        out.append(s)
    return DeviceSeries(history=history, series=out, since=since, options=options)
