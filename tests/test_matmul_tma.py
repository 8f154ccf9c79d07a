"""matmul's persistent TMA configs (kernels/matmul.py): where they are offered, their
grid, and their results (the CPU interpreter runs tensor descriptors too)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

from kernels import DTYPES, REGISTRY
from kernels import matmul as mm
from kernels.spec import Target
from kernels.triton_utils import run_launch


def _tma(cfgs) -> list:
    return [c for c in cfgs if c.kwargs.get("TMA")]


def test_tma_configs_only_on_hopper_and_later_and_only_where_the_layout_allows():
    spec = REGISTRY["matmul"]
    for dtype, family in [("bf16", "16bit"), ("fp16", "16bit"), ("fp8", "fp8")]:
        assert _tma(mm.configs_for(dtype, (9, 0), tma=True)) == mm.TMA_CONFIGS[family]
        assert _tma(mm.configs_for(dtype, (10, 0), tma=True)) == mm.TMA_CONFIGS[family]
        assert not _tma(mm.configs_for(dtype, (8, 9), tma=True))
        assert not _tma(mm.configs_for(dtype, (9, 0), tma=False))
        # The cp.async configs stay, in order, ahead of the TMA ones.
        assert mm.configs_for(dtype, (9, 0), tma=True)[:len(mm.CONFIGS[family])] == \
            mm.CONFIGS[family]
    for dtype in ("fp32", "tf32"):
        assert not _tma(mm.configs_for(dtype, (9, 0), tma=True))
    aligned = spec.make_inputs({"M": 64, "N": 64, "K": 64}, "bf16", 0, "meta")
    odd_k = spec.make_inputs({"M": 64, "N": 64, "K": 7}, "bf16", 0, "meta")  # 14-byte rows
    odd_n = spec.make_inputs({"M": 64, "N": 12, "K": 64}, "bf16", 0, "meta")
    for inputs, ok in [(aligned, True), (odd_k, False), (odd_n, False)]:
        out = spec.alloc_out(inputs, "bf16")
        assert mm.tma_ok(inputs["A"], inputs["B"], out, b_kmajor=False) == ok
    fp8 = spec.make_inputs({"M": 64, "N": 48, "K": 80}, "fp8", 0, "meta")
    assert mm.tma_ok(fp8["A"], fp8["B"], spec.alloc_out(fp8, "fp8"), b_kmajor=True)
    # fp8's B is K-major: read as row-major it has no unit last stride.
    assert not mm.tma_ok(fp8["A"], fp8["B"], spec.alloc_out(fp8, "fp8"), b_kmajor=False)


def test_tma_grid_is_one_program_per_sm_at_most():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 4096, "N": 4096, "K": 4096}, "bf16", 0, "meta")
    (launch,) = mm.triton_launches(inputs, spec.alloc_out(inputs, "bf16"), 132,
                                   target=Target("cuda", (9, 0)))
    for cfg in launch.configs:
        tiles = (4096 // cfg.kwargs["BLOCK_M"]) * (4096 // cfg.kwargs["BLOCK_N"])
        want = min(tiles, 132) if cfg.kwargs.get("TMA") else tiles
        assert launch.grid(dict(cfg.kwargs)) == (want,), cfg


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["fp16", "fp8"])
def test_persistent_tma_matmul_matches_float64(dtype):
    """A small TMA config on 3 programs: each loops over several tiles; M, N and K are
    not multiples of the tile, so loads past the edges must read zeros and stores past
    them must be dropped (the output is poisoned with NaN first)."""
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 80, "N": 48, "K": 80}, dtype, 0, "cpu")
    out = spec.alloc_out(inputs, dtype).fill_(float("nan"))
    (launch,) = mm.triton_launches(inputs, out, 3)
    cfg = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2,
                         "TMA": True}, num_warps=4, num_stages=2)
    assert launch.grid(dict(cfg.kwargs)) == (3,)
    run_launch(dataclasses.replace(launch, configs=(cfg,), interp_config=cfg))
    assert spec.check(out, inputs, dtype) <= DTYPES[dtype].tol
    assert torch.isfinite(out.float()).all()
