"""The comparison as text: the markdown report, github-action-benchmark JSON, the CI
step summary, the terminal summary; and compare_and_report, run_bench.py's one call."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from contract.markdown import md_table_lines
from contract.physics import ratio_text
from contract.record import RunRow
from contract.rows import compute_kernels
from contract.schema import (
    DEFAULT_CACHE,
    RowKey,
    RunLoadError,
    atomic_write_text,
    native_cache,
    resolve_results_json,
)
from roofline.gate.rules import (
    ALLOWABLE_VERDICTS,
    BENCHMARK_JSON,
    COMPARE_MD,
    REGRESSION_VERDICTS,
    CompareError,
    Retime,
    one_line,
    rows_text,
    status_of,
)
from roofline.gate.runs import compare_runs, confirm_slower
from roofline.gate.verdicts import CompareResult, RowVerdict, verdict_rows


def _fmt_ms(x: float | None) -> str:
    return f"{x:.4g}" if x is not None and math.isfinite(x) else "-"


def _fmt_spread(lo: float, hi: float) -> str:
    return f"{lo:.4g}–{hi:.4g}" if math.isfinite(lo) and math.isfinite(hi) else "-"


def _fmt_ratio(r: float) -> str:
    return f"{r:.3f}x" if math.isfinite(r) else "-"


def _fmt_ratio_clocks(r: RowVerdict) -> str:
    """The row's time ratio with the run's SM clock, then the baseline's, where known:
    '1.150x (1,545 vs 1,770 MHz)'; clocks more than 2% apart: 'unequal clocks: ...' (a
    ratio of the clocks as much as of the code; the verdict is the rule's, unchanged)."""
    if not math.isfinite(r.ratio):
        return "-"
    return ratio_text(r.ratio, r.new_mhz, r.base_mhz, digits=3)


def _fmt_n(a: float, b: float) -> str:
    return "/".join(str(int(x)) if math.isfinite(x) else "-" for x in (a, b))


def _md_cell(text: str) -> str:
    # A '|' or newline inside a reason would break the table row.
    return " ".join(str(text).split()).replace("|", "\\|")


def _native(result: CompareResult) -> str:
    """The run's native cache mode (schema.native_cache: warm on a CPU, cold on a GPU)."""
    return native_cache({"device": result.run_meta.device.device_key
                         or result.base_meta.device.device_key})


def _shape(r: RowVerdict, native: str = DEFAULT_CACHE) -> str:
    """The shape as the tables show it: a row timed in another mode than the device's
    native one says so ("n=4096 (warm)" on a GPU); a native row's is the shape alone."""
    cache = str(r.cache or native)
    return str(r.shape) if cache == native else f"{r.shape} ({cache})"


def _md_table(df: pd.DataFrame, native: str = DEFAULT_CACHE) -> list[str]:
    return md_table_lines(
        ["kernel", "provider", "dtype", "shape", "verdict", "base ms", "new ms",
         "ratio (MHz)", "base p20–p80", "new p20–p80", "n base/new", "note"],
        [[_md_cell(r.kernel), _md_cell(r.provider), _md_cell(r.dtype),
          _md_cell(_shape(r, native)), f"**{r.verdict}**", _fmt_ms(r.base_ms),
          _fmt_ms(r.new_ms), _fmt_ratio_clocks(r), _fmt_spread(r.base_p20, r.base_p80),
          _fmt_spread(r.new_p20, r.new_p80), _fmt_n(r.n_base, r.n_new),
          _md_cell(r.note)] for r in verdict_rows(df)], "lllllrrrrrrl")


# (title, verdicts) of the listed sections, in report order; "same" and "skipped" rows
# are only counted, since a healthy run has hundreds of them.
_SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Regressions", REGRESSION_VERDICTS),
    ("Changed rows (missing, or timed by another method)", ("missing", "method-changed")),
    ("Throttled (the GPU slowed itself down while timing: not a code verdict)",
     ("throttled",)),
    ("Not confirmed (looked slower, not slower again when re-timed)", ("not-confirmed",)),
    ("Ambiguous (past the threshold, but not significant)", ("ambiguous",)),
    ("Faster", ("faster",)),
    ("New and fixed", ("new", "fixed")),
    ("Still failing (failed in the baseline too)", ("still-failed",)),
)


