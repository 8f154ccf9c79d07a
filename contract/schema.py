"""The result contract (docs/design.md): row columns, run-folder layout, loading.

Writers (benches/) and readers (roofline plot/compare) both import from here, so a
column is named in one place only.
"""

from __future__ import annotations

import json
import os
import secrets
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Required, TypedDict

import pandas as pd

from contract.bounds import WITHHELD, WithheldJson, withheld_of, withheld_text

# The cache-mode names and the reading of a row's mode live below this module (physics.py,
# which load_doc applies, reads them too); re-exported here, where readers import them.
from contract.modes import (  # noqa: F401
    CACHE,
    CACHE_MODES,
    DEFAULT_CACHE,
    WARM,
    native_cache,
    row_cache,
)
from contract.physics import apply as withhold
from contract.record import COLUMNS as RECORD_COLUMNS
from contract.record import RunRow, column_types, flat, parse_row
from contract.run_meta import RunMeta, meta_json, parse_meta


def _file_type(column: str, hint: Any) -> Any:
    """A record field's type as results.json holds it: a tuple as a list, the withheld
    records as JSON objects (None where there are none)."""
    if column == WITHHELD:
        return list[WithheldJson] | None
    if column == CACHE:  # none in the rows of runs written before it (a fleet's too)
        return str | None
    if typing.get_origin(hint) is tuple:
        return list[typing.get_args(hint)[0]]  # type: ignore[valid-type]
    return hint


# One row of a run as the files hold it: the columns, in order, with their types, derived
# from the row's record (contract/record.py: each column a field of the group that fills
# it; adding a column means adding a field to one group).  The required columns
# (docs/design.md) come first, through `reason`, then the ones this suite adds.  A row's
# columns are all present in a written run (None where they do not apply); `samples_ms`
# (an ok row's raw per-sample times, which the regression gate's rank test reads) is in
# results.json only.  What each column means: the fields' docstrings in contract/record.py
# and docs/results.md.
Row = TypedDict(  # type: ignore[misc]
    "Row", {c: _file_type(c, h) for c, h in column_types().items()}, total=False)

SAMPLES = "samples_ms"
ALL_COLUMNS: list[str] = list(RECORD_COLUMNS)
# Required columns, in order (docs/design.md), then the extra ones this suite adds.
COLUMNS: list[str] = ALL_COLUMNS[:ALL_COLUMNS.index("reason") + 1]
EXTRA_COLUMNS: list[str] = ALL_COLUMNS[len(COLUMNS):]

CUT_SHORT = "cut_short"
ROW_SPLIT = "row_split_s"
# Names a case (kernel, provider, dtype, shape); a row across runs is KEY and its cache
# mode (ROW_ID): a cold and a warm time of one case are different numbers, never compared.
KEY: list[str] = ["kernel", "provider", "dtype", "shape"]
ROW_ID: list[str] = [*KEY, CACHE]
STATUSES = ("ok", "failed", "skipped")

RESULTS_CSV = "results.csv"
RESULTS_JSON = "results.json"
# Append-only record of a run's rows while it runs (one JSON row per line), so writing a
# row costs the same at row 1,000 as at row 10; results.json is rewritten whole only at
# the run's start, after its ceilings and at its end (finished, interrupted or aborted).
# Readers take the journal's rows when it holds more than results.json (a process killed
# before its final write); it is removed once results.json holds every row.
ROWS_JOURNAL = "rows.jsonl"
SUMMARY_MD = "summary.md"
ROOFLINE_PNG = "roofline.png"
SCALING_PNG = "scaling.png"


class RunLoadError(ValueError):
    """A run folder or results file that cannot be read (one-line message)."""


def _create_beside(path: Path) -> tuple[int, Path]:
    """A new, exclusively created temp file in path's folder, (fd, its path).  Created
    with mode 0666 so the kernel applies the process's umask (and a folder's default
    ACL) at this moment, as open() does: 0644 under the usual 022.  mkstemp's files are
    0600 whatever the umask, and a mode computed from the umask at import goes stale when
    the umask changes later."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Write a file through `write(f)` on a temp file in the same folder, then rename it
    into place, so a crash never leaves a half-written file in place of a good one.  The
    file gets the mode open() would give it (see _create_beside)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """atomic_write of UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


# A row's identity across runs (ROW_ID's values): a cold and a warm time of one case are
# different rows, never compared.
RowKey = tuple[str, str, str, str, str]


def row_key(row: Any) -> RowKey:
    """kernel, provider, dtype, shape and cache mode (row_cache) of a row (a dict or
    pandas row): the one key every part of the suite matches rows by."""
    return (str(row["kernel"]), str(row["provider"]), str(row["dtype"]), str(row["shape"]),
            row_cache(row))


