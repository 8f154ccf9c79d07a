"""How a sweep's compile-ahead ends (benches/sweep/triton_cache.CompileAhead): the sweep
waits after its ceilings for the workers to finish, up to GPUBENCH_COMPILE_WAIT_S, and the
run's metadata says why a worker compiled nothing.

Why wait rather than stop the workers when the ceilings end: whatever they do not
compile, the sweep compiles serially, one kernel at a time, at its rows' first calls, so
waiting for workers compiling in parallel is never slower while they work (a worker
that hangs costs at most the deadline); and the main process measures nothing while it
waits, so their compiling on the host's cores cannot disturb a timing.  The wait ends
when every worker has exited (each exits when no job is left), when their first
results (one a worker) all found their kernels in Triton's cache (a warm cache: the
sweep loads the rest as fast itself, and waiting would only cost their start-up), or at
the deadline: GPUBENCH_COMPILE_WAIT_S seconds after the ceilings (default 90; 0 stops
the workers when the ceilings end, as before).  The seconds waited are booked as the run's compile
time (benches/sweep/phases.py) and recorded as `compiled_ahead.waited_s`.

Why a worker compiled nothing (an H200 run recorded 0 of 183 cases and nobody could say
why): each worker's stderr goes to a file, read at stop().  `compiled_ahead.
worker_errors` holds a few distinct lines: the last one of a worker that exited on its
own with a non-zero code (its import failed, say), its `preload ...:` lines, and its
jobs' errors; empty when nothing went wrong.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only
    from benches.sweep.phases import TimeSplit


class Waitable(Protocol):
    """What the sweep waits on (triton_cache.CompileAhead, which imports this module:
    named by its methods, not imported back)."""

    def wait(self, seconds: float) -> float: ...

    def record(self) -> dict[str, Any]: ...

WAIT_ENV = "GPUBENCH_COMPILE_WAIT_S"
DEFAULT_WAIT_S = 90.0
MAX_ERRORS = 5
ERROR_CHARS = 300
# A log's head holds its preload lines, its tail the last words of a worker that died;
# between them may lie megabytes of PTX that Triton prints when ptxas fails.
LOG_EDGE_BYTES = 65536
# How often the wait looks whether a worker exited (its output wakes it at once).
POLL_S = 0.1


def wait_s() -> float:
    """GPUBENCH_COMPILE_WAIT_S: the seconds the sweep waits after its ceilings for the
    compile-ahead workers (default 90, 0: none); a bad value is a one-line error (the
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


def read_output(procs: Iterable[subprocess.Popen], out: dict[int, bytearray],
                timeout: float) -> None:
    """Whatever the workers have written to stdout by `timeout` seconds from now, added to
    `out` (by pid).  Read while waiting so that no worker blocks on a full pipe."""
    fds = {p.stdout.fileno(): p.pid for p in procs
           if p.stdout is not None and not p.stdout.closed}
    if not fds:
        time.sleep(max(0.0, timeout))
        return
    ready, _, _ = select.select(list(fds), [], [], max(0.0, timeout))
    for fd in ready:
        os.set_blocking(fd, False)
        with contextlib.suppress(BlockingIOError):
            out.setdefault(fds[fd], bytearray()).extend(os.read(fd, 65536))


def wait_for_exit(procs: list[subprocess.Popen], out: dict[int, bytearray],
                  seconds: float, clock: Callable[[], float] = time.monotonic,
                  enough: Callable[[dict[int, bytearray]], bool] | None = None) -> str:
    """Wait until every worker of `procs` has exited, `seconds` have passed or `enough`
    says what they wrote so far is (cache_was_warm), reading their result lines into
    `out` meanwhile; why the wait ended (metadata.compiled_ahead.wait_ended): "done"
    (no job left), "cache warm" or "deadline"."""
    deadline = clock() + seconds
    while any(p.poll() is None for p in procs):
        left = deadline - clock()
        if left <= 0:
            return "deadline"
        # An exited worker's pipe stays readable (its end), so it is left out: the
        # select would not wait for the others.
        read_output([p for p in procs if p.poll() is None], out, min(left, POLL_S))
        if enough is not None and enough(out):
            return "cache warm"
    return "done"


def cache_was_warm(out: dict[int, bytearray], needed: int) -> bool:
    """Whether the workers' first `needed` results (one a worker, say) all found their
    kernels in Triton's cache (`built` 0, no error): a warm cache, whose other kernels
    the sweep loads in milliseconds each as well as the workers would, so waiting for
    them is only their start-up.  A cache warm for the first cases and cold for later
    ones (an interrupted run before) leaves the rest to the sweep's serial compiles,
    as without the wait."""
    lines = [ln for data in out.values() for ln in result_lines(bytes(data))]
    return needed > 0 and len(lines) >= needed and all(
        "compiled" in ln and not ln.get("built") for ln in lines)


def result_lines(data: bytes) -> list[dict[str, Any]]:
    """The whole result lines of a worker's output (a line cut by the kill is not one)."""
    out = []
    for line in data.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return [ln for ln in out if isinstance(ln, dict) and "job" in ln]


def _log_lines(log: IO[bytes]) -> tuple[list[str], list[str]]:
    """A worker's stderr log: the lines of its head and of its tail (the same lines for
    a short log), non-empty, stripped.  Read at offsets (pread): the file's own offset
    is the one the worker writes at."""
    try:
        fd = log.fileno()
        size = os.fstat(fd).st_size
        head = os.pread(fd, LOG_EDGE_BYTES, 0)
        rest = max(len(head), size - LOG_EDGE_BYTES)
        tail = os.pread(fd, size - rest, rest)
        if size <= 2 * LOG_EDGE_BYTES:
            tail = head + tail
    except (OSError, ValueError):  # ValueError: closed
        return [], []

    def lines(b: bytes) -> list[str]:
        return [s.strip() for s in b.decode(errors="replace").splitlines() if s.strip()]

    return lines(head), lines(tail)


def worker_errors(logs: dict[int, IO[bytes]], exits: dict[int, int],
                  job_errors: Iterable[str]) -> list[str]:
    """Why workers compiled less than they were given, at most MAX_ERRORS distinct lines
    of ERROR_CHARS: for each worker that exited on its own with a non-zero code (`exits`,
    by pid) its log's last line, then each log's `preload ...:` lines, then the jobs'
    errors; empty when nothing went wrong."""
    found: list[str] = []
    seen_logs = {pid: _log_lines(log) for pid, log in logs.items()}
    for pid, code in exits.items():
        if code != 0:
            tail = seen_logs.get(pid, ([], []))[1]
            found.append(f"worker exited with code {code}: "
                         + (tail[-1] if tail else "nothing on its stderr"))
    for head, _ in seen_logs.values():
        found += [ln for ln in head if ln.startswith("preload ")]
    found += job_errors
    distinct = list(dict.fromkeys(e[:ERROR_CHARS] for e in found))
    return distinct[:MAX_ERRORS]


def after_ceilings(ahead: Waitable, split: TimeSplit,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """The sweep's wait for its compile-ahead after the ceilings (module docstring):
    booked as compile time, then the workers stopped and one line said to `say` (a rich
    console's print: markup), with a warning for each worker error; the record for the
    run's metadata (ahead.record())."""
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
    return (f"compiled ahead: {record.get('cases_done', 0)} of "
            f"{_n(record.get('cases', 0), 'case')} "
            f"({_n(record.get('kernels_compiled', 0), 'kernel')}, "
            f"{record.get('kernels_built', 0)} built"
            + (f", {_n(failed, 'case')} failed" if failed else "")
            + f") by {_n(record.get('workers', 0), 'worker')}, "
            f"{record.get('waited_s', 0.0):.1f} s after the ceilings"
            + _ended(record))


def _ended(record: dict[str, Any]) -> str:
    """Why the wait ended, where it was not that every worker was done."""
    why = record.get("wait_ended")
    return "" if why in (None, "done") else f" (ended: {why})"
