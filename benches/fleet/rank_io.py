"""What a fleet rank says and hears: rank 0 speaks on the terminal, every other rank's
console goes to console.log in its own run folder (one line on stderr when it fails);
after the sweep, SIGINT and SIGTERM are noted instead of raised, so that gathering the
rows and writing the fleet folder run to their end (within torchrun's grace before it
kills its workers) and every rank stops at the same point of the collectives."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

CONSOLE_LOG = "console.log"


class RankOutput:
    """Rank 0's output stays where it is.  Every other rank's file descriptors 1 and 2
    (Python's prints, rich's console, the C++ libraries' warnings alike) go to a capture
    until its run folder exists (`settle`), then to console.log there, the capture
    first.  `say` writes one line to the terminal's stderr whatever the rank (and to
    the log too)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.log: Path | None = None
        self._saved: tuple[int, int] | None = None
        self._capture: IO[bytes] | None = None
        self._file: IO[bytes] | None = None
        if rank == 0:
            return
        _flush()
        self._saved = (os.dup(1), os.dup(2))
        self._capture = tempfile.TemporaryFile()  # noqa: SIM115 (open until settle())
        self._point(self._capture.fileno())

    @staticmethod
    def _point(fd: int) -> None:
        _flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)

    def settle(self, path: Path) -> None:
        """From now on into `path` (with what was captured before)."""
        if self._capture is None or self.log is not None:
            return
        _flush()
        self._file = open(path, "ab")  # noqa: SIM115 (open until close())
        self._capture.seek(0)
        shutil.copyfileobj(self._capture, self._file)
        self._file.flush()
        self._point(self._file.fileno())
        self._capture.close()
        self._capture = None
        self.log = path

    def say(self, line: str) -> None:
        """One line on the terminal's stderr (and in this rank's log)."""
        say_line(line)  # the terminal on rank 0, the log on the others
        if self._saved is not None:
            with contextlib.suppress(OSError):
                os.write(self._saved[1], (line + "\n").encode())

    def close(self) -> None:
        if self._saved is None:
            return
        _flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = None
        for f in (self._capture, self._file):
            if f is not None:
                f.close()
        self._capture = self._file = None


def say_line(line: str) -> None:
    """`line` and its newline on stderr in one write.  The ranks of a fleet share the
    terminal's stderr, and print() writes the text and the newline apart (two write
    calls when Python's stderr is unbuffered: PYTHONUNBUFFERED, -u), so another rank's
    line could land between them; a pipe keeps a write of up to PIPE_BUF (4096) bytes
    whole."""
    _flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


class Noted:
    """The first SIGINT or SIGTERM received within deferred_signals(), by name."""

    def __init__(self) -> None:
        self.name: str | None = None

    def __call__(self) -> str | None:
        return self.name


@contextmanager
def deferred_signals() -> Iterator[Noted]:
    """Within the block SIGINT and SIGTERM raise nothing: the first is noted (the
    caller polls it and stops at its next step)."""
    noted = Noted()

    def note(signum: int, frame: Any) -> None:
        if noted.name is None:
            noted.name = signal.Signals(signum).name

    try:
        old = {s: signal.signal(s, note) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signal handling alone
        yield noted
        return
    try:
        yield noted
    finally:
        for s, h in old.items():
            signal.signal(s, h)
