"""Collectives as a kernel family of fleet runs: all_reduce, all_gather, reduce_scatter,
all_to_all and broadcast through torch.distributed (NCCL on GPUs, gloo on CPUs), in bf16
and fp32, over message sizes, each checked for exact values before it is timed.

Sizes and bandwidths follow nccl-tests (docs/PERFORMANCE.md), so the numbers can be held
against nccl-tests on the same machine: S is the size of the whole array (all_gather:
the gathered output; reduce_scatter: the full input; all_reduce, all_to_all, broadcast:
the buffer), algbw = S / t and busbw = algbw x the factor of roofline/plan/comm.py
(all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1).
Every rank times each call after a barrier (CUDA events on a GPU, the wall clock on a
CPU) and the slowest rank's time counts, sample by sample.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from benches.timing import time_call_ms
from roofline.plan.comm import BUSBW_FACTOR
from roofline.schema import ALL_COLUMNS, SAMPLES

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Whole-array sizes in bytes: a few KB (latency-bound) to 1 GB (bandwidth-bound) on GPUs,
# up to 4 MB on a CPU, where gloo moves data through the host's memory.
GPU_SIZES = tuple(2**k for k in range(13, 31, 3))  # 8 KB .. 1 GB
CPU_SIZES = (2**12, 2**16, 2**20, 2**22)
TIMER = {"nccl": "cuda events, slowest rank", "gloo": "wall clock, slowest rank"}


def busbw(op: str, algbw_gbps: float, ranks: int) -> float:
    return algbw_gbps * BUSBW_FACTOR[op](ranks)


def _buffers(op: str, n: int, dtype: torch.dtype, device: str, rank: int, world: int
             ) -> tuple[Callable[[], Any], Callable[[], bool]]:
    """(call, check) for `op` on a whole array of n elements, filled with values whose
    result is exact in any of the dtypes (small integers)."""
    chunk = n // world
    if op == "all_reduce":
        buf = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
        want = world * (world + 1) / 2

        def call() -> Any:
            buf.fill_(float(rank + 1))
            return dist.all_reduce(buf)
        return call, lambda: bool((buf == want).all())
    if op == "all_gather":
        src = torch.full((chunk,), float(rank + 1), dtype=dtype, device=device)
        out = torch.empty(chunk * world, dtype=dtype, device=device)
        want = torch.arange(1, world + 1, dtype=dtype, device=device).repeat_interleave(chunk)
        return (lambda: dist.all_gather_into_tensor(out, src),
                lambda: bool((out == want).all()))
    if op == "reduce_scatter":
        src = torch.full((chunk * world,), float(rank + 1), dtype=dtype, device=device)
        out = torch.empty(chunk, dtype=dtype, device=device)
        want = world * (world + 1) / 2
        return (lambda: dist.reduce_scatter_tensor(out, src),
                lambda: bool((out == want).all()))
    if op == "all_to_all":
        # Chunk j of rank r holds r * world + j; after the exchange chunk i of rank r
        # holds i * world + r.
        src = (rank * world + torch.arange(world, device=device)).repeat_interleave(
            chunk).to(dtype)
        out = torch.empty_like(src)
        want = (torch.arange(world, device=device) * world + rank).repeat_interleave(
            chunk).to(dtype)
        return (lambda: dist.all_to_all_single(out, src), lambda: bool((out == want).all()))
    if op == "broadcast":
        buf = torch.empty(n, dtype=dtype, device=device)

        def call() -> Any:
            buf.fill_(7.0 if rank == 0 else 0.0)
            return dist.broadcast(buf, 0)
        return call, lambda: bool((buf == 7.0).all())
    raise ValueError(f"unknown collective {op}")


def _time(call: Callable[[], Any], on_gpu: bool, iters: int) -> list[float]:
    """Per-call ms on this rank, each call after a barrier."""
    out = []
    for _ in range(iters):
        dist.barrier()
        if on_gpu:
            torch.cuda.synchronize()
        out.append(time_call_ms(call, on_gpu))
    return out


def measure(op: str, dtype: str, size_bytes: int, device: str, iters: int = 10,
            warmup: int = 2) -> dict[str, Any]:
    """One collective at one size: a row (on every rank; the times are the slowest
    rank's, sample by sample)."""
    import statistics

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    t = DTYPES[dtype]
    itemsize = torch.empty((), dtype=t).element_size()
    n = max(world, size_bytes // itemsize // world * world)  # whole chunks per rank
    size = n * itemsize
    row: dict[str, Any] = dict.fromkeys(ALL_COLUMNS)
    row.update(kernel=op, provider=backend, dtype=dtype, shape=f"bytes={size},ranks={world}",
               flops=0, bytes=size, n_samples=0, timer=TIMER.get(backend, backend),
               roof_class="link")
    call, check = _buffers(op, n, t, device, rank, world)
    call()
    ok = torch.tensor([1.0 if check() else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)  # correct only if correct on every rank
    row["correct"] = bool(ok.item() == 1.0)
    if not row["correct"]:
        row.update(status="failed", reason="a rank received wrong values")
        return row
    for _ in range(warmup):
        call()
    mine = torch.tensor(_time(call, device == "cuda", iters), dtype=torch.float64,
                        device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    samples = [float(x) for x in mine.cpu()]
    s = sorted(samples)
    med = statistics.median(s)
    algbw = size / (med / 1e3) / 1e9
    row.update(status="ok", reason="", rel_err=0.0, ms_median=med,
               ms_p20=s[int(0.2 * (len(s) - 1))], ms_p80=s[int(0.8 * (len(s) - 1))],
               n_samples=len(s), gbps=algbw, algbw_gbps=algbw,
               busbw_gbps=busbw(op, algbw, world))
    row[SAMPLES] = samples
    return row


def sweep(device: str, sizes: tuple[int, ...] | None = None,
          dtypes: tuple[str, ...] = ("bf16", "fp32"), ops: tuple[str, ...] = OPS,
          log: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """Every op x dtype x size, in the same order on every rank."""
    sizes = sizes or (GPU_SIZES if device == "cuda" else CPU_SIZES)
    # torch 2.13 renames all_gather_into_tensor / reduce_scatter_tensor (to *_single) with
    # a FutureWarning per call; the GPU machines' torch 2.11 has only the old names.
    warnings.filterwarnings("ignore", message=".*is deprecated. Please use .*_single",
                            category=FutureWarning)
    rows = []
    for op in ops:
        for dtype in dtypes:
            log(f"collective {op} {dtype}: {len(sizes)} sizes")
            for size in sizes:
                rows.append(measure(op, dtype, size, device,
                                    iters=20 if device == "cuda" else 10))
    return rows
