"""A run's folder: its name checked, made exclusively (a run is never written over
another), and an interrupted run's folder read back for --resume."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

from contract.record import RunRow, parse_row
from contract.request import RequestError
from contract.run_meta import RunMeta, parse_meta
from contract.schema import RunLoadError, read_doc, resolve_results_json

# Run ids become folder names: plain names only, so `--run-id ../../x` cannot write
# outside --out.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise RequestError(f"--run-id '{run_id}' is not a plain name (letters, digits, "
                           "'.', '_', '-'; no '/' or '..')")
    return run_id


def writable_dir(path: Path, what: str) -> Path:
    """`path` as an existing, writable folder (created if missing), else a one-line error."""
    if path.exists() and not path.is_dir():
        raise RequestError(f"{what} {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RequestError(f"cannot create {what} {path}: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RequestError(f"{what} {path} is not writable")
    return path


def new_run_dir(parent: Path, run_id: str | None) -> Path:
    """Create the run folder exclusively: a run is never written over another one.  An
    automatic id (a timestamp) takes a -2, -3, ... suffix when two runs start in the same
    second."""
    names = [run_id] if run_id else [datetime.now().strftime("%Y%m%d-%H%M%S")]
    if not run_id:
        names += [f"{names[0]}-{i}" for i in range(2, 1000)]
    for name in names:
        d = parent / name
        try:
            d.mkdir()
            return d
        except FileExistsError:
            if run_id:
                raise RequestError(f"run folder {d} already exists: runs are never "
                                   "overwritten (choose another --run-id, or --resume "
                                   f"{d})") from None
        except OSError as e:
            raise RequestError(f"cannot create run folder {d}: {e.strerror or e}") from None
    raise RequestError(f"no free run folder name under {parent}")


def read_run_doc(path: str) -> tuple[Path, RunMeta, list[RunRow]]:
    """(run folder, metadata, rows) of a run to resume, validated: its request stored,
    or one its old metadata keys rebuild (contract/run_meta.py)."""
    p = resolve_results_json(path)
    try:
        doc = read_doc(p)  # with the rows of its journal, if it was killed mid-run
    except RunLoadError as e:
        raise RequestError(f"cannot resume {path}: {e}") from None
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or not isinstance(rows, list) \
            or not all(isinstance(r, dict) for r in rows):
        raise RequestError(f"cannot resume {path}: not a results.json written by run_bench")
    parsed = parse_meta(meta)
    if not parsed.request:
        raise RequestError(f"cannot resume {path}: its metadata holds no request (nor "
                           "the kernels, dtypes and providers of one)")
    if parsed.state.complete:
        raise RequestError(f"{path} is a complete run: nothing to resume")
    try:
        records = [parse_row(r) for r in rows]
    except (KeyError, TypeError, ValueError) as e:
        raise RequestError(f"cannot resume {path}: a row is not one run_bench writes "
                           f"({type(e).__name__}: {e})") from None
    return p.parent, parsed, records
