"""The approximate transcendentals of the 16- and 8-bit GELU kernels (kernels/gelu.py,
kernels.triton_utils.tanh_approx): the erf fit, the kernel's use of it, the error budget
of the hardware tanh per dtype, and that compiled kernels really use it (the CPU
interpreter cannot run it, so that part is read from the PTX)."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernels import DTYPES
from kernels.elementwise import ELEMENTWISE_DTYPES, approx_ok, elementwise_launch
from kernels.gelu import ERF_CLAMP, ERF_TANH_COEFFS, gelu_erf_op
from kernels.spec import FP8_MAX
from kernels.triton_utils import run_launch

ROOT = Path(__file__).resolve().parent.parent
TANH_APPROX_REL = 2.0 ** -10.987  # PTX ISA: max relative error of tanh.approx.f32


def erf_by_tanh(x: torch.Tensor) -> torch.Tensor:
    """erf(x / sqrt 2) as the approximate kernels compute it, in float64."""
    c0, c1, c2 = ERF_TANH_COEFFS
    s = torch.clamp(x * x, max=ERF_CLAMP)
    return torch.tanh(x * (c0 + s * (c1 + s * c2)))


def gelu_erf64(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh64(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def test_erf_fit_is_within_4e_5_on_the_whole_line():
    # Past |x| = 11.7 the quadratic turns negative: without the clamp the fit's tanh
    # flips to -1 there, an error of 2.
    x = torch.linspace(-40, 40, 400001, dtype=torch.float64)
    err = (erf_by_tanh(x) - torch.erf(x / math.sqrt(2.0))).abs().max().item()
    assert err < 4e-5


@pytest.mark.interpreter
def test_kernel_approx_path_computes_the_fit():
    """The kernel's APPROX branch (forced on, fp32 in and out so that no rounding hides
    it) against the fit in float64: the same function up to fp32 arithmetic."""
    x = torch.cat([torch.linspace(-16, 16, 4001), torch.randn(4000)])
    inputs = {"x": x, "sx": torch.ones(()), "so": torch.ones(())}
    out = torch.full_like(x, float("nan"))
    launch = elementwise_launch(gelu_erf_op, 1, inputs, out)
    assert launch.constexprs["APPROX"] is False  # fp32: exact math by default
    run_launch(dataclasses.replace(launch, constexprs={**launch.constexprs, "APPROX": True}))
    x64 = x.double()
    fit = 0.5 * x64 * (1.0 + erf_by_tanh(x64))
    assert (out.double() - fit).abs().max().item() < 1e-5
    assert (out.double() - gelu_erf64(x64)).abs().max().item() < 1e-5 + 0.5 * 16 * 4e-5


def _rounded(y: torch.Tensor, dtype: str) -> torch.Tensor:
    """y stored in `dtype` (fp8 with the per-tensor scale that maps amax to its max) and
    read back in float64."""
    storage = DTYPES[dtype].storage
    if not DTYPES[dtype].is_fp8:
        return y.to(storage).double()
    scale = y.abs().max() / FP8_MAX[storage]
    return (y / scale).to(storage).double() * scale


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
def test_hardware_tanh_error_fits_where_it_is_used(dtype):
    """tanh scaled by its full documented relative error, then stored in the dtype:
    within half the dtype's tolerance wherever approx_ok allows it, and over fp32's
    tolerance, which is why fp32 keeps exact math."""
    x = torch.randn(1 << 18, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    z = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
    errs = []
    for exact, t in [(gelu_tanh64(x), torch.tanh(z)), (gelu_erf64(x), erf_by_tanh(x))]:
        y = 0.5 * x * (1.0 + t * (1.0 + TANH_APPROX_REL))
        got = _rounded(y, dtype)
        errs.append((torch.linalg.vector_norm(got - exact)
                     / torch.linalg.vector_norm(exact)).item())
    tol = DTYPES[dtype].tol
    if approx_ok(torch.empty(0, dtype=DTYPES[dtype].storage)):
        assert max(errs) < tol / 2, errs
    else:
        assert dtype == "fp32" and min(errs) > tol, errs


_PTX = textwrap.dedent("""
    import triton
    from benches.inspect.compile import bind, gpu_target, launches_for
    for kernel, dtype in [("gelu", "bf16"), ("gelu_erf", "fp8"), ("gelu", "fp32")]:
        launch = launches_for(kernel, dtype, {"n": 1 << 20}, "sm_90")[0]
        src, options = bind(launch, launch.configs[0], 90)
        ptx = triton.compile(src, target=gpu_target(90), options=options.__dict__).asm["ptx"]
        print(kernel, dtype, ptx.count("tanh.approx.f32"), ptx.count("ex2.approx"))
""")


def test_compiled_kernels_use_the_hardware_tanh_where_allowed():
    """Compiled for sm_90 (no GPU needed): 16- and 8-bit GELU outputs get tanh.approx and
    no exp; fp32 keeps its exp-based tanh.  The interpreter tests above cannot see this."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _PTX], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    counts = {tuple(ln.split()[:2]): tuple(map(int, ln.split()[2:]))
              for ln in r.stdout.splitlines()}
    assert counts[("gelu", "bf16")][0] > 0 and counts[("gelu", "bf16")][1] == 0
    assert counts[("gelu_erf", "fp8")][0] > 0 and counts[("gelu_erf", "fp8")][1] == 0
    assert counts[("gelu", "fp32")][0] == 0 and counts[("gelu", "fp32")][1] > 0
