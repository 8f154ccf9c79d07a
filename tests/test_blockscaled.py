"""Block-scaled matmul (mxfp8, mxfp4, nvfp4): the stored formats, their accounting, the
correctness gate, where each provider runs, the roof a row is held against, and the
planner's bytes per parameter."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benches.sweep.cases import Case, InputCache, SweepContext, base_row
from benches.sweep.runner import run_case
from contract.ceilings import Ceilings, datasheet_of
from contract.devices import DEVICES, Present, host_cpu
from contract.request import RunRequest, Selection
from kernels import REGISTRY
from kernels import blockscaled as bs
from kernels import matmul_blockscaled as mb
from kernels.spec import BLOCK_SCALED, DTYPE_NAMES, DTYPES, Target

ROOT = Path(__file__).resolve().parent.parent
MATMUL = REGISTRY["matmul"]
CPU = Target("cpu")
SM90, SM100, SM89 = Target("cuda", (9, 0)), Target("cuda", (10, 0)), Target("cuda", (8, 9))
INTERP = Target("cpu", interpret=True)


def _skip_unless_interpreter_runs(dtype: str) -> None:
    """triton 3.6's interpreter has no dot_scaled (the GPU machines' interpreter tests)."""
    reason = MATMUL.skip_reason("triton", dtype, INTERP)
    if reason:
        pytest.skip(reason)


# ---- accounting ----------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4096), (4096, 28672, 4096), (96, 40, 640)])
def test_flops_and_bytes_are_pinned(m, n, k):
    """FLOPs 2 M N K; bytes = packed elements + every scale byte + the bf16 output, written
    out per format (a 2x error anywhere, e.g. fp4 counted a byte per element or the scales
    left out of a 4 MB operand, fails)."""
    shape = {"M": m, "N": n, "K": k}
    ops = m * k + k * n  # elements of A and B
    expect = {
        "mxfp8": ops + ops // 32 + 2 * m * n,
        "mxfp4": ops // 2 + ops // 32 + 2 * m * n,
        "nvfp4": ops // 2 + ops // 16 + 4 + 4 + 2 * m * n,
    }
    for dtype, nbytes in expect.items():
        assert MATMUL.flops(shape, dtype) == 2 * m * n * k
        assert MATMUL.nbytes(shape, dtype) == nbytes, dtype


@pytest.mark.parametrize("dtype", BLOCK_SCALED)
def test_bytes_are_what_is_stored(dtype):
    """The count equals the bytes the inputs really hold (elements, scales without the
    blocked layout's padding, tensor scales) plus the output."""
    shape = {"M": 256, "N": 128, "K": 512}  # no padding: rows % 128 == 0, scale cols % 4 == 0
    inputs = MATMUL.make_inputs(shape, dtype, 0, "cpu")
    out = MATMUL.alloc_out(inputs, dtype)
    stored = sum(inputs[k].numel() * inputs[k].element_size() for k in ("A", "B", "sa", "sb"))
    stored += 8 if DTYPES[dtype].tensor_scale else 0
    assert out.dtype == torch.bfloat16
    assert MATMUL.nbytes(shape, dtype) == stored + out.numel() * out.element_size()


def test_bits_per_element_with_scales():
    bits = {d: 8 * DTYPES[d].bytes_per_element for d in BLOCK_SCALED}
    assert bits == {"mxfp8": 8.25, "mxfp4": 4.25, "nvfp4": 4.5}
    assert DTYPES["fp8"].bytes_per_element == 1


# ---- the formats -------------------------------------------------------------------------

def test_e2m1_codes_round_to_nearest_even_and_saturate():
    vals = torch.tensor(bs.E2M1_VALUES)
    assert torch.equal(bs.decode_e2m1(bs.encode_e2m1(vals)), vals.double())
    assert torch.equal(bs.decode_e2m1(bs.encode_e2m1(-vals[1:])), -vals[1:].double())
    # Midpoints go to the neighbour with mantissa bit 0 (codes 0, 2, 4, 6).
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert bs.decode_e2m1(bs.encode_e2m1(mids)).tolist() == [0, 1, 1, 2, 2, 4, 4]
    assert bs.decode_e2m1(bs.encode_e2m1(torch.tensor([7.0, -100.0]))).tolist() == [6, -6]


def test_fp4_packing_puts_the_first_element_in_the_low_nibble():
    # c10's Float4_e2m1fn_x2 (val1 : val0 in bits 7654 : 3210) and tl.dot_scaled agree.
    codes = torch.tensor([[1, 2, 0xF, 0x8]], dtype=torch.uint8)
    packed = bs.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(bs.unpack_fp4(packed), codes)


def test_blocked_scale_layout_is_cublas_s():
    """Scale (r, c) at tile (r // 128, c // 4), byte (r % 32) * 16 + (r // 32 % 4) * 4 +
    c % 4 of it (cuBLAS's 1D block-scaling layout); padding zero; inverse exact."""
    rows, cols = 300, 9
    s = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    flat = bs.to_blocked(s)
    ct = math.ceil(cols / 4)
    assert flat.numel() == bs.blocked_size(rows, cols) == 384 * 12
    for r in range(rows):
        for c in range(cols):
            off = ((r // 128) * ct + c // 4) * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + c % 4
            assert flat[off] == s[r, c], (r, c)
    assert int((flat != 0).sum()) == rows * cols  # everything else is padding
    assert torch.equal(bs.from_blocked(flat, rows, cols), s)


def test_mx_scales_follow_the_ocp_rule():
    """Shared exponent floor(log2(amax)) - emax (e4m3: 8, e2m1: 2): a block whose amax is
    exactly the element format's max times 2^e gets scale 2^e and keeps its max."""
    x = torch.full((1, 64), 0.5)
    x[0, 0], x[0, 32] = 448.0 * 2.0**3, 448.0 * 2.0**-5  # two blocks of 32
    q = bs.quantize(x, "mxfp8")
    assert bs.scale_values(q, "mxfp8")[0].tolist() == [2.0**3, 2.0**-5]
    assert bs.dequantize(q, "mxfp8")[0, 0] == 448.0 * 8
    x4 = torch.full((1, 32), 0.25)
    x4[0, 5] = 6.0 * 2.0**-2
    q4 = bs.quantize(x4, "mxfp4")
    assert bs.scale_values(q4, "mxfp4").item() == 2.0**-2
    assert bs.dequantize(q4, "mxfp4")[0, 5] == 1.5


def test_nvfp4_two_level_scales():
    # Rows 1e-2 .. 1e2 apart: inside e4m3's range of block scales (2^-9 .. 448, ~2e5),
    # so no block underflows to a zero scale.
    x = torch.randn(8, 64) * torch.logspace(-2, 2, 8).unsqueeze(1)
    q = bs.quantize(x, "nvfp4")
    t = q.tensor_scale.item()
    assert t == pytest.approx(x.abs().max().item() / (448 * 6), rel=1e-6)
    blocks = bs.scale_values(q, "nvfp4")  # e4m3 values, all inside its range
    assert blocks.max() <= 448 and (blocks > 0).all()
    err = (bs.dequantize(q, "nvfp4") - x.double()).norm() / x.double().norm()
    assert err < 0.15  # e2m1 keeps ~1.5 significant bits: quantization, not a bug


@pytest.mark.parametrize("dtype", BLOCK_SCALED)
def test_inputs_differ_per_block_and_per_seed(dtype):
    shape = {"M": 64, "N": 64, "K": 256}
    a = MATMUL.make_inputs(shape, dtype, 1, "cpu")
    b = MATMUL.make_inputs(shape, dtype, 2, "cpu")
    assert not torch.equal(a["A"].view(torch.uint8), b["A"].view(torch.uint8))
    qa, _ = bs.operands(a, dtype)
    assert bs.scale_values(qa, dtype).unique().numel() > 4
    assert (bs.dequantize(qa, dtype) != 0).float().mean() > 0.8


# ---- the correctness gate ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", BLOCK_SCALED)
def test_reference_is_the_dequantized_product_and_catches_scale_errors(dtype):
    """The reference multiplies the dequantized operands; a kernel that ignores the block
    scales, or gets one block column's scale wrong by 2x, is past the tolerance."""
    shape = {"M": 48, "N": 40, "K": 1024}
    inputs = MATMUL.make_inputs(shape, dtype, 3, "cpu")
    qa, qb = bs.operands(inputs, dtype)
    da, db = bs.dequantize(qa, dtype), bs.dequantize(qb, dtype)
    ref = MATMUL.reference(inputs, dtype)
    assert torch.allclose(ref, da @ db.t(), rtol=0, atol=0)
    # bf16 output of the exact product: inside the tolerance (one rounding, u = 2^-8).
    assert MATMUL.check((da @ db.t()).bfloat16(), inputs, dtype) <= 2.0**-8
    # A's elements without their block scales (the tensor scale kept).
    elems = qa.elements.double() if bs.element_format(dtype) == "e4m3" else \
        bs.decode_e2m1(bs.unpack_fp4(qa.elements))
    wrong = (elems * qa.tensor_scale.double() @ db.t()).bfloat16()
    assert MATMUL.check(wrong, inputs, dtype) > DTYPES[dtype].tol
    # One block column of A's scales doubled.
    g = DTYPES[dtype].block
    da2 = da.clone()
    da2[:, 5 * g:6 * g] *= 2
    assert MATMUL.check((da2 @ db.t()).bfloat16(), inputs, dtype) > DTYPES[dtype].tol


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", BLOCK_SCALED)
def test_triton_across_scale_tiles(dtype):
    """Rows past the first 128-row tile and scale columns past the first 4-column tile of
    the blocked layout, K over several BLOCK_K slices with a partial block at the end."""
    _skip_unless_interpreter_runs(dtype)
    shape = {"M": 160, "N": 136, "K": 300}
    inputs = MATMUL.make_inputs(shape, dtype, 5, "cpu")
    out = MATMUL.alloc_out(inputs, dtype).fill_(float("nan"))
    err = MATMUL.check(mb.matmul_triton(inputs, out), inputs, dtype)
    assert err <= DTYPES[dtype].tol, err


@pytest.mark.interpreter
def test_interpreter_reads_e4m3_block_scales():
    """triton 3.9's interpreter decodes every dot_scaled scale as e8m0 (e4m3's 1.0, byte
    0x38, came out 2^-71); kernels.triton_utils decodes float8e4nv scales as e4m3."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if not hasattr(interpreter, "_dot_scaled_scale_to_f32"):
        pytest.skip("this Triton's interpreter has no dot_scaled")
    one = interpreter.TensorHandle(np.array([0x38, 0x40], dtype=np.uint8), tl.float8e4nv)
    assert interpreter._dot_scaled_scale_to_f32(one, tl.bfloat16).tolist() == [1.0, 2.0]
    e8m0 = interpreter.TensorHandle(np.array([127, 130], dtype=np.uint8), tl.uint8)
    assert interpreter._dot_scaled_scale_to_f32(e8m0, tl.bfloat16).tolist() == [1.0, 8.0]
    assert mb._interpreter_runs("nvfp4") is None


# ---- where each provider runs ----------------------------------------------------------------

def test_torch_skips_where_it_has_no_block_scaled_gemm():
    for dtype in BLOCK_SCALED:
        assert "needs sm_100" in MATMUL.skip_reason("torch", dtype, SM90)
        assert MATMUL.skip_reason("torch", dtype, SM100) is None
        cpu = MATMUL.skip_reason("torch", dtype, CPU)
        # Asked of torch itself: skipped exactly when this torch refuses on the CPU.
        assert (cpu is None) == (mb._torch_runs_on_cpu(dtype) is None)
        if cpu:
            assert "no block-scaled GEMM on the CPU" in cpu


def test_torch_refusal_on_the_cpu_is_torch_s_own(monkeypatch):
    """A torch whose CPU _scaled_mm ran these formats would get its rows run, not skipped
    (faked: _scaled_mm answering)."""
    mb._torch_runs_on_cpu.cache_clear()
    monkeypatch.setattr(torch, "_scaled_mm", lambda a, b, sa, sb, **kw: torch.zeros(
        a.shape[0], b.shape[1], dtype=torch.bfloat16))
    try:
        assert MATMUL.skip_reason("torch", "mxfp8", CPU) is None
    finally:
        mb._torch_runs_on_cpu.cache_clear()


def test_triton_skips():
    for dtype in BLOCK_SCALED:
        assert MATMUL.skip_reason("triton", dtype, SM100) is None
        assert "sm_90 (emulated) and sm_100 (native)" in MATMUL.skip_reason("triton", dtype,
                                                                          SM89)
    assert MATMUL.skip_reason("triton", "mxfp4", SM90) is None


def test_nvfp4_on_sm90_needs_triton_3_9(monkeypatch):
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    assert "cannot compile NVFP4" in MATMUL.skip_reason("triton", "nvfp4", SM90)
    assert MATMUL.skip_reason("triton", "nvfp4", SM100) is None
    assert MATMUL.skip_reason("triton", "mxfp8", SM90) is None
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert MATMUL.skip_reason("triton", "nvfp4", SM90) is None


def _fake_cuda(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


@pytest.mark.parametrize("dtype", BLOCK_SCALED)
@pytest.mark.parametrize("v2", [True, False])
def test_torch_call_passes_torch_s_cuda_checks(dtype, v2, monkeypatch):
    """The torch provider's call, on fake CUDA tensors (FakeTensorMode: torch's own shape,
    dtype, layout and scale-size checks of _scaled_mm / scaled_mm, no GPU): operands, the
    blocked scales and NVFP4's tensor scales are what torch expects.  A scale tensor one
    tile short is refused, so the check can fail."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not v2:
        if not hasattr(torch.nn.functional, "scaled_mm"):
            pytest.skip("this torch has no scaled_mm: the fallback is the only path")
        monkeypatch.delattr(torch.nn.functional, "scaled_mm")
    shape = {"M": 256, "N": 384, "K": 512}
    real = MATMUL.make_inputs(shape, dtype, 0, "cpu")
    real["sb_short"] = real["sb"][:-512].clone()
    with FakeTensorMode():
        inputs = {k: _fake_cuda(v) if isinstance(v, torch.Tensor) else v
                  for k, v in real.items()}
        out = torch.empty(256, 384, dtype=torch.bfloat16, device="cuda")
        res = mb.matmul_torch(inputs, out)
        assert res.shape == (256, 384) and res.dtype == torch.bfloat16
        short = dict(inputs, sb=inputs["sb_short"])
        with pytest.raises((RuntimeError, ValueError)):
            mb.matmul_torch(short, out)


def test_only_matmul_has_them():
    for spec in REGISTRY.values():
        has = set(spec.dtypes) & set(BLOCK_SCALED)
        assert has == (set(BLOCK_SCALED) if spec.name == "matmul" else set()), spec.name
    assert set(BLOCK_SCALED) <= set(DTYPE_NAMES)  # --dtypes accepts them; "all" has them


# ---- the roof a row is held against ----------------------------------------------------------

def test_roof_classes():
    assert [MATMUL.roof_class(d) for d in BLOCK_SCALED] == ["fp8", "fp4", "fp4"]
    assert [MATMUL.roof_class(d, SM100) for d in BLOCK_SCALED] == ["fp8", "fp4", "fp4"]
    for target in (SM90, CPU):
        for d in BLOCK_SCALED:
            assert MATMUL.roof_class(d, target) == "bf16"
            assert MATMUL.roof_note(d, target).startswith(
                "emulated: held against the bf16 roof")
        assert MATMUL.roof_note("fp8", target) == ""
    assert MATMUL.roof_class("fp8", SM90) == "fp8"
    assert MATMUL.roof_note("nvfp4", SM100) == ""


def _cfg(target: Target, model_key: str, present: Present, ceilings: Ceilings,
         ) -> SweepContext:
    sel = Selection(kernels=("matmul",), dtypes=tuple(BLOCK_SCALED), providers=("triton",),
                    sizes="explicit", seed=0, check_only=True)
    return SweepContext(RunRequest(sel), model=DEVICES[model_key], present=present,
                        target=target, ceilings=ceilings)


def test_rows_on_hopper_are_held_against_bf16_and_on_blackwell_against_fp4():
    shape = {"M": 4096, "N": 4096, "K": 4096}
    h100 = DEVICES["h100"]
    hopper = _cfg(SM90, "h100", Present("h100", h100.name, "cuda", (9, 0)),
                  Ceilings(datasheet_of(h100), None))
    row = base_row(Case(MATMUL, "triton", "nvfp4", shape), hopper)
    assert (row.value("roof_class"), row.value("peak_tflops")) == (
        "bf16", h100.peaks_tflops["bf16"])
    blackwell = _cfg(SM100, "gpu", Present("b200", "B200", "cuda", (10, 0)),
                     Ceilings({"tflops": {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
                               "hbm_gbps": 8000.0}, None))
    for dtype, rc, peak in (("nvfp4", "fp4", 9000.0), ("mxfp8", "fp8", 4500.0)):
        row = base_row(Case(MATMUL, "torch", dtype, shape), blackwell)
        assert (row.value("roof_class"), row.value("peak_tflops")) == (rc, peak)


@pytest.mark.interpreter
def test_cpu_check_only_row_is_flagged():
    _skip_unless_interpreter_runs("mxfp4")
    cfg = _cfg(Target("cpu", interpret=True), "cpu", host_cpu(),
               Ceilings(None, {"tflops": {"fp32": 0.1, "bf16": 0.2, "fp8": 0.3},
                               "hbm_gbps": 10.0, "l2_gbps": 100.0}))
    row = run_case(Case(MATMUL, "triton", "mxfp4", {"M": 64, "N": 64, "K": 128}), cfg,
                   InputCache())
    assert row.status == "ok", row.reason
    assert (row.value("roof_class"), row.value("peak_tflops")) == ("bf16", 0.2)
    assert "emulated: held against the bf16 roof" in row.reason


# ---- listing and the planner -------------------------------------------------------------------

def test_list_shows_the_formats():
    r = subprocess.run([sys.executable, "run_bench.py", "--list"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("mxfp8", "mxfp4", "nvfp4", "e8m0", "4.25", "4.5", "8.25"):
        assert name in r.stdout, name


def test_planner_weight_formats():
    from roofline.plan.arithmetic import WEIGHT_FORMATS, policy_items
    from roofline.plan.comm import policy_bytes

    assert WEIGHT_FORMATS["nvfp4"] == 0.5625 and WEIGHT_FORMATS["mxfp4"] == 0.53125
    assert WEIGHT_FORMATS["mxfp8"] == 1.03125 and WEIGHT_FORMATS["fp8"] == 1
    # bf16-master: the bf16 weights become nvfp4, the fp32 master stays: 16 - 2 + 0.5625.
    items = policy_items("bf16-master", "nvfp4")
    assert sum(items.values()) == 14.5625
    assert policy_bytes(items) == (2.0, 0.5625)  # FSDP gathers the nvfp4 weights
    # A policy whose weights are the only copy keeps them as the master.
    items = policy_items("bf16-mixed", "mxfp4")
    assert items["master weights bf16"] == 2 and sum(items.values()) == 12.53125
    assert policy_items("bf16-master") == policy_items("bf16-master", None)


def _plan(*flags: str) -> dict:
    from roofline.plan.cli import parse_request
    from roofline.plan.planner import build_plan

    request = parse_request(["--params", "8e9", "--device", "h100", *flags])
    return build_plan(request, log=lambda *a, **k: None).to_json()


def test_planner_weight_format_flag():
    from roofline.plan.model import PlanError

    base = _plan()
    fp4 = _plan("--weight-format", "nvfp4")
    assert base["bytes_per_param"] == 16 and fp4["bytes_per_param"] == 14.5625
    assert fp4["static_bytes"] == 8e9 * 14.5625
    assert "nvfp4" in fp4["policy"]
    with pytest.raises(PlanError):
        _plan("--weight-format", "nvfp4", "--bytes-per-param", "3")