def parse_row_key(parts: Sequence[Any]) -> RowKey:
    """A row key from its parts as a list holds them: four (a cold row, as keys were
    written before cache modes) or five."""
    got = [str(x) for x in parts]
    if len(got) == 4:
        got.append(DEFAULT_CACHE)
    if len(got) != 5:
        raise ValueError(f"a row is kernel, provider, dtype, shape[, cache], not {list(parts)!r}")
    return (got[0], got[1], got[2], got[3], got[4])


def cache_column(df: pd.DataFrame) -> pd.Series:
    """row_cache of every row of a frame."""
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    return pd.Series([row_cache(r) for r in df.to_dict("records")], index=df.index)


def mode_tag(row: Any) -> str:
    """"" for a row timed in its device's native mode, else its mode ("warm" on a GPU,
    "cold" on a CPU): what names and tables add, so that a row timed as rows always were
    keeps the name it had."""
    cache = row_cache(row)
    return "" if cache == native_cache(row) else cache


def row_name(row: Any, sep: str = "/") -> str:
    """kernel/provider/dtype/shape of a row (a dict or pandas row), with its mode_tag
    appended when it has one."""
    name = sep.join(str(row.get(k, "?")) for k in KEY)
    tag = mode_tag(row)
    return f"{name}{sep}{tag}" if tag else name


def parse_shape(shape: str) -> dict[str, int]:
    """'M=4096,N=4096,K=4096' -> {'M': 4096, 'N': 4096, 'K': 4096}."""
    out: dict[str, int] = {}
    for part in shape.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = int(value)
    return out


