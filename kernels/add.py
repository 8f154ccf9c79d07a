"""add: out = x + y, elementwise."""

from dataclasses import replace

import torch
import triton
import triton.language as tl

from kernels.elementwise import elementwise_spec
from kernels.shape_groups import VECTOR


@triton.jit
def add_op(x, y, APPROX: tl.constexpr):
    return x + y


SPEC = replace(elementwise_spec(
    name="add",
    arity=2,
    triton_op=add_op,
    math=lambda x, y: x + y,
    torch_native=lambda x, y, out: torch.add(x, y, out=out),
    flops_per_element=1,
    flops_note="one add per element",
    out_bound=lambda ax, ay: ax + ay,
    description="elementwise x + y",
), shape_group=VECTOR)
