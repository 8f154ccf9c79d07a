"""Reading and checking the two runs a comparison joins (baseline rows, devices, dates,
incomplete runs, fp8 modes), comparing them, and confirming rows that look slower by
re-timing them (run_bench.py provides the callback)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract.retimed import Retimed
from contract.run_meta import RunMeta, parse_meta
from contract.schema import (
    RESULTS_JSON,
    SAMPLES,
    RowKey,
    RunDoc,
    RunLoadError,
    load_doc,
    read_doc,
    resolve_results_json,
    row_key,
    row_name,
)
from roofline.gate.rules import (
    CompareError,
    Retime,
    as_time,
    check_threshold,
    default_threshold,
    join_notes,
    one_line,
    parse_allow,
    rows_text,
    status_of,
    time_problem,
)
from roofline.gate.stats import Timing, fast_end_ratio
from roofline.gate.verdicts import CompareResult, Problem, judge_frames, sort_by_verdict


@dataclass(frozen=True)
class GateRun:
    """A run as the gate reads it: its document as records (contract/schema.py load_doc),
    and which of its ok rows have times the gate cannot use, as the file holds them
    (their index in doc.rows -> why).  The file's cells, because the typed row reads a
    hand-edited "8.04" or true as a number and drops an empty or malformed samples list,
    where the gate refuses the baseline that holds one and calls the run's row invalid."""

    doc: RunDoc
    unusable: dict[int, str] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame:
        """The rows as columns, for the statistics (RunDoc.frame)."""
        return self.doc.frame()

    def unusable_keys(self) -> dict[RowKey, str]:
        """unusable by row key (a key written twice: any of its rows)."""
        return {self.doc.rows[i].key: why for i, why in self.unusable.items()}


# The cells a row's times are in: a hand-edited value there that no typed row can hold
# ("fast") is emptied to read the rest of the run (_times_emptied).
_TIME_CELLS = ("ms_median", "ms_p20", "ms_p80", SAMPLES)


def load_checked(path: str | os.PathLike) -> GateRun:
    """load_doc, and the ok rows whose times as written are unusable (GateRun).  A run
    whose time cells hold what no typed row can ("fast") is read with those cells
    emptied, so that the gate can still name the row; RunLoadError and OSError as
    load_doc raises them, TypeError or ValueError for another cell of that kind."""
    try:
        doc = load_doc(path)
    except RunLoadError:
        raise
    except (TypeError, ValueError):  # a cell its column's type cannot hold
        doc = _times_emptied(path)
    cells = read_doc(path)["rows"]  # as written: what the typed row cannot tell
    unusable = {i: why for i, (row, cell) in enumerate(zip(doc.rows, cells, strict=True))
                if status_of(row) == "ok" and (why := time_problem(cell))}
    return GateRun(doc, unusable)


def _times_emptied(path: str | os.PathLike) -> RunDoc:
    """load_doc of the run with the time cells of every row whose times are unusable
    emptied (a copy in a temporary folder; the run is not touched)."""
    whole = read_doc(path)
    whole["rows"] = [{k: v for k, v in c.items() if k not in _TIME_CELLS}
                     if time_problem(c) else c for c in whole["rows"]]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / RESULTS_JSON
        copy.write_text(json.dumps(whole))
        doc = load_doc(copy)
    return replace(doc, path=resolve_results_json(path))


def read_run(path: str | os.PathLike, role: str) -> GateRun:
    """load_checked with every failure as a one-line CompareError naming the role."""
    try:
        return load_checked(path)
    except RunLoadError as e:
        raise CompareError(f"{role}: {one_line(e)}") from None
    except OSError as e:  # e.g. a permission error while probing the path
        raise CompareError(f"{role}: cannot read {path}: {e.strerror or e}") from None
    except (TypeError, ValueError) as e:  # a cell no typed row can hold
        raise CompareError(f"{role}: cannot read {path}: {one_line(e)}") from None


def _check_baseline_rows(run: GateRun, path: str | os.PathLike) -> None:
    if not any(status_of(row) == "ok" for row in run.doc.rows):
        raise CompareError(f"baseline {path} has no ok rows (every row skipped or failed): "
                           "nothing to compare with")
    if run.unusable:
        first = min(run.unusable)
        raise CompareError(f"baseline {path}: row {run.doc.rows[first].label()}: "
                           f"{run.unusable[first]}")


