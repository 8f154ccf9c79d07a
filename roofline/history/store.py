"""The history store: every run kept, one SQLite file per device, append-only.

    <store>/HISTORY_STORE          marker: this folder is a store (add refuses any other
                                   non-empty folder, so `--store results` cannot litter)
    <store>/<device>.sqlite        table `runs` (one row per added run) and `rows` (one per
                                   row of a run: its key, status, median, p20/p80 and a
                                   summary of its samples)

Why SQLite: a run's rows go in as one transaction (all or none, also when the process is
killed), concurrent `add`s from several CI jobs serialize on its file lock (a busy timeout
of a minute) instead of losing a row, a UNIQUE key makes "a run is added once" a
constraint rather than a race, and an insert touches only the new rows and B-tree pages
(the cost does not grow with the store the way rewriting a file would).  Triggers refuse
every UPDATE and DELETE: the store is append-only.  Readers open it read-only and check
every row they use, so a row edited by hand is a one-line error, never a wrong chart.
The journal is SQLite's rollback journal, not WAL: a store is a file CI carries between
jobs (an artifact, a cache, a Pages branch), and in WAL mode committed rows can sit in a
`-wal` file beside it until a checkpoint, lost when the .sqlite is copied alone; WAL's
gain, readers running during a write, is nothing here (an add takes milliseconds).

Each run also keeps its metadata and rows (without raw samples) compressed, so the
dashboard can draw the roofline of the latest run after its folder is gone (a CI
artifact expires).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from contract.schema import (
    KEY,
    ROW_ID,
    SAMPLES,
    STATUSES,
    RunLoadError,
    load_run,
    row_cache,
    row_name,
)
from roofline.gate.rules import time_problem
from roofline.gate.runs import incomplete_reasons, run_device_key
from roofline.gate.stats import fast_end
from roofline.history.errors import HistoryError

DEFAULT_STORE = "results/history"
MARKER = "HISTORY_STORE"
SUFFIX = ".sqlite"
APPLICATION_ID = 0x67627368  # "gbsh": PRAGMA application_id of every store file
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 60.0  # how long an add waits for another add's transaction

_MARKER_TEXT = ("gpubench history store: one SQLite file per device (<device>.sqlite), "
                "append-only.\nAdd runs with `python -m roofline history add RUN --store "
                "DIR`; never edit the files by hand.\n")

_TRIGGER = ("CREATE TRIGGER IF NOT EXISTS {t}_no_{op} BEFORE {OP} ON {t} "
            "BEGIN SELECT RAISE(ABORT, 'the history store is append-only'); END")
# One statement each: executescript() would commit the caller's open transaction first.
_SCHEMA: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS runs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        run_key TEXT NOT NULL UNIQUE,
        run_id TEXT, created TEXT, added TEXT NOT NULL, git_commit TEXT,
        device TEXT NOT NULL, device_name TEXT, versions TEXT NOT NULL,
        complete INTEGER NOT NULL, source TEXT, doc BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS rows (
        seq INTEGER NOT NULL REFERENCES runs(seq),
        kernel TEXT NOT NULL, provider TEXT NOT NULL, dtype TEXT NOT NULL,
        shape TEXT NOT NULL, cache TEXT NOT NULL,
        status TEXT NOT NULL, reason TEXT, timer TEXT,
        median REAL, p20 REAL, p80 REAL, n INTEGER,
        fast_end REAL, fastest REAL, slowest REAL,
        tflops REAL, gbps REAL, throttled INTEGER,
        PRIMARY KEY (seq, kernel, provider, dtype, shape, cache))""",
    "CREATE INDEX IF NOT EXISTS rows_series ON rows (kernel, provider, dtype, shape, cache)",
    *(_TRIGGER.format(t=t, op=op, OP=op.upper()) for t in ("runs", "rows")
      for op in ("update", "delete")),
)

ROW_COLUMNS = ("kernel", "provider", "dtype", "shape", "cache", "status", "reason", "timer",
               "median", "p20", "p80", "n", "fast_end", "fastest", "slowest", "tflops",
               "gbps", "throttled")
VERSION_KEYS = ("python", "torch", "triton", "cuda", "fp8_accum")


@dataclass(frozen=True)
class Added:
    """What `add_run` stored."""

    device: str
    path: Path  # the device's store file
    seq: int  # the run's number in that file
    rows: int
    run_id: str


