"""The sweep's wait after its ceilings for its compile-ahead workers (triton_cache.py), up
to GPUBENCH_COMPILE_WAIT_S, and why a worker compiled nothing (`worker_errors`).  What
the workers do not compile the sweep compiles serially at its rows' first calls, so
waiting for them while they work is never slower: docs/measurement.md."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from benches.sweep.time_split import TimeSplit

WAIT_ENV = "GPUBENCH_COMPILE_WAIT_S"
DEFAULT_WAIT_S = 90.0
MAX_ERRORS = 5
ERROR_CHARS = 300
# A log's head holds its preload lines, its tail the last words of a worker that died;
# between them may lie megabytes of PTX that Triton prints when ptxas fails.
LOG_EDGE_BYTES = 65536


def wait_s() -> float:
    """GPUBENCH_COMPILE_WAIT_S (default 90, 0: none); a bad value is a one-line error (the
    command's exit 2, before anything is measured)."""
    raw = os.environ.get(WAIT_ENV, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_WAIT_S
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        from contract.request import RequestError  # pandas: only to refuse

        raise RequestError(f"{WAIT_ENV}={raw!r}: give the seconds to wait after the "
                           f"ceilings for the compile-ahead workers, 0 or more (0: stop "
                           f"them when the ceilings end; default {DEFAULT_WAIT_S:g})")
    return seconds


def _log_lines(path: str) -> tuple[list[str], list[str]]:
    """A worker's log: the non-empty lines of its head and of its tail."""
    try:
        with open(path, "rb") as f:
            head = f.read(LOG_EDGE_BYTES)
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_EDGE_BYTES))
            edges = head, f.read()
    except OSError:
        return [], []
    head, tail = ([s.strip() for s in b.decode(errors="replace").splitlines() if s.strip()]
                  for b in edges)
    return head, tail


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


def after_ceilings(ahead: Any, split: TimeSplit,  # a triton_cache.CompileAhead
                   say: Callable[[str], None]) -> dict[str, Any]:
    """The wait (booked as compile time), then the workers stopped and one line said to
    `say` (rich markup), with a warning per worker error; the run's record of them."""
    from rich.markup import escape  # an error's own brackets are no markup

    seconds = wait_s()
    if seconds > 0:
        with split.phase("compile"):
            ahead.wait(seconds)
    record = ahead.record()
    from contract.rows import compiled_ahead_text  # pandas: after the wait, and no worker's

    say(f"compiled ahead: {compiled_ahead_text(record)}")
    for err in record["worker_errors"]:
        say(f"[yellow]warning[/yellow]: a compile-ahead worker: {escape(err)}")
    return record
