"""Run-to-run comparison against a stored baseline, and baseline promotion.

    python -m roofline compare BASELINE RUN [--threshold PCT] [--allow-device-mismatch]
                                            [--md PATH] [--json PATH]
    python -m roofline promote RUN [--device KEY] [--baselines DIR]

Rows of the two runs are joined on schema.KEY (kernel, provider, dtype, shape) and each
gets one verdict (see `judge` for the exact rule):

    slower, failed, now-skipped   regressions: exit code 1
    ambiguous                     beyond the threshold, but the runs' spreads overlap
    faster, same                  timing verdicts
    new, missing, fixed           a row only in RUN / only in BASELINE / failed -> ok
    skipped, still-failed         neutral status rows (skipped now; failed in both)

Exit codes: 0 no regression, 1 a regression, 2 a usage error (missing or unreadable
file, device mismatch) reported as one `error: ...` line, never a traceback.

Everything here is pandas/python on saved results: no kernel is launched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd

from roofline.devices import DeviceError, get_device_model
from roofline.schema import (
    KEY,
    RunLoadError,
    atomic_write_text,
    load_run,
    resolve_results_json,
)

DEFAULT_THRESHOLD = 5.0  # percent, on the ratio of median times
DEFAULT_BASELINES_DIR = "results/baselines"
COMPARE_MD = "compare.md"
BENCHMARK_JSON = "benchmark.json"

# A change this large (as a time ratio) is a verdict even when the p20..p80 spreads
# overlap: two medians this far apart are not noise, and a real 2x slowdown must never
# hide as "ambiguous" behind one noisy run.  The floor rises with the threshold
# (1 + 2 x threshold) so a deliberately loose --threshold is not overridden.
GROSS_RATIO_FLOOR = 1.5

# Kernels whose benchmark.json value is achieved TFLOP/s; every other kernel reports GB/s.
# Keyed on the kernel, not on a row's intensity, so a series never changes unit between
# runs (github-action-benchmark tracks each name as one series).  Only matmul is
# compute-bound at the suite's shapes; add/mul/gelu/dot/matvec are bandwidth-bound.
TFLOPS_KERNELS: frozenset[str] = frozenset({"matmul"})

REGRESSION_VERDICTS: tuple[str, ...] = ("slower", "failed", "now-skipped")
# Display/count order: regressions, then doubt, then good news, then bookkeeping.
VERDICT_ORDER: tuple[str, ...] = (
    "slower", "failed", "now-skipped", "ambiguous", "faster",
    "new", "missing", "fixed", "still-failed", "skipped", "same",
)
_NUMERIC = ("ms_median", "ms_p20", "ms_p80", "n_samples", "tflops", "gbps")
_SAFE_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class CompareError(ValueError):
    """A usage error (bad arguments, missing baseline, device mismatch): one-line message."""


# ---------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Timing:
    """One side of a row as the verdict needs it."""

    status: str  # ok, failed, skipped (anything else is treated like skipped)
    median: float = math.nan
    p20: float = math.nan
    p80: float = math.nan
    reason: str = ""

    @property
    def spread(self) -> tuple[float, float]:
        """The p20..p80 interval; a missing percentile collapses onto the median, so a
        run without percentiles is judged on its median and the threshold alone."""
        lo = self.p20 if math.isfinite(self.p20) else self.median
        hi = self.p80 if math.isfinite(self.p80) else self.median
        return (lo, hi) if lo <= hi else (hi, lo)


def gross_ratio(threshold_pct: float) -> float:
    """The time ratio beyond which overlapping spreads no longer make a change ambiguous."""
    return max(GROSS_RATIO_FLOOR, 1.0 + 2.0 * threshold_pct / 100.0)


def judge(base: Timing | None, new: Timing | None,
          threshold_pct: float = DEFAULT_THRESHOLD) -> tuple[str, str]:
    """Verdict and a short note for one row; None means the row is absent from that run.

    Both ok, with r = new median / base median and t = threshold / 100:
      * 1/(1+t) <= r <= 1+t                       -> same (inside the threshold)
      * r > 1+t and new p20 > base p80            -> slower (spreads do not overlap)
      * r < 1/(1+t) and new p80 < base p20        -> faster
      * r >= G (or r <= 1/G), G = max(1.5, 1+2t)  -> slower (faster) even if the spreads
        overlap: a 2x change is never waved through as noise
      * otherwise beyond the threshold            -> ambiguous
    The faster bound is 1/(1+t), not 1-t, so "5% faster" and "5% slower" are the same
    distance in log-time.  Status rules, by the new run's status:
      * failed:  still-failed if the baseline row failed too, else failed (a regression,
        also for a row new to this run: a wrong kernel must not pass the gate)
      * skipped: now-skipped if the baseline row was ok (a regression: kernels that crash
        become skipped rows, so a lost measurement may hide one), else skipped
      * ok:      fixed if the baseline row failed, new if it was skipped or absent
      * absent:  missing
    """
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

    if not (_positive(base.median) and _positive(new.median)):
        side = "baseline" if not _positive(base.median) else "run"
        return "ambiguous", f"no valid median time in the {side}"
    t = threshold_pct / 100.0
    ratio = new.median / base.median
    gross = gross_ratio(threshold_pct)
    base_lo, base_hi = base.spread
    new_lo, new_hi = new.spread
    if ratio > 1.0 + t:
        if new_lo > base_hi:
            return "slower", ""
        if ratio >= gross:
            return "slower", f"spreads overlap, but >= {gross:g}x"
        return "ambiguous", "slower beyond threshold, spreads overlap"
    if ratio < 1.0 / (1.0 + t):
        if new_hi < base_lo:
            return "faster", ""
        if ratio <= 1.0 / gross:
            return "faster", f"spreads overlap, but >= {gross:g}x"
        return "ambiguous", "faster beyond threshold, spreads overlap"
    return "same", ""


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


# ---------------------------------------------------------------------------- joining


def _normalise(df: pd.DataFrame) -> pd.DataFrame:
    """Key columns as strings, timing columns as floats, one row per key (last wins)."""
    df = df.copy()
    for col in KEY:
        df[col] = df[col].astype(str) if col in df.columns else ""
    for col in _NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df.columns else math.nan
    for col in ("status", "reason"):
        df[col] = df[col].fillna("").astype(str) if col in df.columns else ""
    df["status"] = df["status"].str.strip().str.lower()
    return df.drop_duplicates(subset=KEY, keep="last").reset_index(drop=True)


def _timing(row: dict[str, Any], suffix: str) -> Timing | None:
    if not row.get(f"_in{suffix}"):
        return None
    return Timing(
        status=row[f"status{suffix}"],
        median=float(row[f"ms_median{suffix}"]),
        p20=float(row[f"ms_p20{suffix}"]),
        p80=float(row[f"ms_p80{suffix}"]),
        reason=row[f"reason{suffix}"],
    )


def compare_frames(base_df: pd.DataFrame, run_df: pd.DataFrame,
                   threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """One row per key of either run: KEY, verdict, note, ratio and both sides' timings
    (base_ms, new_ms, base_p20, base_p80, new_p20, new_p80, base_status, new_status),
    sorted by verdict (regressions first), then key."""
    cols = ["status", "reason", "ms_median", "ms_p20", "ms_p80"]
    b = _normalise(base_df)[KEY + cols].assign(_in=True)
    n = _normalise(run_df)[KEY + cols].assign(_in=True)
    merged = b.merge(n, on=KEY, how="outer", suffixes=("_b", "_n"))
    # After the outer join, a row absent from one side has NaN in that side's marker.
    merged["_in_b"] = merged["_in_b"].eq(True)
    merged["_in_n"] = merged["_in_n"].eq(True)
    out: list[dict[str, Any]] = []
    for row in merged.to_dict("records"):
        base, new = _timing(row, "_b"), _timing(row, "_n")
        verdict, note = judge(base, new, threshold)
        ratio = math.nan
        if base and new and _positive(base.median) and _positive(new.median):
            ratio = new.median / base.median
        out.append({
            **{k: row[k] for k in KEY},
            "verdict": verdict,
            "note": note,
            "ratio": ratio,
            "base_ms": base.median if base else math.nan,
            "new_ms": new.median if new else math.nan,
            "base_p20": base.spread[0] if base else math.nan,
            "base_p80": base.spread[1] if base else math.nan,
            "new_p20": new.spread[0] if new else math.nan,
            "new_p80": new.spread[1] if new else math.nan,
            "base_status": base.status if base else "",
            "new_status": new.status if new else "",
        })
    columns = [*KEY, "verdict", "note", "ratio", "base_ms", "new_ms", "base_p20",
               "base_p80", "new_p20", "new_p80", "base_status", "new_status"]
    df = pd.DataFrame(out, columns=columns)
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    df["_order"] = df["verdict"].map(order)
    return df.sort_values(["_order", *KEY]).drop(columns="_order").reset_index(drop=True)


# ---------------------------------------------------------------------------- result


@dataclass
class CompareResult:
    """The outcome of comparing a run with a baseline."""

    rows: pd.DataFrame  # compare_frames() output
    threshold: float
    base_meta: dict[str, Any] = field(default_factory=dict)
    run_meta: dict[str, Any] = field(default_factory=dict)
    base_label: str = "baseline"
    run_label: str = "run"
    run_df: pd.DataFrame | None = None  # the run's own rows, for benchmark.json
    warnings: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """Verdict -> number of rows, in VERDICT_ORDER, zero counts left out."""
        vc = self.rows["verdict"].value_counts()
        return {v: int(vc[v]) for v in VERDICT_ORDER if v in vc}

    @property
    def regressions(self) -> pd.DataFrame:
        return self.rows[self.rows["verdict"].isin(REGRESSION_VERDICTS)]

    @property
    def exit_code(self) -> int:
        return 1 if len(self.regressions) else 0

    def headline(self) -> str:
        """'REGRESSION (1 slower; 10 same, 1 new)' or 'OK (12 same)'."""
        counts = self.counts
        bad = [f"{counts[v]} {v}" for v in REGRESSION_VERDICTS if v in counts]
        rest = [f"{c} {v}" for v, c in counts.items() if v not in REGRESSION_VERDICTS]
        if bad:
            return f"REGRESSION ({', '.join(bad)}" + (f"; {', '.join(rest)})" if rest else ")")
        return f"OK ({', '.join(rest) or 'no rows'})"


def run_device_key(meta: dict[str, Any], df: pd.DataFrame) -> str | None:
    """The run's device key: metadata device_key, else the rows' single `device` value."""
    key = meta.get("device_key")
    if isinstance(key, str) and key:
        return key
    if "device" in df.columns:
        values = {str(v) for v in df["device"].dropna().unique() if str(v)}
        if len(values) == 1:
            return values.pop()
    return None


def _load(path: str | os.PathLike, role: str) -> tuple[dict[str, Any], pd.DataFrame]:
    try:
        return load_run(path)
    except RunLoadError as e:
        raise CompareError(f"{role}: {_one_line(e)}") from None
    except OSError as e:  # e.g. a permission error while probing the path
        raise CompareError(f"{role}: cannot read {path}: {e.strerror or e}") from None


def _label(path: str | os.PathLike, meta: dict[str, Any]) -> str:
    bits = [str(meta[k]) for k in ("run_id", "device_name") if meta.get(k)]
    if meta.get("git_commit"):
        bits.append(f"commit {str(meta['git_commit'])[:10]}")
    if meta.get("created"):
        bits.append(str(meta["created"]))
    return f"`{path}`" + (f" ({', '.join(bits)})" if bits else "")


def _check_threshold(threshold: float) -> float:
    threshold = float(threshold)
    if not math.isfinite(threshold) or threshold < 0:
        raise CompareError(f"--threshold must be a non-negative percentage, got {threshold:g}")
    return threshold


def compare_runs(baseline: str | os.PathLike, run: str | os.PathLike,
                 threshold: float = DEFAULT_THRESHOLD,
                 allow_device_mismatch: bool = False) -> CompareResult:
    """Load both runs (folders or results.json files) and compare them.

    Raises CompareError (one line) for a missing/invalid file or, unless
    allow_device_mismatch, runs of different devices: timings of an H100 and an A100
    say nothing about a code change.
    """
    threshold = _check_threshold(threshold)
    base_meta, base_df = _load(baseline, "baseline")
    run_meta, run_df = _load(run, "run")
    warnings: list[str] = []
    base_key, run_key = run_device_key(base_meta, base_df), run_device_key(run_meta, run_df)
    if base_key and run_key and base_key != run_key:
        if not allow_device_mismatch:
            raise CompareError(
                f"device mismatch: baseline is '{base_key}', run is '{run_key}' "
                "(pass --allow-device-mismatch to compare anyway)")
        warnings.append(f"comparing different devices: baseline '{base_key}', "
                        f"run '{run_key}'; timing verdicts are not meaningful")
    return CompareResult(
        rows=compare_frames(base_df, run_df, threshold),
        threshold=threshold,
        base_meta=base_meta,
        run_meta=run_meta,
        base_label=_label(baseline, base_meta),
        run_label=_label(run, run_meta),
        run_df=run_df,
        warnings=warnings,
    )


# ---------------------------------------------------------------------------- reports


def _fmt_ms(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "-"


def _fmt_spread(lo: float, hi: float) -> str:
    return f"{lo:.4g}–{hi:.4g}" if math.isfinite(lo) and math.isfinite(hi) else "-"


def _fmt_ratio(r: float) -> str:
    return f"{r:.3f}x" if math.isfinite(r) else "-"


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def _md_cell(text: str) -> str:
    # A '|' or newline inside a reason would break the table row.
    return " ".join(str(text).split()).replace("|", "\\|")


def _md_table(df: pd.DataFrame) -> list[str]:
    lines = [
        "| kernel | provider | dtype | shape | verdict | base ms | new ms | ratio "
        "| base p20–p80 | new p20–p80 | note |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in df.to_dict("records"):
        lines.append(
            f"| {_md_cell(r['kernel'])} | {_md_cell(r['provider'])} | {_md_cell(r['dtype'])} "
            f"| {_md_cell(r['shape'])} | **{r['verdict']}** | {_fmt_ms(r['base_ms'])} "
            f"| {_fmt_ms(r['new_ms'])} | {_fmt_ratio(r['ratio'])} "
            f"| {_fmt_spread(r['base_p20'], r['base_p80'])} "
            f"| {_fmt_spread(r['new_p20'], r['new_p80'])} | {_md_cell(r['note'])} |")
    return lines


# (title, verdicts) of the listed sections, in report order; "same" and "skipped" rows
# are only counted, since a healthy run has hundreds of them.
_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Regressions", REGRESSION_VERDICTS),
    ("Ambiguous (beyond the threshold, but the spreads overlap)", ("ambiguous",)),
    ("Faster", ("faster",)),
    ("New and missing", ("new", "missing", "fixed")),
    ("Still failing (failed in the baseline too)", ("still-failed",)),
)


def render_markdown(result: CompareResult) -> str:
    """The comparison report: regressions first, then ambiguous, faster, new/missing,
    and a count of rows that are the same."""
    t = result.threshold
    lines = [
        "## Benchmark comparison",
        "",
        f"**{result.headline()}**",
        "",
        f"- baseline: {result.base_label}",
        f"- run: {result.run_label}",
        f"- rule: a change beyond ±{t:g}% of the median time counts only when the two "
        f"runs' p20–p80 spreads do not overlap, or when it reaches {gross_ratio(t):g}x; "
        "ratio = new / base median time (> 1 is slower)",
    ]
    lines += [f"- warning: {w}" for w in result.warnings]
    for title, verdicts in _SECTIONS:
        part = result.rows[result.rows["verdict"].isin(verdicts)]
        if len(part):
            lines += ["", f"### {title} ({len(part)})", "", *_md_table(part)]
    counts = result.counts
    same, skipped = counts.get("same", 0), counts.get("skipped", 0)
    tail = [f"{_rows(same)} the same within ±{t:g}%."]
    if skipped:
        tail.append(f"{_rows(skipped)} skipped in this run (not ok in the baseline either, "
                    "or new).")
    lines += ["", " ".join(tail), ""]
    return "\n".join(lines)


def benchmark_entries(run_df: pd.DataFrame,
                      verdicts: pd.DataFrame | None = None) -> list[dict[str, Any]]:
    """The run's ok rows in github-action-benchmark's `customBiggerIsBetter` format.

    name = "kernel/provider/dtype/shape"; value = achieved TFLOP/s for kernels in
    TFLOPS_KERNELS (matmul), achieved GB/s for every other kernel; extra = the median time
    and spread, plus the verdict when `verdicts` (compare_frames output) is given.
    """
    df = _normalise(run_df)
    by_key: dict[tuple[str, ...], dict[str, Any]] = {}
    if verdicts is not None:
        by_key = {tuple(r[k] for k in KEY): r for r in verdicts.to_dict("records")}
    entries: list[dict[str, Any]] = []
    for r in df[df["status"] == "ok"].to_dict("records"):
        if r["kernel"] in TFLOPS_KERNELS:
            unit, value = "TFLOP/s", r["tflops"]
        else:
            unit, value = "GB/s", r["gbps"]
        if not math.isfinite(value):
            continue  # the format needs a number; a row without one cannot be tracked
        extra = (f"median {_fmt_ms(r['ms_median'])} ms "
                 f"(p20 {_fmt_ms(r['ms_p20'])}, p80 {_fmt_ms(r['ms_p80'])})")
        if math.isfinite(r["n_samples"]):
            extra += f", n={int(r['n_samples'])}"
        v = by_key.get(tuple(r[k] for k in KEY))
        if v is not None:
            extra += f"; vs baseline: {v['verdict']}"
            if math.isfinite(v["ratio"]):
                extra += f" ({_fmt_ratio(v['ratio'])} time)"
        entries.append({
            "name": "/".join(str(r[k]) for k in KEY),
            "unit": unit,
            "value": float(value),
            "extra": extra,
        })
    return entries


def append_step_summary(markdown: str) -> bool:
    """Append to the file named by $GITHUB_STEP_SUMMARY (GitHub Actions' job summary)
    when set.  A failure only warns: the summary is a convenience, the exit code is the
    gate."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return False
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown.rstrip("\n") + "\n\n")
    except OSError as e:
        print(f"warning: cannot append to GITHUB_STEP_SUMMARY ({path}): {e.strerror or e}",
              file=sys.stderr)
        return False
    return True