@dataclass
class History:
    """One device's history: runs in order (oldest first) and their rows."""

    device: str
    path: Path
    runs: pd.DataFrame  # seq, run_id, created, added, git_commit, device_name, versions,
    # complete, pos (0-based position in time order)
    rows: pd.DataFrame  # ROW_COLUMNS + seq + pos


# ---- the store folder ---------------------------------------------------------------------


def _device_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(f"*{SUFFIX}") if p.is_file())


def prepare_store(store: str | os.PathLike) -> Path:
    """A folder `add` may write into: absent or empty (made a store), or a store;
    HistoryError for anything else."""
    store = Path(store)
    if store.exists() and not store.is_dir():
        raise HistoryError(f"{store} is not a history store (a file, not a store folder)")
    if store.is_dir() and not (store / MARKER).is_file() and any(store.iterdir()):
        raise HistoryError(f"{store} is not a history store (no {MARKER} marker, and not "
                           "empty): choose a new or empty folder")
    try:
        store.mkdir(parents=True, exist_ok=True)
        if not (store / MARKER).is_file():
            (store / MARKER).write_text(_MARKER_TEXT)
    except OSError as e:
        raise HistoryError(f"cannot create the store {store}: {e.strerror or e}") from None
    return store


def store_files(store: str | os.PathLike, device: str | None = None) -> list[Path]:
    """The device files of an existing store (a store folder, or one device file);
    HistoryError when it is not a store, or holds no file (of that device)."""
    p = Path(store)
    if p.is_file():
        _check_file(p)
        files = [p]
    elif p.is_dir():
        if not (p / MARKER).is_file():
            raise HistoryError(f"{p} is not a history store (no {MARKER} marker)")
        files = _device_files(p)
    else:
        raise HistoryError(f"no history store at {p}")
    if device is not None:
        files = [f for f in files if f.name == f"{device}{SUFFIX}"]
        if not files:
            raise HistoryError(f"store {p} has no runs of device '{device}'")
    if not files:
        raise HistoryError(f"store {p} is empty: add a run first (python -m roofline "
                           f"history add RUN --store {p})")
    return files


# ---- one device file ------------------------------------------------------------------------


def _sqlite_error(path: Path, e: sqlite3.Error) -> HistoryError:
    return HistoryError(f"{path} is not a readable history store ({' '.join(str(e).split())})")


def _check_file(path: Path) -> None:
    """HistoryError unless `path` is a store file (SQLite with our application id)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise HistoryError(f"cannot read {path}: {e.strerror or e}") from None
    if head != b"SQLite format 3\x00":
        raise HistoryError(f"{path} is not a history store (not an SQLite file)")
    with _connect(path, readonly=True) as db:
        _check_schema(db, path)


def _check_schema(db: sqlite3.Connection, path: Path) -> None:
    app = db.execute("PRAGMA application_id").fetchone()[0]
    if app != APPLICATION_ID:
        raise HistoryError(f"{path} is not a history store (an SQLite file of another "
                           "program)")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:
        raise HistoryError(f"{path}: store schema {version}, this version reads "
                           f"{SCHEMA_VERSION}")


@contextmanager
def _connect(path: Path, readonly: bool) -> Iterator[sqlite3.Connection]:
    try:
        if readonly:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                 timeout=BUSY_TIMEOUT_S, isolation_level=None)
        else:
            db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as e:
        raise _sqlite_error(path, e) from None
    try:
        yield db
    except sqlite3.Error as e:
        raise _sqlite_error(path, e) from None
    finally:
        db.close()


def _open_for_append(db: sqlite3.Connection, path: Path) -> None:
    """A foreign file refused before anything is set on it; then the rollback journal
    (the module says why not WAL), full sync, the write lock and (in that transaction)
    the schema if the file is new."""
    if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        _check_schema(db, path)
    db.execute("PRAGMA journal_mode=DELETE")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("BEGIN IMMEDIATE")  # the write lock now: two adds never interleave
    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if tables == 0:
        db.execute(f"PRAGMA application_id={APPLICATION_ID}")
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        for statement in _SCHEMA:
            db.execute(statement)
    _check_schema(db, path)


# ---- adding a run ---------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _summary(row: Mapping[str, Any]) -> dict[str, Any]:
    """A run row as the store keeps it: key, status, times and its samples' summary."""
    out: dict[str, Any] = {k: str(row.get(k)) for k in KEY}
    out["cache"] = row_cache(row)
    status = str(row.get("status") or "").strip().lower()
    out.update(status=status, reason=str(row.get("reason") or ""),
               timer=str(row.get("timer") or ""))
    samples = row.get(SAMPLES)
    has_samples = isinstance(samples, list | tuple) and len(samples) > 0
    for col, name in (("ms_median", "median"), ("ms_p20", "p20"), ("ms_p80", "p80")):
        out[name] = _num(row.get(col)) if status == "ok" else None
    n = _num(row.get("n_samples"))
    out["n"] = len(samples) if has_samples else (int(n) if n else None)
    if status == "ok" and has_samples:
        s = np.asarray(samples, dtype=np.float64)
        out.update(fast_end=fast_end(s) if len(s) >= 2 else float(s[0]),
                   fastest=float(s.min()), slowest=float(s.max()))
    else:
        out.update(fast_end=None, fastest=None, slowest=None)
    out["tflops"], out["gbps"] = _num(row.get("tflops")), _num(row.get("gbps"))
    thr = row.get("throttled")
    out["throttled"] = 1 if thr is True or str(thr).lower() == "true" else 0
    return out


