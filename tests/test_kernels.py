"""Every kernel, provider and dtype against the float64 reference, on awkward shapes."""

from __future__ import annotations

import pytest
import torch

from kernels import DTYPES, REGISTRY, current_target
from kernels.matmul import UnsupportedShape
from kernels.spec import Target

CPU = current_target("cpu")
INTERP = Target("cpu", None, interpret=True)

# Shapes that are no multiple of any block size: a single element, primes, odd sizes,
# and one just past a power of two.
SHAPES = {
    ("n",): [{"n": 1}, {"n": 7}, {"n": 1009}, {"n": 65537}],
    ("M", "K"): [{"M": 1, "K": 1}, {"M": 3, "K": 997}, {"M": 37, "K": 129},
                 {"M": 129, "K": 64}],
    ("M", "N", "K"): [{"M": 1, "N": 1, "K": 1}, {"M": 17, "N": 13, "K": 7},
                      {"M": 37, "N": 45, "K": 70}, {"M": 65, "N": 33, "K": 129}],
}


def cases(provider: str):
    out = []
    for spec in REGISTRY.values():
        for dtype in spec.dtypes:
            target = CPU if provider == "torch" else INTERP
            reason = spec.skip_reason(provider, dtype, target)
            for shape in SHAPES[spec.dims]:
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                sid = f"{spec.name}-{dtype}-" + "x".join(str(v) for v in shape.values())
                out.append(pytest.param(spec.name, dtype, shape, marks=marks, id=sid))
    return out


def run_checked(name: str, provider: str, dtype: str, shape: dict, seed: int = 0,
                device: str = "cpu") -> float:
    spec = REGISTRY[name]
    inputs = spec.make_inputs(shape, dtype, seed, device)
    out = spec.alloc_out(inputs, dtype)
    out.fill_(float("nan"))  # poison: an element the kernel does not write stays NaN
    result = spec.providers[provider].fn(inputs, out)
    return spec.check(result, inputs, dtype)


@pytest.mark.parametrize("name,dtype,shape", cases("torch"))
def test_torch_provider_matches_float64(name, dtype, shape):
    err = run_checked(name, "torch", dtype, shape)
    assert err <= DTYPES[dtype].tol, f"rel_err {err:.3g} > {DTYPES[dtype].tol}"


@pytest.mark.parametrize("name,dtype,shape", cases("triton"))
def test_triton_provider_matches_float64(name, dtype, shape):
    if not INTERP.interpret and not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET is not set")
    err = run_checked(name, "triton", dtype, shape)
    assert err <= DTYPES[dtype].tol, f"rel_err {err:.3g} > {DTYPES[dtype].tol}"


def test_interpreter_is_on():
    # conftest switches the interpreter on before triton is imported; if this fails, the
    # Triton tests above would be testing nothing.
    from kernels.spec import interpreter_enabled

    assert torch.cuda.is_available() or interpreter_enabled()


def test_unwritten_output_fails_the_check():
    """Poisoning works: a kernel that skips the last elements is caught."""
    from kernels.add import add_op
    from kernels.elementwise import launch_elementwise

    spec = REGISTRY["add"]
    inputs = spec.make_inputs({"n": 1000}, "fp32", 0, "cpu")
    out = spec.alloc_out(inputs, "fp32").fill_(float("nan"))
    short = dict(inputs, x=inputs["x"][:900], y=inputs["y"][:900])
    launch_elementwise(add_op, 2, short, out)  # writes only 900 of 1000 elements
    assert spec.check(out, inputs, "fp32") == float("inf")


def test_wrong_result_exceeds_every_tolerance():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 16, "N": 16, "K": 16}, "fp32", 0, "cpu")
    wrong = inputs["A"] @ inputs["B"].t()  # transposed operand: a classic bug
    assert spec.check(wrong, inputs, "fp32") > max(d.tol for d in DTYPES.values())


