"""Signals as exceptions: Ctrl-C (SIGINT) is Python's KeyboardInterrupt; SIGTERM (a CI
job cancelled, `kill`) becomes `Terminated`, so both unwind through the same code that
keeps every finished row.  Light on imports: run_bench installs it before torch loads."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
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


class _Stopping:
    """The process-wide state of the handlers that `signals_raise` installs: whether a
    first signal has been raised (the run is unwinding, keeping its rows), and the pipe
    in which Python's C-level handler notes each signal as it arrives."""

    raised: BaseException | None = None
    noted = False
    wake_r: int | None = None


def _first_arrived(signum: int) -> int:
    """The signal that arrived first among those pending.  Python runs the handlers of
    signals pending together in signal-number order (SIGINT, 2, before SIGTERM, 15),
    whatever their order of arrival; its C handler writes each signal's number to the
    wakeup fd as it arrives, so the pipe tells the true order."""
    if _Stopping.wake_r is None:
        return signum
    try:
        seen = os.read(_Stopping.wake_r, 512)
    except (BlockingIOError, OSError):
        return signum
    for b in seen:
        if b in (signal.SIGINT, signal.SIGTERM):
            return b
    return signum


def _on_signal(signum: int, frame: object) -> None:
    """SIGINT raises KeyboardInterrupt and SIGTERM Terminated, once.  A signal that
    follows (GNU `timeout` signals the process, then its whole group; a user presses
    Ctrl-C again) lands while the first one unwinds the run and writes its results:
    raised there, it would cut that writing short, so it is noted and dropped."""
    first = _first_arrived(signum)
    if _Stopping.raised is not None:
        if not _Stopping.noted:
            _Stopping.noted = True
            with contextlib.suppress(OSError, ValueError):
                os.write(2, b"stopping already: the results are being written\n")
        return
    _Stopping.raised = Terminated() if first == signal.SIGTERM else KeyboardInterrupt()
    raise _Stopping.raised


@contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises (KeyboardInterrupt,
    Terminated) in the main thread and later ones are dropped; outside it, the handlers
    that were there before."""
    _Stopping.raised, _Stopping.noted = None, False
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers: leave signal handling alone
        return
    r, w = os.pipe()
    for fd in (r, w):
        os.set_blocking(fd, False)
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    _Stopping.wake_r = r
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_fd)
        _Stopping.wake_r = None
        os.close(r)
        os.close(w)


def python_handlers_back() -> None:
    """Put Python's own SIGINT and SIGTERM handlers back at the C level.

    A Triton compile in this process (a JIT launch, an autotuning candidate,
    `triton.compile`) runs LLVM, which installs C handlers of its own for SIGINT and
    SIGTERM over Python's and keeps them until one fires; Python still believes its
    handler is there.  A signal then reaches LLVM's handler, and a second one in quick
    succession (GNU `timeout` signals the process, then its group) can end the process
    at once: no row written, no word said.  Setting each handler again to what Python
    holds reinstalls Python's C trampoline (signal.signal always calls sigaction)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers; the next call there will
    for s in (signal.SIGINT, signal.SIGTERM):
        h = signal.getsignal(s)
        if h is not None:  # None: a handler not set from Python, left as it is
            signal.signal(s, h)


def _after_compile(*args: object, **kwargs: object) -> None:
    python_handlers_back()


def restore_handlers_after_compiles() -> None:
    """Have every Triton JIT compile in this process (launches and autotuning alike) put
    Python's handlers back as soon as it is done, through Triton's post-compile hook (a
    hook already set is kept and called first).  Without Triton, or with a Triton that
    has no such hook, nothing is done: the runner's per-row call still applies."""
    try:
        from triton import knobs
    except ImportError:
        return
    rt = getattr(knobs, "runtime", None)
    if rt is None or not hasattr(rt, "jit_post_compile_hook"):
        return
    prior = rt.jit_post_compile_hook
    if prior is _after_compile or getattr(prior, "restores_handlers", False):
        return

    def hook(*args: object, **kwargs: object) -> object:
        out = prior(*args, **kwargs) if prior is not None else None
        python_handlers_back()
        return out

    hook.restores_handlers = True  # type: ignore[attr-defined]
    rt.jit_post_compile_hook = hook if prior is not None else _after_compile


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