def _run_key(device: str, meta: Mapping[str, Any], raw: bytes) -> str:
    """A run's identity: device, run id and start time (a run folder is created
    exclusively, so these name one run wherever its folder is copied); a hand-made run
    without them is known by its content's hash."""
    run_id, created = meta.get("run_id"), meta.get("created")
    if isinstance(run_id, str) and run_id and isinstance(created, str) and created:
        return f"{device}|{run_id}|{created}"
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _read_run(run: str | os.PathLike) -> tuple[dict[str, Any], pd.DataFrame, bytes]:
    try:
        meta, df = load_run(run)
    except RunLoadError as e:
        raise HistoryError(" ".join(str(e).split())) from None
    except OSError as e:
        raise HistoryError(f"cannot read {run}: {e.strerror or e}") from None
    path = Path(run) / "results.json" if Path(run).is_dir() else Path(run)
    return meta, df, path.read_bytes()


def add_run(run: str | os.PathLike, store: str | os.PathLike = DEFAULT_STORE,
            allow_incomplete: bool = False) -> Added:
    """Append a run's rows to its device's file in `store` (created if absent).

    HistoryError (one line, nothing written) for an unreadable run, a --check-only run
    (no times), an incomplete one unless allow_incomplete, one without a device key, an
    ok row with unusable times, a store that is not one, or a run already in the store.
    """
    meta, df, raw = _read_run(run)
    if meta.get("check_only"):
        raise HistoryError(f"{run} is a --check-only run: it has no times to keep")
    reasons = incomplete_reasons(meta)
    if reasons and not allow_incomplete:
        raise HistoryError(f"{run} is {', '.join(reasons)}: resume it first (run_bench.py "
                           "--resume RUN), or pass --allow-incomplete")
    device = run_device_key(meta, df)
    if not device:
        raise HistoryError(f"{run} names no device (no metadata device_key, no single "
                           "'device' in its rows)")
    if not all(c.isalnum() or c in "._-" for c in device):
        raise HistoryError(f"{run}: device key {device!r} is not a plain name")
    records = df.to_dict("records")
    if not records:
        raise HistoryError(f"{run} has no rows")
    by_key: dict[tuple, dict[str, Any]] = {}
    for r in records:
        status = str(r.get("status") or "").strip().lower()
        if status not in STATUSES:
            raise HistoryError(f"{run}: row {row_name(r)} has status {r.get('status')!r}")
        if status == "ok":
            problem = time_problem(r)
            if problem:
                raise HistoryError(f"{run}: row {row_name(r)}: {problem}")
        s = _summary(r)
        by_key[tuple(s[k] for k in ROW_ID)] = s  # a key twice (resumed): the last row
    doc = zlib.compress(json.dumps({
        "metadata": meta,
        "rows": [{k: v for k, v in r.items() if k != SAMPLES} for r in records],
    }, default=str).encode("utf-8"), 9)
    versions = json.dumps({k: meta.get(k) for k in VERSION_KEYS}, sort_keys=True)
    key = _run_key(device, meta, raw)
    path = prepare_store(store) / f"{device}{SUFFIX}"
    with _connect(path, readonly=False) as db:
        try:
            _open_for_append(db, path)
            old = db.execute("SELECT seq, added FROM runs WHERE run_key = ?",
                             (key,)).fetchone()
            if old:
                raise HistoryError(f"run {meta.get('run_id') or run} is already in {path} "
                                   f"(run #{old[0]}, added {old[1]}): a run is added once")
            cur = db.execute(
                "INSERT INTO runs (run_key, run_id, created, added, git_commit, device, "
                "device_name, versions, complete, source, doc) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (key, _text(meta.get("run_id")), _text(meta.get("created")),
                 datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 _text(meta.get("git_commit")), device, _text(meta.get("device_name")),
                 versions, 0 if reasons else 1, str(Path(run).resolve()), doc))
            seq = int(cur.lastrowid)
            db.executemany(
                f"INSERT INTO rows (seq, {', '.join(ROW_COLUMNS)}) VALUES "
                f"({', '.join('?' * (len(ROW_COLUMNS) + 1))})",
                [(seq, *(s[c] for c in ROW_COLUMNS)) for s in by_key.values()])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    return Added(device, path, seq, len(by_key), str(meta.get("run_id") or ""))


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