def format_shape(dims: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


def resolve_results_json(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / RESULTS_JSON
    if not p.exists():
        raise RunLoadError(f"no results found at {path} (expected a run folder or results.json)")
    return p


def journal_rows(path: str | os.PathLike) -> list[Row]:
    """The rows of a run journal, in order, up to the first line that is not a whole JSON
    object (a process killed mid-write leaves at most one such line, the last)."""
    rows: list[Row] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break
                if not isinstance(row, dict) or not line.endswith("\n"):
                    break
                rows.append(row)
    except (OSError, UnicodeDecodeError):
        return []
    return rows


class ResultsDoc(TypedDict, total=False):
    """A results.json document as the file holds it (write_results writes it)."""

    # The run's metadata, the file's open JSON object (run_meta.parse_meta reads it).
    metadata: dict[str, Any] | None
    rows: Required[list[Row]]


def read_doc(path: str | os.PathLike) -> ResultsDoc:
    """A run's results.json document, with the rows of its journal (ROWS_JOURNAL) when
    that holds more: the rows written since results.json was last rewritten whole."""
    p = resolve_results_json(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunLoadError(f"cannot read {p}: {e}") from None
    if not isinstance(doc, dict) or "rows" not in doc or not isinstance(doc["rows"], list):
        raise RunLoadError(f"{p} is not a results.json (no 'rows' list)")
    journal = p.parent / ROWS_JOURNAL
    if journal.exists():
        rows = journal_rows(journal)
        if len(rows) > len(doc["rows"]):
            doc["rows"] = rows
    return doc


@dataclass(frozen=True)
class RunDoc:
    """A saved run as records: its metadata and its rows (contract/run_meta.py,
    contract/record.py), the physics check applied (load_doc).  `frame()` gives the rows
    as the files hold them, one column each, for the readers that work on columns."""

    meta: RunMeta
    rows: tuple[RunRow, ...]
    path: Path | None = None

    def frame(self) -> pd.DataFrame:
        if not self.rows:
            return pd.DataFrame(columns=ALL_COLUMNS)
        return pd.DataFrame([flat(r, ALL_COLUMNS) for r in self.rows])


def load_doc(path: str | os.PathLike) -> RunDoc:
    """A run (folder or results.json) as a RunDoc: its metadata and rows as records, the
    physics check applied to the rows (values no device can produce withheld, each
    recorded on its row; the files are not touched)."""
    p = resolve_results_json(path)
    doc = _read_checked(p)
    parsed = parse_meta(doc.get("metadata"))
    return RunDoc(parsed, tuple(withhold([parse_row(r) for r in doc["rows"]], parsed)), p)


def _read_checked(p: Path) -> ResultsDoc:
    """A results.json as the file holds it (with its journal's rows when longer),
    refused (RunLoadError) where its metadata or a row is not an object or a row lacks a
    required column."""
    doc = read_doc(p)
    meta = doc.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise RunLoadError(f"{p}: 'metadata' is a {type(meta).__name__}, not an object")
    bad = next((i for i, r in enumerate(doc["rows"]) if not isinstance(r, dict)), None)
    if bad is not None:
        raise RunLoadError(f"{p}: row {bad} is a {type(doc['rows'][bad]).__name__}, "
                           "not an object")
    present = {c for r in doc["rows"] for c in r}
    missing = [c for c in COLUMNS if c not in present] if doc["rows"] else []
    if missing:
        raise RunLoadError(f"{p} lacks columns: {', '.join(missing)}")
    return doc


def csv_frame(rows: Sequence[Row]) -> pd.DataFrame:
    """Rows as results.csv holds them: ALL_COLUMNS, one scalar per cell (the withheld
    records as JSON text)."""
    df = pd.DataFrame(list(rows), columns=ALL_COLUMNS)
    df[WITHHELD] = [withheld_text(r.get(WITHHELD)) for r in rows]
    return df


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None  # JSON has no NaN/inf
    return v


def row_json(row: RunRow) -> Row:
    """A row as results.json and the journal hold it (contract.record.flat, its raw
    samples included), in strict JSON: no NaN or inf."""
    out = {k: _finite_or_none(v) for k, v in flat(row, ALL_COLUMNS, samples=False).items()}
    if row.timing.samples_ms:
        out[SAMPLES] = [_finite_or_none(float(x)) for x in row.timing.samples_ms]
    return out


def journal_line(row: RunRow) -> str:
    """A row as one line of the run's journal (ROWS_JOURNAL)."""
    return json.dumps(row_json(row), separators=(",", ":")) + "\n"


def csv_text(rows: Sequence[RunRow], header: bool = True) -> str:
    """Rows as results.csv's text (csv_frame's form)."""
    return csv_frame([flat(r, ALL_COLUMNS, samples=False) for r in rows]).to_csv(
        index=False, header=header)


def write_results(folder: Path, meta: RunMeta, rows: Sequence[RunRow]) -> None:
    """A run's results.csv and results.json written whole, each atomically: the one
    writer of a run's files from its records (the sweep's ResultWriter, a finalized
    journal's run, a fleet's folder)."""
    atomic_write_text(folder / RESULTS_CSV, csv_text(rows))
    doc = {"metadata": meta_json(meta), "rows": [row_json(r) for r in rows]}
    atomic_write_text(folder / RESULTS_JSON, json.dumps(doc, indent=1) + "\n")


# Metric columns an ok row must carry as numbers (the roofline places a point by them),
# and those that may be empty but, when present, must be numbers too.
OK_ROW_NUMBERS = ("flops", "bytes", "intensity", "ms_median", "tflops", "gbps")
OPTIONAL_NUMBERS = ("ms_p20", "ms_p80", "peak_tflops", "peak_gbps", "roof_tflops", "mfu",
                    "pct_roof", "meas_peak_tflops", "meas_peak_gbps", "meas_roof_tflops",
                    "pct_meas_roof", "rel_err")


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_empty(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def check_metrics(df: pd.DataFrame, where: str | os.PathLike) -> None:
    """RunLoadError (one line) for the first ok row whose metrics are not numbers: a
    hand-edited "tflops": "abc" or "flops": null would otherwise be drawn or dropped
    without a word."""
    if df.empty or "status" not in df.columns:
        return
    for i, row in enumerate(df.to_dict("records")):
        if row.get("status") != "ok":
            continue
        withheld = {w.column for w in withheld_of(row)}
        for col in (*OK_ROW_NUMBERS, *OPTIONAL_NUMBERS):
            v = row.get(col)
            # A value the physics check withheld is empty on purpose, with its record.
            required = col in OK_ROW_NUMBERS and col not in withheld
            if (required and not _is_number(v)) or \
                    (not required and not _is_empty(v) and not _is_number(v)):
                name = row_name(row, " ")
                raise RunLoadError(f"{where}: row {i} ({name}): '{col}' is {v!r}, not a "
                                   "number")



def row_problems(row: Row) -> list[str]:
    """What in `row` the Row type does not allow: a column it does not declare, or a
    value of another type (None is allowed where the column's type says so; an int is a
    float; a bool is neither).  [] for a well-typed row."""
    import types
    import typing

    hints = typing.get_type_hints(Row)
    problems = []
    for key, value in row.items():
        if key not in hints:
            problems.append(f"undeclared column {key!r}")
            continue
        hint = hints[key]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None:
            if type(None) not in allowed:
                problems.append(f"{key}: None where {hint} is required")
            continue
        ok = False
        for t in allowed:
            origin = typing.get_origin(t) or t
            if origin is float:
                ok = isinstance(value, int | float) and not isinstance(value, bool)
            elif origin is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif origin is not type(None):
                ok = isinstance(value, origin)
            if ok:
                break
        if not ok:
            problems.append(f"{key}: {type(value).__name__} {value!r} is not {hint}")
    return problems
