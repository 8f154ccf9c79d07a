"""`python -m roofline plan`: the worked examples of docs/plan.md to within 2%,
the parameter/FLOP/byte accounting it rests on, measured and run-derived MFU, outputs,
and one-line errors for bad input."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benches.measured_ceilings import device_ceilings
from contract.models import PRESETS
from roofline.__main__ import main as roofline_main
from roofline.plan.arithmetic import (
    GPU_MEMORY_GB,
    Gemm,
    device_memory_bytes,
    matrix_bytes,
    step_gemms,
    summarize_step,
    train_flops,
)
from roofline.plan.cli import main
from roofline.plan.plan_request import EfficiencyRequest, ModelRequest, PlanRequest
from roofline.plan.planner import build_plan
from roofline.plan.sources import peak_of

ROOT = Path(__file__).resolve().parent.parent

def run_plan(capsys, *argv: str) -> dict[str, Any]:
    code = main([*argv, "--json", "--no-save"])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def close(got: float, want: float, rel: float = 0.02) -> bool:
    return abs(got - want) <= rel * abs(want)


# ---- worked examples (docs/plan.md) ---------------------------------------------


def test_70b_on_15t_tokens_on_1024_h100_takes_about_144_days(capsys):
    p = run_plan(capsys, "--params", "70e9", "--tokens", "15e12", "--gpus", "1024",
                 "--device", "h100", "--mfu", "0.5")
    assert close(p["train_flops"], 6.3e24, 1e-9)
    assert close(p["days"], 144.0)
    assert p["peak_tflops"] == 989.4 and p["mfu"] == 0.5 and p["mfu_source"] == "assumed"
    for key in ("params", "tokens", "train_flops", "gpus", "peak_tflops", "mfu", "mfu_source",
                "days", "bytes_per_param", "static_bytes", "max_params_fit", "gemms"):
        assert key in p
    # Twice the GPUs halve the time; twice the MFU too.
    q = run_plan(capsys, "--params", "70B", "--tokens", "15T", "--gpus", "2048",
                 "--device", "h100", "--mfu", "0.5")
    assert close(q["days"], 72.0)


@pytest.mark.parametrize("bpp,want", [(12, 53.3e9), (16, 40e9)])
def test_most_parameters_that_fit_in_8_h100(capsys, bpp, want):
    p = run_plan(capsys, "--gpus", "8", "--device", "h100", "--bytes-per-param", str(bpp))
    assert close(p["max_params_fit"], want)
    assert p["bytes_per_param"] == bpp


def test_32_h100_for_two_weeks_trains_12_6b_on_253b_tokens(capsys):
    p = run_plan(capsys, "--gpus", "32", "--days", "14", "--device", "h100", "--mfu", "0.5")
    b = p["budget"]
    assert close(b["flops"], 32 * 989.4e12 * 0.5 * 14 * 86400, 1e-9)
    assert close(b["max_params_compute_optimal"], 12.6e9)
    assert close(b["tokens_compute_optimal"], 253e9)
    assert b["tokens_compute_optimal"] == pytest.approx(20 * b["max_params_compute_optimal"])
    assert b["fits_compute_optimal"] is True  # 12.6B x 16 B = 202 GB << 32 x 80 GB


def test_the_plan_document_keeps_its_keys_in_order(capsys):
    """plan.json's readers (plan_text.py, gemm_plot.py, step_plot.py, scripts) see the same
    document whatever steps build it: its keys, their order, the budget's optional ones."""
    p = run_plan(capsys, "--preset", "llama3-8b", "--gpus", "32", "--days", "14")
    assert list(p) == [
        "model", "params", "tokens", "tokens_source", "train_flops", "flops_forward",
        "flops_backward", "attention_flops", "device", "device_name", "dtype", "gpus",
        "peak_tflops", "peak_source", "mfu", "mfu_source", "mfu_from", "days",
        "days_with_attention", "budget", "versus", "policy", "bytes_per_param_itemized",
        "bytes_per_param", "static_bytes", "gpu_memory_bytes", "gpu_memory_source",
        "total_memory_bytes", "fits", "max_params_fit", "micro_batch", "step", "gemms",
        "gemms_timed", "warnings", "communication"]
    optimal = ["days", "flops", "max_params_compute_optimal", "tokens_compute_optimal"]
    fit = ["static_bytes_compute_optimal", "fits_compute_optimal"]
    assert list(p["budget"]) == [*optimal, "tokens_for_this_model", *fit]
    assert p["tokens_source"] == "the --days budget (6 N D = budget)"
    assert p["tokens"] == p["budget"]["tokens_for_this_model"]
    # No model: what the budget trains, and whether that fits, but no tokens of its own.
    assert list(run_plan(capsys, "--gpus", "8", "--days", "1")["budget"]) == [*optimal, *fit]


