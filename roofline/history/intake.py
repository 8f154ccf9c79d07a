"""A run as the history store takes it in (roofline/history/store.py add_run): the checks
it passes first (readable, timed, whole unless allowed, of a named device, its rows'
statuses known and its ok rows' times usable) and what the store keeps of it: each row's
summary (StoredRow: the table `rows`), the run's identity, versions and its document
(metadata and rows without raw samples, compressed)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from contract.record import RunRow, flat
from contract.request import stored_selection
from contract.run_meta import meta_json
from contract.schema import ALL_COLUMNS, RESULTS_JSON, STATUSES, RowKey, RunDoc, RunLoadError
from roofline.gate.rules import status_of
from roofline.gate.runs import GateRun, incomplete_reasons, load_checked, run_device_key
from roofline.gate.stats import fast_end
from roofline.history.errors import HistoryError

VERSION_KEYS = ("python", "torch", "triton", "cuda", "fp8_accum")


@dataclass(frozen=True)
class StoredRow:
    """A run's row as the store keeps it (table `rows`, less the run's seq): its key, its
    status, why and how it was timed, its median, p20 and p80 (ms, ok rows), its sample
    count, its samples' fast end (second-fastest), fastest and slowest, its rates, and
    whether the GPU throttled (1) or not (0)."""

    kernel: str
    provider: str
    dtype: str
    shape: str
    cache: str
    status: str
    reason: str
    timer: str
    median: float | None
    p20: float | None
    p80: float | None
    n: int | None
    fast_end: float | None
    fastest: float | None
    slowest: float | None
    tflops: float | None
    gbps: float | None
    throttled: int

    @property
    def key(self) -> RowKey:
        return (self.kernel, self.provider, self.dtype, self.shape, self.cache)


ROW_COLUMNS = tuple(f.name for f in fields(StoredRow))


def finite(v: Any) -> float | None:
    """v as a finite float, else None (bools, text, null, NaN, infinities)."""
    if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class Intake:
    """A run the store takes: its document as records, the file's bytes (a run without
    an id and a start time is known by their hash), its device, why it is not whole
    (allowed), and its rows as the store keeps them (one per key)."""

    doc: RunDoc
    raw: bytes
    device: str
    incomplete: list[str]
    rows: list[StoredRow]

    @property
    def key(self) -> str:
        """The run's identity: device, run id and start time (a run folder is created
        exclusively, so these name one run wherever its folder is copied); a hand-made
        run without them is known by its content's hash."""
        made = self.doc.meta.provenance
        if isinstance(made.run_id, str) and made.run_id and isinstance(made.created, str) \
                and made.created:
            return f"{self.device}|{made.run_id}|{made.created}"
        return "sha256:" + hashlib.sha256(self.raw).hexdigest()

    def versions(self) -> str:
        """The versions the run was made with, as the runs table keeps them (JSON)."""
        meta = self.doc.meta
        sw = meta.software
        return json.dumps(dict(zip(VERSION_KEYS, (sw.python, sw.torch, sw.triton, sw.cuda,
                                                  meta.settings.fp8_accum), strict=True)),
                          sort_keys=True)

    def document(self) -> bytes:
        """What the store keeps of the run besides its rows' summaries: its metadata and
        rows (without raw samples), compressed (store.run_document reads it back)."""
        return zlib.compress(json.dumps({
            "metadata": meta_json(self.doc.meta),
            "rows": [flat(r, ALL_COLUMNS, samples=False) for r in self.doc.rows],
        }, default=str).encode("utf-8"), 9)


def take_in(run: str | os.PathLike, allow_incomplete: bool = False) -> Intake:
    """The run read and checked for the store; HistoryError (one line) for an unreadable
    run, a --check-only run (no times), an incomplete one unless allow_incomplete, one
    without a device key, a row with an unknown status or an ok row with unusable
    times."""
    read, raw = _read(run)
    reasons = _refused(run, read.doc, allow_incomplete)
    device = _device_of(run, read.doc)
    return Intake(read.doc, raw, device, reasons, _stored_rows(run, read))


def _read(run: str | os.PathLike) -> tuple[GateRun, bytes]:
    try:
        read = load_checked(run)
    except RunLoadError as e:
        raise HistoryError(" ".join(str(e).split())) from None
    except OSError as e:
        raise HistoryError(f"cannot read {run}: {e.strerror or e}") from None
    except (TypeError, ValueError) as e:  # a cell no typed row can hold
        raise HistoryError(f"cannot read {run}: {' '.join(str(e).split())}") from None
    path = Path(run) / RESULTS_JSON if Path(run).is_dir() else Path(run)
    return read, path.read_bytes()


def _refused(run: str | os.PathLike, doc: RunDoc, allow_incomplete: bool) -> list[str]:
    """HistoryError for a run the store does not keep: a --check-only run (no times),
    an incomplete one unless allow_incomplete; its incomplete reasons otherwise."""
    if (asked := stored_selection(doc.meta)) is not None and asked.check_only:
        raise HistoryError(f"{run} is a --check-only run: it has no times to keep")
    reasons = incomplete_reasons(doc.meta)
    if reasons and not allow_incomplete:
        raise HistoryError(f"{run} is {', '.join(reasons)}: resume it first (run_bench.py "
                           "--resume RUN), or pass --allow-incomplete")
    return reasons


def _device_of(run: str | os.PathLike, doc: RunDoc) -> str:
    device = run_device_key(doc)
    if not device:
        raise HistoryError(f"{run} names no device (no metadata device_key, no single "
                           "'device' in its rows)")
    if not all(c.isalnum() or c in "._-" for c in device):
        raise HistoryError(f"{run}: device key {device!r} is not a plain name")
    return device


def _summary(row: RunRow) -> StoredRow:
    """A run's row as the store keeps it: key, status, times and its samples' summary."""
    status = status_of(row)
    t = row.timing
    ok = status == "ok"
    samples = t.samples_ms
    n = finite(t.n_samples)
    ends: tuple[float | None, float | None, float | None] = (None, None, None)
    if ok and samples:
        s = np.asarray(samples, dtype=np.float64)
        ends = (fast_end(s) if len(s) >= 2 else float(s[0]), float(s.min()), float(s.max()))
    return StoredRow(
        *row.key[:4], cache=row.case.cache, status=status, reason=row.reason or "",
        timer=t.timer or "", median=finite(t.ms_median) if ok else None,
        p20=finite(t.ms_p20) if ok else None, p80=finite(t.ms_p80) if ok else None,
        n=len(samples) if samples else (int(n) if n else None), fast_end=ends[0],
        fastest=ends[1], slowest=ends[2], tflops=finite(row.metrics.tflops),
        gbps=finite(row.metrics.gbps), throttled=1 if row.clocks.throttled is True else 0)


def _stored_rows(run: str | os.PathLike, read: GateRun) -> list[StoredRow]:
    """The run's rows as the store keeps them, one per key (a key twice, a resumed
    run's: the last row); HistoryError for a row with an unknown status or an ok row
    with unusable times."""
    if not read.doc.rows:
        raise HistoryError(f"{run} has no rows")
    by_key: dict[RowKey, StoredRow] = {}
    for i, row in enumerate(read.doc.rows):
        s = _summary(row)
        if s.status not in STATUSES:
            raise HistoryError(f"{run}: row {row.label()} has status {row.status!r}")
        if i in read.unusable:
            raise HistoryError(f"{run}: row {row.label()}: {read.unusable[i]}")
        by_key[s.key] = s
    return list(by_key.values())
