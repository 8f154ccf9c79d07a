"""The training step, measured (`python -m roofline plan --measure step`): a real model
with the planner's parameter count, FLOPs counted against the formulas, memory by
category, the slice extrapolation, and bad input refused before anything runs."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from benches.step import measure as step_mod
from benches.step.measure import measure_step
from benches.step.profile import CATEGORIES, category
from benches.step.transformer import StepError, Transformer, parameter_count
from contract.models import PRESETS, ModelShape
from roofline.__main__ import main as roofline_main
from roofline.plan.arithmetic import attention_score_flops
from roofline.plan.step import step_report
from roofline.plan.step_records import StepMeasurement
from tests.test_plan import ROOT

TINY = ModelShape("tiny", d_model=64, n_layers=2, d_ff=256, vocab=1000, seq_len=32,
                  heads=4, kv_heads=4, tied=False)
TINY_ARGS = ["plan", "--d-model", "64", "--layers", "2", "--heads", "4", "--d-ff", "256",
             "--vocab", "1000", "--seq-len", "32", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny() -> dict:
    return measure_step(TINY, 2, "cpu", "fp32", steps=2)


@pytest.mark.parametrize("name", list(PRESETS))
def test_the_model_has_the_planners_parameter_count(name):
    with torch.device("meta"):
        model = Transformer(PRESETS[name])
    assert parameter_count(model) == PRESETS[name].params


@pytest.mark.parametrize("shape", [
    TINY,
    ModelShape("gqa", 96, 3, 200, 500, 16, 6, 2, tied=True, gated=True),
    ModelShape("gpt", 64, 2, 256, 300, 16, 4, 4, tied=True, bias=True, learned_pos=True,
               norm_params=2),
])
def test_small_models_too(shape):
    assert parameter_count(Transformer(shape)) == shape.params


def test_forward_gemm_flops_are_2_x_gemm_params_x_tokens(tiny):
    tokens = 2 * TINY.seq_len
    assert tiny["flops_forward"]["gemm"] == 2 * TINY.matmul_params * tokens
    # Attention by its formula, causal: Q K^T and the weighted sum of V, 2 T^2 hd each
    # per head and sequence over the whole square, half of it kept by the mask.
    hd, T = TINY.head_dim, TINY.seq_len
    assert tiny["flops_forward"]["attention"] == \
        TINY.n_layers * 2 * TINY.heads * 2 * (2 * T**2 * hd) // 2
    assert tiny["attention_counting"] == "causal"


def test_backward_gemms_are_twice_the_forward(tiny):
    assert tiny["flops_backward"]["gemm"] == 2 * tiny["flops_forward"]["gemm"]


def test_memory_categories_add_up(tiny):
    mem, n = tiny["memory"], TINY.params
    assert mem["parameters"] == 4 * n and mem["gradients"] == 4 * n
    assert mem["optimizer_state"] == 8 * n  # AdamW m and v in fp32
    assert 0 < mem["activations_in_blocks"] <= mem["activations"]
    assert mem["weight_casts"] == 0  # fp32: no autocast, no copies
    n_tensors = sum(1 for _ in Transformer(TINY).parameters())
    assert mem["optimizer_step_counters"] <= 8 * n_tensors  # one scalar per tensor


def test_time_and_profile(tiny):
    assert tiny["time_ms"]["n"] == 2 and tiny["time_ms"]["median"] > 0
    prof = tiny["profile_ms"]
    assert prof["gemm"] > 0 and prof["optimizer"] > 0
    assert set(prof) == set(CATEGORIES)


def test_the_missing_sdpa_count_is_said(tiny):
    assert any("scaled_dot_product_attention" in n for n in tiny["notes"])


@pytest.mark.parametrize("op, cat", [
    ("aten::addmm", "gemm"), ("aten::mm", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "gemm"),  # Hopper's cuBLAS
    # In this model batched matmuls and plain softmax are SDPA's math backend's.
    ("aten::bmm", "attention"), ("aten::_softmax", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_fused_adamw_", "optimizer"), ("aten::_foreach_mul_", "optimizer"),
    ("aten::nll_loss_forward", "loss"), ("aten::_log_softmax", "loss"),
    ("aten::native_layer_norm", "norms and elementwise"), ("aten::gelu", "norms and elementwise"),
    ("aten::view", "other"),
])
def test_categories(op, cat):
    assert category(op) == cat


def test_a_slice_extrapolates_linearly_to_the_whole_model(tiny, monkeypatch):
    real = step_mod._measure

    def timed(shape, n_blocks, *args, **kwargs):
        # Times fixed (1 ms for the embedding and head, +1 ms a block): on a busy host a
        # tiny model's blocks are lost in the noise, and such a slice is refused.
        m = real(shape, n_blocks, *args, **kwargs)
        return replace(m, time_ms=replace(m.time_ms, median=1.0 + n_blocks))

    monkeypatch.setattr(step_mod, "_measure", timed)
    part = measure_step(TINY, 2, "cpu", "fp32", measure_layers=1, steps=2)
    assert part["time_ms"]["median"] == pytest.approx(3.0)  # 1 + 2 x (2 - 1) / 1
    assert part["slice"]["blocks"] == 1 and part["measured_layers"] == 1
    # FLOPs and the training state grow by the same amount per block: exact.
    for key in ("flops_forward", "flops_backward"):
        for cat, v in tiny[key].items():
            assert part[key][cat] == pytest.approx(v, rel=1e-12), (key, cat)
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert part["memory"][cat] == pytest.approx(tiny["memory"][cat], rel=1e-12)
    assert part["params"] == TINY.params
    assert any("extrapolated as F(0) + 2 x (F(1) - F(0)) / 1" in n for n in part["notes"])


def test_a_category_the_blocks_add_nothing_to_is_not_extrapolated_below_zero(monkeypatch):
    """A category of the embedding and head (the loss, the head's GEMM) measured a little
    faster in the slice than alone, as noise does on a busy host: the line through the
    two would take it to base - 32 x the noise, a negative time, which crashed the step
    figure (matplotlib's log axis and marker sizes).  The blocks add no less than
    nothing."""
    real = step_mod._measure

    def noisy(shape, n_blocks, *args, **kwargs):
        m = real(shape, n_blocks, *args, **kwargs)
        return replace(m, time_ms=replace(m.time_ms, median=1.0 + n_blocks),
                       profile_ms={**m.profile_ms, "loss": 0.5 if n_blocks else 0.6,
                                   "attention": 0.3 * n_blocks})

    monkeypatch.setattr(step_mod, "_measure", noisy)
    whole = measure_step(TINY, 2, "cpu", "fp32", measure_layers=1, steps=2)
    assert whole["profile_ms"]["loss"] == pytest.approx(0.6)  # the base's, not 0.4
    assert whole["profile_ms"]["attention"] == pytest.approx(0.6)  # 0 + 2 x 0.3
    assert whole["time_ms"]["median"] == pytest.approx(3.0)


def test_gpt2_small_attention_term_is_nanogpts():
    """nanoGPT's estimate_mfu: flops_per_token = 6 N + 12 L H Q T."""
    s = PRESETS["gpt2-small"]
    L, H, Q, T = s.n_layers, s.heads, s.d_model // s.heads, s.seq_len
    assert attention_score_flops(s, 1.0) == 12 * L * H * Q * T
    m = {"tokens": 1024, "dtype": "bf16", "micro_batch": 1, "measured_layers": L,
         "time_ms": {"median": 100.0, "p20": 99.0, "p80": 101.0},
         "flops_forward": {"gemm": 1.0}, "flops_backward": {"gemm": 2.0},
         "flops_optimizer": {}, "profile_ms": {"gemm": 50.0},
         "memory": {"parameters": 1, "gradients": 1, "optimizer_state": 1,
                    "activations": 1}}
    r = step_report(s, StepMeasurement.from_json(m), 989.4, 16.0)
    per_token = 6 * s.params + 12 * L * H * Q * T
    assert r.mfu == pytest.approx(per_token * 1024 / 0.1 / 989.4e12)
    assert r.attention_per_token == 12 * L * H * Q * T


def test_report_checks_the_lectures_claims(tiny):
    r = step_report(TINY, StepMeasurement.from_json(tiny), 0.2, 16.0)
    assert r.gemm_backward_over_forward == 2.0
    assert r.bytes_per_param_measured == 16.0
    assert r.optimizer_bytes_per_param == 8.0
    assert r.counted_over_6n == pytest.approx(
        (tiny["flops_forward"]["gemm"] + tiny["flops_backward"]["gemm"]
         + tiny["flops_forward"]["attention"] + tiny["flops_backward"]["attention"])
        / (2 * TINY.seq_len) / (6 * TINY.params))
    assert r.hfu > 0 and r.mfu > 0
    assert math.isclose(sum(c.share for c in r.categories), 1.0, rel_tol=1e-9)


def test_the_cli_measures_a_step(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the CPU ceilings cache of results/.ceilings
    code = roofline_main([*TINY_ARGS, "--measure", "step", "--micro-batch", "2", "--steps",
                          "2", "--json", "--out", str(tmp_path / "p")])
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = json.loads(out.out)
    assert plan["mfu_source"] == "measured step"
    assert plan["mfu"] == plan["step_measured"]["report"]["mfu"]
    files = {f.name for f in (tmp_path / "p").iterdir()}
    assert {"plan.md", "plan.json", "step.png"} <= files
    md = (tmp_path / "p" / "plan.md").read_text()
    assert "Training step: FLOPs against the lecture's accounting" in md and "step.png" in md
    # Each of the step's GEMMs timed per call in the step's own profile: the table has
    # no dashes, and their time adds up to (at most) the step's GEMM category.
    assert all(g["ms"] and g["note"] == "profiled in the step" for g in plan["gemms"])
    assert "profiled inside the measured step" in plan["gemms_timed"]
    gemm_ms = plan["step_measured"]["report"]["categories"]
    gemm_ms = next(c["ms"] for c in gemm_ms if c["category"] == "gemm")
    assert 0.5 * gemm_ms < plan["step"]["ms"] <= gemm_ms * (1 + 1e-9)


@pytest.mark.parametrize("extra, needle", [
    (["--heads", "5"], "does not divide"),
    (["--heads", "4", "--kv-heads", "3"], "does not divide"),
    (["--seq-len", "0"], "seq-len"),
    (["--micro-batch", "0"], "micro-batch"),
    (["--measure-layers", "3"], "--measure-layers 3"),
    (["--gpu-memory-gb", "0.000001"], "does not fit|needs at least"),
])
def test_bad_step_input_is_one_line_exit_2_before_measuring(extra, needle, capsys,
                                                            monkeypatch):
    monkeypatch.setattr(step_mod, "measure_model",
                        lambda *a, **k: pytest.fail("measured despite bad input"))
    code = roofline_main([*TINY_ARGS, "--measure", "step", *extra, "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:")
    import re

    assert re.search(needle, err[0]), err[0]


def test_measure_layers_needs_measure_step(capsys):
    assert roofline_main([*TINY_ARGS, "--measure-layers", "1", "--no-save"]) == 2
    assert "--measure step" in capsys.readouterr().err


def test_step_error_is_a_plan_error():
    from roofline.plan.model import PlanError

    assert issubclass(StepError, PlanError)


def test_a_slice_lost_in_the_noise_is_refused_not_extrapolated(monkeypatch):
    """On a busy host a tiny slice can time no slower than the embedding and head alone;
    extrapolating the difference gave a negative step time (and a traceback further on,
    in the plan's arithmetic).  It is refused in one line instead."""
    real = step_mod._measure

    def noisy(shape, n_blocks, *args, **kwargs):
        m = real(shape, n_blocks, *args, **kwargs)
        # The slice measured faster than the base: what noise does to a tiny model.
        return replace(m, time_ms=replace(m.time_ms, median=1.0 if n_blocks else 2.0))

    monkeypatch.setattr(step_mod, "_measure", noisy)
    with pytest.raises(StepError, match="cannot be told from the noise") as e:
        measure_step(TINY, 2, "cpu", "fp32", measure_layers=1, steps=2)
    assert "\n" not in str(e.value)


def test_the_model_is_built_on_the_device_it_steps_on(monkeypatch):
    """Built on the host, every weight is drawn there serially and copied over (most of
    the GPU job's plan-step, docs/gpu-job.md): the model is built under the device."""
    built_on = []

    class Stop(Exception):
        pass

    def fake(shape, n_blocks):
        built_on.append(torch.get_default_device().type)
        raise Stop

    monkeypatch.setattr(step_mod, "Transformer", fake)
    with pytest.raises(Stop):
        step_mod.measure_model(PRESETS["gpt2-small"], 1, 1, "meta", "fp32")
    assert built_on == ["meta"]