@pytest.mark.parametrize("d,layers,want", [(2048, 24, 1.21e9), (1024, 12, 150.9e6)])
def test_12_d2_l_approximation(capsys, d, layers, want):
    p = run_plan(capsys, "--d-model", str(d), "--layers", str(layers))
    m = p["model"]
    assert close(m["params_12d2l"], want)
    # 4 d^2 attention + 2 d (4 d) MLP per layer is exactly the 12 d^2 L of the layers.
    assert m["params_itemized"]["attention"] + m["params_itemized"]["mlp"] == m["params_12d2l"]
    assert m["params"] > m["params_12d2l"]  # embeddings and norms come on top


def test_gpt3_matrix_and_training_flops(capsys):
    assert close(matrix_bytes(49152, 12288, "fp32"), 2.4e9)
    p = run_plan(capsys, "--preset", "gpt3-175b", "--tokens", "300e9")
    assert close(p["train_flops"], 3.14e23)
    assert p["model"]["largest_matrix"]["shape"] == [49152, 12288]
    assert close(p["model"]["largest_matrix"]["bytes_fp32"], 2.4e9)
    q = run_plan(capsys, "--params", "175e9", "--tokens", "300e9")
    assert close(q["train_flops"], 3.14e23)


# ---- accounting -------------------------------------------------------------------------


