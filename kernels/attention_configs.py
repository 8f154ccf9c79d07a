"""Autotune candidates of the Triton attention kernels (kernels/attention_triton.py),
per kernel ("fwd", "dkdv", "dq", "delta") and per architecture."""

from __future__ import annotations

import triton

from kernels.spec import for_arch


def _cfg(bm: int, bn: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps)


# Candidates for sm_90 (`python run_bench.py --inspect` compiles each for every default
# GPU shape; the README's attention section has what it reports).  Forward: BLOCK_M = 128
# query rows per program as two warpgroups (8 warps, 64 rows each: wgmma's M), K/V tiles
# of 64 or 128 keys, 2-3 stages of K/V copies in shared memory.  dK/dV: a 128- or 64-key
# tile whose two fp32 accumulators (dK and dV, keys x D each) are spread over 8 warps, 32
# queries a step (64 spill 12 bytes at D = 128, causal); k and v stay in shared memory.
# dQ: 128 queries, 64 keys a step.  The smaller tiles cover short sequences, where big
# ones leave SMs idle.  Few candidates: each is compiled per head dim and causal flag
# (constexprs), by the autotuner and by --inspect alike.
CONFIGS: dict[str, list[triton.Config]] = {
    "fwd": [_cfg(128, 128, 2, 8), _cfg(128, 64, 3, 8), _cfg(64, 64, 3, 4)],
    "dkdv": [_cfg(32, 128, 2, 8), _cfg(32, 64, 2, 8)],
    "dq": [_cfg(128, 64, 2, 8), _cfg(64, 64, 2, 4)],
    # delta = rowsum(dO o): no loop, no dot; one fixed launch of DELTA_BLOCK_M rows.
    "delta": [triton.Config({}, num_warps=4)],
}
DELTA_BLOCK_M = 64
# Blackwell (sm_100 class): Hopper's lists less two configs that spill there (forward
# 128x64 w8 s3 -> 2 stages; delta 4 -> 8 warps), docs/kernels.md ("Config lists").
SM100_CONFIGS: dict[str, list[triton.Config]] = {
    **CONFIGS,
    "fwd": [_cfg(128, 128, 2, 8), _cfg(128, 64, 2, 8), _cfg(64, 64, 3, 4)],
    "delta": [triton.Config({}, num_warps=8)],
}
# Per compute-capability major version; any other GPU (and meta/CPU tensors): CONFIGS.
ARCH_CONFIGS: dict[int, dict[str, list[triton.Config]]] = {10: SM100_CONFIGS}
# Under the interpreter: small tiles, so that test shapes of a few dozen rows still take
# several tiles, diagonal and bounds masks included.
INTERP_CONFIGS = {"fwd": _cfg(32, 16, 1, 4), "dkdv": _cfg(16, 32, 1, 4), "dq": _cfg(32, 16, 1, 4)}


def configs_for(part: str, capability: tuple[int, int] | None) -> list[triton.Config]:
    """The candidates of one kernel ("fwd", "dkdv", "dq", "delta") on a GPU of
    `capability` (None: CONFIGS)."""
    return for_arch(ARCH_CONFIGS, CONFIGS, capability)[part]