def check_baseline(path: str | os.PathLike, device_key: str | None = None,
                   allow_device_mismatch: bool = False) -> GateRun:
    """Validate a baseline before anything is measured; returns it read (GateRun).

    Raises CompareError (one line) when it is missing or unreadable, not JSON, of the
    wrong shape (metadata not an object, rows not a list, a row not an object, required
    columns missing), has no ok row, has an ok row whose median/p20/p80/samples are
    non-positive, NaN or non-numeric, or (given device_key, unless
    allow_device_mismatch) was measured on another device.
    """
    run = read_run(path, "baseline")
    _check_baseline_rows(run, path)
    key = run_device_key(run.doc)
    if device_key and key and key != device_key and not allow_device_mismatch:
        raise CompareError(f"device mismatch: baseline {path} is '{key}', this run is "
                           f"'{device_key}' (pass --allow-device-mismatch to compare anyway)")
    return run


def run_device_key(doc: RunDoc) -> str | None:
    """The run's device key: its metadata's device_key, else its rows' single device."""
    key = doc.meta.device.device_key
    if isinstance(key, str) and key:
        return key
    values = {row.accounting.device for row in doc.rows if row.accounting.device}
    return values.pop() if len(values) == 1 else None


def _label(path: str | os.PathLike, meta: RunMeta) -> str:
    made = meta.provenance
    bits = [str(v) for v in (made.run_id, meta.device.device_name) if v]
    if made.git_commit:
        bits.append(f"commit {str(made.git_commit)[:10]}")
    if made.created:
        bits.append(str(made.created))
    return f"`{path}`" + (f" ({', '.join(bits)})" if bits else "")


def _created(meta: RunMeta) -> datetime | None:
    value = meta.provenance.created
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def incomplete_reasons(meta: RunMeta | Mapping[str, Any]) -> list[str]:
    """Why a run's metadata says it is not a whole run ([] when it is).  (Metadata as
    the file holds it is read through parse_meta, for the readers not yet on load_doc.)"""
    state = (meta if isinstance(meta, RunMeta) else parse_meta(meta)).state
    reasons = []
    if state.interrupted is True:
        reasons.append("interrupted")
    if state.aborted is True:
        why = state.abort_reason
        reasons.append(f"aborted ({' '.join(str(why).split())})" if why else "aborted")
    if state.complete is False and not reasons:
        reasons.append(f"cut short ({state.cut_short})" if state.cut_short
                       else "incomplete")
    return reasons


def _run_problems(base: RunMeta, run: RunMeta, warnings: list[str]) -> list[Problem]:
    problems: list[Problem] = []
    reasons = incomplete_reasons(run)
    if reasons:
        problems.append(Problem("incomplete", f"run {', '.join(reasons)}",
                                f"the run is {', '.join(reasons)}: its missing rows were "
                                "never measured"))
    base_reasons = incomplete_reasons(base)
    if base_reasons:
        warnings.append(f"the baseline is {', '.join(base_reasons)} (promoted with --force?): "
                        "rows it lacks are only 'new'")
    b_when, r_when = _created(base), _created(run)
    if b_when and r_when:
        if b_when > r_when:
            problems.append(Problem(
                "newer-baseline", "baseline newer than run",
                f"the baseline was created {base.provenance.created}, after the run "
                f"({run.provenance.created}): are BASELINE and RUN swapped?"))
    else:
        warnings.append("cannot tell whether the baseline is older than the run "
                        "(no valid 'created' in the metadata of "
                        f"{'both' if not (b_when or r_when) else 'one'})")
    b, r = base.provenance, run.provenance
    if b.run_id and b.run_id == r.run_id and b.created == r.created:
        warnings.append("the baseline and the run are the same run: this comparison proves "
                        "nothing")
    return problems


