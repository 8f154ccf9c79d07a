"""GELU in its two forms: `gelu` is the tanh approximation, `gelu_erf` the exact one.

  gelu(x)     = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  gelu_erf(x) = 0.5 x (1 + erf(x / sqrt(2)))

FLOPs per element (a transcendental counts as one):
  tanh form: x*x*x (2), *0.044715 (1), +x (1), *sqrt(2/pi) (1), tanh (1), 1+ (1),
             x* (1), 0.5* (1) = 9
  erf form:  x*(1/sqrt 2) (1), erf (1), 1+ (1), x* (1), 0.5* (1) = 5

Triton, 16- and 8-bit outputs (APPROX): tanh is the hardware's tanh.approx.f32
(kernels.triton_utils.tanh_approx, relative error 2^-10.987, about half an ulp of fp16
and far under bf16's and fp8's), and erf(x / sqrt 2) is tanh(x Q(min(x^2, 14))) with
Q a quadratic fitted minimax to erf (max abs error 3.7e-5 over the reals; clamping x^2
keeps Q positive, and past |x| = 3.74 both sides are 1 within 1.7e-4): a MUFU.TANH and
seven other instructions per element instead of libdevice's erff (two polynomials and
an exp).  fp32 outputs keep the exact forms: its tolerance (2e-5) is below the
approximations'.  Both forms end as hx + hx t with hx = x / 2: one FFMA.  docs/hopper.md
has the SASS before and after.
"""

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.elementwise import elementwise_spec
from kernels.shape_groups import VECTOR
from kernels.triton_utils import tanh_approx

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)


# erf(x / sqrt 2) ~ tanh(x (C0 + C1 s + C2 s^2)), s = min(x^2, ERF_CLAMP): see the docstring.
ERF_TANH_COEFFS = (0.7977178338974897, 0.03679825599396501, -0.00031580704685156677)
ERF_CLAMP = 14.0
_C0, _C1, _C2 = (tl.constexpr(c) for c in ERF_TANH_COEFFS)  # what the jit code reads
_S_MAX = tl.constexpr(ERF_CLAMP)


@triton.jit
def gelu_tanh_op(x, unused, APPROX: tl.constexpr):
    # sqrt(2/pi) (x + 0.044715 x^3) = x (sqrt(2/pi) + 0.0356774 x^2)
    z = x * (0.7978845608028654 + 0.035677408136300125 * (x * x))
    if APPROX:  # noqa: SIM108 (a constexpr branch: only the taken side is compiled)
        t = tanh_approx(z)
    else:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): saturates cleanly at +-1 for large |z|, and
        # uses tl.exp because libdevice's tanh is unavailable in the interpreter.
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    hx = 0.5 * x
    return hx + hx * t


@triton.jit
def gelu_erf_op(x, unused, APPROX: tl.constexpr):
    hx = 0.5 * x
    if APPROX:
        s = tl.minimum(x * x, _S_MAX)
        e = tanh_approx(x * ((s * _C2 + _C1) * s + _C0))
    else:
        e = tl.erf(x * 0.7071067811865476)
    return hx + hx * e


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * INV_SQRT_2))


SPEC = replace(elementwise_spec(
    name="gelu",
    arity=1,
    triton_op=gelu_tanh_op,
    math=_gelu_tanh,
    torch_native=lambda x, out: F.gelu(x, approximate="tanh"),
    flops_per_element=9,
    flops_note="tanh form: 8 arithmetic + 1 tanh per element",
    out_bound=lambda ax: ax,  # |gelu(x)| <= |x|
    description="GELU, tanh approximation",
), shape_group=VECTOR)

SPEC_ERF = replace(elementwise_spec(
    name="gelu_erf",
    arity=1,
    triton_op=gelu_erf_op,
    math=_gelu_erf,
    torch_native=lambda x, out: F.gelu(x),
    flops_per_element=5,
    flops_note="erf form: 4 arithmetic + 1 erf per element",
    out_bound=lambda ax: ax,
    description="GELU, exact erf form",
), shape_group=VECTOR)
