"""Compile functions a compile-ahead worker runs in tests/test_compile_ahead_wait.py
(benches/sweep/triton_cache.py's workers import them by name): standard library only, so a
worker starts in a blink."""

from __future__ import annotations

import sys
import time


def slept(kernel: str, dtype: str, shape: dict[str, int], sms: int,
          capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Builds one kernel in shape["ms"] milliseconds: Triton's compilation listener (the
    worker's, benches/sweep/phases.compiles_booked) hears of a build, as of a cold cache."""
    time.sleep(shape["ms"] / 1000)
    from triton import knobs

    if knobs.compilation.listener is not None:
        knobs.compilation.listener(src=None, metadata=None, metadata_group=None,
                                   times=None, cache_hit=False)
    return 1


def loaded(kernel: str, dtype: str, shape: dict[str, int], sms: int,
           capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Finds one kernel in Triton's cache after shape["ms"] milliseconds (no build)."""
    time.sleep(shape["ms"] / 1000)
    return 1


def boom(kernel: str, dtype: str, shape: dict[str, int], sms: int,
         capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Fails after shape["ms"] milliseconds, as a compile may."""
    time.sleep(shape["ms"] / 1000)
    raise RuntimeError("ptxas failed")


def broken_preload() -> None:
    """A preload that fails, as a worker's import of torch or Triton may."""
    raise ImportError("libcuda.so.1: cannot open shared object file")


def dies() -> None:
    """A preload that ends the worker's process, as a crash in an import would."""
    print("Fatal Python error: the fake's import aborted", file=sys.stderr, flush=True)
    raise SystemExit(3)
