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

from contract import metrics
from contract.devices import DeviceError, get_device_model
from contract.record import Accounting, RunRow, parse_row
from contract.rows import is_throttled
from contract.run_meta import RunMeta
from contract.schema import (
    SAMPLES,
    RunDoc,
    RunLoadError,
    load_doc,
    resolve_results_json,
)
from roofline.gate.render import write_report
from roofline.gate.rules import (
    DEFAULT_BASELINES_DIR,
    HISTORY_DIR,
    SAFE_KEY,
    CompareError,
    one_line,
    status_of,
)
from roofline.gate.runs import GateRun, incomplete_reasons, read_run, run_device_key


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
    median recomputed from the pool).  `docs` are the runs' results.json documents as
    written, and so are the rows returned: each the last run's row, its pooled values
    replaced (the baseline keeps every other cell as the run wrote it).

    Why: on a shared machine a whole run can sit in a fast or a slow spell (seen on the
    2-core CI VM: the same row 1.2-1.7x apart between back-to-back runs, with tight
    spreads inside each), so a baseline from one run bakes its spell in, and every later
    run is judged against it.  Samples pooled over runs span those spells, and the rank
    test then asks whether a new run lies outside what the machine itself does.  A row
    that is not ok with the same timer in every run is taken from the last run as it is.
    """
    by_run = [{row.key: row for row in map(parse_row, d["rows"])} for d in docs]
    out = []
    for cells in docs[-1]["rows"]:
        row = parse_row(cells)
        same = [b.get(row.key) for b in by_run]
        if all(r is not None and r.ok and r.timing.timer == row.timing.timer
               and r.timing.samples_ms for r in same):
            out.append(_pooled(cells, row.accounting, [r for r in same if r is not None]))
        else:
            out.append(dict(cells))
    return out


def _pooled(cells: dict[str, Any], acc: Accounting, same: list[RunRow]) -> dict[str, Any]:
    """A row as written (`cells`) with the samples of its rows in every run (`same`)
    pooled: median, p20, p80, count and the metrics derived from the median."""
    samples = [x for r in same for x in r.timing.samples_ms]
    p20, p50, p80 = (float(v) for v in np.percentile(samples, [20, 50, 80]))
    pooled = dict(cells)
    pooled.update(ms_median=p50, ms_p20=p20, ms_p80=p80, n_samples=len(samples))
    pooled[SAMPLES] = samples
    pooled.update(metrics.derive(acc.flops, acc.bytes, p50, acc.peak_tflops, acc.peak_gbps,
                                 acc.meas_peak_tflops, acc.meas_peak_gbps))
    pooled["pooled_runs"] = len(same)
    # Samples of a throttled GPU are in the pool: the baseline row says so (the gate
    # gives it the verdict `throttled`), not only when the last run's was.
    if any(is_throttled(r.clocks.throttled) for r in same):
        pooled["throttled"] = True
    return pooled


def _row_refusal(run: str | Path, read: GateRun) -> None:
    """CompareError for an ok row with unusable times: such a baseline could never be
    compared with."""
    if read.unusable:
        first = min(read.unusable)
        raise CompareError(f"cannot promote {run}: row {read.doc.rows[first].label()}: "
                           f"{read.unusable[first]}")


def _pool_refusals(run: str | Path, device_key: str | None) -> list[str]:
    """Why a run to be pooled into a baseline should not be (bad times always raise)."""
    read = read_run(run, "run")
    _row_refusal(run, read)
    out = [f"{run} is {', '.join(r)}" for r in [incomplete_reasons(read.doc.meta)] if r]
    if _throttled_count(read.doc):
        out.append(f"{run} has {_throttled_count(read.doc)} row(s) timed while the GPU "
                   "throttled")
    other = run_device_key(read.doc)
    if other and device_key and other != device_key:
        out.append(f"{run} was measured on '{other}', not '{device_key}'")
    return out


def _throttled_count(doc: RunDoc) -> int:
    """Ok rows timed while the GPU throttled: as a baseline, each would make every later
    comparison of its row `throttled`."""
    return sum(is_throttled(row.clocks.throttled) for row in doc.rows
               if status_of(row) == "ok")


def _refusals(runs: list[str | Path], read: GateRun) -> list[str]:
    """Why the last of `runs` (read: `read`), pooled with the others, should not become
    a baseline (unless forced)."""
    refusals = []
    for other in runs[:-1]:  # every pooled run passes the same checks as the last one
        refusals += _pool_refusals(other, run_device_key(read.doc))
    reasons = incomplete_reasons(read.doc.meta)
    if reasons:
        refusals.append(f"the run is {', '.join(reasons)}")
    if not any(status_of(row) == "ok" for row in read.doc.rows):
        refusals.append("the run has no ok rows (every row skipped or failed)")
    if _throttled_count(read.doc):
        refusals.append(f"the run has {_throttled_count(read.doc)} row(s) timed while the "
                        "GPU throttled")
    return refusals


def _baseline_key(device: str | None, run: str | Path, run_key: str | None) -> str:
    """The key the baseline is stored under: `device` (validated against
    contract.devices), else the run's own."""
    if device is not None:
        try:
            device = get_device_model(device).key
        except DeviceError as e:
            raise CompareError(one_line(e)) from None
    key = device or run_key
    if not key:
        raise CompareError(f"cannot tell the device of {run} (no device_key in its metadata); "
                           "pass --device KEY")
    if not SAFE_KEY.fullmatch(key):
        raise CompareError(f"device key '{key}' is not usable as a file name; pass --device KEY")
    return key


