"""FLOP and byte formulas against hand-counted cases (docs/design.md)."""

import pytest

from kernels import REGISTRY


@pytest.mark.parametrize("name,shape,dtype,flops,nbytes", [
    # add/mul: 1 FLOP per element; read x and y, write out: 3 n b.
    ("add", {"n": 1000}, "fp32", 1000, 3 * 1000 * 4),
    ("mul", {"n": 10}, "bf16", 10, 3 * 10 * 2),
    ("add", {"n": 8}, "fp8", 8, 3 * 8 * 1),
    # gelu tanh: 9 FLOPs per element; erf: 5. Read x, write out: 2 n b.
    ("gelu", {"n": 100}, "fp16", 900, 2 * 100 * 2),
    ("gelu_erf", {"n": 100}, "fp32", 500, 2 * 100 * 4),
    # dot: 2n FLOPs; 2 n b in plus the output scalar (bf16 for fp8 inputs).
    ("dot", {"n": 1 << 20}, "fp32", 2 << 20, 2 * (1 << 20) * 4 + 4),
    ("dot", {"n": 100}, "fp8e5", 200, 2 * 100 + 2),
    # matvec 3x5: 30 FLOPs; A (15) and x (5) in, y (3) out.
    ("matvec", {"M": 3, "K": 5}, "fp32", 30, (15 + 5) * 4 + 3 * 4),
    ("matvec", {"M": 4096, "K": 4096}, "fp8", 2 * 4096 * 4096,
     (4096 * 4096 + 4096) * 1 + 4096 * 2),
    # matmul 2x3x4: 2*2*3*4 = 48; A 2x4, B 4x3 in, C 2x3 out.
    ("matmul", {"M": 2, "N": 3, "K": 4}, "fp16", 48, (8 + 12) * 2 + 6 * 2),
    ("matmul", {"M": 2, "N": 3, "K": 4}, "tf32", 48, (8 + 12) * 4 + 6 * 4),
    ("matmul", {"M": 8192, "N": 8192, "K": 8192}, "fp8", 2 * 8192**3,
     2 * 8192 * 8192 * 1 + 8192 * 8192 * 2),
])
def test_counts(name, shape, dtype, flops, nbytes):
    spec = REGISTRY[name]
    assert spec.flops(shape, dtype) == flops
    assert spec.nbytes(shape, dtype) == nbytes


def test_h100_bf16_ridge_is_about_295():
    from contract.devices import DEVICES

    assert DEVICES["h100"].ridge("bf16") == pytest.approx(295.3, abs=0.5)
    assert DEVICES["h200"].ridge("bf16") == pytest.approx(206.1, abs=0.5)
    assert DEVICES["h100"].ridge("fp8e5") == DEVICES["h100"].ridge("fp8")


def test_matmul_8192_intensity_is_past_the_h100_ridge():
    spec = REGISTRY["matmul"]
    shape = {"M": 8192, "N": 8192, "K": 8192}
    ai = spec.flops(shape, "bf16") / spec.nbytes(shape, "bf16")
    assert ai == pytest.approx(2 * 8192 / 6, rel=1e-9)  # 2MNK / (3 x 2 bytes x 8192^2)
    assert ai > 295


def test_roof_classes():
    assert REGISTRY["matmul"].roof_class("fp8e5") == "fp8"
    assert REGISTRY["matmul"].roof_class("tf32") == "tf32"
    assert REGISTRY["add"].roof_class("bf16") == "fp32"  # vector units, whatever the storage
