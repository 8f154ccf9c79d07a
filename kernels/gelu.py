"""GELU in its two forms: `gelu` is the tanh approximation, `gelu_erf` the exact one.

  gelu(x)     = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  gelu_erf(x) = 0.5 x (1 + erf(x / sqrt(2)))

FLOPs per element (a transcendental counts as one):
  tanh form: x*x*x (2), *0.044715 (1), +x (1), *sqrt(2/pi) (1), tanh (1), 1+ (1),
             x* (1), 0.5* (1) = 9
  erf form:  x*(1/sqrt 2) (1), erf (1), 1+ (1), x* (1), 0.5* (1) = 5
"""

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.elementwise import elementwise_spec

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)


@triton.jit
def gelu_tanh_op(x, unused):
    z = 0.7978845608028654 * (x + 0.044715 * x * x * x)  # sqrt(2/pi) (x + 0.044715 x^3)
    # tanh(z) = 1 - 2 / (exp(2z) + 1): saturates cleanly at +-1 for large |z|, and uses
    # tl.exp because libdevice's tanh is unavailable in the interpreter.
    t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
    return 0.5 * x * (1.0 + t)


@triton.jit
def gelu_erf_op(x, unused):
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def _gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * INV_SQRT_2))


SPEC = elementwise_spec(
    name="gelu",
    arity=1,
    triton_op=gelu_tanh_op,
    math=_gelu_tanh,
    torch_native=lambda x, out: F.gelu(x, approximate="tanh"),
    flops_per_element=9,
    flops_note="tanh form: 8 arithmetic + 1 tanh per element",
    out_bound=lambda ax: ax,  # |gelu(x)| <= |x|
    description="GELU, tanh approximation",
)

SPEC_ERF = elementwise_spec(
    name="gelu_erf",
    arity=1,
    triton_op=gelu_erf_op,
    math=_gelu_erf,
    torch_native=lambda x, out: F.gelu(x),
    flops_per_element=5,
    flops_note="erf form: 4 arithmetic + 1 erf per element",
    out_bound=lambda ax: ax,
    description="GELU, exact erf form",
)