def retime_line(result: CompareResult) -> str | None:
    """'re-timed 3 rows that looked slower (3 rounds): 1 confirmed, 2 not confirmed',
    with the re-timing's time bound where it had one."""
    if not result.retimed:
        return None
    rounds = f" ({result.rounds} rounds)" if result.rounds else ""
    bound = "" if result.retime_budget_s is None else \
        f" within a {result.retime_budget_s:g} s bound, worst first"
    return (f"re-timed {rows_text(result.retimed)} that looked slower{rounds}{bound}: "
            f"{result.confirmed} confirmed, {result.retimed - result.confirmed} not")


def not_retimed_line(result: CompareResult) -> str | None:
    """The rows that looked slower and were not re-timed, each with why (a bounded
    re-timing's last rows): their verdicts stand unconfirmed."""
    if not result.not_retimed:
        return None
    return (f"not re-timed: {rows_text(len(result.not_retimed))} that looked slower, "
            f"their verdicts unconfirmed: {'; '.join(result.not_retimed)}")


def _gate_lines(result: CompareResult) -> list[str]:
    lines = []
    for p in result.problems:
        if p.kind in result.allow:
            lines.append(f"allowed ({p.kind}): {p.detail}")
        else:
            lines.append(f"gate failure: {p.detail} (--allow {p.kind} to accept)")
    counts = result.counts
    if counts.get("slower") and "slower" in result.allow:
        lines.append(f"allowed (slower): {rows_text(counts['slower'])} slower, reported "
                     "without failing the gate")
    for verdict, name in ALLOWABLE_VERDICTS.items():
        if counts.get(verdict):
            state = "allowed" if name in result.allow else "gate failure"
            hint = "" if name in result.allow else f" (--allow {name} to accept)"
            lines.append(f"{state}: {rows_text(counts[verdict])} {verdict}{hint}")
    return lines


