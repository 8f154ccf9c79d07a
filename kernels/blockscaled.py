"""Block-scaled formats: how a matrix is quantized to MXFP8, MXFP4 or NVFP4 and stored.

A row of K values is cut into blocks of g consecutive elements along K; each block
shares one 8-bit scale, each element is a small float:

| format | element | g  | block scale | per-tensor scale |
| ---    | ---     | -- | ---         | ---              |
| mxfp8  | e4m3    | 32 | e8m0 (2^e)  | none             |
| mxfp4  | e2m1    | 32 | e8m0 (2^e)  | none             |
| nvfp4  | e2m1    | 16 | e4m3        | fp32             |

Quantization happens on the host side of the timing, in make_inputs: the stored format is
the case's input, quantizing is not part of what is timed.

- MX (OCP Microscaling spec v1.0): the block's shared exponent is floor(log2(amax)) minus
  the element format's largest exponent (e4m3: 8, since 448 = 1.75 x 2^8; e2m1: 2, since
  6 = 1.5 x 2^2); elements are x / 2^e, clamped to the format's largest value (the spec's
  saturating conversion) and rounded to nearest even.
- NVFP4: a per-tensor fp32 scale s_t = amax(tensor) / (448 x 6) puts every block scale
  amax(block) / 6 / s_t inside e4m3's range; elements are x / (s_b s_t) rounded to e2m1.

Storage, shared by both providers (the very same tensors are multiplied):
- elements as rows x K_pad: e4m3 bytes, or e2m1 packed two per byte with the element of
  even k in the low nibble (c10's Float4_e2m1fn_x2 layout and tl.dot_scaled's);
  K_pad = K rounded up to g (the tail of a partial block holds zeros).  B is stored as
  N x K (its transpose, K-major), which torch._scaled_mm requires;
- block scales in cuBLAS's blocked layout (what torch._scaled_mm requires on sm_100):
  rows padded to 128 and scale columns to 4, each 128 x 4 tile stored as 32 x 16 bytes,
  the scale of (row r, column c) at byte ((r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4) of
  its tile; the Triton kernel computes the same addresses (kernels/matmul_blockscaled.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.spec import DTYPES, FP8_MAX, Shape, generator

E4M3_MAX = FP8_MAX[torch.float8_e4m3fn]  # 448
E2M1_MAX = 6.0
# Largest exponent of each element format: MX's shared exponent is log2(amax) minus it.
EMAX = {"e4m3": 8, "e2m1": 2}
# The 8 magnitudes of e2m1 by code (sign in bit 3) and the midpoints between neighbours.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E8M0_BIAS = 127
TILE_ROWS, TILE_COLS = 128, 4  # one tile of the blocked scale layout


def element_format(dtype: str) -> str:
    """tl.dot_scaled's name of the element format: "e4m3" or "e2m1"."""
    return "e2m1" if DTYPES[dtype].bits == 4 else "e4m3"


def scale_format(dtype: str) -> str:
    """The block scales' format: "e8m0" (MX: a power of two) or "e4m3" (NVFP4)."""
    return "e4m3" if DTYPES[dtype].scale == torch.float8_e4m3fn else "e8m0"


