"""Collectives as a kernel family of fleet runs: all_reduce, all_gather, reduce_scatter,
all_to_all and broadcast through torch.distributed (NCCL on GPUs, gloo on CPUs), in bf16
and fp32, over message sizes, each checked for exact values before it is timed.

Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md), so the numbers can be held
against nccl-tests on the same machine: S is the size of the whole array (all_gather:
the gathered output; reduce_scatter: the full input; all_to_all: one rank's send buffer;
all_reduce and broadcast: the buffer), rounded down to whole elements per rank;
algbw = S / t and busbw = algbw x the factor of roofline/plan/comm.py (all_reduce
2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1).  all_reduce and
broadcast run in place, the others out of place.  One rank runs them too (NCCL and gloo
take a world of one): each op is then checked and its algbw measured (a local copy or
nothing at all), but no busbw is claimed (None, "n/a" in the report): nothing crosses a
link, and nccl-tests' factor is 0 there for every op but broadcast.

A sample is a batch of back-to-back calls after a barrier, timed together and divided
by the batch's length (CUDA events on a GPU, the wall clock on a CPU), as nccl-tests
times its -n iterations between barriers: ranks leave a barrier at different moments,
and the first call after it absorbs that skew while it waits for the last rank, which
one call per sample would count in full (at 4 KB, where a call takes microseconds, it
can be most of the sample).  The batch is sized from the warm-up so that a sample lasts
at least MIN_SAMPLE_MS, the same length on every rank (the slowest rank's warm-up
decides it), and is recorded in the row's `config`.  The slowest rank's time counts,
sample by sample (an all_reduce MAX of the per-rank samples: a collective is as fast as
its slowest rank; nccl-tests averages the ranks' times instead).  The rows count no
FLOPs (a reduction's adds are not what bounds it) and are held against the link.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from benches.timing.clock import summarize, time_call_ms
from contract.metrics import BUSBW_FACTOR
from contract.modes import DEFAULT_CACHE, WARM
from contract.record import Accounting, Build, CaseId, Check, Fleet, Metrics, RunRow, Timing

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Whole-array sizes in bytes, x4 apart: 4 KB (latency-bound) to 1 GB (bandwidth-bound) on
# GPUs; 4 KB to 4 MB on a CPU, where gloo moves data through the host's memory and TCP.
GPU_SIZES = tuple(2**k for k in range(12, 31, 2))
CPU_SIZES = tuple(2**k for k in range(12, 23, 2))
ITERS = {"cuda": 20, "cpu": 10}  # samples per size, after WARMUP calls
WARMUP = 2
# A sample's shortest duration: the barrier's exit skew (tens of microseconds between
# GPUs' hosts, up to a scheduling slice between CPU processes) is then a few percent of
# it at most.  MAX_BATCH bounds the calls of one sample.
MIN_SAMPLE_MS = {"cuda": 1.0, "cpu": 10.0}
MAX_BATCH = 1000
TIMER = {"nccl": "cuda events, slowest rank", "gloo": "wall clock, slowest rank"}
# Integers a dtype holds exactly: 2^(significand bits).  Sums stay exact (in any order of
# reduction) while every partial sum is at most this.
EXACT_INT = {torch.float32: 2**24, torch.bfloat16: 2**8}


def busbw(op: str, algbw_gbps: float, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth: algbw x the collective's factor for `ranks`; None for
    one rank, where no data crosses a link (a figure of 0, or broadcast's algbw, would be
    read as a link's speed)."""
    if ranks < 2:
        return None
    return algbw_gbps * BUSBW_FACTOR[op](ranks)


def fill_value(rank: int, world: int, dtype: torch.dtype) -> float:
    """What rank `rank` contributes to a reduction: rank + 1 where every partial sum
    (at most world (world + 1) / 2) is exact in `dtype` (bf16: up to 22 ranks), else
    1 or 2 by the rank's parity (bf16: up to 128 ranks), else 1 (up to 256)."""
    limit = EXACT_INT[dtype]
    if world * (world + 1) // 2 <= limit:
        return float(rank + 1)
    return float(1 + rank % 2) if 2 * world <= limit else 1.0