@pytest.mark.parametrize("name,published", [("gpt2-small", 124_439_808),
                                            ("gpt3-175b", 175e9),
                                            ("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9)])
def test_presets_have_their_published_parameter_counts(name, published):
    assert close(PRESETS[name].params, published, 0.01)


def test_gated_gqa_itemization_of_llama3_8b():
    s = PRESETS["llama3-8b"]
    d, f, L = 4096, 14336, 32
    items = s.param_items()
    assert items["mlp"] == L * 3 * d * f  # gate, up and down
    assert items["attention"] == L * (2 * d * d + 2 * d * 1024)  # 8 kv heads of 128
    assert items["lm head"] == items["token embedding"] == 128256 * d  # untied
    assert PRESETS["gpt2-small"].param_items()["lm head"] == 0  # tied
    # The fused qkv GEMM is 4096 -> 6144, the shape the suite's LLM preset times.
    qkv = [w for w in s.weight_matrices() if w[0] == "attn.qkv"][0]
    assert qkv[1:3] == (4096, 6144)


def test_training_flops_itemized_and_attention_apart(capsys):
    f = train_flops(1e9, 1e10)
    assert f["forward"] == 2e19 and f["backward"] == 4e19 and f["total"] == 6e19
    p = run_plan(capsys, "--d-model", "1024", "--layers", "12", "--seq-len", "4096",
                 "--tokens", "1e9")
    # 12 L S d D: 4 S d per token and layer forward (Q K^T and A V), x3 with backward.
    assert p["attention_flops"] == pytest.approx(12 * 12 * 4096 * 1024 * 1e9)
    assert p["train_flops"] == pytest.approx(6 * p["params"] * 1e9)
    assert p["days_with_attention"] > p["days"]


def test_step_gemms_are_6_flops_per_matmul_parameter_and_token():
    s = PRESETS["gpt2-small"]
    gemms = step_gemms(s, micro_batch=4)
    t = 4 * 1024
    assert sum(g.flops * g.count for g in gemms) == 6 * t * s.matmul_params
    up = {g.phase: g for g in gemms if g.name == "mlp.up"}
    assert (t, 3072, 768) == (up["forward"].M, up["forward"].N, up["forward"].K)
    assert (t, 768, 3072) == (up["bwd-input"].M, up["bwd-input"].N, up["bwd-input"].K)
    assert (768, 3072, t) == (up["bwd-weight"].M, up["bwd-weight"].N, up["bwd-weight"].K)
    assert up["forward"].count == 12


def test_step_summary_mfu_is_gemm_flops_over_time_and_peak():
    gemms = [Gemm("a", "forward", 1000, 1000, 1000, 2, ms=1.0),
             Gemm("b", "forward", 1000, 1000, 1000, 1, ms=2.0)]
    st = summarize_step(gemms, peak_tflops=10.0)
    assert st.ms == 4.0
    assert st.tflops == pytest.approx(3 * 2e9 / 4e-3 / 1e12)  # 1.5 TFLOP/s
    assert st.mfu == pytest.approx(0.15)
    assert [g.share for g in gemms] == [0.5, 0.5]


@pytest.mark.parametrize("policy,bpp", [("fp32-adamw", 16), ("bf16-mixed", 12),
                                        ("bf16-master", 16)])
def test_memory_policies(capsys, policy, bpp):
    p = run_plan(capsys, "--params", "1e9", "--policy", policy, "--device", "h100")
    assert p["bytes_per_param"] == bpp == sum(p["bytes_per_param_itemized"].values())
    assert p["static_bytes"] == bpp * 1e9


@pytest.mark.parametrize("key,gb_", [("h100", 80), ("h100-pcie", 80), ("h100-nvl", 94),
                                     ("h200", 141), ("h200-nvl", 141), ("a100", 80),
                                     ("l40s", 48), ("l4", 24)])
def test_memory_per_device_is_the_datasheets(key, gb_):
    assert device_memory_bytes(key)[0] == gb_ * 1e9
    assert device_memory_bytes(key, override_gb=10)[0] == 10e9


def test_memory_capacity_and_fit(capsys):
    assert GPU_MEMORY_GB["h100"] == 80 and GPU_MEMORY_GB["h200"] == 141
    p = run_plan(capsys, "--params", "70e9", "--gpus", "8", "--device", "h200",
                 "--policy", "bf16-mixed")
    assert p["gpu_memory_bytes"] == 141e9
    assert p["fits"] is True  # 840 GB in 1128 GB
    q = run_plan(capsys, "--params", "70e9", "--gpus", "8", "--device", "h100",
                 "--policy", "bf16-mixed")
    assert q["fits"] is False  # 840 GB in 640 GB


# ---- measured MFU -----------------------------------------------------------------------


def fake_run(tmp_path: Path, rows: list[tuple[str, str, str, float]], peak: float = 989.4,
             status: str = "ok", name: str = "run") -> Path:
    """A results.json with matmul rows (provider, dtype, shape, tflops)."""
    from contract.schema import COLUMNS

    out = []
    for prov, dt, shape, tf in rows:
        r = {c: None for c in COLUMNS}
        r.update(kernel="matmul", provider=prov, dtype=dt, shape=shape, tflops=tf,
                 peak_tflops=peak, status=status, ms_median=1.0)
        out.append(r)
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(
        {"metadata": {"device_key": "h100", "device_name": "NVIDIA H100 80GB HBM3",
                      "run_id": "fake"}, "rows": out}))
    return d


def test_from_run_uses_the_nearest_shapes_mfu(capsys, tmp_path):
    # Big GEMMs at 80% of peak, small ones at 20%: gpt2-small's attention GEMMs (M = 1024
    # tokens, d = 768) are nearest the small square, its LM head (N = 50257) the big one.
    run = fake_run(tmp_path, [("torch", "bf16", "M=8192,N=8192,K=8192", 0.8 * 989.4),
                              ("torch", "bf16", "M=1024,N=1024,K=1024", 0.2 * 989.4),
                              ("torch", "fp16", "M=1024,N=1024,K=1024", 0.9 * 989.4)])
    p = run_plan(capsys, "--preset", "gpt2-small", "--tokens", "1e10", "--gpus", "8",
                 "--from-run", str(run))
    assert p["mfu_source"] == "measured" and p["device"] == "h100"
    g = {(g["name"], g["phase"]): g for g in p["gemms"]}
    assert g["attn.out", "forward"]["measured_shape"] == "M=1024,N=1024,K=1024"
    assert g["attn.out", "forward"]["mfu"] == pytest.approx(0.2)
    assert g["lm_head", "forward"]["measured_shape"] == "M=8192,N=8192,K=8192"
    assert g["lm_head", "forward"]["mfu"] == pytest.approx(0.8)
    # The step's MFU is FLOPs over summed time: between the two, pulled to the slow one.
    st = p["step"]
    assert 0.2 < p["mfu"] == st["mfu"] < 0.5
    assert st["ms"] == pytest.approx(sum(x["flops"] * x["count"] / (x["tflops"] * 1e9)
                                         for x in p["gemms"]))
    a = run_plan(capsys, "--preset", "gpt2-small", "--tokens", "1e10", "--gpus", "8",
                 "--mfu", "0.5")
    assert p["days"] == pytest.approx(a["days"] * 0.5 / p["mfu"])  # days scale as 1 / MFU
    assert any("off the model's" in w for w in p["warnings"])  # 50257 vs 1024: far


def run_err(capsys, *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["--gpus", "0"], ["--gpus", "-4"], ["--params", "0"], ["--params", "-1e9"],
    ["--tokens", "0", "--params", "1e9"], ["--days", "0"], ["--d-model", "0", "--layers", "2"],
    ["--device", "tpu-v9"], ["--preset", "gpt5"], ["--mfu", "1.5"], ["--mfu", "0"],
    ["--params", "abc"], ["--d-model", "100", "--layers", "2", "--heads", "3"],
    ["--params", "1e9", "--d-model", "512", "--layers", "2"],
    ["--params", "1e9", "--measure"], ["--chinchilla"],
    ["--device", "h100", "--measure", "--d-model", "64", "--layers", "1"],
    ["--mfu", "0.5", "--measure", "--d-model", "64", "--layers", "1"],
])
def test_bad_input_is_one_line_exit_2(capsys, argv):
    run_err(capsys, *argv, "--no-save")


def test_from_run_without_matmul_rows_or_unreadable(capsys, tmp_path):
    run = fake_run(tmp_path, [("torch", "bf16", "M=64,N=64,K=64", 1.0)], status="skipped")
    assert "matmul" in run_err(capsys, "--preset", "gpt2-small", "--from-run", str(run))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.json").write_text("{not json")
    run_err(capsys, "--preset", "gpt2-small", "--from-run", str(bad))
    run_err(capsys, "--preset", "gpt2-small", "--from-run", str(tmp_path / "missing"))
    other = fake_run(tmp_path, [("torch", "fp32", "M=64,N=64,K=64", 1.0)], name="fp32")
    assert "bf16" in run_err(capsys, "--preset", "gpt2-small", "--from-run", str(other))


def test_measure_on_the_cpu_times_the_models_gemms(capsys, tmp_path, cpu_ceilings_now):
    # fp32: a roof on every CPU (bf16 is none on a CPU without its unit: the test below).
    code = roofline_main(["plan", "--d-model", "256", "--layers", "2", "--seq-len", "128",
                          "--measure", "--device", "cpu", "--dtype", "fp32", "--json",
                          "--rep-ms", "10",
                          "--out", str(tmp_path / "p")])
    out = capsys.readouterr()
    assert code == 0, out.err
    p = json.loads(out.out)
    assert p["mfu_source"] == "measured" and p["device"] == "cpu"
    assert p["gemms"] and all(g["tflops"] and g["ms"] for g in p["gemms"])
    st = p["step"]
    assert st["tokens"] == 128 and st["mfu"] == pytest.approx(p["mfu"])
    assert math.isclose(sum(g["share"] for g in p["gemms"]), 1.0, rel_tol=1e-9)
    # MFU against the CPU's fp32 ceiling, however fast this machine is beside it (the
    # ceilings are a given CPU's, tests/conftest.py).
    peak = cpu_ceilings_now.peak("fp32")
    assert p["peak_tflops"] == peak and p["mfu"] > 0
    for g in p["gemms"]:
        assert g["mfu"] == pytest.approx(g["tflops"] / peak, rel=1e-9)
    files = {f.name for f in (tmp_path / "p").iterdir()}
    assert {"plan.md", "plan.json", "plan.png"} <= files
    md = (tmp_path / "p" / "plan.md").read_text()
    assert "measured" in md and "plan.png" in md


TINY_PLAN = ["plan", "--d-model", "256", "--layers", "2", "--seq-len", "128", "--measure",
             "--device", "cpu", "--no-save"]


def test_a_cpu_class_with_no_roof_is_refused_saying_why_and_what_to_run(capsys, tmp_path,
                                                                        cpu_ceilings):
    """On each CPU (tests/conftest.py): the classes that are no roof (bf16 and fp16 on the
    AVX2 CPU, whose bf16 matmul runs at 1/125 of fp32's rate; fp8 on the other) are
    refused before anything is timed, with the measured figures and fp32 to run instead,
    `plan --measure --device cpu` with its default bf16 included; the others are planned
    at their measured peak."""
    tflops = cpu_ceilings.measured["tflops"]
    for dtype, rc in (("fp32", "fp32"), ("fp16", "fp16"), ("bf16", "bf16"), ("fp8", "fp8")):
        if cpu_ceilings.peak(rc) is not None:
            assert peak_of("cpu", dtype, print, device_ceilings) == (
                tflops[rc], "measured (no datasheet)")
            continue
        default = ["--dtype", dtype] if dtype != "bf16" else []  # bf16: plan's default
        assert roofline_main([*TINY_PLAN, *default]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err  # refused before anything is timed (nothing logged)
        assert err[0].startswith(f"error: no {rc} peak for host CPU (")
        assert f"its {rc} matmul measured {tflops[rc]:.3g} TFLOP/s, under 0.1x fp32's " \
            f"{tflops['fp32']:.3g}" in err[0]
        assert err[0].endswith("run with --dtype fp32 instead")
    assert ("bf16" in cpu_ceilings.no_roofs) == (cpu_ceilings.kind == "slow-bf16")


# ---- outputs ----------------------------------------------------------------------------


def test_unwritable_out_and_help(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot create" in run_err(capsys, "--params", "1e9", "--out", str(blocker / "p"))
    assert main(["--help"]) == 0
    assert "--from-run" in capsys.readouterr().out
    assert roofline_main(["plan", "--gpus", "0"]) == 2


def test_outputs_are_never_overwritten(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--preset", "gpt2-small", "--chinchilla", "--gpus", "8"]
    assert main(args) == 0
    assert main(args) == 0
    capsys.readouterr()
    plans = sorted((tmp_path / "results" / "plans").iterdir())
    assert len(plans) == 2 and all((d / "plan.md").exists() for d in plans)
    md = (plans[0] / "plan.md").read_text()
    assert "6 N D" in md and "assumed" in md and "attention scores" in md
    assert "plan.png" not in md  # nothing measured: no figure
    assert main([*args, "--out", str(plans[0])]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_a_failed_plan_leaves_no_folder_behind(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_err(capsys, "--preset", "gpt2-small", "--from-run", str(tmp_path / "missing"))
    assert not (tmp_path / "results").exists()  # nor results/plans/ it would have made
    (tmp_path / "results").mkdir()
    run_err(capsys, "--preset", "gpt2-small", "--from-run", str(tmp_path / "missing"))
    assert list((tmp_path / "results").iterdir()) == []  # the user's folder stays


def test_plan_png_sizes_markers_by_share_of_step_time():
    from roofline.plan.gemm_plot import marker_area, plot_plan

    gemms = step_gemms(PRESETS["gpt2-small"], 1)
    for i, g in enumerate(gemms):
        g.ms = 1.0 + i
        g.tflops = g.flops / (g.ms * 1e-3) / 1e12
        g.mfu = g.tflops / 989.4
    st = summarize_step(gemms, 989.4)
    request = PlanRequest(model=ModelRequest(preset="gpt2-small"),
                          efficiency=EfficiencyRequest(dtype="bf16"))
    plan = replace(build_plan(request, log=lambda *a: None), gemms=tuple(gemms), step=st,
                   mfu_from="test")
    assert plan.device == "h100" and plan.micro_batch == 1
    fig = plot_plan(plan)
    by_gid = {a.get_gid(): a for a in fig.axes[0].collections}
    fwd = by_gid["gemms:forward"]
    want = [marker_area(g.share) for g in gemms if g.phase == "forward"]
    assert list(fwd.get_sizes()) == pytest.approx(want)
    assert max(want) > 2 * min(want)
    gids = {ln.get_gid() for ln in fig.axes[0].lines}
    assert "roof:datasheet:bf16" in gids and "step-average" in gids


# ---- days on another device (--vs) ---------------------------------------------------------

def test_days_on_b200_vs_h100_for_a_preset(capsys):
    p = run_plan(capsys, "--preset", "llama3-8b", "--tokens", "15T", "--gpus", "32",
                 "--device", "b200", "--vs", "h100,gb200", "--mfu", "0.4")
    v = {x["device"]: x for x in p["versus"]}
    assert [x["device"] for x in p["versus"]] == ["b200", "h100", "gb200"]
    assert v["b200"]["days"] == pytest.approx(p["days"])
    # Same tokens, GPUs and MFU: the days go as the inverse of the bf16 peaks.
    assert v["h100"]["vs_plan"] == pytest.approx(2250 / 989.4)
    assert v["gb200"]["vs_plan"] == pytest.approx(2250 / 2500)
    assert v["h100"]["days_with_attention"] == pytest.approx(
        p["days_with_attention"] * 2250 / 989.4)
    main(["--preset", "llama3-8b", "--tokens", "15T", "--device", "b200", "--vs", "h100",
            "--no-save"])
    assert "Days by device" in capsys.readouterr().out


def test_vs_refusals_are_one_line(capsys):
    assert "--vs: unknown device 'h999'" in run_err(capsys, "--preset", "llama3-8b",
                                                    "--tokens", "1T", "--vs", "h999",
                                                    "--no-save")
    assert "--vs compares days" in run_err(capsys, "--preset", "llama3-8b", "--vs", "h100",
                                           "--no-save")
