"""The result contract (docs/design.md): row columns, run-folder layout, loading.

Writers (benches/) and readers (roofline plot/compare) both import from here, so a
column is named in one place only.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

import pandas as pd

# The cache-mode names and the reading of a row's mode live below this module (physics.py,
# which load_run applies, reads them too); re-exported here, where readers import them.
from contract.modes import (  # noqa: F401
    CACHE,
    CACHE_MODES,
    DEFAULT_CACHE,
    WARM,
    native_cache,
    row_cache,
)
from contract.physics import apply as withhold
from contract.physics import withheld_of, withheld_text
from contract.record import RunRow, flat, parse_row
from contract.run_meta import RunMeta, parse_meta


class Row(TypedDict, total=False):
    """One row of a run: the columns, in order, with their types; the one place a column
    is named.  The required columns (docs/design.md) come first, through `reason`, then
    the ones this suite adds.  A row's columns are all present in a written run (None
    where they do not apply); `samples_ms` is in results.json only."""

    kernel: str
    provider: str
    dtype: str
    shape: str  # "n=1048576", "M=4096,K=4096", "M=4096,N=4096,K=4096", ...
    flops: int
    bytes: int
    intensity: float
    ms_median: float | None
    ms_p20: float | None
    ms_p80: float | None
    n_samples: int
    tflops: float | None
    gbps: float | None
    peak_tflops: float | None
    peak_gbps: float | None
    roof_tflops: float | None
    mfu: float | None
    pct_roof: float | None
    correct: bool | None
    rel_err: float | None
    status: str  # STATUSES
    reason: str | None
    device: str  # device model key (e.g. h100), in every row
    gpu_name: str  # name of the device present (GPU or CPU model), in every row
    meas_peak_tflops: float | None  # measured compute ceiling for this row's roof
    meas_peak_gbps: float | None  # measured memory bandwidth (large copy)
    meas_roof_tflops: float | None  # min(meas_peak, intensity x meas_bandwidth)
    pct_meas_roof: float | None  # achieved / meas_roof_tflops, in percent
    # ceiling the row is held against: fp32 (vector units) or tf32/fp16/bf16/fp8
    roof_class: str | None
    tolerance: float | None  # the relative-error tolerance the correctness gate used
    timer: str | None  # how the row was timed (do_bench, cudagraph, torch.utils.benchmark)
    # cold (caches flushed or rotated past) or warm (back-to-back calls on the same
    # buffers); a row written before this column has its device's native mode
    # (native_cache: cold on a GPU, warm on a CPU)
    cache: str | None
    # ok row faster than its roof allows (pct_roof > 100): a finding to explain
    above_roof: bool | None
    sm_clock_mhz: float | None  # GPU: median SM clock (NVML) while the row ran
    # GPU: timed with the SM clock below the throttle threshold, still so after
    # re-timing (clock-event reasons are reported in `reason`, not judged)
    throttled: bool | None
    # GPU: host time to dispatch one call (Python + launch), apart from device time;
    # longer than the device time (ms_median) = launch-bound
    host_us: float | None
    # GPU: the device kernels' time per call (torch.profiler over a few calls, apart from
    # the timing) and the kernels' names, "name; name" (docs/measurement.md)
    kernel_ms: float | None
    kernels: str | None
    # Energy per call (J): the mean power over the timed samples (NVML's total energy
    # counter on a GPU, RAPL on a CPU where readable) x ms_median; and what it buys
    energy_j: float | None
    tflop_per_j: float | None
    gb_per_j: float | None
    power_w: float | None  # mean power over the timed samples
    power_limit_w: float | None  # GPU: the enforced power limit while the row ran
    # GPU: samples left out as timed below the throttle threshold (per-sample SM clock)
    throttled_samples: int | None
    # Triton: the config each launch ran, "kernel[BLOCK_M=..,num_warps=..]; ..."
    config: str | None
    config_source: str | None  # Triton: shipped, tuned, cached, fixed or given (per launch)
    # --sizes model:NAME: the model layer(s) the row's shape stands for ("attn.qkv",
    # "mlp.down", "lm_head"); None for a preset's or an explicit shape
    layer: str | None
    # compile, compile-max: seconds torch.compile took at the row's first call (untimed)
    compile_s: float | None
    # GPU: the library of the kernels the row's call ran (cublas, cublasLt, cutlass, cudnn,
    # flash, triton, aten), from the profiler's kernel names; None on a CPU
    library: str | None
    # the run's baseline provider's ms_median / this row's, same kernel, dtype, shape and
    # cache mode (>1: faster than the baseline); None where the baseline row is not ok
    speedup: float | None
    algbw_gbps: float | None  # collectives: size of the whole array / time (nccl-tests')
    busbw_gbps: float | None  # collectives: algbw x the collective's factor (nccl-tests')
    rank: int | None  # fleet runs: the torch.distributed rank that measured the row
    host: str | None  # fleet runs: its host name
    gpu_uuid: str | None  # fleet runs: the UUID of its GPU (NVML), to find a slow GPU
    # CPU: "timed/planned" rounds of a row an interrupt cut short (--resume times it
    # again); empty for a row timed in full
    cut_short: str | None
    # Values the physics check withheld (contract/physics.py): a list of records
    # {column, value, bound, kind, reason, derived_from}, each value emptied in its own
    # column; JSON text in the CSV; None (absent in a run written before) when none
    withheld: list[dict[str, Any]] | None
    # Raw per-sample times (ms) of an ok row: in results.json only (a list per row), where
    # the regression gate's rank test reads them; the CSV keeps one scalar per cell.
    samples_ms: list[float]


SAMPLES = "samples_ms"
ALL_COLUMNS: list[str] = [c for c in Row.__annotations__ if c != SAMPLES]
# Required columns, in order (docs/design.md), then the extra ones this suite adds.
COLUMNS: list[str] = ALL_COLUMNS[:ALL_COLUMNS.index("reason") + 1]
EXTRA_COLUMNS: list[str] = ALL_COLUMNS[len(COLUMNS):]


class RunMetadata(TypedDict, total=False):
    """A run's metadata (results.json's "metadata"), by key.  Written by the sweep
    (benches/sweep/results.py and job.py), read by every reader; a key that a run of an
    older version lacks is absent, hence total=False."""

    run_id: str
    created: str  # ISO 8601, UTC
    device_key: str  # the device model the rows are held against
    device_name: str  # the device present
    device_model: str
    device_kind: str  # "cuda" or "cpu"
    detected_key: str
    capability: list[int] | None
    sms: int | None
    l2_mb: float | None
    llc_mb: float | None
    llc_rotation_mb: float | None
    gpu_memory_gb: float | None
    cpu_cores: int
    threads: int
    load_avg_1m: float
    cuda: str | None
    driver: str
    python: str
    torch: str
    triton: str
    triton_interpret: bool
    platform: str
    git_commit: str
    command: str
    version_warnings: list[str]
    request: dict[str, Any]  # the typed request the run was made from
    seed: int
    sizes: str  # a preset, or "explicit"
    explicit_shapes: list[str]
    # --sizes model:NAME: the model, tokens, and each kernel shape's layer and count per
    # forward pass (benches/sweep/results.py model_step)
    model_step: dict[str, Any] | None
    kernels: list[str]
    dtypes: list[str]
    providers: list[str]
    check_only: bool
    cache: list[str]
    fp8_accum: str
    timing: dict[str, Any]
    run_budget_s: float | None
    throttle_settings: dict[str, Any]
    ceilings: dict[str, Any]  # contract/ceilings.py: datasheet and measured
    ceilings_ready: bool
    autotune_on_disk: bool
    tuning_identity: str  # the GPU's identity its tunings are keyed by on disk
    shipped_configs: dict[str, Any]  # the shipped configs file used, or why none
    # benches/sweep/triton_cache.CompileAhead.record: counts (workers, cases, cases_done,
    # cases_failed, kernels_compiled, kernels_built, started_early), waited_s (float) and
    # worker_errors (list of str)
    compiled_ahead: dict[str, Any]
    nvml_start: dict[str, Any] | None
    nvml_end: dict[str, Any] | None
    clocks: dict[str, Any]
    power: dict[str, Any]
    throttle: dict[str, Any]
    # Where the rows' energy and kernel_ms come from, or why they are empty:
    # {"source": "nvml" | "rapl" | "torch.profiler" | None, "reason": str}
    energy: dict[str, Any]
    kernel_time: dict[str, Any]
    interrupted: bool
    aborted: bool
    abort_reason: str | None
    complete: bool
    signal: str | None
    cut_short: str
    resumed: list[dict[str, Any]]
    time_split_s: dict[str, float]
    wall_s: float
    # A serial sweep's (GPU, checks only, one CPU round) own split of each row:
    # [{"row": [kernel, provider, dtype, shape, cache], "s": {phase: seconds}}], the
    # phases that took none left out (benches/sweep/phases.py TimeSplit.since)
    row_split_s: list[dict[str, Any]]
    # Triton's compiles the sweep asked for: {"compiled": built, "from_cache": loaded}
    triton_compiles: dict[str, int]
    fleet: dict[str, Any]
    promoted_at: str  # a baseline's: when and from which runs it was promoted
    promoted_from: list[str]
    promoted_from_device_key: str
    promoted_with_force: bool
    replaced_baseline_kept_at: str

CUT_SHORT = "cut_short"
ROW_SPLIT = "row_split_s"
ALL_COLUMNS: list[str] = COLUMNS + EXTRA_COLUMNS
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


def journal_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a run journal, in order, up to the first line that is not a whole JSON
    object (a process killed mid-write leaves at most one such line, the last)."""
    rows: list[dict[str, Any]] = []
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