def padded_k(k: int, dtype: str) -> int:
    """K rounded up to whole blocks: the length each stored row has."""
    g = DTYPES[dtype].block
    return -(-k // g) * g


def operand_bytes(rows: int, k: int, dtype: str) -> int:
    """Bytes of one stored operand of `rows` x K: packed elements, one scale byte per
    block, and the per-tensor fp32 scale where the format has one.  The blocked layout's
    padding (rows to 128, scale columns to 4; none at the preset shapes) holds no scale
    and is not counted."""
    d = DTYPES[dtype]
    kp = padded_k(k, dtype)
    return rows * kp * d.element_bits // 8 + rows * (kp // d.block) + 4 * d.tensor_scale


# ---- e2m1 ------------------------------------------------------------------------------

def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 values -> e2m1 codes (uint8, 0..15), clamped to +-6 and rounded to nearest
    even (a tie goes to the code with mantissa bit 0)."""
    mag = x.abs().clamp(max=E2M1_MAX)
    mids = torch.tensor(_E2M1_MIDPOINTS, dtype=mag.dtype, device=mag.device)
    code = torch.bucketize(mag, mids)  # at a midpoint: the lower neighbour
    tie = (code < len(_E2M1_MIDPOINTS)) & (mag == mids[code.clamp(max=len(mids) - 1)])
    code = code + (tie & (code % 2 == 1)).to(code.dtype)
    return (code | ((x < 0).to(code.dtype) << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8, 0..15) -> float64 values."""
    lut = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float64,
                       device=codes.device)
    return lut[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """rows x 2n codes -> rows x n bytes, element 2j in the low nibble of byte j."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """rows x n bytes -> rows x 2n codes (inverse of pack_fp4)."""
    out = torch.stack([packed & 0xF, packed >> 4], dim=-1)
    return out.reshape(packed.shape[0], -1)


# ---- the blocked scale layout -----------------------------------------------------------

def blocked_size(rows: int, cols: int) -> int:
    """Bytes of a rows x cols scale matrix in the blocked layout (padding included)."""
    return (-(-rows // TILE_ROWS) * TILE_ROWS) * (-(-cols // TILE_COLS) * TILE_COLS)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """rows x cols scales -> the flat blocked layout (module docstring), zero-padded."""
    rows, cols = scales.shape
    rt, ct = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    padded = scales.new_zeros(rt * TILE_ROWS, ct * TILE_COLS)
    padded[:rows, :cols] = scales
    tiles = padded.view(rt, TILE_ROWS, ct, TILE_COLS).permute(0, 2, 1, 3)
    # Row r of a tile = 32 (r // 32) + r % 32: byte (r % 32) * 16 + (r // 32) * 4 + c.
    return tiles.reshape(rt, ct, 4, 32, TILE_COLS).transpose(2, 3).reshape(-1).contiguous()


def from_blocked(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The blocked layout -> rows x cols (inverse of to_blocked)."""
    rt, ct = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    tiles = flat.view(rt, ct, 32, 4, TILE_COLS).transpose(2, 3)
    padded = tiles.reshape(rt, ct, TILE_ROWS, TILE_COLS).permute(0, 2, 1, 3)
    return padded.reshape(rt * TILE_ROWS, ct * TILE_COLS)[:rows, :cols]


# ---- quantization -----------------------------------------------------------------------

@dataclass
class Quantized:
    """One operand in a block-scaled format, as the kernels read it."""

    elements: torch.Tensor  # rows x K_pad (e4m3) or rows x K_pad/2 (packed e2m1, uint8)
    scales: torch.Tensor  # flat blocked layout: uint8 e8m0 bits (MX) or float8_e4m3fn
    tensor_scale: torch.Tensor  # 0-d fp32 (1.0 for MX)
    rows: int
    k: int  # K_pad


def quantize(x: torch.Tensor, dtype: str) -> Quantized:
    """Quantize fp32 rows x K values to `dtype` (the module docstring's recipes)."""
    d = DTYPES[dtype]
    rows, k = x.shape
    kp = padded_k(k, dtype)
    if kp != k:
        x = torch.nn.functional.pad(x, (0, kp - k))
    blocks = x.view(rows, kp // d.block, d.block)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    fmt = element_format(dtype)
    one = torch.ones((), dtype=torch.float32, device=x.device)
    if d.tensor_scale:  # NVFP4: e4m3 block scales under an fp32 tensor scale
        t_scale = (x.abs().amax() / (E4M3_MAX * E2M1_MAX)).clamp_min(1e-30).float()
        s = (amax / E2M1_MAX / t_scale).to(torch.float8_e4m3fn)
        s_val = s.float() * t_scale
        scale_bytes = s.squeeze(-1)
    else:  # MX: a power of two, floor(log2(amax)) - emax, stored as e8m0 (biased byte)
        t_scale = one
        e = torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - EMAX[fmt]
        e = e.clamp(-E8M0_BIAS, E8M0_BIAS)
        s_val = torch.exp2(e)
        scale_bytes = (e + E8M0_BIAS).to(torch.uint8).squeeze(-1)
    # An all-zero block (or an NVFP4 block scale that rounds to 0) stores zeros.
    q = torch.where(s_val > 0, blocks / s_val.clamp_min(2.0**-149), torch.zeros_like(blocks))
    q = q.view(rows, kp)
    if fmt == "e4m3":
        elements = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    else:
        elements = pack_fp4(encode_e2m1(q))
    return Quantized(elements, to_blocked(scale_bytes), t_scale.reshape(()), rows, kp)


def scale_values(q: Quantized, dtype: str) -> torch.Tensor:
    """rows x K_pad/g block scales as float64 values (per-tensor scale not applied)."""
    d = DTYPES[dtype]
    s = from_blocked(q.scales, q.rows, q.k // d.block)
    if d.scale == torch.float8_e4m3fn:
        return s.double()
    return torch.exp2(s.double() - E8M0_BIAS)


def dequantize(q: Quantized, dtype: str) -> torch.Tensor:
    """The values a Quantized operand stands for, rows x K_pad in float64."""
    d = DTYPES[dtype]
    if element_format(dtype) == "e4m3":
        vals = q.elements.double()
    else:
        vals = decode_e2m1(unpack_fp4(q.elements))
    scales = scale_values(q, dtype).repeat_interleave(d.block, dim=1)
    return vals * scales * q.tensor_scale.double()


def _meta_operand(rows: int, k: int, dtype: str) -> Quantized:
    """Shapes and dtypes only (inspect binds launches to "meta" tensors, no values)."""
    d = DTYPES[dtype]
    kp = padded_k(k, dtype)
    cols = kp * d.element_bits // 8
    scale_dtype = torch.float8_e4m3fn if d.tensor_scale else torch.uint8
    return Quantized(torch.empty(rows, cols, dtype=d.storage, device="meta"),
                     torch.empty(blocked_size(rows, kp // d.block), dtype=scale_dtype,
                                 device="meta"),
                     torch.empty((), device="meta"), rows, kp)


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> dict:
    """A (M x K) and B (K x N, stored as N x K and viewed transposed) in `dtype`.

    Values are N(0, 1) x K^-1/4 with a few rows and columns scaled up and down by 2^+-6:
    blocks of very different magnitudes, so the scales really differ from block to block
    and a kernel that applies the wrong one (or none) is caught."""
    m, n, k = shape["M"], shape["N"], shape["K"]
    if device == "meta":
        qa, qb = _meta_operand(m, k, dtype), _meta_operand(n, k, dtype)
    else:
        qa = quantize(_values(m, k, seed, device), dtype)
        qb = quantize(_values(n, k, seed + 1, device), dtype)
    return {"A": qa.elements, "B": qb.elements.t(), "sa": qa.scales, "sb": qb.scales,
            "ga": qa.tensor_scale, "gb": qb.tensor_scale, "dtype": dtype, "K": k}


def _values(rows: int, k: int, seed: int, device: str) -> torch.Tensor:
    g = generator(seed, device)
    x = torch.randn((rows, k), generator=g, device=device) * k ** -0.25
    # Magnitudes spread over 2^-6 .. 2^6 per 32 elements (the MX block, two NVFP4
    # blocks), a different pattern per operand.
    spread = torch.randint(-6, 7, (rows, -(-k // 32)), generator=g, device=device)
    return x * torch.exp2(spread.float()).repeat_interleave(32, dim=1)[:, :k]


def operands(inputs: dict, dtype: str) -> tuple[Quantized, Quantized]:
    """(A, B^T) of a case's inputs as Quantized operands (rows x K each)."""
    a, bt = inputs["A"], inputs["B"].t()
    kp = padded_k(inputs["K"], dtype)
    return (Quantized(a, inputs["sa"], inputs["ga"], a.shape[0], kp),
            Quantized(bt, inputs["sb"], inputs["gb"], bt.shape[0], kp))


def reference(inputs: dict, dtype: str) -> torch.Tensor:
    """float64 A B from the dequantized stored operands: only the product is judged."""
    qa, qb = operands(inputs, dtype)
    return dequantize(qa, dtype) @ dequantize(qb, dtype).t()


def nbytes(shape: Shape, dtype: str) -> int:
    """Compulsory bytes: both operands as stored (operand_bytes) + the bf16 output."""
    m, n, k = shape["M"], shape["N"], shape["K"]
    return operand_bytes(m, k, dtype) + operand_bytes(n, k, dtype) + 2 * m * n