def _write(path: str | os.PathLike, text: str) -> None:
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise CompareError(f"cannot write {path}: {e.strerror or e}") from None


def _json_text(entries: Iterable[dict[str, Any]]) -> str:
    return json.dumps(list(entries), indent=2) + "\n"


def short_summary(result: CompareResult, limit: int = 20) -> str:
    """A few lines for a terminal: the headline and each regression."""
    lines = [f"compare (threshold {result.threshold:g}%): {result.headline()}"]
    lines += [f"warning: {w}" for w in result.warnings]
    reg = result.regressions
    for r in reg.head(limit).to_dict("records"):
        what = f"{r['kernel']} {r['provider']} {r['dtype']} {r['shape']}"
        if math.isfinite(r["ratio"]):
            detail = f"{_fmt_ms(r['base_ms'])} -> {_fmt_ms(r['new_ms'])} ms " \
                     f"({_fmt_ratio(r['ratio'])})"
        else:
            detail = r["note"] or r["new_status"]
        lines.append(f"  {r['verdict']:<11} {what}: {_md_cell(detail)}")
    if len(reg) > limit:
        lines.append(f"  ... and {len(reg) - limit} more")
    return "\n".join(lines)


def compare_and_report(baseline: str | Path, run_dir: str | Path,
                       threshold: float = DEFAULT_THRESHOLD,
                       allow_device_mismatch: bool = False) -> int:
    """Compare a finished run with a baseline, for run_bench.py.

    Writes compare.md and benchmark.json into the run folder (or next to a results.json
    passed instead), prints a short verdict summary, appends the report to
    $GITHUB_STEP_SUMMARY when set, and returns 1 on a regression, else 0.  Raises
    CompareError (one line) for usage errors; the caller turns it into exit code 2.
    """
    result = compare_runs(baseline, run_dir, threshold, allow_device_mismatch)
    out_dir = resolve_results_json(run_dir).parent
    markdown = render_markdown(result)
    _write(out_dir / COMPARE_MD, markdown)
    assert result.run_df is not None
    _write(out_dir / BENCHMARK_JSON, _json_text(benchmark_entries(result.run_df, result.rows)))
    append_step_summary(markdown)
    print(short_summary(result))
    print(f"comparison report: {out_dir / COMPARE_MD}")
    return result.exit_code


