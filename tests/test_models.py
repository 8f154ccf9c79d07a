"""`--sizes model:NAME[:tokens=N]`: a model's kernel shapes (contract/models.py) checked
against the model's own dimensions, a config.json read from disk, the rows named by
layer, and the summary's forward-pass table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import run_bench
from benches.sweep import job
from benches.sweep.cases import build_cases
from contract.ceilings import Ceilings
from contract.models import (
    PRESETS,
    ModelConfigError,
    ModelShape,
    ModelSizes,
    parse_model_sizes,
    read_hf_config,
    step_shapes,
)
from tests.run_docs import load_run
from tests.test_measurement import cpu_cfg

# A Llama-shaped model small enough to run every kernel of it in a test.
TINY_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256,
               "max_position_embeddings": 32, "hidden_act": "silu",
               "tie_word_embeddings": False}


def _gemms(sizes: ModelSizes) -> dict[str, tuple[int, int, int]]:
    return {s.layer: (s.shape["M"], s.shape["N"], s.shape["K"])
            for s in step_shapes(sizes) if s.kernel == "matmul"}


def test_llama3_8b_gemms_at_256_tokens() -> None:
    # Meta's params.json: dim 4096, 32 heads, 8 kv heads (head dim 128), FFN 14336,
    # vocab 128256; q, k, v fused: 4096 + 2 x 8 x 128 = 6144 outputs; gate and up fused.
    assert _gemms(parse_model_sizes("model:llama3-8b:tokens=256")) == {
        "attn.qkv": (256, 6144, 4096), "attn.out": (256, 4096, 4096),
        "mlp.gate_up": (256, 2 * 14336, 4096), "mlp.down": (256, 4096, 14336),
        "lm_head": (256, 128256, 4096)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_gemm_of_a_preset_has_the_presets_own_dimensions(name: str) -> None:
    m = PRESETS[name]
    t = 512
    hd = m.d_model // m.heads  # none of the presets sets a head_dim of its own
    up = 2 * m.d_ff if m.gated else m.d_ff
    want = {"attn.qkv": (t, (m.heads + 2 * m.kv_heads) * hd, m.d_model),
            "attn.out": (t, m.d_model, m.heads * hd),
            ("mlp.gate_up" if m.gated else "mlp.up"): (t, up, m.d_model),
            "mlp.down": (t, m.d_model, m.d_ff),
            "lm_head": (t, m.vocab, m.d_model)}
    assert _gemms(ModelSizes(m, t)) == want
    attn = [s for s in step_shapes(ModelSizes(m, t)) if s.kernel == "attention"]
    assert [s.shape for s in attn] == [
        {"B": 1, "H": m.heads, "S": min(t, m.seq_len), "D": hd, "causal": 1}]


def test_the_other_kernels_of_a_forward_pass_and_their_counts() -> None:
    shapes = {(s.kernel, s.layer): (s.shape, s.count)
              for s in step_shapes(parse_model_sizes("model:llama3-8b:tokens=16384"))}
    assert shapes[("attention", "attn.sdpa")] == (
        {"B": 2, "H": 32, "S": 8192, "D": 128, "causal": 1}, 32)
    assert shapes[("rmsnorm", "norm")] == ({"M": 16384, "N": 4096}, 65)
    assert shapes[("softmax", "loss.softmax")] == ({"M": 16384, "N": 128256}, 1)
    assert shapes[("gelu", "mlp.act")] == ({"n": 16384 * 14336}, 32)
    # measured at the model's shapes, not counted twice in a forward pass
    assert shapes[("gelu_erf", "mlp.act")][1] == shapes[("attention_bwd", "attn.sdpa")][1] == 0
    assert shapes[("mul", "mlp.gate_mul")] == ({"n": 16384 * 14336}, 32)
    assert shapes[("add", "residual")] == ({"n": 16384 * 4096}, 64)
    assert ("layernorm", "norm") not in shapes  # llama's norm is RMSNorm
    gpt2 = {s.kernel for s in step_shapes(parse_model_sizes("model:gpt2-small"))}
    assert "layernorm" in gpt2 and "rmsnorm" not in gpt2 and "mul" not in gpt2


def test_tokens_default_to_one_sequence_and_bad_sizes_are_one_line_errors() -> None:
    assert parse_model_sizes("model:gpt2-small").tokens == 1024
    for bad, says in (("model:llama9", "unknown model 'llama9'"),
                      ("model:llama3-8b:tokens=x", "not an integer"),
                      ("model:llama3-8b:tokens=0", "must be >= 1"),
                      ("model:", "no model named")):
        with pytest.raises(ModelConfigError, match=says):
            parse_model_sizes(bad)


def test_a_hf_config_json_is_read(tmp_path: Path) -> None:
    llama = tmp_path / "llama" / "config.json"
    llama.parent.mkdir()
    llama.write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}))
    got = read_hf_config(llama)
    assert got.name == "llama"
    assert _gemms(ModelSizes(got, 256)) == _gemms(parse_model_sizes("model:llama3-8b:tokens=256"))
    assert got.params == PRESETS["llama3-8b"].params
    gpt2 = tmp_path / "config.json"
    gpt2.write_text(json.dumps({"n_embd": 768, "n_layer": 12, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024}))
    g = read_hf_config(gpt2)
    assert (g.d_ff, g.gated, g.norm_params, g.tied) == (3072, False, 2, True)
    qwen = tmp_path / "qwen.json"  # a head_dim of its own: q is 32 x 128 = 4096 wide
    qwen.write_text(json.dumps({**TINY_CONFIG, "hidden_size": 2560, "num_attention_heads": 32,
                                "num_key_value_heads": 8, "head_dim": 128}))
    q = _gemms(ModelSizes(read_hf_config(qwen), 8))
    assert q["attn.qkv"] == (8, (32 + 16) * 128, 2560) and q["attn.out"] == (8, 2560, 4096)
    moe = tmp_path / "moe.json"
    moe.write_text(json.dumps({**TINY_CONFIG, "num_local_experts": 8}))
    with pytest.raises(ModelConfigError, match="mixture-of-experts"):
        read_hf_config(moe)


def test_hf_config_declares_every_key_read() -> None:
    # HfConfig is the config.json shape read_hf_config reads: exactly the keys it reads.
    import inspect
    import re

    from contract import models
    read = set(re.findall(r'cfg\.get\("(\w+)"', inspect.getsource(models)))
    read |= {k for keys in models._KEYS.values() for k in keys} | set(models._MOE_KEYS)
    assert read == set(models.HfConfig.__annotations__)


def test_layers_of_one_shape_are_one_row_named_by_both() -> None:
    # vocab 128 = q + k + v's 64 + 2 x 32: the LM head and the QKV GEMM coincide
    m = read_hf_config_dict({**TINY_CONFIG, "vocab_size": 128})
    gemms = [(s.layer, s.count) for s in step_shapes(ModelSizes(m, 8)) if s.kernel == "matmul"]
    assert gemms[0] == ("attn.qkv+lm_head", 3) and len(gemms) == 4


def read_hf_config_dict(cfg: dict) -> ModelShape:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(cfg))
        return read_hf_config(path)


def test_cases_of_a_model_carry_their_layer() -> None:
    cfg = cpu_cfg(kernels=["matmul", "rmsnorm"], providers=["torch"],
                  sizes="model:llama3-8b:tokens=256")
    got = [(c.spec.name, c.layer, c.shape_str) for c in build_cases(cfg)]
    assert got[:2] == [("matmul", "attn.qkv", "M=256,N=6144,K=4096"),
                       ("matmul", "attn.out", "M=256,N=4096,K=4096")]
    assert ("rmsnorm", "norm", "M=256,N=4096") in got
    assert len([g for g in got if g[0] == "matmul"]) == 5


def test_a_model_run_names_rows_by_layer_and_sums_the_forward_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"tflops": {"fp32": 1.0}, "hbm_gbps": 10.0, "l2_gbps": 50.0, "method": {}}
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, fake))
    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_CONFIG))
    argv = ["--device", "cpu", "--kernels", "matmul,rmsnorm,gelu,gelu_erf", "--dtypes", "fp32",
            "--providers", "torch,triton", "--sizes", f"model:{config}:tokens=32",
            "--no-plots", "--out", str(tmp_path / "out")]
    assert run_bench.main(argv) == 0
    (run,) = (tmp_path / "out" / "cpu").iterdir()
    meta, df = load_run(run)
    torch_rows = df[df["provider"] == "torch"]
    assert list(torch_rows["layer"]) == ["attn.qkv", "attn.out", "mlp.gate_up", "mlp.down",
                                         "lm_head", "norm", "mlp.act", "mlp.act"]
    assert set(torch_rows["status"]) == {"ok"}
    assert meta["model_step"]["tokens"] == 32
    text = (run / "summary.md").read_text()
    assert "## The model's forward pass" in text
    total = sum(r.ms_median * c for r, c in zip(
        torch_rows.itertuples(), [2, 2, 2, 2, 1, 5, 2, 0], strict=True))
    sum_line = next(line for line in text.splitlines() if line.startswith("| **sum**"))
    assert f"| {total:.4g} |" in sum_line
    assert "| mlp.down | `M=32,N=64,K=96` | 2 |" in text
    assert "| gelu | mlp.act |" in text and "| gelu_erf | mlp.act |" not in text


def test_a_bad_model_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench.main(["--sizes", "model:nope", "--check-only"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: unknown model 'nope'")
