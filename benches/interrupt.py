"""Signals as exceptions: Ctrl-C (SIGINT) is Python's KeyboardInterrupt; SIGTERM (a CI
job cancelled, `kill`) becomes `Terminated`, so both unwind through the same code that
keeps every finished row.  Light on imports: run_bench installs it before torch loads."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

EXIT_SIGINT = 130  # 128 + SIGINT, the shell's convention
EXIT_SIGTERM = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM received.  A BaseException, like KeyboardInterrupt, so that no
    `except Exception` (a kernel's error handling, the plotting guard) swallows it."""


class PeerStopped(Terminated):
    """A fleet rank stopped by its fleet (a peer lost, or interrupted): raised in the
    main thread by the heartbeat's watcher (benches/fleet/liveness.py), it unwinds the sweep as
    SIGTERM does, so every finished row is kept."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread."""
    try:
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave signal handling alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def exit_code(e: BaseException) -> int:
    return EXIT_SIGTERM if isinstance(e, Terminated) else EXIT_SIGINT


def signal_name(e: BaseException) -> str | None:
    """"SIGTERM" for Terminated, "SIGINT" for KeyboardInterrupt, "the fleet" for a fleet
    rank stopped by its peers (PeerStopped), else None."""
    if isinstance(e, PeerStopped):
        return "the fleet"
    if isinstance(e, Terminated):
        return "SIGTERM"
    return "SIGINT" if isinstance(e, KeyboardInterrupt) else None


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once the command's work is done and its output
    written, without interpreter finalization.

    A Ctrl-C landing while the interpreter tears down (threads joined, modules freed,
    torch and NVML unloaded) cannot be handled any more: the process died by SIGINT
    (status -2, seen with a complete run) or aborted ("Fatal Python error ...
    finalizing", -6).  With nothing left to do, signals are ignored from here on,
    output is flushed, and the process exits at once with the command's own code."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)
    for stream in (sys.stdout, sys.stderr):
        # A closed stream or a broken pipe: nothing more can be said.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