def render_markdown(result: CompareResult) -> str:
    """The comparison report: gate failures, regressions, changed rows, re-timing,
    ambiguous, faster, new, and a count of rows that are the same."""
    t = result.threshold
    lines = [
        "## Benchmark comparison",
        "",
        f"**{result.headline()}**",
        "",
        f"- baseline: {result.base_label}",
        f"- run: {result.run_label}",
        f"- rule: a row is slower (faster) when its median time and its fast end (second-"
        f"fastest sample) moved past ±{t:g}% and a one-sided Mann-Whitney U test on the raw "
        f"samples says it moved beyond ±{t:g}% at p < {result.alpha:.2g} (0.01 over the rows "
        "compared); re-timed rows stay slower only when the fast end of every re-timed round "
        "is past the threshold; ratio = new / base median time (> 1 is slower), with the "
        "run's SM clock, then the baseline's: `unequal clocks` where they differ by more "
        "than 2% (the clocks moved the time as much as the code may have)",
    ]
    lines += [f"- {line}" for line in (retime_line(result), not_retimed_line(result))
              if line]
    lines += [f"- {g}" for g in _gate_lines(result)]
    lines += [f"- warning: {w}" for w in result.warnings]
    for title, verdicts in _SECTIONS:
        part = result.rows[result.rows["verdict"].isin(verdicts)]
        if len(part):
            lines += ["", f"### {title} ({len(part)})", "", *_md_table(part, _native(result))]
    counts = result.counts
    same, skipped = counts.get("same", 0), counts.get("skipped", 0)
    tail = [f"{rows_text(same)} the same within ±{t:g}%."]
    if skipped:
        tail.append(f"{rows_text(skipped)} skipped in this run (not ok in the baseline either, "
                    "or new).")
    lines += ["", " ".join(tail), ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class BenchmarkEntry:
    """One series point of github-action-benchmark's `customBiggerIsBetter` format (the
    tool's benchmark.json: a list of these objects)."""

    name: str
    unit: str
    value: float
    extra: str


def _last_of_each_key(rows: Sequence[RunRow]) -> list[RunRow]:
    """One row per key, the last written (a key written twice: a resumed run's), in the
    order of those last rows."""
    last = {row.key: i for i, row in enumerate(rows)}
    return [rows[i] for i in sorted(last.values())]


def benchmark_entries(rows: Sequence[RunRow],
                      verdicts: pd.DataFrame | None = None) -> list[BenchmarkEntry]:
    """The run's ok rows in github-action-benchmark's `customBiggerIsBetter` format.

    name = "kernel/provider/dtype/shape" (schema.row_name: "/warm" appended for a warm
    row on a GPU, "/cold" for a cold one on a CPU); value = achieved TFLOP/s for the
    kernels on the matrix units (contract.rows.compute_kernels: the spec's
    matrix_unit), achieved GB/s for every other kernel, so that a series never changes
    unit between runs (the tool tracks each name as one series); extra = the median
    time and spread, plus the verdict when `verdicts` (compare_frames output) is given.
    """
    by_key: dict[RowKey, RowVerdict] = {}
    if verdicts is not None:
        by_key = {(v.kernel, v.provider, v.dtype, v.shape, v.cache): v
                  for v in verdict_rows(verdicts)}
    compute = compute_kernels()
    entries = []
    for row in _last_of_each_key(rows):
        if status_of(row) != "ok":
            continue
        if row.case.kernel in compute:
            unit, value = "TFLOP/s", row.metrics.tflops
        else:
            unit, value = "GB/s", row.metrics.gbps
        if value is None or not math.isfinite(value):
            continue  # the format needs a number; a row without one cannot be tracked
        t = row.timing
        extra = (f"median {_fmt_ms(t.ms_median)} ms "
                 f"(p20 {_fmt_ms(t.ms_p20)}, p80 {_fmt_ms(t.ms_p80)})")
        if t.n_samples:  # 0: the row does not say
            extra += f", n={t.n_samples}"
        v = by_key.get(row.key)
        if v is not None:
            extra += f"; vs baseline: {v.verdict}"
            if math.isfinite(v.ratio):
                extra += f" ({_fmt_ratio(v.ratio)} time)"
        entries.append(BenchmarkEntry(row.label(), unit, float(value), extra))
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


def write_report(path: str | os.PathLike, text: str) -> None:
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise CompareError(f"cannot write {path}: {e.strerror or e}") from None


def json_text(entries: Iterable[BenchmarkEntry]) -> str:
    """benchmark.json's text."""
    return json.dumps([asdict(e) for e in entries], indent=2) + "\n"


def short_summary(result: CompareResult, limit: int = 20) -> str:
    """A few lines for a terminal: the headline, gate failures, re-timing, and each
    failing row."""
    lines = [f"compare (threshold {result.threshold:g}%): {result.headline()}"]
    lines += [line for line in (retime_line(result), not_retimed_line(result)) if line]
    lines += _gate_lines(result)
    lines += [f"warning: {w}" for w in result.warnings]
    bad = result.failing_rows
    for r in verdict_rows(bad.head(limit)):
        what = f"{r.kernel} {r.provider} {r.dtype} {_shape(r, _native(result))}"
        if math.isfinite(r.ratio):
            detail = f"{_fmt_ms(r.base_ms)} -> {_fmt_ms(r.new_ms)} ms " \
                     f"({_fmt_ratio_clocks(r)})"
        else:
            detail = r.note or r.new_status or r.base_status
        lines.append(f"  {r.verdict:<14} {what}: {_md_cell(detail)}")
    if len(bad) > limit:
        lines.append(f"  ... and {len(bad) - limit} more")
    return "\n".join(lines)


def compare_and_report(baseline: str | Path, run_dir: str | Path,
                       threshold: float | None = None,
                       allow_device_mismatch: bool = False, *,
                       allow: Iterable[str] | str = (),
                       retime: Retime | None = None) -> int:
    """Compare a finished run with a baseline, for run_bench.py.

    With `retime` (keys -> several fresh sample lists per key), rows that look slower
    (judged slower, or ambiguous past the threshold) are re-timed first and stay
    regressions only when confirmed (see confirm_slower).  Writes
    compare.md and benchmark.json into the run folder (or next to a results.json passed
    instead), prints a short summary, appends the report to $GITHUB_STEP_SUMMARY when set,
    and returns 1 when the gate fails, else 0.  Raises CompareError (one line) for usage
    errors; the caller turns it into exit code 2.
    """
    result = compare_runs(baseline, run_dir, threshold, allow_device_mismatch, allow=allow)
    if retime is not None:
        confirm_slower(result, retime)
    try:
        out_dir = resolve_results_json(run_dir).parent
    except RunLoadError as e:
        raise CompareError(f"run: {one_line(e)}") from None
    markdown = render_markdown(result)
    write_report(out_dir / COMPARE_MD, markdown)
    assert result.run_doc is not None
    write_report(out_dir / BENCHMARK_JSON,
                 json_text(benchmark_entries(result.run_doc.rows, result.rows)))
    append_step_summary(markdown)
    print(short_summary(result))
    print(f"comparison report: {out_dir / COMPARE_MD}")
    return result.exit_code
