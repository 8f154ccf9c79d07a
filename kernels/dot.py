"""dot: s = sum_i x_i y_i over n elements.

FLOPs: 2n (a multiply and an add per element).  Bytes: both inputs read once (2 n b) plus
the scalar output written once.  Output dtype: the input dtype for fp32/fp16/bf16; bf16
for fp8 inputs (fp8 products produce bf16 results, as matmul does).  Accumulation is fp32.

Triton: a deterministic two-stage reduction in one launch.  A fixed number of programs
(a few per SM) each stride over the input with a BLOCK-wide fp32 accumulator, its loads
pipelined STAGES deep through shared memory (cp.async), and write one partial sum; the
program that finishes last, told by an atomic ticket, sums the partials in index order.
The same n on the same GPU always gives bit-identical results: the atomic only counts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.shape_groups import VECTOR
from kernels.spec import (
    DTYPES,
    PLAIN_DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    TritonLaunch,
    dequantize,
    quantize,
    randn,
)
from kernels.triton_utils import round_for_store, run_launch, store_round_bits

DOT_DTYPES = tuple(d for d in PLAIN_DTYPES if d != "tf32")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def product_out_dtype(dtype: str) -> torch.dtype:
    """Output dtype of the product families (dot, matvec, matmul): bf16 for fp8 and
    block-scaled inputs."""
    d = DTYPES[dtype]
    return torch.bfloat16 if d.is_fp8 or d.block else d.storage


@triton.jit
def dot_kernel(X, Y, P, TICKET, O, SX, SY, n, nprog, BLOCK: tl.constexpr,
               STAGES: tl.constexpr, PARTS: tl.constexpr, MBITS: tl.constexpr):
    # nprog: the grid size, also passed as an argument so that Triton specializes it (a
    # multiple of 16, _num_partials) and the final sum loads 128 bits a thread.
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # Grid-stride loop: program p handles blocks p, p + P, p + 2P, ...  tl.range's
    # pipelining (cp.async into shared memory) keeps STAGES - 1 blocks of x and y in
    # flight while one is summed; a plain loop had one block's first half in flight at a
    # time (ptxas waited on it before issuing the second half's loads).
    for start in tl.range(pid.to(tl.int64) * BLOCK, n,
                          tl.num_programs(0).to(tl.int64) * BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        acc += x * y
    tl.store(P + pid, tl.sum(acc, axis=0))
    # One thread per program stores the partial and takes a ticket; acq_rel orders the
    # partial before the ticket, and the last ticket before the reads of every partial
    # (.cg: from L2, never a stale L1 line).  The last program also re-arms the ticket
    # for the next launch.  One dot at a time per device: the ticket is shared.
    done = tl.atomic_add(TICKET, 1, sem="acq_rel", scope="gpu")
    if done == nprog - 1:
        offs = tl.arange(0, PARTS)
        parts = tl.load(P + offs, mask=offs < nprog, other=0.0, cache_modifier=".cg")
        s = tl.sum(parts, axis=0) * tl.load(SX) * tl.load(SY)
        tl.store(O, round_for_store(s, MBITS).to(O.dtype.element_ty))
        tl.store(TICKET, 0)


WARPS = 8
# Bytes of x and y each thread has in flight: twice what the 0.92-of-copy fp32 rows of
# the H200 run had (a plain loop, 64), four times the bf16 and fp8 rows' (32, at 0.81).
IN_FLIGHT = 128
# Programs per SM: 4 x 8 warps x 32 threads at <= 64 registers fill the register file,
# and 4 x 32 KB of pipeline buffers (IN_FLIGHT per thread) fit in shared memory, so
# every program is resident at once (a second wave would leave SMs idle at the end).
PROGRAMS_PER_SM = 4


def block_and_stages(itemsize: int) -> tuple[int, int]:
    """(BLOCK, STAGES) for inputs of `itemsize` bytes: 16 elements a thread per block (8
    of fp32: 32 bytes; 16 fp32 accumulators keep fp8 at <= 64 registers), pipelined
    deep enough that STAGES - 1 blocks of x and y are IN_FLIGHT bytes a thread."""
    per_thread = min(16, 32 // itemsize)
    return per_thread * 32 * WARPS, 1 + IN_FLIGHT // (2 * per_thread * itemsize)


# The ticket of each device's dot launches: zero between launches (the last program of
# each launch resets it), allocated once so that a launch costs no memset.
_TICKETS: dict[str, torch.Tensor] = {}


def ticket(device: torch.device) -> torch.Tensor:
    """The dot ticket of `device` (see dot_kernel), created zeroed on first use."""
    t = _TICKETS.get(str(device))
    if t is None:
        t = _TICKETS[str(device)] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def _num_partials(n: int, block: int, sms: int) -> int:
    # On a GPU: PROGRAMS_PER_SM per SM, all resident, each summing n / P elements.  A
    # multiple of 16, so that Triton specializes the count as divisible by 16 (568
    # partials on a 142-SM L40S gave 32-bit loads in the final sum).  sms = 0: the CPU
    # interpreter.
    cap = max(16, PROGRAMS_PER_SM * sms // 16 * 16) if sms else 64
    return max(1, min(triton.cdiv(n, block), cap))


def triton_launches(inputs: Inputs, out: torch.Tensor, sms: int) -> list[TritonLaunch]:
    """The one launch of a dot on a GPU with `sms` SMs."""
    x, y = inputs["x"], inputs["y"]
    n = x.numel()
    block, stages = block_and_stages(x.element_size())
    nparts = _num_partials(n, block, sms)
    partials = torch.empty(nparts, dtype=torch.float32, device=x.device)
    return [TritonLaunch(
        fn=dot_kernel,
        args=(x, y, partials, ticket(x.device), out, inputs["sx"], inputs["sy"], n, nparts),
        constexprs={"BLOCK": block, "PARTS": triton.next_power_of_2(nparts),
                    "MBITS": store_round_bits(out)},
        configs=(triton.Config({"STAGES": stages}, num_warps=WARPS),),
        grid=lambda meta: (nparts,),
        operands={"X": (1,), "Y": (1,)})]


def dot_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    x = inputs["x"]
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
           if x.device.type == "cuda" else 0)
    for launch in triton_launches(inputs, out, sms):
        run_launch(launch)
    return out


def dot_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    x, y = inputs["x"], inputs["y"]
    if x.dtype in FP8:
        # No fp8 dot in eager PyTorch: upcast, dot in fp32, scale, cast to bf16.
        return (torch.dot(x.float(), y.float()) * inputs["sx"] * inputs["sy"]).to(out.dtype)
    return torch.dot(x, y, out=out)


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    n = shape["n"]
    # x ~ N(0, n^-1/2) and y = x/2 + independent noise of the same size: the dot is then
    # about sqrt(n)/2 +- 1, never near zero by chance (a scalar's relative error blows up
    # when the reference cancels to ~0), and far below fp16's 65504 for any n < 2^34.
    scale = n ** -0.25
    xf = randn((n,), seed, device, scale)
    x, sx = quantize(xf, dtype)
    y, sy = quantize(0.5 * xf + randn((n,), seed + 1, device, scale), dtype)
    return {"x": x, "y": y, "sx": sx, "sy": sy}


SPEC = KernelSpec(
    name="dot",
    family="dot",
    dims=("n",),
    flops=lambda shape, dtype: 2 * shape["n"],
    nbytes=lambda shape, dtype: (2 * shape["n"] * DTYPES[dtype].itemsize
                                 + product_out_dtype(dtype).itemsize),
    flops_formula="2 n  (multiply + add per element)",
    bytes_formula="2 n b + b_out",
    make_inputs=make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty((), dtype=product_out_dtype(dtype),
                                                device=inputs["x"].device),
    reference=lambda inputs, dtype: torch.dot(dequantize(inputs["x"], inputs["sx"]),
                                              dequantize(inputs["y"], inputs["sy"])),
    providers={
        "torch": Provider("torch", dot_torch, DOT_DTYPES,
                          note="torch.dot; fp8: upcast to fp32"),
        "triton": Provider("triton", dot_triton, DOT_DTYPES,
                           note="deterministic two-stage reduction, fp32 accumulation"),
    },
    description="inner product of two vectors",
    triton_launches=triton_launches,
    shape_group=VECTOR,
)