def collective_buffers(op: str, n: int, dtype: torch.dtype, device: str, rank: int, world: int,
             group: Any = None
             ) -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], bool]]:
    """(reset, call, check) for `op` on a whole array of n elements (n a multiple of
    world): reset writes the known inputs, call runs the collective (what is timed), check
    compares the result with the known one exactly.  Inputs are small integers whose
    results every dtype holds exactly.  `rank` and `world` are within `group` (None: the
    default group); broadcast's source is the group's first rank."""
    chunk = n // world
    mine = fill_value(rank, world, dtype)
    total = sum(fill_value(r, world, dtype) for r in range(world))

    def filler(x: torch.Tensor, v: float) -> Callable[[], Any]:
        return lambda: x.fill_(v)

    if op == "all_reduce":
        buf = torch.empty(n, dtype=dtype, device=device)
        return (filler(buf, mine), lambda: dist.all_reduce(buf, group=group),
                lambda: bool((buf == total).all()))
    if op == "reduce_scatter":
        src = torch.empty(n, dtype=dtype, device=device)
        out = torch.empty(chunk, dtype=dtype, device=device)
        return (filler(src, mine), lambda: dist.reduce_scatter_tensor(out, src, group=group),
                lambda: bool((out == total).all()))
    per_rank = torch.arange(world, device=device)
    if op == "all_gather":
        src = torch.empty(chunk, dtype=dtype, device=device)
        out = torch.empty(n, dtype=dtype, device=device)
        # Chunk r of the gathered array comes from rank r (compared chunk by chunk, so no
        # second whole array is made).
        want = (per_rank % 256 + 1).to(dtype).view(world, 1)
        return (filler(src, float(rank % 256 + 1)),
                lambda: dist.all_gather_into_tensor(out, src, group=group),
                lambda: bool((out.view(world, chunk) == want).all()))
    if op == "all_to_all":
        # Chunk j of rank r's send buffer holds r * world + j; after the exchange, chunk i
        # of rank r's receive buffer holds i * world + r (mod 256, exact in bf16).
        src = torch.empty(n, dtype=dtype, device=device)
        out = torch.empty(n, dtype=dtype, device=device)
        sent = ((rank * world + per_rank) % 256).to(dtype).view(world, 1)
        want = ((per_rank * world + rank) % 256).to(dtype).view(world, 1)
        return (lambda: src.view(world, chunk).copy_(sent.expand(world, chunk)),
                lambda: dist.all_to_all_single(out, src, group=group),
                lambda: bool((out.view(world, chunk) == want).all()))
    if op == "broadcast":
        buf = torch.empty(n, dtype=dtype, device=device)
        src_rank = 0 if group is None else dist.get_global_rank(group, 0)
        return (filler(buf, 7.0 if rank == 0 else 0.0),
                lambda: dist.broadcast(buf, src_rank, group=group),
                lambda: bool((buf == 7.0).all()))
    raise ValueError(f"unknown collective {op}")


def batch_size(call_ms: float, min_sample_ms: float, cap: int = MAX_BATCH) -> int:
    """Calls per sample so that a sample of calls of `call_ms` each lasts at least
    `min_sample_ms` (1 to `cap`)."""
    if not call_ms > 0:  # a call too short for the clock
        return cap
    return max(1, min(cap, math.ceil(min_sample_ms / call_ms)))