def read_doc(path: str | os.PathLike) -> dict[str, Any]:
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
    """A run (folder or results.json) as a RunDoc, its rows checked (load_run)."""
    p = resolve_results_json(path)
    meta, df = load_run(p)
    rows = tuple(parse_row(r) for r in df.to_dict("records"))
    return RunDoc(parse_meta(meta), rows, p)


def load_run(path: str | os.PathLike) -> tuple[dict[str, Any], pd.DataFrame]:
    """Load a run (folder or results.json) as (metadata, rows DataFrame), the physics
    check applied to its rows (values no device can produce withheld, each recorded in
    the row's `withheld` column; the files are not touched)."""
    p = resolve_results_json(path)
    doc = read_doc(p)
    meta = doc.get("metadata", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise RunLoadError(f"{p}: 'metadata' is a {type(meta).__name__}, not an object")
    bad = next((i for i, r in enumerate(doc["rows"]) if not isinstance(r, dict)), None)
    if bad is not None:
        raise RunLoadError(f"{p}: row {bad} is a {type(doc['rows'][bad]).__name__}, "
                           "not an object")
    # The physics check (contract/physics.py): a value no device can produce is withheld
    # wherever a saved run is shown, whatever version of the suite wrote it.
    withhold(doc["rows"], meta)
    df = pd.DataFrame(doc["rows"])
    missing = [c for c in COLUMNS if c not in df.columns] if len(df) else []
    if missing:
        raise RunLoadError(f"{p} lacks columns: {', '.join(missing)}")
    if not len(df):
        df = pd.DataFrame(columns=ALL_COLUMNS)
    return meta, df


def csv_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows as results.csv holds them: ALL_COLUMNS, one scalar per cell (the withheld
    records as JSON text)."""
    df = pd.DataFrame(list(rows), columns=ALL_COLUMNS)
    df["withheld"] = [withheld_text(r.get("withheld")) for r in rows]
    return df


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



def row_problems(row: dict[str, Any]) -> list[str]:
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
