"""Stored baselines: where a device's baseline lives, promoting a run (or a pool of
runs) to it, and keeping every baseline it replaces."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract.devices import DeviceError, get_device_model
from contract.rows import is_throttled
from contract.schema import (
    SAMPLES,
    RunLoadError,
    load_run,
    resolve_results_json,
    row_key,
    row_name,
)
from roofline.gate.render import write_report
from roofline.gate.rules import (
    DEFAULT_BASELINES_DIR,
    HISTORY_DIR,
    SAFE_KEY,
    CompareError,
    one_line,
    status_column,
    time_problem,
)
from roofline.gate.runs import incomplete_reasons, read_run, run_device_key


def baseline_path(device_key: str, baselines_dir: str | Path = DEFAULT_BASELINES_DIR) -> Path:
    """Where the stored baseline of a device lives: <baselines_dir>/<device_key>.json."""
    return Path(baselines_dir) / f"{device_key}.json"


def _keep_copy(dest: Path) -> Path:
    """Copy the baseline about to be replaced to <dir>/history/<key>.<UTC time>.json,
    created exclusively (never over an earlier copy)."""
    history = dest.parent / HISTORY_DIR
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    data = dest.read_bytes()
    try:
        history.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(f"cannot create {history}: {e.strerror or e}") from None
    for i in range(1000):
        path = history / f"{dest.stem}.{stamp}{f'-{i}' if i else ''}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise CompareError(f"cannot keep the old baseline at {path}: "
                               f"{e.strerror or e}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return path
    raise CompareError(f"cannot keep the old baseline: too many copies in {history}")


def pool_rows(docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of several runs of one sweep as one baseline: each ok row's raw samples
    are pooled over the runs (its median, p20, p80 and the metrics derived from the
    median recomputed from the pool).

    Why: on a shared machine a whole run can sit in a fast or a slow spell (seen on the
    2-core CI VM: the same row 1.2-1.7x apart between back-to-back runs, with tight
    spreads inside each), so a baseline from one run bakes its spell in, and every later
    run is judged against it.  Samples pooled over runs span those spells, and the rank
    test then asks whether a new run lies outside what the machine itself does.  A row
    that is not ok with the same timer in every run is taken from the last run as it is.
    """
    from contract import metrics

    last = docs[-1]["rows"]
    by_run = [{row_key(r): r for r in d["rows"] if isinstance(r, dict)} for d in docs]
    out = []
    for row in last:
        key = row_key(row)
        same = [b.get(key) for b in by_run]
        pooled = dict(row)
        if all(r is not None and str(r.get("status")) == "ok"
               and r.get("timer") == row.get("timer") and r.get(SAMPLES) for r in same):
            samples = [float(x) for r in same for x in r[SAMPLES]]
            p20, p50, p80 = (float(v) for v in np.percentile(samples, [20, 50, 80]))
            pooled.update(ms_median=p50, ms_p20=p20, ms_p80=p80, n_samples=len(samples))
            pooled[SAMPLES] = samples
            pooled.update(metrics.derive(row["flops"], row["bytes"], p50, row.get("peak_tflops"),
                                         row.get("peak_gbps"), row.get("meas_peak_tflops"),
                                         row.get("meas_peak_gbps")))
            pooled["pooled_runs"] = len(same)
            # Samples of a throttled GPU are in the pool: the baseline row says so (the
            # gate gives it the verdict `throttled`), not only when the last run's was.
            if any(is_throttled(r.get("throttled")) for r in same):
                pooled["throttled"] = True
        out.append(pooled)
    return out


def _pool_refusals(run: str | Path, device_key: str | None) -> list[str]:
    """Why a run to be pooled into a baseline should not be (bad times always raise)."""
    meta, df = read_run(run, "run")
    for row in df[status_column(df) == "ok"].to_dict("records"):
        problem = time_problem(row)
        if problem:
            raise CompareError(f"cannot promote {run}: row {row_name(row)}: {problem}")
    out = [f"{run} is {', '.join(r)}" for r in [incomplete_reasons(meta)] if r]
    if _throttled_count(df):
        out.append(f"{run} has {_throttled_count(df)} row(s) timed while the GPU throttled")
    other = run_device_key(meta, df)
    if other and device_key and other != device_key:
        out.append(f"{run} was measured on '{other}', not '{device_key}'")
    return out


def _throttled_count(df: pd.DataFrame) -> int:
    """Ok rows timed while the GPU throttled: as a baseline, each would make every later
    comparison of its row `throttled`."""
    if "throttled" not in df.columns:
        return 0
    return sum(is_throttled(v) for v in df.loc[status_column(df) == "ok", "throttled"])


