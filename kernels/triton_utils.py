"""Small Triton helpers shared by the kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.spec import interpreter_enabled

# Explicit mantissa bits of the formats whose fp32 -> narrow cast the Triton interpreter
# gets wrong (seen with triton 3.9: bf16 truncates; fp8 loses the exponent carry when
# rounding up across a power of two, e.g. -124.98 -> -64 in e4m3).  0 = cast is fine.
_INTERP_ROUND_BITS = {torch.bfloat16: 7, torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}


def store_round_bits(out: torch.Tensor) -> int:
    """MBITS for `round_for_store`: nonzero only under the interpreter, for the formats
    it casts wrongly, so compiled GPU kernels never carry the extra instructions."""
    return _INTERP_ROUND_BITS.get(out.dtype, 0) if interpreter_enabled() else 0


@triton.jit
def round_for_store(x, MBITS: tl.constexpr):
    """Round fp32 `x` to nearest-even at MBITS mantissa bits (the hardware cast's
    rounding), so that the following narrowing cast is exact.  Integer add on the bit
    pattern: a carry out of the mantissa correctly bumps the exponent."""
    if MBITS > 0:
        SHIFT: tl.constexpr = 23 - MBITS
        bits = x.to(tl.uint32, bitcast=True)
        lsb = (bits >> SHIFT) & 1
        bits = ((bits + ((1 << (SHIFT - 1)) - 1) + lsb) >> SHIFT) << SHIFT
        x = bits.to(tl.float32, bitcast=True)
    return x
