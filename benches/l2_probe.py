"""The GPU's L2 bandwidth ceiling, measured by one long kernel: a Triton kernel that copies
a buffer held in the L2 pass after pass (thousands of passes in one launch), so that the
time is the cache's and not the launches'.

Why not back-to-back copies: a copy whose source and destination fill a quarter of the
L2 takes a few microseconds, and each kernel of a CUDA graph of them still pays its
launch, its ramp over the SMs and its tail (the last wave's SMs idle), a fraction of a
microsecond to a microsecond: a cache roof measured so is bound by the launches as much
as by the cache, and can come out barely above the DRAM copy (docs/measurement.md, the
L2 ceiling).  Here one launch runs for milliseconds and its ramp and tail are a rounding
error.

The kernel: `programs` programs, a multiple of the SM count; in pass p, program i copies
slice (i + p) mod programs of the source into the same slice of the destination, its
loads cached in the L2 only (`.cg`: an SM's L1 would otherwise serve a slice it re-reads).
Every pass moves every byte of both buffers once, each at another address than the
pass before, so no compiler may hoist or drop a pass, and a slice moves from SM to SM
pass after pass, as the data of back-to-back kernels does.  Both buffers together fill
a quarter of the L2 (the cache copy's footprint since it was measured), so they stay in
it on GPUs whose L2 is split in two halves that may each hold a copy of a line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Imported for its interpreter fixes (Triton 3.6's loop over a runtime bound under NumPy
# 2), which the probe's loops need when it runs on CPU tensors.
import kernels.triton_utils  # noqa: F401

BLOCK = 1024  # fp32 elements a program copies per step: 4 KiB
# Bytes (read + written) one call moves: ~2 ms at 8 TB/s, so a launch's microseconds of
# ramp and tail are ~0.1% of a sample, and a sample's first pass, from DRAM after the
# timer's flush (15 MiB: ~4 us), ~0.2%.
BYTES_PER_CALL = 16 << 30
PROGRAMS_PER_SM = 4


@triton.jit
def l2_copy_kernel(src, dst, n_per_prog, passes, programs, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for p in range(passes):
        base = ((pid + p) % programs) * n_per_prog
        for i in range(0, n_per_prog, BLOCK):
            x = tl.load(src + base + i + offs, cache_modifier=".cg")
            tl.store(dst + base + i + offs, x)


@dataclass(frozen=True)
class L2Copy:
    """One call of the probe: `fn` runs it; it moves `bytes_moved` (read + written) in
    `passes` passes over `buffer_bytes` of source (`src`) and as much of destination
    (`dst`)."""

    fn: Callable[[], object]
    src: torch.Tensor
    dst: torch.Tensor
    bytes_moved: int
    buffer_bytes: int
    passes: int
    programs: int

    @property
    def method(self) -> str:
        return (f"one Triton kernel copying {self.buffer_bytes / 2**20:.1f} MiB held in the "
                f"L2 {self.passes} times ({self.programs} programs, loads cached in the L2 "
                "only), read + write counted")


def l2_copy(cache_bytes: int, sms: int, device: str = "cuda",
            bytes_per_call: int = BYTES_PER_CALL) -> L2Copy:
    """The probe for a source (and a destination) of about `cache_bytes` each: as many
    fp32 BLOCKs per program as fit, over PROGRAMS_PER_SM x `sms` programs, and as many
    passes as move about `bytes_per_call`.  ValueError when the buffer holds less than a
    BLOCK per program."""
    programs = max(1, sms) * PROGRAMS_PER_SM
    n_per_prog = cache_bytes // 4 // programs // BLOCK * BLOCK
    if n_per_prog < BLOCK:
        raise ValueError(f"{cache_bytes} bytes hold less than {BLOCK} fp32 values for each "
                         f"of {programs} programs")
    n = n_per_prog * programs
    passes = max(1, bytes_per_call // (2 * 4 * n))
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)

    def call() -> None:
        l2_copy_kernel[(programs,)](src, dst, n_per_prog, passes, programs, BLOCK=BLOCK,
                                    num_warps=4)

    return L2Copy(call, src, dst, 2 * 4 * n * passes, 4 * n, passes, programs)