# ---------------------------------------------------------------------------- baselines


def baseline_path(device_key: str, baselines_dir: str | Path = DEFAULT_BASELINES_DIR) -> Path:
    """Where the stored baseline of a device lives: <baselines_dir>/<device_key>.json."""
    return Path(baselines_dir) / f"{device_key}.json"


def promote(run: str | Path, device: str | None = None,
            baselines_dir: str | Path = DEFAULT_BASELINES_DIR) -> Path:
    """Copy a run's results.json (rows and metadata) to the device's baseline, atomically.

    The device key is `device` (validated against roofline.devices), else the run's
    metadata device_key.  The copy's metadata gets device_key set to that key (so a later
    compare's device check agrees with the file name) and `promoted_from`.
    """
    meta, df = _load(run, "run")  # validates the file before anything is written
    if device is not None:
        try:
            device = get_device_model(device).key
        except DeviceError as e:
            raise CompareError(str(e)) from None
    key = device or run_device_key(meta, df)
    if not key:
        raise CompareError(f"cannot tell the device of {run} (no device_key in its metadata); "
                           "pass --device KEY")
    if not _SAFE_KEY.fullmatch(key):
        raise CompareError(f"device key '{key}' is not usable as a file name; pass --device KEY")
    src = resolve_results_json(run)
    # Re-read the raw document rather than re-serialising the DataFrame, so the baseline
    # keeps every field and value exactly as the run wrote it.
    doc = json.loads(src.read_text())
    new_meta = dict(doc.get("metadata") or {})
    old_key = new_meta.get("device_key")
    if old_key and old_key != key:
        new_meta["promoted_from_device_key"] = old_key
    new_meta["device_key"] = key
    new_meta["promoted_from"] = str(src)
    doc["metadata"] = new_meta
    dest = baseline_path(key, baselines_dir)
    _write(dest, json.dumps(doc, indent=1) + "\n")
    return dest


