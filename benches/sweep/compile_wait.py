"""How a sweep's compile-ahead ends (benches/sweep/triton_cache.CompileAhead): the sweep
waits after its ceilings for the workers, up to GPUBENCH_COMPILE_WAIT_S, and the run's
metadata says why a worker compiled nothing.

Why wait rather than stop the workers when the ceilings end: what they do not compile,
the sweep compiles serially at its rows' first calls, so waiting for workers compiling in
parallel is never slower while they work, and the main process measures nothing while it
waits.  The wait ends when every job is done, when the first results (one a worker) all
found their kernels in Triton's cache (a warm cache: the sweep loads the rest as fast
itself), or GPUBENCH_COMPILE_WAIT_S seconds after the ceilings (default 90; 0 stops the
workers when the ceilings end).  It is booked as compile time and recorded as
`compiled_ahead.waited_s`, with why it ended (`wait_ended`: done, cache warm, deadline).

`compiled_ahead.worker_errors` holds a few distinct lines: the last line of each worker
that died on its own (its stderr log's tail), its `preload ...:` lines, its jobs' errors.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only
    from benches.sweep.phases import TimeSplit

WAIT_ENV = "GPUBENCH_COMPILE_WAIT_S"
DEFAULT_WAIT_S = 90.0
MAX_ERRORS = 5
ERROR_CHARS = 300
# A log's head holds its preload lines, its tail the last words of a worker that died;
# between them may lie megabytes of PTX that Triton prints when ptxas fails.
LOG_EDGE_BYTES = 65536


class Waitable(Protocol):
    """What the sweep waits on (triton_cache.CompileAhead, named by its methods)."""

    def wait(self, seconds: float) -> float: ...

    def record(self) -> dict[str, Any]: ...


def wait_s() -> float:
    """GPUBENCH_COMPILE_WAIT_S (default 90, 0: none); a bad value is a one-line error (the
    command's exit 2, before anything is measured)."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        from benches.sweep.run_folder import RequestError  # pandas: only to refuse

        raise RequestError(f"{WAIT_ENV}={raw!r}: give the seconds to wait after the "
                           f"ceilings for the compile-ahead workers, 0 or more (0: stop "
                           f"them when the ceilings end; default {DEFAULT_WAIT_S:g})")
    return seconds


def _log_lines(path: str) -> tuple[list[str], list[str]]:
    """A worker's log: the non-empty lines of its head and of its tail."""
    try:
        with open(path, "rb") as f:
            head = f.read(LOG_EDGE_BYTES)
            f.seek(max(len(head), os.fstat(f.fileno()).st_size - LOG_EDGE_BYTES))
            tail = (f.read() if len(head) == LOG_EDGE_BYTES else b"") or head
    except OSError:
        return [], []

    def lines(b: bytes) -> list[str]:
        return [s.strip() for s in b.decode(errors="replace").splitlines() if s.strip()]

    return lines(head), lines(tail)


def worker_errors(logs: str, exits: dict[int, int], job_errors: Iterable[str]) -> list[str]:
    """At most MAX_ERRORS distinct lines of ERROR_CHARS: for each worker that exited on its
    own with a non-zero code (`exits`, by pid) its log's last line (`logs`: the folder of
    the workers' <pid>.log), then each log's `preload ...:` lines, then `job_errors`."""
    names = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
    seen = {int(n.split(".")[0]): _log_lines(os.path.join(logs, n)) for n in names}
    found = [f"worker exited with code {code}: "
             + (seen.get(pid, ([], []))[1] or ["nothing on its stderr"])[-1]
             for pid, code in exits.items() if code != 0]
    found += [ln for head, _ in seen.values() for ln in head if ln.startswith("preload ")]
    found += job_errors
    return list(dict.fromkeys(e[:ERROR_CHARS] for e in found))[:MAX_ERRORS]


def after_ceilings(ahead: Waitable, split: TimeSplit,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """The sweep's wait for its compile-ahead after the ceilings, booked as compile time,
    then the workers stopped and one line said to `say` (rich markup), with a warning per
    worker error; the record for the run's metadata (ahead.record())."""
    from rich.markup import escape  # an error's own brackets are no markup

    seconds = wait_s()
    if seconds > 0:
        with split.phase("compile"):
            ahead.wait(seconds)
    record = ahead.record()
    say(summary_line(record))
    for err in record["worker_errors"]:
        say(f"[yellow]warning[/yellow]: a compile-ahead worker: {escape(err)}")
    return record


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def summary_line(record: dict[str, Any]) -> str:
    """One line of what the compile-ahead did: "compiled ahead: 183 of 183 cases (178
    kernels, 178 built) by 8 workers, 9.4 s after the ceilings"."""
    failed = record.get("cases_failed") or 0
    why = record.get("wait_ended")
    return (f"compiled ahead: {record.get('cases_done', 0)} of "
            f"{_n(record.get('cases', 0), 'case')} "
            f"({_n(record.get('kernels_compiled', 0), 'kernel')}, "
            f"{record.get('kernels_built', 0)} built"
            + (f", {_n(failed, 'case')} failed" if failed else "")
            + f") by {_n(record.get('workers', 0), 'worker')}, "
            f"{record.get('waited_s', 0.0):.1f} s after the ceilings"
            + ("" if why in (None, "done") else f" (ended: {why})"))