def _replaced_key(dest: Path) -> str | None:
    """The device of the baseline at `dest` (None: none there, or unreadable: it is
    still kept in history)."""
    if not dest.exists():
        return None
    try:
        return run_device_key(load_doc(dest))
    except (RunLoadError, OSError, TypeError, ValueError):
        return None


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
    read = read_run(run, "run")  # validates the file before anything is written
    _row_refusal(run, read)
    refusals = _refusals(runs, read)
    run_key = run_device_key(read.doc)
    key = _baseline_key(device, run, run_key)
    if run_key and run_key != key:
        refusals.append(f"the run was measured on '{run_key}', not '{key}'")
    dest = baseline_path(key, baselines_dir)
    old_key = _replaced_key(dest)
    if old_key and run_key and old_key != run_key:
        refusals.append(f"the baseline it replaces ({dest}) is of '{old_key}', the run "
                        f"of '{run_key}'")
    if refusals and not force:
        raise CompareError(f"not promoting {run}: {'; '.join(refusals)} (--force to promote "
                           "anyway)")
    doc = _baseline_doc(runs, key, read.doc.meta, refusals)
    kept = _keep_copy(dest) if dest.exists() else None
    if kept is not None:
        doc["metadata"]["replaced_baseline_kept_at"] = str(kept)
    write_report(dest, json.dumps(doc, indent=1) + "\n")
    return dest, kept


def _baseline_doc(runs: list[str | Path], key: str, meta: RunMeta, refusals: list[str]
                  ) -> dict[str, Any]:
    """The baseline document: the last run's results.json as it wrote it (not re-written
    from the records, so that the baseline keeps every field and value), its rows pooled
    over `runs`, and its metadata's promotion keys (contract/run_meta.py Promotion) and
    device_key set."""
    src = resolve_results_json(runs[-1])
    doc = json.loads(src.read_text())
    if len(runs) > 1:
        docs = [json.loads(resolve_results_json(r).read_text()) for r in runs]
        keys = [sorted(parse_row(r).key for r in d["rows"]) for d in docs]
        if any(k != keys[-1] for k in keys):
            raise CompareError("cannot pool runs with different rows: promote runs of "
                               "the same sweep (same --kernels, --dtypes, --sizes)")
        doc["rows"] = pool_rows(docs)
    new_meta = dict(doc.get("metadata") or {})
    old_run_key = meta.device.device_key
    if old_run_key and old_run_key != key:
        new_meta["promoted_from_device_key"] = old_run_key
    new_meta["device_key"] = key
    new_meta["promoted_from"] = str(src) if len(runs) == 1 else \
        [str(resolve_results_json(r)) for r in runs]
    new_meta["promoted_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if refusals:
        new_meta["promoted_with_force"] = refusals
    doc["metadata"] = new_meta
    return doc