def _sized_batch(call: Callable[[], Any], on_gpu: bool, device: str, first: int,
                 group: Any = None) -> int:
    """Calls per sample, from timed warm-up batches (the first of `first` calls), grown
    until one lasts MIN_SAMPLE_MS: a batch that long dilutes the barrier's skew that
    the first call absorbs, so the per-call estimate is the call's own time.  Every rank
    must make the same number of calls: the slowest rank's batch time decides."""
    n, least = first, MIN_SAMPLE_MS[device]
    while True:
        dist.barrier(group=group)
        if on_gpu:
            torch.cuda.synchronize()
        took = torch.tensor([time_call_ms(_repeat(call, n), on_gpu)], dtype=torch.float64,
                            device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
        ms = float(took.item())
        if ms >= least or n >= MAX_BATCH:
            return min(n, batch_size(ms / n, least))
        n = min(MAX_BATCH, max(2 * n, batch_size(ms / n, least)))


def _repeat(call: Callable[[], Any], n: int) -> Callable[[], None]:
    def calls() -> None:
        for _ in range(n):
            call()
    return calls


def _time(call: Callable[[], Any], on_gpu: bool, iters: int, batch: int = 1,
          group: Any = None) -> list[float]:
    """Per-call ms on this rank: `iters` samples, each `batch` back-to-back calls after a
    barrier (so every rank starts the sample together), timed together and divided."""
    out = []
    calls = _repeat(call, batch)
    for _ in range(iters):
        dist.barrier(group=group)
        if on_gpu:
            torch.cuda.synchronize()
        out.append(time_call_ms(calls, on_gpu) / batch)
    return out


def elements(size_bytes: int, itemsize: int, world: int) -> int:
    """Elements of the whole array for a requested size: whole elements per rank, at
    least one each (nccl-tests rounds the same way)."""
    return max(world, size_bytes // itemsize // world * world)


def measure(op: str, dtype: str, size_bytes: int, device: str, iters: int = 10,
            warmup: int = WARMUP, group: Any = None) -> RunRow:
    """One collective at one size among the ranks of `group` (None: every rank): a row
    (on each of them; the times are the slowest rank's, sample by sample).  Its cache
    mode is the device's native one: a collective moves an array over links, never a
    flushed cache."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    backend = str(dist.get_backend(group))
    t = DTYPES[dtype]
    itemsize = torch.empty((), dtype=t).element_size()
    n = elements(size_bytes, itemsize, world)
    size = n * itemsize
    timer = TIMER.get(backend, backend)
    row = RunRow(CaseId(op, backend, dtype, f"bytes={size},ranks={world}",
                        DEFAULT_CACHE if device == "cuda" else WARM),
                 Accounting(flops=0, bytes=size, intensity=0.0, roof_class="link"),
                 timing=Timing(n_samples=0, timer=timer))
    reset, call, check = collective_buffers(op, n, t, device, rank, world, group)
    reset()
    call()
    ok = torch.tensor([1.0 if check() else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)  # correct only if on every rank
    if ok.item() != 1.0:
        return replace(row, status="failed", reason="a rank received wrong values",
                       check=Check(correct=False))
    on_gpu = device == "cuda"
    batch = _sized_batch(call, on_gpu, device, max(1, warmup), group)
    mine = torch.tensor(_time(call, on_gpu, iters, batch, group), dtype=torch.float64,
                        device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)
    timing = summarize([float(x) for x in mine.cpu()], timer)
    algbw = size / (timing.ms_median / 1e3) / 1e9
    return replace(
        row, status="ok", reason="", check=Check(correct=True, rel_err=0.0),
        timing=Timing(ms_median=timing.ms_median, ms_p20=timing.ms_p20,
                      ms_p80=timing.ms_p80, n_samples=timing.n_samples, timer=timer,
                      samples_ms=tuple(timing.samples_ms)),
        build=Build(config=f"{batch} calls per sample"), metrics=Metrics(gbps=algbw),
        fleet=Fleet(algbw_gbps=algbw, busbw_gbps=busbw(op, algbw, world)))


def stop_agreed(stop: Callable[[], int], device: str) -> int:
    """The largest stop code of every rank's `stop` (0: go on), by an all_reduce MAX:
    every rank then ends at the same row, none left waiting in a collective for a peer
    that left."""
    flag = torch.tensor([float(stop())], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def sweep(device: str, sizes: tuple[int, ...] | None = None,
          dtypes: tuple[str, ...] = ("bf16", "fp32"), ops: tuple[str, ...] = OPS,
          log: Callable[[str], None] = lambda m: None,
          stop: Callable[[], int] = lambda: 0,
          rows: list[RunRow] | None = None) -> int:
    """Every op x dtype x size, in the same order on every rank, appended to `rows`.
    Before each row the ranks agree on whether to go on: a rank whose `stop` gives a
    non-zero code (an interrupt's exit code) ends the sweep on every rank, with the rows
    measured so far.  Returns the code agreed on (0: the sweep ran to its end)."""
    sizes = sizes or (GPU_SIZES if device == "cuda" else CPU_SIZES)
    # torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor (to *_single) with
    # a FutureWarning per call; the GPU machines' torch 2.11 has only the old names.
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use .*_single",
                            category=FutureWarning)
    rows = [] if rows is None else rows
    for op in ops:
        for dtype in dtypes:
            log(f"collective {op} {dtype}: {len(sizes)} sizes")
            for size in sizes:
                code = stop_agreed(stop, device)
                if code:
                    return code
                rows.append(measure(op, dtype, size, device, iters=ITERS[device]))
                if device == "cuda":
                    torch.cuda.empty_cache()  # 1 GB buffers, several per size
    return 0
