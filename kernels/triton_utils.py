"""Small Triton helpers shared by the kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.spec import TritonLaunch, interpreter_enabled

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


# How this process's kernels were decorated: jit returns an InterpretedFunction when
# TRITON_INTERPRET=1 was set at import (kernels.spec.interpreter_enabled reads this).
KERNELS_INTERPRETED: bool = type(round_for_store).__name__ == "InterpretedFunction"


# One autotuner per (kernel, tuner name), created on first use: its cache of tuned
# configs lives as long as the process.
_TUNERS: dict[tuple[str, str], object] = {}


def run_launch(launch: TritonLaunch) -> None:
    """Launch a declared kernel launch: autotuned over its configs on a GPU, with its
    small interpreter config (or first config) on the CPU interpreter."""
    on_gpu = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in launch.args)
    if not on_gpu or len(launch.configs) == 1:
        cfg = (launch.interp_config or launch.configs[0]) if not on_gpu else launch.configs[0]
        kwargs = cfg.all_kwargs() if on_gpu else dict(cfg.kwargs)
        launch.fn[launch.grid(dict(cfg.kwargs))](*launch.args, **launch.constexprs, **kwargs)
        return
    key = (launch.name, launch.tuner)
    tuner = _TUNERS.get(key)
    if tuner is None:
        tuner = triton.autotune(configs=list(launch.configs), key=list(launch.tune_key))(
            launch.fn)
        _TUNERS[key] = tuner
    tuner[launch.grid](*launch.args, **launch.constexprs)
