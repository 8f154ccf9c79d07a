"""The rehearsal's summary table and its rehearsal.json."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benches.rehearse.rehearsal import ArchReport, Failure, KernelCount
from benches.rehearse.tuning_record import Dropped, TuneKey

REPORT_FILE = "rehearsal.json"


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


def to_json(report: ArchReport) -> dict[str, Any]:
    return asdict(report)


def from_json(data: dict[str, Any]) -> ArchReport:
    """An ArchReport read back (a child process's, for the parent's summary)."""
    r = ArchReport(data["arch"], data["device"], list(data["capability"]), data["triton"],
                   data["cache_dir"], data.get("identity"), wall_s=data["wall_s"],
                   left_out=list(data["left_out"]))
    r.kernels = {k: KernelCount(**v) for k, v in data["kernels"].items()}
    r.failures = [Failure(**f) for f in data["failures"]]
    r.dropped = [Dropped(**d) for d in data["dropped"]]
    r.tunings = [TuneKey(**t) for t in data["tunings"]]
    return r


def write_report(folder: Path, reports: list[ArchReport], meta: dict[str, Any]) -> Path:
    """<folder>/rehearsal.json: the run's metadata and each arch's report."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / REPORT_FILE
    doc = {**meta, "passed": not any(r.failures for r in reports),
           "arches": [to_json(r) for r in reports]}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2
