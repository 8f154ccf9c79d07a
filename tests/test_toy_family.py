"""A kernel family of new dimensions is one module plus one registry line: a toy family
(a sum over the last axis of an R x C x Z tensor, torch provider only) declared below as
its module would be, registered with one line, is swept at its own presets, checked
against float64, plotted, and ordered, with no other file knowing about it.  Also: the
readers of saved runs derive the kernel order and the compute kernels from the registry
without loading it at import."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import kernels
import run_bench
from benches.sweep.shapes import ShapeError, parse_sizes, preset_shapes, shapes_for
from contract.rows import canonical_order, compute_kernels, kernel_order, row_roof_class
from kernels.spec import DTYPES, Inputs, KernelSpec, Provider, Shape, ShapeGroup, randn
from tests.run_docs import doc_of, load_run

ROOT = Path(__file__).resolve().parent.parent

# ---- the family's module: its dimensions, presets, accounting, inputs, reference ----------

TOY_DTYPES = ("fp32", "bf16")

TOY_SHAPES = ShapeGroup(
    "toy",
    gpu={"quick": [{"R": 1024, "C": 1024, "Z": 64}],
         "default": [{"R": 1024, "C": 1024, "Z": 64}, {"R": 4096, "C": 4096, "Z": 16}],
         "full": [{"R": 1024, "C": 1024, "Z": 64}, {"R": 4096, "C": 4096, "Z": 64}]},
    cpu={"quick": [{"R": 4, "C": 8, "Z": 16}, {"R": 16, "C": 32, "Z": 64}],
         "default": [{"R": 64, "C": 64, "Z": 64}],
         "full": [{"R": 64, "C": 64, "Z": 64}, {"R": 256, "C": 256, "Z": 64}]},
)


def _make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    x = randn((shape["R"], shape["C"], shape["Z"]), seed, device)
    return {"x": x.to(DTYPES[dtype].storage)}


def _sum_z(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    return torch.sum(inputs["x"], dim=-1, out=out)


def _nbytes(shape: Shape, dtype: str) -> int:
    # x read once, the R x C sums written once.
    return (shape["R"] * shape["C"] * shape["Z"] + shape["R"] * shape["C"]) \
        * DTYPES[dtype].itemsize


TOY = KernelSpec(
    name="toy",
    family="toy",
    dims=("R", "C", "Z"),
    flops=lambda shape, dtype: shape["R"] * shape["C"] * (shape["Z"] - 1),
    nbytes=_nbytes,
    flops_formula="R C (Z - 1)  (one add per element but the first of each sum)",
    bytes_formula="(R C Z + R C) b",
    make_inputs=_make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty(inputs["x"].shape[:2],
                                                dtype=inputs["x"].dtype,
                                                device=inputs["x"].device),
    reference=lambda inputs, dtype: inputs["x"].double().sum(dim=-1),
    providers={"torch": Provider("torch", _sum_z, TOY_DTYPES, note="torch.sum over Z")},
    description="sum over the last axis of an R x C x Z tensor",
    shape_group=TOY_SHAPES,
)

# ---- the tests ---------------------------------------------------------------------------


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> KernelSpec:
    """The registry line: the toy family registered, after the built-in ones."""
    monkeypatch.setitem(kernels.REGISTRY, "toy", TOY)
    return TOY


def _off_by_one(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    """A deliberately wrong variant: the last element of each sum left out."""
    return torch.sum(inputs["x"][..., :-1], dim=-1, out=out)


def _wrong(spec: KernelSpec) -> KernelSpec:
    return replace(spec, providers={"torch": Provider("torch", _off_by_one, TOY_DTYPES)})


def test_the_toy_gets_its_own_presets_and_sizes(toy):
    assert preset_shapes(toy, "quick", on_gpu=False) == TOY_SHAPES.shapes("quick", False)
    assert preset_shapes(toy, "full", on_gpu=True)[-1] == {"R": 4096, "C": 4096, "Z": 64}
    # Its dimensions are parsed once it is registered: a whole shape, and one integer in
    # every dimension; the other families take none of its shapes.
    explicit = parse_sizes("R=2,C=3,Z=5;M=8,K=8;7")
    assert shapes_for(toy, "", False, explicit) == [{"R": 2, "C": 3, "Z": 5},
                                                     {"R": 7, "C": 7, "Z": 7}]
    assert shapes_for(kernels.REGISTRY["matvec"], "", False, explicit) == [
        {"M": 8, "K": 8}, {"M": 7, "K": 7}]
    with pytest.raises(ShapeError, match="R=...,C=...,Z=..."):
        parse_sizes("R=2,C=3")


def test_sizes_come_from_the_spec_not_from_its_dimensions():
    # A family with matmul's dimensions does not get matmul's sizes: it names its group.
    group = ShapeGroup("mnk", gpu={p: [{"M": 8, "N": 8, "K": 8}] for p in ("quick", "default",
                                                                         "full")},
                       cpu={p: [{"M": 2, "N": 3, "K": 4}] for p in ("quick", "default", "full")})
    other = replace(kernels.REGISTRY["matmul"], name="mnk", shape_group=group)
    assert preset_shapes(other, "default", on_gpu=False) == [{"M": 2, "N": 3, "K": 4}]
    # Without the toy registered its dimensions are no shape.
    with pytest.raises(ShapeError, match="bad shape"):
        parse_sizes("R=2,C=3,Z=5")


def test_a_spec_must_declare_fitting_presets():
    with pytest.raises(ValueError, match="does not fit dims"):
        replace(TOY, dims=("R", "C"))
    with pytest.raises(ValueError, match="no CPU shapes for full"):
        ShapeGroup("bad", gpu=TOY_SHAPES.gpu, cpu={"quick": [{"R": 1}], "default": [{"R": 1}]})
    with pytest.raises(ValueError, match="declares no shape group"):
        kernels.checked([replace(TOY, shape_group=None)])
    with pytest.raises(ValueError, match="registered twice"):
        kernels.checked([TOY, TOY])


def test_float64_check_passes_and_a_wrong_variant_fails():
    for dtype in TOY_DTYPES:
        inputs = TOY.make_inputs({"R": 4, "C": 8, "Z": 16}, dtype, 0, "cpu")
        out = TOY.alloc_out(inputs, dtype)
        good = TOY.check(TOY.providers["torch"].fn(inputs, out), inputs, dtype)
        bad = TOY.check(_off_by_one(inputs, out), inputs, dtype)
        assert good <= DTYPES[dtype].tol < bad, (dtype, good, bad)


def test_the_toy_is_swept_checked_and_plotted(toy, tmp_path):
    code = run_bench.main(["--device", "cpu", "--kernels", "toy", "--providers", "torch",
                           "--dtypes", ",".join(TOY_DTYPES), "--sizes", "quick",
                           "--run-budget", "2", "--out", str(tmp_path), "--run-id", "t"])
    assert code == 0
    run = tmp_path / "cpu" / "t"
    meta, df = load_run(run)
    assert set(df["kernel"]) == {"toy"} and (df["status"] == "ok").all(), df
    assert df["correct"].all() and (df["rel_err"] <= df["tolerance"]).all()
    assert set(df["shape"]) == {"R=4,C=8,Z=16", "R=16,C=32,Z=64"}  # its own CPU presets
    assert (df["roof_class"] == "fp32").all()  # not a matrix-unit kernel
    assert (run / "roofline.png").stat().st_size > 0 and (run / "scaling.png").exists()

    from roofline.report.plot import plot_roofline

    fig = plot_roofline(doc_of(meta, df))
    points = {c.get_gid(): len(c.get_offsets()) for ax in fig.axes for c in ax.collections}
    for dtype in TOY_DTYPES:  # a CPU times warm: the gid ends in ":warm"
        assert points[f"points:{dtype}:toy:torch:warm"] == (df["dtype"] == dtype).sum()
    assert "toy" in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_wrong_toy_fails_its_check(monkeypatch, tmp_path):
    monkeypatch.setitem(kernels.REGISTRY, "toy", _wrong(TOY))
    code = run_bench.main(["--device", "cpu", "--kernels", "toy", "--providers", "torch",
                           "--dtypes", "fp32", "--sizes", "R=4,C=8,Z=16", "--check-only",
                           "--out", str(tmp_path), "--run-id", "w"])
    assert code == 1
    _, df = load_run(tmp_path / "cpu" / "w")
    (row,) = df.itertuples()
    assert row.status == "failed" and not row.correct and "tolerance" in row.reason


def test_order_and_compute_kernels_follow_the_registry(toy, monkeypatch):
    # The registry's order, the sweep's: a new family's line comes after the others.
    assert kernel_order() == tuple(kernels.REGISTRY) == (
        "add", "mul", "gelu", "gelu_erf", "dot", "matvec", "matmul", "softmax", "layernorm",
        "rmsnorm", "attention", "attention_bwd", "toy")
    assert compute_kernels() == {"matmul", "attention", "attention_bwd"}
    # An older run's kernel the registry no longer has goes last.
    assert canonical_order(["retired", "toy", "matmul", "add"], kernel_order()) == [
        "add", "matmul", "toy", "retired"]
    assert row_roof_class("toy", "bf16") == "fp32"
    monkeypatch.setitem(kernels.REGISTRY, "toy", replace(TOY, matrix_unit=True))
    assert "toy" in compute_kernels() and row_roof_class("toy", "bf16") == "bf16"


def test_readers_of_saved_runs_do_not_load_the_registry_at_import():
    code = """
import json, sys
import benches.sweep.shapes, roofline.gate.cli, roofline.report.findings
import roofline.report.plot, roofline.report.plot_devices, roofline.report.plot_scaling
import roofline.report.summary
before = sorted(m for m in sys.modules if m.startswith("kernels."))
from contract.rows import kernel_order
order = kernel_order()
print(json.dumps([before, "kernels.triton_utils" in sys.modules, order[0]]))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, loaded_after, first = json.loads(out.stdout.splitlines()[-1])
    # No family, no Triton kernel: the spec and the JSON shapes of shipped configs only.
    assert before == ["kernels.shape_groups", "kernels.shipped_json", "kernels.spec"]
    assert loaded_after and first == "add"