# ---------------------------------------------------------------------------- CLI


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so every usage error
    becomes the same single `error: ...` line (subparsers inherit this class)."""

    def error(self, message: str) -> NoReturn:
        raise CompareError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m roofline", description="Compare benchmark runs.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{compare,promote}")
    c = sub.add_parser("compare", help="regression verdicts of RUN against BASELINE",
                       description="Regression verdicts of RUN against BASELINE; exit 1 on a "
                       "regression, 2 on a usage error.")
    c.add_argument("baseline", help="baseline run folder or results.json "
                   "(e.g. results/baselines/h100.json)")
    c.add_argument("run", help="run folder or results.json to judge")
    c.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="PCT",
                   help=f"percent change of the median time that counts (default "
                   f"{DEFAULT_THRESHOLD:g})")
    c.add_argument("--allow-device-mismatch", action="store_true",
                   help="compare runs of different devices")
    c.add_argument("--md", metavar="PATH", help="also write the markdown report here")
    c.add_argument("--json", metavar="PATH",
                   help="write the run's results in github-action-benchmark "
                   "customBiggerIsBetter format here")
    pr = sub.add_parser("promote", help="make RUN the stored baseline of its device",
                        description="Copy RUN's results.json to <baselines>/<device>.json.")
    pr.add_argument("run", help="run folder or results.json")
    pr.add_argument("--device", metavar="KEY", help="device key (default: the run's own)")
    pr.add_argument("--baselines", metavar="DIR", default=DEFAULT_BASELINES_DIR,
                    help=f"baselines folder (default {DEFAULT_BASELINES_DIR})")
    return p


def _cmd_compare(args: argparse.Namespace) -> int:
    result = compare_runs(args.baseline, args.run, args.threshold,
                          args.allow_device_mismatch)
    markdown = render_markdown(result)
    if args.md:
        _write(args.md, markdown)
    if args.json:
        assert result.run_df is not None
        _write(args.json, _json_text(benchmark_entries(result.run_df, result.rows)))
    append_step_summary(markdown)
    print(markdown)
    return result.exit_code


def _cmd_promote(args: argparse.Namespace) -> int:
    dest = promote(args.run, args.device, args.baselines)
    _, df = load_run(dest)
    failed = int((df["status"] == "failed").sum()) if "status" in df.columns else 0
    if failed:
        print(f"note: {failed} rows of this baseline failed correctness", file=sys.stderr)
    print(dest)
    return 0


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """`compare` / `promote` entry point (argv[0] is the command); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
        return _cmd_compare(args) if args.cmd == "compare" else _cmd_promote(args)
    except SystemExit as e:  # --help exits through argparse
        return e.code if isinstance(e.code, int) else 0
    except (CompareError, RunLoadError, DeviceError) as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}",
              file=sys.stderr)
        return 2
    except Exception as e:
        # A CI gate must answer with an exit code, not a traceback; set ROOFLINE_DEBUG=1
        # to see the traceback while debugging.
        if os.environ.get("ROOFLINE_DEBUG"):
            raise
        print(f"error: unexpected {type(e).__name__}: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
