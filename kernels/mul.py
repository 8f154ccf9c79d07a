"""mul: out = x * y, elementwise."""

from dataclasses import replace

import torch
import triton
import triton.language as tl

from kernels.elementwise import elementwise_spec
from kernels.shape_groups import VECTOR


@triton.jit
def mul_op(x, y, APPROX: tl.constexpr):
    return x * y


SPEC = replace(elementwise_spec(
    name="mul",
    arity=2,
    triton_op=mul_op,
    math=lambda x, y: x * y,
    torch_native=lambda x, y, out: torch.mul(x, y, out=out),
    flops_per_element=1,
    flops_note="one multiply per element",
    out_bound=lambda ax, ay: ax * ay,
    description="elementwise x * y",
), shape_group=VECTOR)
