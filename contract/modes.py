"""How a row was timed, as its stored cells say: its cache mode (cold or warm) and what
its timer's name tells a reader (a CUDA-graph replay launches nothing from the host
between calls).  A module of its own below contract/schema.py, which re-exports the
cache-mode names, so that contract/physics.py (which schema.load_doc applies) can read a
row's mode without an import circle.  No pandas: rows here are dicts or pandas rows."""

from __future__ import annotations

from typing import Any

CACHE = "cache"
CACHE_MODES: tuple[str, ...] = ("cold", "warm")
DEFAULT_CACHE = "cold"
WARM = "warm"

# The timer names a row stores (column `timer`), as benches/timing/plan.py writes them;
# roofline/ and contract/ may not import benches/, so the names a reader judges by are
# repeated here and tests/test_physics.py holds them equal.
# CUDA-graph replays (TIMER_GRAPH): the calls of a sample are one graph launch, so no
# host launch sits between them and events' time cannot hold a host launch gap.
GRAPH_TIMER = "cudagraph"

# Timers of CPU rows written before the `cache` column: every call on the same buffers.
_CPU_SAME_BUFFER_TIMERS = ("timeit blocks", "torch.utils.benchmark")


def launches_from_host(timer: Any) -> bool:
    """Whether a row's timer launched each call from the host (CUDA events around
    launches, do_bench, a CPU's blocks), so that the device may have waited for it; a
    CUDA-graph replay (GRAPH_TIMER) did not.  A row without a timer: not known, True."""
    return str(timer).strip() != GRAPH_TIMER


def native_cache(row: Any) -> str:
    """The cache mode a row's device times in by default, and the mode of a row written
    before the `cache` column: warm on a CPU (its timer has always run blocks of calls on
    the same buffers; device "cpu", or a CPU timer), cold on a GPU (L2 flushed or
    rotated past)."""
    return native_cache_of(row.get("device"), row.get("timer"))


def native_cache_of(device: Any, timer: Any) -> str:
    """native_cache of a row's device model key and timer (a typed row's parts)."""
    if str(device) == "cpu" or timer in _CPU_SAME_BUFFER_TIMERS:
        return WARM
    return DEFAULT_CACHE


def row_cache(row: Any) -> str:
    """A row's cache mode (a dict or pandas row): its `cache` cell, else native_cache
    (so that rows and baselines written before the column keep matching today's rows
    timed the same way)."""
    value = row.get(CACHE)
    if value is None or (isinstance(value, float) and value != value) \
            or not str(value).strip():
        return native_cache(row)
    return str(value).strip().lower()
