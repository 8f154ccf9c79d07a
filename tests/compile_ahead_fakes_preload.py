"""A module a compile-ahead worker preloads in tests: importing it writes the worker's
pid to the file COMPILE_AHEAD_MARKER names, to show the import ran before any job."""

from __future__ import annotations

import os

_path = os.environ.get("COMPILE_AHEAD_MARKER")
if _path:
    with open(_path, "a") as f:
        f.write(f"{os.getpid()}\n")


def mark() -> None:
    """A preload function: called after the import, it writes "called"."""
    if _path:
        with open(_path, "a") as f:
            f.write("called\n")
