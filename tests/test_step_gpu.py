"""The measured step's numbers on a GPU, held on this CPU: causal attention counted as
what it computes (torch's flop counter over meta tensors of the fused SDPA ops), every
category held to the device's peak, MFU and HFU each with its convention, the step's
peak memory against the device's with what would fit, and the step's GEMMs timed from
its profile.  The H200's own measurement of a Llama-3-8B step (plan --measure step
--measure-layers 1, plan.json's "measurement" as written, before the causal count) is
the fixture: tests/data/h200-llama3-8b-step.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from benches.step.flops import flop_counter
from benches.step.kernel_split import gemm_calls
from contract.devices import DEVICES, Present
from contract.models import PRESETS
from roofline.plan.arithmetic import step_gemms
from roofline.plan.harness import Harness
from roofline.plan.plan_record import Plan
from roofline.plan.plan_request import EfficiencyRequest, ModelRequest, PlanRequest
from roofline.plan.plan_text import sections
from roofline.plan.planner import build_plan
from roofline.plan.step import (
    gemms_from_step,
    memory_fit,
    step_report,
    step_sections,
)
from roofline.plan.step_records import StepMeasurement, StepReport
from tests.test_step_accounting import Events

FIXTURE = Path(__file__).resolve().parent / "data" / "h200-llama3-8b-step.json"
LLAMA = PRESETS["llama3-8b"]
PEAK = DEVICES["h200"].peak("bf16")  # 989.4 TFLOP/s dense, datasheet
H200_BYTES = 141e9


def recorded() -> dict:
    return json.loads(FIXTURE.read_text())


def sdpa_flops(counter: FlopCounterMode, op: str, shape: tuple[int, ...], causal: bool
               ) -> tuple[int, int]:
    """(forward, backward) FLOPs `counter` counts for one fused SDPA call and its
    backward (flash) on meta tensors: nothing is computed, only counted."""
    q = torch.empty(shape, device="meta", dtype=torch.bfloat16)
    aten = torch.ops.aten
    with counter:
        if op == "flash":
            out = aten._scaled_dot_product_flash_attention(q, q, q, 0.0, causal)
            fwd = counter.get_total_flops()
            aten._scaled_dot_product_flash_attention_backward(
                out[0], q, q, q, out[0], out[1], out[2], out[3], out[4], out[5], 0.0,
                causal, out[6], out[7])
        elif op == "efficient":
            aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, causal)
            fwd = counter.get_total_flops()
        else:
            aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, causal)
            fwd = counter.get_total_flops()
    return fwd, counter.get_total_flops() - fwd


@pytest.mark.parametrize("op", ["flash", "efficient", "cudnn"])
def test_fused_causal_attention_counts_half_the_square(op):
    """torch's counter alone counts every fused SDPA call as the full square."""
    shape = (2, 4, 256, 64)
    full = sdpa_flops(FlopCounterMode(display=False), op, shape, causal=True)
    causal = sdpa_flops(flop_counter(), op, shape, causal=True)
    plain = sdpa_flops(flop_counter(), op, shape, causal=False)
    assert full[0] == 4 * 2 * 4 * 256**2 * 64  # q k^T and P v, the whole square
    assert causal == (full[0] // 2, full[1] // 2)
    assert plain == full


def recounted() -> dict:
    """The H200's measurement with its attention counted as the causal counter counts
    the slice's one block (1 x 32 heads x 8192 x 128), 32 blocks."""
    m = recorded()
    fwd, bwd = sdpa_flops(flop_counter(), "flash", (1, LLAMA.heads, LLAMA.seq_len,
                                                    LLAMA.head_dim), causal=True)
    m["flops_forward"]["attention"] = LLAMA.n_layers * fwd
    m["flops_backward"]["attention"] = LLAMA.n_layers * bwd
    m["attention_counting"] = "causal"
    return m


def test_the_h200_recorded_the_full_square_twice_what_ran():
    m, r = recorded(), recounted()
    for k in ("flops_forward", "flops_backward"):
        assert m["slice"]["measured"][k]["attention"] == 2 * r[k]["attention"] / 32
        assert m[k]["attention"] == 2 * r[k]["attention"]


def split_rates(report: StepReport) -> dict[str, str]:
    """The TFLOP/s cell of each row of the time-by-kind-of-work table, as printed."""
    [(_, header, rows)] = [s for s in step_sections(report, str, str) if "kind of work"
                           in s[0]]
    return {row[0]: row[header.index("TFLOP/s")] for row in rows}


def test_every_category_is_held_to_the_peak():
    # As recorded: attention at 1.06e3 TFLOP/s, over the 989.4 peak: flagged.
    r = step_report(LLAMA, StepMeasurement.from_json(recorded()), PEAK, 16.0, H200_BYTES)
    assert [c.category for c in r.categories if c.over_peak] == ["attention"]
    cells = split_rates(r)
    assert cells["attention"] == "accounting error: 1.06e+03 > peak 989.4"
    # Counted causal, every category is a rate this device can run.
    r = step_report(LLAMA, StepMeasurement.from_json(recounted()), PEAK, 16.0, H200_BYTES)
    rates = {c.category: c.tflops for c in r.categories if c.tflops}
    assert set(rates) == {"gemm", "attention"}
    assert all(t <= PEAK for t in rates.values()) and not any(
        c.over_peak for c in r.categories)
    assert rates["attention"] == pytest.approx(529.2, abs=0.1)
    assert split_rates(r)["attention"] == "529"


def test_mfu_and_hfu_each_with_its_convention():
    r = step_report(LLAMA, StepMeasurement.from_json(recounted()), PEAK, 16.0, H200_BYTES)
    n, t_s, tokens = float(LLAMA.params), r.step_ms / 1e3, 8192
    L, H, Q, T = LLAMA.n_layers, LLAMA.heads, LLAMA.head_dim, LLAMA.seq_len
    # PaLM's model FLOPs count the full square; the causal one half of it.
    assert r.mfu == pytest.approx((6 * n + 12 * L * H * Q * T) * tokens / t_s / (PEAK * 1e12))
    assert r.mfu_causal == pytest.approx((6 * n + 6 * L * H * Q * T) * tokens / t_s
                                            / (PEAK * 1e12))
    counted = sum(recounted()["flops_forward"].values()) + \
        sum(recounted()["flops_backward"].values())
    assert r.hfu == pytest.approx(counted / t_s / (PEAK * 1e12))
    assert (round(r.mfu, 3), round(r.mfu_causal, 3), round(r.hfu, 3)) == \
        (0.613, 0.549, 0.528)
    speed = {row[0]: row for row in step_sections(r, str, str)[1][2]}
    assert "full T x T square" in speed["MFU (PaLM: 6N + 12 L H Q T)"][2]
    assert "half the square" in speed["HFU (counted FLOPs)"][2]
    assert "6 N + 6 L H Q T" in speed["MFU (6N + causal attention)"][2]


def test_the_h200_steps_peak_does_not_fit_and_what_would():
    m = recorded()
    f = memory_fit(LLAMA, StepMeasurement.from_json(m), H200_BYTES)
    mem = m["memory"]
    state = mem["parameters"] + mem["gradients"] + mem["optimizer_state"]
    assert (f.fits, round(f.peak / 1e9, 1)) == (False, 176.9)
    # Checkpointing: the blocks' activations go, 32 fp32 block inputs and one block's
    # activations come: 130 GB, under 141.
    blocks = mem["activations_in_blocks"]
    assert f.checkpointing == pytest.approx(
        mem["peak_allocated"] - blocks + 32 * 8192 * 4096 * 4 + blocks / 32)
    assert f.checkpointing_fits and round(f.checkpointing / 1e9) == 130
    # FSDP: the 128 GB of state over 2 GPUs, the other 48 GB per GPU: 113 GB.
    assert f.fsdp_gpus == 2
    assert f.fsdp_peak == pytest.approx(state / 2 + mem["peak_allocated"] - state)
    # No smaller micro-batch: the state and the weight casts alone are 143 GB.
    assert (f.micro_batch, f.seq_len) == (None, None)
    assert f.fixed == pytest.approx(state + mem["weight_casts"])
    rows = {row[0]: row for row in step_sections(step_report(
        LLAMA, StepMeasurement.from_json(m), PEAK, 16.0, H200_BYTES), lambda x: f"{x:.3g}",
        lambda x: f"{x / 1e9:.3g} GB")[2][2]}
    assert rows["fits in the device's memory"][1] == "NO: 177 GB > 141 GB"
    assert rows["with FSDP over 2 GPUs"][1] == "113 GB"
    assert rows["with activation checkpointing"][2].startswith("fits")
    assert rows["with a smaller micro-batch"][2].startswith("does NOT fit")


@pytest.mark.parametrize("device_gb, expect", [
    (200.0, {"fits": True}),
    # 160 GB: 16.5 GB beside the state and casts, 4.07 MB a token: 4044 tokens.
    (160.0, {"fits": False, "micro_batch": None, "seq_len": 4047}),
])
def test_what_fits_by_the_device_memory(device_gb, expect):
    f = memory_fit(LLAMA, StepMeasurement.from_json(recorded()), device_gb * 1e9)
    assert {k: getattr(f, k) for k in expect} == expect


def h200_plan(monkeypatch, measurement: dict) -> Plan:
    """build_plan on a faked H200 with the step's measurement given back."""
    import contract.devices

    h200 = Present("h200", "NVIDIA H200", "cuda", (9, 0), 132, 50.0, 141.0)
    monkeypatch.setattr(contract.devices, "detect", lambda: h200)
    request = PlanRequest(model=ModelRequest(preset="llama3-8b"),
                          efficiency=EfficiencyRequest(measure="step", measure_layers=1))
    return build_plan(request, log=lambda msg: None,
                      harness=Harness(measure_step=lambda *a: copy.deepcopy(measurement)))


def test_the_plan_holds_the_static_fit_to_the_measured_peak(monkeypatch):
    plan = h200_plan(monkeypatch, recounted())
    tables = {title: rows for title, _, rows in sections(plan)}
    static = next(r for r in tables["Memory (bf16-master)"] if r[0] == "static bytes (N x B)")
    assert static[2] == ("fits in 1 x 141 GB (the state alone; the measured step peaks at "
                         "177 GB: does NOT fit)")
    assert "PaLM's 6 N + 12 L H Q T" in plan.mfu_from


def test_a_step_measured_without_gemm_times_says_why(monkeypatch):
    """The H200's measurement predates the step's GEMM times: the table says so."""
    plan = h200_plan(monkeypatch, recounted())
    [title] = [t for t, _, _ in sections(plan) if t.startswith("GEMMs of one step")]
    assert "not timed one by one" in title
    assert all(g.ms is None for g in plan.gemms)


def test_gemms_on_a_gpu_are_timed_by_shape_and_pass():
    """The profile of a forward and backward on a GPU: each mm's kernels (cuBLAS may
    launch two) summed per op, keyed by pass and shape, the weight gradient's output
    transposed against the planner's."""
    ev = Events()
    t, d, n = 8192, 4096, 6144
    fwd = ev.op("aten::mm", ev.op("aten::matmul", ev.op("aten::linear")))
    fwd.input_shapes = [[t, d], [d, n]]
    ev.kernel("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT", 400.0, fwd)
    node = ev.op("MmBackward0", ev.op("autograd::engine::evaluate_function: MmBackward0"))
    dx = ev.op("aten::mm", node)
    dx.input_shapes = [[t, n], [n, d]]
    ev.kernel("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NTN", 410.0, dx)
    dw = ev.op("aten::mm", node)
    dw.input_shapes = [[n, t], [t, d]]
    ev.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_splitk", 380.0, dw)
    ev.kernel("void cublasLt::splitKreduce_kernel<...>", 20.0, dw)
    calls = gemm_calls(ev.events, on_gpu=True)
    assert calls == {"forward 6144x8192 K=4096": {"ms": 0.4, "calls": 1},
                     "backward 4096x8192 K=6144": {"ms": 0.41, "calls": 1},
                     "backward 4096x6144 K=8192": {"ms": 0.4, "calls": 1}}
    qkv = [g for g in step_gemms(LLAMA, 1) if g.name == "attn.qkv"]
    how = gemms_from_step(qkv, calls, PEAK)
    assert how == "ms per call, profiled inside the measured step"
    assert [g.ms for g in qkv] == [0.4, 0.41, 0.4]
    assert qkv[0].tflops == pytest.approx(2 * t * n * d / 0.4e-3 / 1e12)


def test_step_png_flags_a_category_over_the_peak(monkeypatch):
    from roofline.plan.step_plot import plot_step

    fig = plot_step(h200_plan(monkeypatch, recorded()))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(lb.startswith("attention") and "accounting error: 1.06e+03 > peak 989.4" in lb
               for lb in labels), labels
    assert any(lb.startswith("gemm") and lb.endswith("813 TFLOP/s") for lb in labels), labels
