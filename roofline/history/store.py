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

import json
import os
import sqlite3
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, astuple, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from contract.record import parse_row
from contract.run_meta import parse_meta
from contract.schema import ROW_ID, STATUSES, RunDoc, row_name
from roofline.history.errors import HistoryError
from roofline.history.intake import ROW_COLUMNS, StoredRow, finite, take_in

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


def add_run(run: str | os.PathLike, store: str | os.PathLike = DEFAULT_STORE,
            allow_incomplete: bool = False) -> Added:
    """Append a run's rows to its device's file in `store` (created if absent).

    HistoryError (one line, nothing written) for an unreadable run, a --check-only run
    (no times), an incomplete one unless allow_incomplete, one without a device key, an
    ok row with unusable times, a store that is not one, or a run already in the store.
    """
    got = take_in(run, allow_incomplete)
    made = got.doc.meta.provenance
    entry = (got.key, _text(made.run_id or None), _text(made.created),
             datetime.now(timezone.utc).isoformat(timespec="seconds"),
             _text(made.git_commit), got.device, _text(got.doc.meta.device.device_name),
             got.versions(), 0 if got.incomplete else 1, str(Path(run).resolve()),
             got.document())
    path = prepare_store(store) / f"{got.device}{SUFFIX}"
    seq = _append(path, entry, got.rows, made.run_id or str(run))
    return Added(got.device, path, seq, len(got.rows), str(made.run_id or ""))


def _append(path: Path, entry: tuple[Any, ...], stored: list[StoredRow], name: str) -> int:
    """Insert a run (`entry`: the runs table's values) and its rows in one transaction;
    its seq.  HistoryError, nothing written, for a run already in the file."""
    with _connect(path, readonly=False) as db:
        try:
            _open_for_append(db, path)
            old = db.execute("SELECT seq, added FROM runs WHERE run_key = ?",
                             (entry[0],)).fetchone()
            if old:
                raise HistoryError(f"run {name} is already in {path} "
                                   f"(run #{old[0]}, added {old[1]}): a run is added once")
            cur = db.execute(
                "INSERT INTO runs (run_key, run_id, created, added, git_commit, device, "
                "device_name, versions, complete, source, doc) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                entry)
            seq = int(cur.lastrowid)
            db.executemany(
                f"INSERT INTO rows (seq, {', '.join(ROW_COLUMNS)}) VALUES "
                f"({', '.join('?' * (len(ROW_COLUMNS) + 1))})",
                [(seq, *astuple(s)) for s in stored])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
    return seq


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


# ---- reading --------------------------------------------------------------------------------


def _bad_row(r: StoredRow) -> str | None:
    """Why a stored row is corrupt (None when it is usable); its values as SQLite holds
    them (a text in a REAL column stays text)."""
    for k in ROW_ID:
        v = getattr(r, k)
        if not isinstance(v, str) or not v:
            return f"'{k}' is {v!r}"
    if r.status not in STATUSES:
        return f"status is {r.status!r}"
    if r.status != "ok":
        return None
    for col in ("median", "p20", "p80"):
        v = getattr(r, col)
        if finite(v) is None or v <= 0:
            return f"'{col}' is {v!r}, not a positive time"
    for col in ("fast_end", "fastest", "slowest"):
        v = getattr(r, col)
        if v is not None and (finite(v) is None or v <= 0):
            return f"'{col}' is {v!r}, not a positive time"
    if r.n is not None and (not isinstance(r.n, int) or r.n < 1):
        return f"'n' is {r.n!r}, not a sample count"
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
        stored = [(seq, StoredRow(*values)) for seq, *values in cur.fetchall()]
    if runs.empty:
        raise HistoryError(f"{path} holds no run: add one first")
    run_ids = dict(zip(runs["seq"], runs["run_id"], strict=True))
    for seq, r in stored:
        problem = _bad_row(r)
        if problem is None and seq not in run_ids:
            problem = "it belongs to no run"
        if problem:
            raise HistoryError(f"{path}: a corrupt row (run #{seq} "
                               f"{run_ids.get(seq) or ''}, {row_name(asdict(r))}): {problem}")
    rows = pd.DataFrame([(seq, *astuple(r)) for seq, r in stored],
                        columns=["seq", *ROW_COLUMNS])
    runs["pos"] = range(len(runs))
    rows = rows.merge(runs[["seq", "pos"]], on="seq", how="left")
    for col in ("median", "p20", "p80", "fast_end", "fastest", "slowest", "tflops", "gbps"):
        rows[col] = pd.to_numeric(rows[col], errors="coerce").astype(float)
    device = str(runs["device"].iloc[-1])
    return History(device=device, path=path, runs=runs, rows=rows)


def load_store(store: str | os.PathLike, device: str | None = None) -> list[History]:
    """Every device's history in a store (or the one device asked for)."""
    return [load_history(f) for f in store_files(store, device)]


def run_document(path: Path, seq: int) -> RunDoc:
    """A stored run as records (its rows without raw samples), as add_run kept it."""
    with _connect(path, readonly=True) as db:
        got = db.execute("SELECT doc FROM runs WHERE seq = ?", (int(seq),)).fetchone()
    if got is None:
        raise HistoryError(f"{path} has no run #{seq}")
    try:
        doc = json.loads(zlib.decompress(got[0]).decode("utf-8"))
        return RunDoc(parse_meta(doc.get("metadata")),
                      tuple(parse_row(r) for r in doc.get("rows") or []))
    except (zlib.error, UnicodeDecodeError, json.JSONDecodeError, TypeError, ValueError,
            KeyError, AttributeError) as e:
        raise HistoryError(f"{path}: run #{seq}'s document is corrupt ({e})") from None
