"""attention and attention_bwd: FLOPs against torch's FlopCounterMode, bytes against the
tensors, both providers against the float64 reference, the part-wise check, the SDPA
backend in the row, shapes and the Triton launch geometry."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benches.sweep.cases import Case, InputCache
from benches.sweep.runner import run_case
from benches.sweep.shapes import CPU_PRESETS, GPU_PRESETS, ShapeError, parse_sizes, shapes_for
from kernels import DTYPES, REGISTRY
from kernels import attention as attn
from kernels import attention_configs as ac
from kernels import attention_triton as at
from kernels.spec import Target, UnsupportedShape, set_fp8_accum

FWD, BWD = REGISTRY["attention"], REGISTRY["attention_bwd"]
aten = torch.ops.aten


def _shape(b=2, h=3, s=64, d=32, causal=0) -> dict:
    return {"B": b, "H": h, "S": s, "D": d, "causal": causal}


def _counted(shape: dict, backward: bool) -> int:
    """FlopCounterMode's count of SDPA's fused forward (and backward) ops, run on meta
    tensors: the counter's formulas are registered for the CUDA kernels' ops, which the
    meta device runs by shape alone."""
    dims = (shape["B"], shape["H"], shape["S"], shape["D"])
    q, k, v, do = (torch.empty(dims, device="meta", dtype=torch.bfloat16) for _ in range(4))
    causal = bool(shape["causal"])
    with FlopCounterMode(display=False) as counter:
        out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        if backward:
            aten._scaled_dot_product_flash_attention_backward(
                do, q, k, v, out[0], out[1], out[2], out[3], shape["S"], shape["S"], 0.0,
                causal, out[6], out[7])
    return counter.get_total_flops()


@pytest.mark.parametrize("shape", [_shape(), _shape(1, 16, 512, 128), _shape(4, 2, 96, 64)])
def test_flops_are_flop_counter_modes(shape):
    """Non-causal: exactly the counter's SDPA forward and forward + sdpa_backward
    (14 = 4 + 10 B H S^2 D, the backward's recomputed q k^T included).  Causal: half of
    the counter's, which does not look at the mask."""
    assert FWD.flops(shape, "bf16") == _counted(shape, backward=False)
    assert BWD.flops(shape, "bf16") == _counted(shape, backward=True)
    causal = dict(shape, causal=1)
    assert 2 * FWD.flops(causal, "bf16") == _counted(causal, backward=False)
    assert 2 * BWD.flops(causal, "bf16") == _counted(causal, backward=True)
    b, h, s, d = shape["B"], shape["H"], shape["S"], shape["D"]
    assert FWD.flops(shape, "fp16") == 4 * b * h * s * s * d


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32", "fp8"])
def test_bytes_are_each_tensor_once(dtype):
    """attention: q, k, v read and o written (bf16 for fp8); attention_bwd adds dO, dq,
    dk, dv and the fp32 log-sum-exp per query row: counted from the tensors themselves."""
    shape = _shape(2, 3, 40, 16)
    ins = FWD.make_inputs(shape, dtype, 0, "cpu")
    tensors = [ins[n] for n in ("q", "k", "v")] + [FWD.alloc_out(ins, dtype)]
    assert FWD.nbytes(shape, dtype) == sum(t.nbytes for t in tensors)
    if dtype == "fp8":
        assert FWD.nbytes(shape, dtype) == 5 * 2 * 3 * 40 * 16
        return  # no fp8 backward
    ins = BWD.make_inputs(shape, dtype, 0, "cpu")
    lse = torch.empty(2, 3, 40, dtype=torch.float32)
    tensors = [ins[n] for n in ("q", "k", "v", "do")] + [BWD.alloc_out(ins, dtype), lse]
    assert BWD.nbytes(shape, dtype) == sum(t.nbytes for t in tensors)
    assert FWD.nbytes(dict(shape, causal=1), dtype) == FWD.nbytes(shape, dtype)


def test_rows_are_held_against_the_tensor_core_roof():
    for spec in (FWD, BWD):
        assert spec.matrix_unit
        assert spec.roof_class("bf16") == "bf16" and spec.roof_class("fp16") == "fp16"
        assert spec.dims == ("B", "H", "S", "D", "causal")


# ---- correctness ---------------------------------------------------------------------------

def _err(spec, provider: str, dtype: str, shape: dict, seed: int = 0) -> float:
    inputs = spec.make_inputs(shape, dtype, seed, "cpu")
    out = spec.alloc_out(inputs, dtype).fill_(float("nan"))
    return spec.check(spec.providers[provider].fn(inputs, out), inputs, dtype)


# Awkward sizes: S no multiple of any tile (bounds masks), several tiles (online softmax
# across tiles, the causal diagonal inside a tile), head dims 16..64.
TRITON_CASES = [("fp16", _shape(1, 2, 37, 16, 1)), ("bf16", _shape(2, 1, 64, 32, 0)),
                ("bf16", _shape(1, 2, 96, 16, 1)), ("fp16", _shape(1, 1, 50, 64, 0))]


@pytest.mark.interpreter
@pytest.mark.parametrize("name", ["attention", "attention_bwd"])
@pytest.mark.parametrize("dtype,shape", TRITON_CASES)
def test_triton_matches_float64(name, dtype, shape):
    err = _err(REGISTRY[name], "triton", dtype, shape)
    assert err <= DTYPES[dtype].tol, err


@pytest.mark.interpreter
@pytest.mark.parametrize("shape", [_shape(1, 2, 37, 32, 1), _shape(2, 1, 130, 64, 0)])
def test_triton_fp8_forward(shape):
    """e4m3 q, k, v with per-tensor scales, v stored sequence-major, o in bf16: within
    fp8's 0.1 (measured 1-2e-2: P rounded to e4m3 for P v); without v's scale it is not."""
    ins = FWD.make_inputs(shape, "fp8", 0, "cpu")
    assert ins["v"].stride()[-2:] == (1, shape["S"]) and ins["sv"].item() != 1.0
    out = FWD.alloc_out(ins, "fp8").fill_(float("nan"))
    assert out.dtype == torch.bfloat16
    assert FWD.check(at.attention_triton(ins, out), ins, "fp8") <= 0.05
    unscaled = at.attention_triton(dict(ins, sv=torch.ones(())), out)
    assert FWD.check(unscaled, ins, "fp8") > 0.5


def test_fp8_head_dim_below_nvidia_dot_minimum_is_skipped():
    """Triton's NVIDIA backend refuses an 8-bit tl.dot with K < 32 (q k^T has K = D) at
    compile time; the interpreter runs it.  So D = 16 fp8 is an unsupported shape on
    every target (a skipped row), not a compile failure on a GPU only."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import min_dot_size

    e4m3 = tl.block_type(tl.float8e4nv, [64, 64])
    assert min_dot_size(GPUTarget("cuda", 90, 32))(e4m3, e4m3)[2] == at.FP8_MIN_HEAD_DIM
    ins = FWD.make_inputs(_shape(1, 1, 16, 16, 0), "fp8", 0, "cpu")
    with pytest.raises(UnsupportedShape, match="D=16"):
        at.triton_launches_fwd(ins, FWD.alloc_out(ins, "fp8"), 0)
    ins = FWD.make_inputs(_shape(1, 1, 16, 32, 0), "fp8", 0, "cpu")
    assert len(at.triton_launches_fwd(ins, FWD.alloc_out(ins, "fp8"), 0)) == 1
    ins = FWD.make_inputs(_shape(1, 1, 16, 16, 0), "fp16", 0, "cpu")
    assert len(at.triton_launches_fwd(ins, FWD.alloc_out(ins, "fp16"), 0)) == 1


def test_fp8_rows_say_why_not():
    cpu = Target("cpu", None, interpret=True)
    assert "no fp8 kernel" in FWD.skip_reason("torch", "fp8", cpu)
    assert BWD.skip_reason("triton", "fp8", cpu) == "triton attention_bwd has no fp8 variant"
    assert FWD.skip_reason("triton", "fp8", cpu) is None
    set_fp8_accum("precise")
    try:
        assert "fast accumulation only" in FWD.skip_reason("triton", "fp8", cpu)
    finally:
        set_fp8_accum("fast")


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the planted NaNs
def test_causal_tiles_past_the_diagonal_are_never_read():
    """Causal tile skipping: with NaN in v for keys 64.. (forward) and in q for queries
    ..31 (backward), the outputs that only tiles past the diagonal would mix them into
    stay finite.  A kernel that loads those tiles and masks them yields NaN (0 x NaN in
    P v)."""
    shape = _shape(1, 1, 96, 16, 1)
    ins = FWD.make_inputs(shape, "fp16", 0, "cpu")
    ins["v"][..., 64:, :] = float("nan")
    out = at.attention_triton(ins, FWD.alloc_out(ins, "fp16"))
    assert torch.isfinite(out[..., :64, :]).all() and out[..., 64:, :].isnan().any()
    ins = BWD.make_inputs(shape, "fp16", 0, "cpu")
    ins["q"][..., :32, :] = float("nan")
    out = at.attention_bwd_triton(ins, BWD.alloc_out(ins, "fp16"))
    assert torch.isfinite(out[2:, ..., 32:, :]).all()  # dk, dv of keys 32..
    assert out[2:, ..., :32, :].isnan().any()


@pytest.mark.parametrize("name", ["attention", "attention_bwd"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", [0, 1])
def test_torch_matches_float64(name, dtype, causal):
    err = _err(REGISTRY[name], "torch", dtype, _shape(1, 2, 33, 16, causal))
    assert err <= DTYPES[dtype].tol, err


def test_reference_is_the_explicit_formula_and_honours_causal():
    shape = _shape(1, 2, 24, 8, 1)
    ins = FWD.make_inputs(shape, "fp32", 3, "cpu")
    q, k, v = (ins[n].double() for n in ("q", "k", "v"))
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(FWD.reference(ins, "fp32"), torch.softmax(s, -1) @ v)
    full = F.scaled_dot_product_attention(ins["q"], ins["k"], ins["v"])  # not causal
    assert FWD.check(full, ins, "fp32") > 0.1


def test_reference_in_chunks_equals_one_piece(monkeypatch):
    """The float64 reference walks query rows in chunks (memory at S = 16k): chunks of
    5 rows give what one chunk gives, gradients of dk and dv summed over chunks."""
    ins = BWD.make_inputs(_shape(1, 2, 23, 8, 1), "fp32", 1, "cpu")
    whole = BWD.reference(ins, "fp32")
    monkeypatch.setattr(attn, "_chunk", lambda q: 5)
    assert torch.allclose(BWD.reference(ins, "fp32"), whole, rtol=1e-12, atol=1e-12)
    assert torch.allclose(FWD.reference(ins, "fp32"), whole[0], rtol=1e-12, atol=1e-12)


def test_each_gradient_is_held_to_the_tolerance_alone():
    """A dq 2% off fails fp16's 5e-3 although o, dk and dv are right; and so does a zero
    dv (the stacked four as one vector would dilute either)."""
    ins = BWD.make_inputs(_shape(1, 2, 33, 16, 0), "fp16", 0, "cpu")
    ref = BWD.reference(ins, "fp16")
    good = ref.to(torch.float16)
    assert BWD.check(good, ins, "fp16", ref=ref) <= DTYPES["fp16"].tol
    bad = good.clone()
    bad[1] *= 1.02
    assert BWD.check(bad, ins, "fp16", ref=ref) == pytest.approx(0.02, rel=0.05)
    bad = good.clone()
    bad[3] = 0
    assert BWD.check(bad, ins, "fp16", ref=ref) == pytest.approx(1.0)
    # torch's autograd tuple is read as the same stack
    assert BWD.check(tuple(good.unbind(0)), ins, "fp16", ref=ref) <= DTYPES["fp16"].tol


# ---- the SDPA backend in the row -----------------------------------------------------------

def test_sdpa_backend_is_read_from_the_dispatched_ops():
    ins = BWD.make_inputs(_shape(1, 2, 16, 16, 1), "fp32", 0, "cpu")
    for spec in (FWD, BWD):
        call = lambda spec=spec: spec.providers["torch"].fn(ins, None)  # noqa: E731
        assert attn.sdpa_backend(call) == "SDPA backend: flash (CPU kernel)"
        with sdpa_kernel(SDPBackend.MATH):
            assert attn.sdpa_backend(call) == "SDPA backend: math"


def test_row_reason_names_the_backend():
    from tests.test_measurement import cpu_cfg

    cfg = cpu_cfg(kernels=["attention_bwd"], dtypes=["bf16"])
    shape = _shape(1, 2, 32, 16, 1)
    row = run_case(Case(BWD, "torch", "bf16", shape), cfg, InputCache())
    assert row.status == "ok", row.reason
    assert "SDPA backend: flash (CPU kernel)" in row.reason
    assert row.accounting.flops == BWD.flops(shape, "bf16")
    assert row.value("roof_class") == "bf16"
    checked = run_case(Case(FWD, "torch", "fp32", shape),
                       cpu_cfg(kernels=["attention_bwd"], dtypes=["bf16"], check_only=True),
                       InputCache())
    assert checked.reason == "check-only: not timed; SDPA backend: flash (CPU kernel)"
    row = run_case(Case(FWD, "torch", "fp8", shape), cfg, InputCache())
    assert row.status == "skipped" and "no fp8 kernel" in row.reason


def test_triton_rejects_head_dims_it_cannot_tile():
    ins = FWD.make_inputs(_shape(1, 1, 16, 80), "fp16", 0, "meta")
    with pytest.raises(UnsupportedShape, match="D=80"):
        at.triton_launches_fwd(ins, FWD.alloc_out(ins, "fp16"), 132)
    assert [at.head_dim_ok(d) for d in (8, 16, 64, 96, 128, 256, 512)] == \
        [False, True, True, False, True, True, False]


# ---- launches and shapes -------------------------------------------------------------------

def test_tiles_nest_as_causal_skipping_needs():
    """The diagonal region of a query tile is walked in key tiles (forward, dQ) and that of
    a key tile in query tiles (dK/dV): the walked tile must divide the owning one."""
    for part, own, step in (("fwd", "BLOCK_M", "BLOCK_N"), ("dq", "BLOCK_M", "BLOCK_N"),
                            ("dkdv", "BLOCK_N", "BLOCK_M")):
        arch_lists = [cfgs[part] for cfgs in ac.ARCH_CONFIGS.values()]
        for cfg in [*ac.CONFIGS[part], *sum(arch_lists, []), ac.INTERP_CONFIGS[part]]:
            assert cfg.kwargs[own] % cfg.kwargs[step] == 0, (part, cfg)


def test_launch_geometry_on_a_gpu_shape():
    shape = _shape(8, 16, 2048, 128, 1)
    ins = BWD.make_inputs(shape, "bf16", 0, "meta")
    launches = BWD.triton_launches(ins, BWD.alloc_out(ins, "bf16"), 132)
    assert [ln.name for ln in launches] == ["attn_fwd_kernel", "attn_bwd_delta_kernel",
                                            "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel"]
    fwd, _, dkdv, dq = launches
    assert fwd.grid({"BLOCK_M": 128, "BLOCK_N": 64}) == (16, 128)
    assert dkdv.grid({"BLOCK_M": 64, "BLOCK_N": 128}) == (16, 128)
    assert fwd.constexprs["CAUSAL"] and fwd.args[4].shape == (8, 16, 2048)  # the lse
    assert not fwd.constexprs["UPCAST"] or at.interpreter_enabled()
    assert all(ln.matrix_unit for ln in (fwd, dkdv, dq))
    ins = FWD.make_inputs(shape, "bf16", 0, "meta")
    (plain,) = FWD.triton_launches(ins, FWD.alloc_out(ins, "bf16"), 132)
    # the same kernel, constexprs and tuning as attention_bwd's forward: one compile
    assert (plain.fn, plain.constexprs, plain.tuner) == (fwd.fn, fwd.constexprs, fwd.tuner)


def test_gpu_presets_cross_the_ridge_at_a_fixed_token_count():
    shapes = GPU_PRESETS["default"]["attention"]
    assert {s["S"] for s in shapes} == {512, 1024, 2048, 4096, 8192, 16384}
    assert {s["D"] for s in shapes} == {64, 128} and {s["causal"] for s in shapes} == {0, 1}
    assert {s["B"] * s["S"] for s in shapes} == {16384}
    assert {s["H"] * s["D"] for s in shapes} == {2048}
    # intensity grows with S: a memory-bound size no more, a compute-bound one at 16k
    flop_per_byte = [FWD.flops(s, "bf16") / FWD.nbytes(s, "bf16") for s in shapes
                     if s["D"] == 128 and not s["causal"]]
    assert flop_per_byte == sorted(flop_per_byte) and flop_per_byte[-1] > 1000


def test_cpu_presets_are_tiny():
    for preset in ("quick", "default"):
        for s in CPU_PRESETS[preset]["attention"]:
            assert BWD.flops(s, "fp32") <= 2e8, s


def test_explicit_attention_sizes():
    (s,) = parse_sizes("B=2,H=4,S=128,D=64,causal=0")
    assert s == _shape(2, 4, 128, 64, 0)
    assert shapes_for(FWD, "", False, [s, {"*": 4096}]) == [s]  # one integer is no shape
    for bad in ("B=2,H=4,S=128,D=64,causal=2", "B=2,H=4,S=128,D=64", "B=0,H=1,S=1,D=16,causal=1"):
        with pytest.raises(ShapeError):
            parse_sizes(bad)


def test_list_shows_both_families(capsys):
    import run_bench

    assert run_bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "attention_bwd" in out and "14 B H S^2 D" in out


def test_partwise_spec_survives_replace():
    assert isinstance(dataclasses.replace(BWD, name="x"), attn.PartwiseSpec)
