"""The rehearsal's summary table and its rehearsal.json."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TypedDict, cast

from benches.rehearse.rehearsal import ArchReport, Failure, KernelCount
from benches.rehearse.tuning_record import Dropped, TuneKey

REPORT_FILE = "rehearsal.json"


# The JSON forms of the rehearsal's records (their fields, in their order: asdict's).
class KernelCountJson(TypedDict):
    kernel: str
    dtypes: list[str]
    cases: int
    covered: int
    launches: int
    tunings: int
    failures: int
    seconds: float


class FailureJson(TypedDict):
    kernel: str
    dtype: str
    shape: str
    path: str
    launch: str
    config: str
    error: str


class DroppedJson(TypedDict):
    kernel: str
    dtype: str
    shape: str
    launch: str
    config: str
    why: str


class TuneKeyJson(TypedDict):
    kernel: str
    dtype: str
    shape: str
    launch: str
    device: str
    tuning_key: str
    configs: list[str]
    target: str
    backend_hash: str
    fn_cache_key: str
    env: str
    triton_key_sha: str
    cache_key: str
    cache_dir: str
    hit: bool
    best: str
    inputs_match: bool


class ArchReportJson(TypedDict):
    """One arch's report: a child process's report file, and one of rehearsal.json's
    `arches`."""

    arch: str
    device: str
    capability: list[int]
    triton: str
    cache_dir: str
    identity: str | None
    kernels: dict[str, KernelCountJson]
    left_out: list[str]
    failures: list[FailureJson]
    dropped: list[DroppedJson]
    tunings: list[TuneKeyJson]
    wall_s: float


class RehearsalRun(TypedDict):
    """rehearsal.json's metadata: the command, the toolchain, when."""

    command: str
    triton: str
    torch: str
    python: str
    created: str


class RehearsalDoc(RehearsalRun):
    """rehearsal.json: the metadata, whether every arch passed, each arch's report."""

    passed: bool
    arches: list[ArchReportJson]


def table_lines(report: ArchReport) -> list[str]:
    """One arch's summary: a row per kernel, a total, then every failure."""
    head = ("kernel", "dtypes", "cases", "covered", "launches", "tunings", "failed", "s")
    rows = [(k.kernel, ",".join(k.dtypes), k.cases, k.covered, k.launches, k.tunings,
             k.failures, f"{k.seconds:.1f}") for k in report.kernels.values()]
    total = [sum(int(r[i]) for r in rows) for i in range(2, 7)]
    rows.append(("total", "", *total, f"{report.wall_s:.1f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    out = [f"rehearsal {report.arch} on a stand-in {report.device} (triton "
           f"{report.triton}): {total[0]} distinct cases ({total[1]} more covered by "
           f"them), {total[2]} launches, {total[3]} tunings, {report.wall_s:.1f} s",
           fmt.format(*head), *(fmt.format(*r) for r in rows)]
    out += [f"left out: {n}" for n in report.left_out]
    out += [f"dropped by the autotuner: {d.kernel} {d.dtype} {d.shape} {d.launch}"
            f"[{d.config}]: {d.why}" for d in report.dropped]
    out += [f"FAILED {f.line()}" for f in report.failures]
    out.append(f"{report.arch}: {verdict(report)}")
    return out


def verdict(report: ArchReport) -> str:
    n = len(report.failures)
    return f"FAILED, {n} failure(s)" if n else "passed"


def print_report(report: ArchReport, log: Callable[[str], None] = print) -> None:
    for line in table_lines(report):
        log(line)


def to_json(report: ArchReport) -> ArchReportJson:
    return cast(ArchReportJson, asdict(report))


def from_json(data: ArchReportJson) -> ArchReport:
    """An ArchReport read back (a child process's, for the parent's summary)."""
    r = ArchReport(data["arch"], data["device"], list(data["capability"]), data["triton"],
                   data["cache_dir"], data.get("identity"), wall_s=data["wall_s"],
                   left_out=list(data["left_out"]))
    r.kernels = {k: KernelCount(**v) for k, v in data["kernels"].items()}
    r.failures = [Failure(**f) for f in data["failures"]]
    r.dropped = [Dropped(**d) for d in data["dropped"]]
    r.tunings = [TuneKey(**t) for t in data["tunings"]]
    return r


def write_report(folder: Path, reports: list[ArchReport], meta: RehearsalRun) -> Path:
    """<folder>/rehearsal.json: the run's metadata and each arch's report."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / REPORT_FILE
    doc = RehearsalDoc(**meta, passed=not any(r.failures for r in reports),
                       arches=[to_json(r) for r in reports])
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2