def test_inputs_are_random_and_never_zero():
    for spec in REGISTRY.values():
        shape = SHAPES[spec.dims][2]
        a = spec.make_inputs(shape, "fp32", 1, "cpu")
        b = spec.make_inputs(shape, "fp32", 2, "cpu")
        t = [k for k, v in a.items() if isinstance(v, torch.Tensor) and v.dim() > 0]
        assert t
        for k in t:
            assert (a[k] != 0).all(), f"{spec.name}.{k} has zeros"
            assert not torch.equal(a[k], b[k]), f"{spec.name}.{k} ignores the seed"


def test_triton_dot_is_deterministic():
    from kernels.dot import dot_triton

    spec = REGISTRY["dot"]
    inputs = spec.make_inputs({"n": 300_001}, "fp32", 3, "cpu")
    r1 = dot_triton(inputs, spec.alloc_out(inputs, "fp32")).clone()
    r2 = dot_triton(inputs, spec.alloc_out(inputs, "fp32"))
    assert torch.equal(r1, r2)


def test_fp8_inputs_use_nontrivial_scales():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 32, "N": 32, "K": 32}, "fp8", 0, "cpu")
    assert inputs["A"].dtype == torch.float8_e4m3fn
    assert inputs["sa"].item() != 1.0 and inputs["sb"].item() != 1.0
    # B is column-major, as torch._scaled_mm requires.
    assert inputs["B"].stride() == (1, 32)


def test_fp8_matmul_outputs_bf16_and_elementwise_stays_fp8():
    mm = REGISTRY["matmul"]
    i = mm.make_inputs({"M": 16, "N": 16, "K": 16}, "fp8e5", 0, "cpu")
    assert mm.alloc_out(i, "fp8e5").dtype == torch.bfloat16
    add = REGISTRY["add"]
    i = add.make_inputs({"n": 16}, "fp8e5", 0, "cpu")
    assert add.alloc_out(i, "fp8e5").dtype == torch.float8_e5m2


# ---- skip reasons ------------------------------------------------------------------------

def test_skip_reasons():
    mm = REGISTRY["matmul"]
    hopper = Target("cuda", (9, 0))
    ampere = Target("cuda", (8, 0))
    assert mm.skip_reason("torch", "bf16", hopper) is None
    assert mm.skip_reason("triton", "fp8", hopper) is None
    assert "sm_89" in mm.skip_reason("triton", "fp8", ampere)
    assert "e5m2" in mm.skip_reason("torch", "fp8e5", hopper)
    assert "interpreter" in mm.skip_reason("triton", "bf16", INTERP)
    assert "tf32" in mm.skip_reason("torch", "tf32", CPU)
    assert "CUDA" in REGISTRY["add"].skip_reason("triton", "fp32", Target("cpu"))
    assert "no tf32" in REGISTRY["add"].skip_reason("torch", "tf32", hopper)


# ---- GPU-only ------------------------------------------------------------------------------

GPU_SIZES = {
    ("n",): [{"n": 4097}, {"n": 1 << 20}, {"n": (1 << 26) + 3}],
    ("M", "K"): [{"M": 129, "K": 257}, {"M": 4096, "K": 4096}, {"M": 8192, "K": 8191}],
    ("M", "N", "K"): [{"M": 129, "N": 255, "K": 67}, {"M": 1024, "N": 1024, "K": 1024},
                      {"M": 4096, "N": 4096, "K": 4096}],
}


@pytest.mark.gpu
@pytest.mark.parametrize("provider", ["torch", "triton"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_gpu_every_dtype_three_sizes(name, provider):
    spec = REGISTRY[name]
    target = current_target()
    errors = []
    for dtype in spec.dtypes:
        if spec.skip_reason(provider, dtype, target):
            continue
        for shape in GPU_SIZES[spec.dims]:
            try:
                err = run_checked(name, provider, dtype, shape, device="cuda")
            except UnsupportedShape:
                continue  # e.g. torch._scaled_mm on dims that are not multiples of 16
            if not err <= DTYPES[dtype].tol:
                errors.append(f"{dtype} {shape}: {err:.3g}")
    assert not errors, errors