def promote(run: str | Path | Sequence[str | Path], device: str | None = None,
            baselines_dir: str | Path = DEFAULT_BASELINES_DIR,
            force: bool = False) -> tuple[Path, Path | None]:
    """Make a run the device's baseline; returns (baseline path, where the replaced
    baseline was kept or None).

    The device key is `device` (validated against contract.devices), else the run's
    device_key.  Refused (CompareError) unless `force`: a run that was interrupted,
    aborted or is incomplete, a run with no ok row, a run with rows timed while the GPU
    throttled, a run of another device than `device` or than the baseline it replaces.
    Always refused: an ok row with unusable times (such a baseline could never be
    compared with).  The replaced baseline is copied to <baselines_dir>/history/ first,
    then the new one is written atomically, with device_key set to the key and
    `promoted_from`.
    """
    runs = [run] if isinstance(run, (str, Path)) else list(run)
    if not runs:
        raise CompareError("promote needs at least one run")
    run = runs[-1]
    meta, df = read_run(run, "run")  # validates the file before anything is written
    ok = df[status_column(df) == "ok"]
    for row in ok.to_dict("records"):
        problem = time_problem(row)
        if problem:
            raise CompareError(f"cannot promote {run}: row {row_name(row)}: {problem}")
    refusals = []
    for other in runs[:-1]:  # every pooled run passes the same checks as the last one
        refusals += _pool_refusals(other, run_device_key(meta, df))
    reasons = incomplete_reasons(meta)
    if reasons:
        refusals.append(f"the run is {', '.join(reasons)}")
    if not len(ok):
        refusals.append("the run has no ok rows (every row skipped or failed)")
    if _throttled_count(df):
        refusals.append(f"the run has {_throttled_count(df)} row(s) timed while the GPU "
                        "throttled")
    if device is not None:
        try:
            device = get_device_model(device).key
        except DeviceError as e:
            raise CompareError(one_line(e)) from None
    run_key = run_device_key(meta, df)
    key = device or run_key
    if not key:
        raise CompareError(f"cannot tell the device of {run} (no device_key in its metadata); "
                           "pass --device KEY")
    if not SAFE_KEY.fullmatch(key):
        raise CompareError(f"device key '{key}' is not usable as a file name; pass --device KEY")
    if run_key and run_key != key:
        refusals.append(f"the run was measured on '{run_key}', not '{key}'")
    dest = baseline_path(key, baselines_dir)
    if dest.exists():
        try:
            old_meta, old_df = load_run(dest)
            old_key = run_device_key(old_meta, old_df)
        except (RunLoadError, OSError):
            old_key = None  # an unreadable baseline is still kept in history below
        if old_key and run_key and old_key != run_key:
            refusals.append(f"the baseline it replaces ({dest}) is of '{old_key}', the run "
                            f"of '{run_key}'")
    if refusals and not force:
        raise CompareError(f"not promoting {run}: {'; '.join(refusals)} (--force to promote "
                           "anyway)")
    src = resolve_results_json(run)
    # Re-read the raw document rather than re-serialising the DataFrame, so the baseline
    # keeps every field and value exactly as the run wrote it.
    doc = json.loads(src.read_text())
    if len(runs) > 1:
        docs = [json.loads(resolve_results_json(r).read_text()) for r in runs]
        keys = [sorted(row_key(r) for r in d["rows"]) for d in docs]
        if any(k != keys[-1] for k in keys):
            raise CompareError("cannot pool runs with different rows: promote runs of "
                               "the same sweep (same --kernels, --dtypes, --sizes)")
        doc["rows"] = pool_rows(docs)
    new_meta = dict(doc.get("metadata") or {})
    old_run_key = new_meta.get("device_key")
    if old_run_key and old_run_key != key:
        new_meta["promoted_from_device_key"] = old_run_key
    new_meta["device_key"] = key
    new_meta["promoted_from"] = str(src) if len(runs) == 1 else \
        [str(resolve_results_json(r)) for r in runs]
    new_meta["promoted_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if refusals:
        new_meta["promoted_with_force"] = refusals
    kept = _keep_copy(dest) if dest.exists() else None
    if kept is not None:
        new_meta["replaced_baseline_kept_at"] = str(kept)
    doc["metadata"] = new_meta
    write_report(dest, json.dumps(doc, indent=1) + "\n")
    return dest, kept