def _fp8_modes(base: RunMeta, run: RunMeta, warnings: list[str]
               ) -> tuple[str | None, str | None]:
    modes = tuple(m if isinstance(m, str) and m else None
                  for m in (base.settings.fp8_accum, run.settings.fp8_accum))
    if modes[0] and modes[1] and modes[0] != modes[1]:
        warnings.append(f"fp8 accumulation differs: baseline '{modes[0]}', run '{modes[1]}' "
                        "(fp8 rows are method-changed)")
    return modes[0], modes[1]


# How a GPU run's providers shared the device: a run that records interleave_ms timed a
# case's providers in turns after warming a compute-bound case to a sustained clock
# (benches/timing/interleave.py); earlier GPU runs timed them one after the other, the
# first often at the boost clock.  A compute-bound row's time depends on which.
INTERLEAVED = "providers in turns at a sustained clock"
ONE_AT_A_TIME = "providers one after the other"


def gpu_sampling(meta: RunMeta) -> str | None:
    """How a run's GPU providers were sampled (None: not a GPU run)."""
    if meta.device.device_kind != "cuda":
        return None
    timing = meta.settings.timing  # the timing settings' document (benches/timing/plan.py)
    return INTERLEAVED if isinstance(timing, dict) and "interleave_ms" in timing \
        else ONE_AT_A_TIME


def _compute_bound(df: pd.DataFrame) -> pd.Series:
    """Rows whose roof is their compute peak (their time follows the SM clock)."""
    if df.empty or "roof_tflops" not in df.columns or "peak_tflops" not in df.columns:
        return pd.Series(False, index=df.index)
    roof = pd.to_numeric(df["roof_tflops"], errors="coerce")
    peak = pd.to_numeric(df["peak_tflops"], errors="coerce")
    return (roof >= 0.999 * peak) & peak.notna()


