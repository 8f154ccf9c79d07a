"""Heartbeats through torchrun's rendezvous store, and the fleet's stop (benches/fleet/dist.py
starts one per rank): a background thread beats this rank's counter, reads the ranks it
watches, and, while the sweep is armed, raises PeerStopped in the main thread when the
fleet stops."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from benches.sweep.interrupt import PeerStopped, Terminated

# The heartbeat's period: often enough that a loss is seen within a few percent of the
# timeout, rarely enough that rank 0 reading every rank's beat stays cheap.
MAX_BEAT_S = 1.0
PREFIX = "gpubench/"
STOP_KEY = PREFIX + "stop"
# The signal the heartbeat thread raises PeerStopped with in the main thread.  SIGURG's
# default action is to ignore it, so one that arrives outside the armed window (or from
# elsewhere) does nothing; a real signal, unlike _thread.interrupt_main, also wakes a
# main thread blocked in a system call (a sleep, a store wait).
STOP_SIGNAL = signal.SIGURG


class FleetError(RuntimeError):
    """A peer that died or hung (one-line message, exit 1), or a fleet stopped by a
    rank's interrupt (exit 130 or 143: `code`)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _stop_value(raw: bytes | str) -> tuple[str, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    try:
        v = json.loads(text)
        return str(v["why"]), int(v["code"])
    except (ValueError, KeyError, TypeError):
        return text, 1


class Liveness:
    """Heartbeats through the rendezvous store, and the fleet's stop.

    A background thread beats this rank's counter every `period_s` and reads the
    counters it watches (rank 0: every rank's; the others: rank 0's) and the stop key.
    A watched rank whose counter has not moved for `timeout_s` (by this process's clock:
    hosts' clocks never meet) is lost; rank 0 then posts the stop, so every rank learns
    of it within a period.  A rank that leaves posts its last word (retire), so it is
    never taken for lost and an error is known at once.  While armed (the sweep), a
    stop raises PeerStopped in the main thread, which unwinds the sweep as an interrupt
    does: every finished row is kept."""

    def __init__(self, store: Any, rank: int, world: int, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.rank, self.world, self.timeout_s = store, rank, world, timeout_s
        self.period_s = min(MAX_BEAT_S, timeout_s / 8)
        self.clock = clock
        self.problem: str | None = None  # why the fleet stops (first seen)
        self.problem_code = 1  # its exit code: 1 (a rank lost), 130/143 (interrupted)
        self.lost: dict[int, str] = {}  # ranks lost or failed, with why
        self.retired: dict[int, str] = {}  # ranks that left, with their last word
        self._seen: dict[int, tuple[int, float]] = {}
        self._armed = False
        self._delivered = False
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._old_handler: Any = None

    def watched(self) -> list[int]:
        return [r for r in range(self.world) if r != self.rank] if self.rank == 0 else [0]

    def store_call(self, doing: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except RuntimeError as e:  # the store's host is gone, or it timed out
            raise FleetError(f"{doing}: the rendezvous store did not answer "
                             f"({first_line(e)})") from None

    def beat_key(self, r: int) -> str:
        return f"{PREFIX}beat/{r}"

    def poll(self) -> str | None:
        """One round: beat, read the watched ranks and the stop key.  Returns the
        problem, if any (also kept in self.problem, the first one found)."""
        try:
            self.store.add(self.beat_key(self.rank), 1)
            now = self.clock()
            for r in self.watched():
                if r in self.lost or r in self.retired:
                    continue
                if self.store.check([f"{PREFIX}retired/{r}"]):
                    word = self.store.get(f"{PREFIX}retired/{r}").decode()
                    self.retired[r] = word
                    if word != "done":
                        self._lose(r, word)
                    continue
                count = int(self.store.add(self.beat_key(r), 0))
                last = self._seen.get(r)
                if last is None or count != last[0]:
                    self._seen[r] = (count, now)
                elif now - last[1] >= self.timeout_s:
                    self._lose(r, f"rank {r} sent no heartbeat for {now - last[1]:.0f} s "
                                  "(died or hung)")
            if self.problem is None and self.store.check([STOP_KEY]):
                self._found(*_stop_value(self.store.get(STOP_KEY)))
        except RuntimeError as e:
            self._found(f"the rendezvous store did not answer ({first_line(e)})")
        return self.problem

    def _lose(self, r: int, why: str) -> None:
        self.lost[r] = why
        if self.rank == 0:
            self.post_stop(why)  # so that every rank learns of it
        self._found(why)

    def _found(self, why: str, code: int = 1) -> None:
        with self._lock:  # the watcher's thread and the main thread both get here
            if self.problem is None:
                self.problem, self.problem_code = why, code
            if not self._armed or self._delivered:
                return
            self._delivered = True
        main = threading.main_thread().ident
        if main is not None and main != threading.get_ident():
            signal.pthread_kill(main, STOP_SIGNAL)

    def post_stop(self, why: str, code: int = 1) -> None:
        """Ask every rank to stop, for `why` (exit code `code`); the first reason posted
        by any rank stands, and becomes this rank's problem too."""
        value = json.dumps({"why": why, "code": code})
        try:
            stands = self.store.compare_set(STOP_KEY, "", value)
        except RuntimeError:
            stands = value
        self._found(*_stop_value(stands or value))

    def retire(self, word: str = "done") -> None:
        """This rank leaves: "done", or what went wrong (the others learn it at once)."""
        # The store gone: the others see the heartbeat stop instead.
        with contextlib.suppress(RuntimeError):
            self.store.set(f"{PREFIX}retired/{self.rank}", word)

    def silent_s(self, r: int) -> float | None:
        """Seconds since rank r's beat last moved, as this rank's watcher saw it (None:
        not watched)."""
        last = self._seen.get(r)
        return None if last is None else self.clock() - last[1]

    # ---- the thread, and the main thread's interruption while armed ----------------

    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(STOP_SIGNAL, self._on_signal)
        self._thread = threading.Thread(target=self._run, name="gpubench-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(self.period_s):
            try:
                self.poll()
            except Exception as e:  # a beat that stopped silently would read as a loss
                self._found(f"rank {self.rank}'s heartbeat failed: {type(e).__name__}: {e}")

    def freeze(self) -> None:
        """Stop beating, as a frozen process would (the test-only hang hook)."""
        self._halt.set()

    def close(self) -> None:
        self._halt.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.period_s + 5)
        self._armed = False
        if self._old_handler is not None:
            signal.signal(STOP_SIGNAL, self._old_handler)
            self._old_handler = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._armed and self.problem is not None:
            self._armed = False  # once: the unwinding that follows is not interrupted
            raise PeerStopped(self.problem)

    @contextmanager
    def armed(self) -> Iterator[None]:
        """Within the block, a stop (a lost peer, another rank's interrupt) raises
        PeerStopped in the main thread, at once or as soon as the call it is blocked in
        returns.  This rank's own SIGINT or SIGTERM disarms it first: the sweep is then
        unwinding already, and a second interruption would cut its saving short."""
        own: dict[int, Any] = {}

        def disarm_then(signum: int, frame: Any) -> None:
            self._armed = False
            old = own[signum]
            if callable(old):
                old(signum, frame)
            elif old != signal.SIG_IGN:  # the default action, as an exception
                raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt

        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                own[s] = signal.signal(s, disarm_then)
        self._armed, self._delivered = True, False
        try:
            if self.problem is not None:
                self._armed = False
                raise PeerStopped(self.problem)
            yield
        finally:
            self._armed = False
            for s, old in own.items():
                signal.signal(s, old)