# ---- reading --------------------------------------------------------------------------------


def _bad_row(path: Path, r: Mapping[str, Any]) -> str | None:
    """Why a stored row is corrupt (None when it is usable)."""
    for k in ROW_ID:
        if not isinstance(r[k], str) or not r[k]:
            return f"'{k}' is {r[k]!r}"
    if r["status"] not in STATUSES:
        return f"status is {r['status']!r}"
    if r["status"] != "ok":
        return None
    for col in ("median", "p20", "p80"):
        v = r[col]
        if _num(v) is None or v <= 0:
            return f"'{col}' is {v!r}, not a positive time"
    for col in ("fast_end", "fastest", "slowest"):
        v = r[col]
        if v is not None and (_num(v) is None or v <= 0):
            return f"'{col}' is {v!r}, not a positive time"
    if r["n"] is not None and (not isinstance(r["n"], int) or r["n"] < 1):
        return f"'n' is {r['n']!r}, not a sample count"
    return None


def load_history(path: Path) -> History:
    """One device file, read-only and checked: HistoryError for a file that is not a
    store, holds no run, or has a corrupt row (named)."""
    with _connect(path, readonly=True) as db:
        _check_schema(db, path)
        runs = pd.read_sql_query(
            "SELECT seq, run_id, created, added, git_commit, device, device_name, versions, "
            "complete FROM runs ORDER BY coalesce(created, added), seq", db)
        cur = db.execute(f"SELECT seq, {', '.join(ROW_COLUMNS)} FROM rows ORDER BY seq")
        records = [dict(zip(("seq", *ROW_COLUMNS), r, strict=True)) for r in cur.fetchall()]
    if runs.empty:
        raise HistoryError(f"{path} holds no run: add one first")
    run_ids = dict(zip(runs["seq"], runs["run_id"], strict=True))
    for r in records:  # as stored (SQLite keeps a text in a REAL column as text)
        problem = _bad_row(path, r)
        if problem is None and r["seq"] not in run_ids:
            problem = "it belongs to no run"
        if problem:
            raise HistoryError(f"{path}: a corrupt row (run #{r['seq']} "
                               f"{run_ids.get(r['seq']) or ''}, {row_name(r)}): {problem}")
    rows = pd.DataFrame(records, columns=["seq", *ROW_COLUMNS])
    runs["pos"] = range(len(runs))
    rows = rows.merge(runs[["seq", "pos"]], on="seq", how="left")
    for col in ("median", "p20", "p80", "fast_end", "fastest", "slowest", "tflops", "gbps"):
        rows[col] = pd.to_numeric(rows[col], errors="coerce").astype(float)
    device = str(runs["device"].iloc[-1])
    return History(device=device, path=path, runs=runs, rows=rows)


def load_store(store: str | os.PathLike, device: str | None = None) -> list[History]:
    """Every device's history in a store (or the one device asked for)."""
    return [load_history(f) for f in store_files(store, device)]


def run_document(path: Path, seq: int) -> tuple[dict[str, Any], pd.DataFrame]:
    """(metadata, rows) of a stored run, as load_run gives them (without raw samples)."""
    with _connect(path, readonly=True) as db:
        got = db.execute("SELECT doc FROM runs WHERE seq = ?", (int(seq),)).fetchone()
    if got is None:
        raise HistoryError(f"{path} has no run #{seq}")
    try:
        doc = json.loads(zlib.decompress(got[0]).decode("utf-8"))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError, TypeError) as e:
        raise HistoryError(f"{path}: run #{seq}'s document is corrupt ({e})") from None
    return doc.get("metadata") or {}, pd.DataFrame(doc.get("rows") or [])