def _sampling_tagged(base_meta: RunMeta, run_meta: RunMeta,
                     base_df: pd.DataFrame, run_df: pd.DataFrame, warnings: list[str]
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Where the two runs sampled their GPU providers differently, each compute-bound
    row's timer carries how (so that the gate calls it method-changed, not slower or
    faster: the clock moved with the method, not the code)."""
    b, r = gpu_sampling(base_meta), gpu_sampling(run_meta)
    if not (b and r and b != r):
        return base_df, run_df
    warnings.append(f"GPU sampling differs: baseline {b}, run {r} (compute-bound rows are "
                    "method-changed; promote a run of the new method)")

    def tagged(df: pd.DataFrame, how: str) -> pd.DataFrame:
        df = df.copy()
        if "timer" not in df.columns:
            return df
        bound = _compute_bound(df)
        df["timer"] = df["timer"].astype(object)
        df.loc[bound, "timer"] = [f"{t}, {how}" for t in df.loc[bound, "timer"]]
        return df

    return tagged(base_df, b), tagged(run_df, r)


def _drift_warnings(rows: pd.DataFrame, threshold: float) -> list[str]:
    out = []
    both = rows[rows["ratio"].notna()]
    if len(both) >= 4:
        t = 1.0 + threshold / 100.0
        up, down = int((both["ratio"] > t).sum()), int((both["ratio"] < 1 / t).sum())
        med = float(np.exp(np.log(both["ratio"]).median()))
        if max(up, down) * 2 > len(both):
            way = "slower" if up > down else "faster"
            out.append(f"{max(up, down)} of {len(both)} rows moved {way} past the threshold "
                       f"together (median ratio {med:.3f}x): the machine's state (load, "
                       "clocks), or a change every row shares")
    very_fast = int((rows["verdict"].eq("faster") & (rows["ratio"] <= 0.5)).sum())
    if very_fast:
        out.append(f"{rows_text(very_fast)} 2x or more faster than the baseline: if that code "
                   "did not change, the baseline was measured on a busy machine and hides "
                   "slowdowns of those rows (promote a new one)")
    return out


def compare_runs(baseline: str | os.PathLike, run: str | os.PathLike,
                 threshold: float | None = None,
                 allow_device_mismatch: bool = False, *,
                 allow: Iterable[str] | str = ()) -> CompareResult:
    """Load both runs (folders or results.json files) and compare them.

    Raises CompareError (one line) for a missing/invalid file, an unusable baseline (see
    check_baseline), a bad threshold or --allow name or, unless allow_device_mismatch,
    runs of different devices: timings of an H100 and an A100 say nothing about a code
    change.  Run-level gate failures (incomplete run, newer baseline) are in
    result.problems; `allow` names those (and missing / method-changed rows) that do not
    fail the gate.
    """
    threshold = check_threshold(threshold)
    allowed = parse_allow(allow)
    base = check_baseline(baseline)
    new = read_run(run, "run")
    base_meta, run_meta = base.doc.meta, new.doc.meta
    warnings: list[str] = []
    base_key, run_key = run_device_key(base.doc), run_device_key(new.doc)
    if base_key and run_key and base_key != run_key:
        if not allow_device_mismatch:
            raise CompareError(
                f"device mismatch: baseline is '{base_key}', run is '{run_key}' "
                "(pass --allow-device-mismatch to compare anyway)")
        warnings.append(f"comparing different devices: baseline '{base_key}', "
                        f"run '{run_key}'; timing verdicts are not meaningful")
    if threshold is None:
        threshold = default_threshold(base_key or run_key)
    problems = _run_problems(base_meta, run_meta, warnings)
    modes = _fp8_modes(base_meta, run_meta, warnings)
    judged = _sampling_tagged(base_meta, run_meta, base.frame(), new.frame(), warnings)
    rows, base_timings, alpha = judge_frames(*judged, threshold, None, modes,
                                             unusable=new.unusable_keys())
    warnings += _drift_warnings(rows, threshold)
    return CompareResult(
        rows=rows, threshold=threshold, alpha=alpha, base_meta=base_meta,
        run_meta=run_meta, base_label=_label(baseline, base_meta),
        run_label=_label(run, run_meta), run_doc=new.doc, warnings=warnings,
        problems=problems, allow=allowed, base_timings=base_timings,
    )


def confirm_slower(result: CompareResult, retime: Retime) -> None:
    """Re-time every row that looks slower (judged slower, or ambiguous with its median
    past the threshold: the run's median moved) and call it slower only when the fast end
    (second-fastest sample) of EVERY re-timed round is past the threshold against the
    baseline's fast end (the median when a side has a single sample or the baseline has
    no raw samples).

    Why the fast end, in every round: contention on a shared machine only adds time, in
    spells of seconds that can cover a whole round, so a round's fast end is how fast the
    code can run, and a slower kernel is slower there in every round (no neighbour can
    make it fast).  Unchanged code sits past the threshold only in rounds caught whole by
    a slow spell, and rarely in all of them.  The median is no yardstick here: a round is
    one process's few milliseconds, while the baseline's median spans the spells of the
    runs it pools, and a rank test of the one against the other loses real slowdowns.
    Measured on the 2-core CI VM (20 fresh-process rounds of the quick sweep's 26 rows
    against a 3-run pooled baseline, 20% threshold): unchanged rows pass 5 of 5 rounds
    with probability 0.25% on average (3.1% for the worst row), rows made 1.43x slower
    with probability 100%; median and fast end in 4 of 5 rounds gave 0.38% and 92.5%.

    run_bench.py times each round in a fresh process, seconds apart (a whole process
    can sit in a slow state).  Rows judged slower that are not confirmed become
    not-confirmed; ambiguous rows stay ambiguous.  A row judged slower that got no valid
    round stays slower (the gate does not pass a regression it could not check).
    The rows go to `retime` worst first (worst_first); a re-timing bounded in time
    (a Retimed answer) may leave the last out: each keeps its verdict, its note and
    result.not_retimed say why.  Updates result in place.
    """
    rows = result.rows
    todo = worst_first(rows, result.threshold)
    if not len(todo):
        return
    keys = [row_key(rows.loc[i]) for i in todo]
    fresh = _fresh_rounds(result, retime, keys)
    if fresh is None:
        return
    left_out = fresh.left_out if isinstance(fresh, Retimed) else {}
    result.retimed = len(keys)
    for i, key in zip(todo, keys, strict=True):
        rounds = [s for s in (fresh.get(key) or []) if s and all(
            as_time(x) is not None for x in s)]
        result.rounds = max(result.rounds, len(rounds))
        _confirm_row(result, i, rounds, result.base_timings.get(key), left_out.get(key))
    result.rows = sort_by_verdict(rows)


def _fresh_rounds(result: CompareResult, retime: Retime, keys: list[RowKey]
                  ) -> Mapping[RowKey, list[list[float]]] | None:
    """The re-timed rounds of `keys` (a bounded re-timing's Retimed records its bound on
    `result`); None, with a warning, when the re-timing failed."""
    try:
        fresh = retime(keys)
    except Exception as e:  # a re-timing failure must not hide the regressions found
        result.warnings.append(f"re-timing failed ({one_line(e)}): rows kept as they are")
        return None
    if isinstance(fresh, Retimed):
        result.retime_budget_s = fresh.budget_s
        if fresh.interrupted:
            result.warnings.append("the re-timing was interrupted (SIGINT): the rows it "
                                   "had not re-timed keep their verdicts")
    return {} if fresh is None else fresh


def _confirm_row(result: CompareResult, i: Any, rounds: list[list[float]],
                 base: Timing | None, left_out: str | None) -> None:
    """confirm_slower's rule for the row at index `i` of result.rows, from its valid
    re-timed rounds; `left_out`: why a bounded re-timing left it out."""
    rows = result.rows
    was_slower = rows.loc[i, "verdict"] == "slower"
    if left_out is not None and not rounds:
        # Never re-timed (the bound ran out first): its verdict stands, unconfirmed.
        result.retimed -= 1
        result.not_retimed.append(f"{row_name(rows.loc[i], ' ')} ({left_out})")
        rows.loc[i, "note"] = join_notes(rows.loc[i, "note"], f"not re-timed: {left_out}")
        return
    if left_out is not None:
        rows.loc[i, "note"] = join_notes(rows.loc[i, "note"], left_out)
    if base is None or not rounds:
        if was_slower:
            result.confirmed += 1
        rows.loc[i, "note"] = join_notes(rows.loc[i, "note"], "could not be re-timed")
        return
    ratios = [_round_ratio(base, r) for r in rounds]
    hits = sum(x > 1.0 + result.threshold / 100.0 for x in ratios)
    note = join_notes(rows.loc[i, "note"], f"fast end slower in {hits} of {len(rounds)} "
                      f"re-timed rounds ({', '.join(f'{x:.3g}x' for x in ratios)})")
    if len(rounds) < CONFIRM_MIN_ROUNDS:
        # Too few rounds to confirm or clear anything: the verdict stands.
        result.confirmed += int(was_slower)
        rows.loc[i, "note"] = join_notes(note, f"only {len(rounds)} valid rounds")
    elif hits == len(rounds):
        result.confirmed += 1
        rows.loc[i, ["verdict", "note"]] = ["slower", note]
    else:
        rows.loc[i, ["verdict", "note"]] = ["not-confirmed" if was_slower
                                            else "ambiguous", note]


def worst_first(rows: pd.DataFrame, threshold: float) -> pd.Index:
    """The rows that look slower (judged slower, or ambiguous with the median past the
    threshold), worst first: the slower verdicts, then the ambiguous ones, each by
    ratio, largest first; a bounded re-timing (compare --retime-budget) times them in
    this order and leaves out the last."""
    ratio = pd.to_numeric(rows["ratio"], errors="coerce")
    looks = (rows["verdict"] == "slower") | (
        (rows["verdict"] == "ambiguous") & (ratio > 1.0 + threshold / 100.0))
    order = pd.DataFrame({"ambiguous": rows["verdict"] != "slower",
                          "ratio": -ratio.fillna(0.0)})[looks]
    return order.sort_values(["ambiguous", "ratio"], kind="stable").index


# Fewer valid re-timed rounds than this (child processes failed) neither confirm nor
# clear a row: one round past the threshold is common for unchanged code.
CONFIRM_MIN_ROUNDS = 3


def _round_ratio(base: Timing, samples: Sequence[float]) -> float:
    """A re-timed round against the baseline: the ratio of fast ends, or of medians when
    a side has fewer than 2 samples."""
    if len(samples) < 2 or len(base.samples) < 2:
        return float(np.median(samples)) / base.center
    return fast_end_ratio(base.samples, samples)
