"""`python -m roofline plan`'s typed request (roofline/plan/plan_request.py): every flag
lands in its record, the parser's defaults are the records', a record refuses what no
command line can give, a plan asked from code is the command line's, and no module of
the plan but its command line reads the parsed arguments."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from roofline.plan.cli import main, parse_request
from roofline.plan.model import PlanError
from roofline.plan.plan_record import Plan
from roofline.plan.plan_request import (
    EfficiencyRequest,
    HardwareRequest,
    MemoryRequest,
    ModelRequest,
    OutputRequest,
    PlanRequest,
    TrainingRequest,
)
from roofline.plan.planner import build_plan

ROOT = Path(__file__).resolve().parent.parent


def test_no_flags_is_the_default_request():
    assert parse_request([]) == PlanRequest()
    r = PlanRequest()
    assert (r.hardware.gpus, r.training.micro_batch, r.efficiency.steps) == (1, 1, 5)
    assert (r.efficiency.dtype, r.efficiency.provider, r.memory.policy) == \
        ("bf16", "torch", "bf16-master")
    assert r.output == OutputRequest(out=None, save=True, json=False)


def test_every_flag_lands_in_its_record():
    argv = ["--preset", "llama3-8b", "--d-model", "2048", "--layers", "8", "--d-ff", "8k",
            "--vocab", "32000", "--seq-len", "4096", "--heads", "16", "--kv-heads", "4",
            "--no-gated", "--untied", "--micro-batch", "2", "--chinchilla", "--device",
            "h200", "--gpus", "64", "--vs", " h100,,b200 ", "--busbw-run", "RUN",
            "--force-busbw-run", "--days", "3.5", "--gpu-memory-gb", "96", "--measure",
            "step", "--measure-layers", "2", "--explain", "--steps", "7", "--dtype",
            "fp16", "--provider", "triton", "--rep-ms", "20", "--policy", "bf16-mixed",
            "--weight-format", "nvfp4", "--out", "DIR", "--no-save", "--json"]
    assert parse_request(argv) == PlanRequest(
        model=ModelRequest(preset="llama3-8b", d_model=2048, layers=8, d_ff=8000,
                           vocab=32000, seq_len=4096, heads=16, kv_heads=4, gated=False,
                           tied=False),
        training=TrainingRequest(chinchilla=True, days=3.5, micro_batch=2),
        hardware=HardwareRequest(device="h200", gpus=64, gpu_memory_gb=96.0,
                                 vs=("h100", "b200"), busbw_run="RUN",
                                 force_busbw_run=True),
        efficiency=EfficiencyRequest(measure="step", measure_layers=2, explain=True,
                                     steps=7, dtype="fp16", provider="triton", rep_ms=20.0),
        memory=MemoryRequest(policy="bf16-mixed", weight_format="nvfp4"),
        output=OutputRequest(out="DIR", save=False, json=True))
    # The other side of each exclusive pair, and --measure's default.
    other = parse_request(["--params", "70B", "--tokens", "15T", "--busbw", "400",
                           "--measure", "--bytes-per-param", "12", "--tied", "--gated"])
    assert other.model == ModelRequest(params=70e9, tied=True, gated=True)
    assert other.training.tokens == 15e12 and other.hardware.busbw == 400
    assert other.efficiency.measure == "gemms" and other.memory.bytes_per_param == 12
    assert parse_request(["--mfu", "0.4", "--from-run", "R"]) == 2  # argparse's refusal


def test_the_request_is_frozen():
    r = PlanRequest()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.hardware.gpus = 8  # type: ignore[misc]


@pytest.mark.parametrize("make, says", [
    (lambda: HardwareRequest(gpus=0), "--gpus must be positive"),
    (lambda: HardwareRequest(busbw=100.0, busbw_run="R"), "--busbw or --busbw-run"),
    (lambda: ModelRequest(params=-1.0), "--params must be positive"),
    (lambda: TrainingRequest(tokens=1e9, chinchilla=True), "--tokens or --chinchilla"),
    (lambda: TrainingRequest(micro_batch=0), "--micro-batch must be positive"),
    (lambda: EfficiencyRequest(mfu=1.5), "not a fraction"),
    (lambda: EfficiencyRequest(mfu=0.5, measure="step"), "one of --mfu"),
    (lambda: EfficiencyRequest(measure="all"), "--measure 'all'"),  # type: ignore[arg-type]
    (lambda: EfficiencyRequest(dtype="int4"), "--dtype 'int4'"),
    (lambda: MemoryRequest(policy="fp64"), "--policy 'fp64'"),
    (lambda: MemoryRequest(weight_format="int4"), "--weight-format 'int4'"),
])
def test_a_record_refuses_what_no_command_line_gives(make, says):
    with pytest.raises(PlanError, match=re.escape(says)):
        make()


def test_the_model_shape_from_its_request():
    assert ModelRequest().shape() is None and ModelRequest(params=1e9).shape() is None
    s = ModelRequest(d_model=512, layers=4, heads=8).shape()
    assert (s.name, s.d_ff, s.kv_heads, s.tied) == ("custom", 2048, 8, False)
    m = ModelRequest(preset="llama3-8b", d_model=2048, heads=16).shape()
    # A preset keeps its d_ff; heads given alone carry the kv heads with them.
    assert (m.name, m.d_model, m.d_ff, m.heads, m.kv_heads) == \
        ("llama3-8b (modified)", 2048, 14336, 16, 16)
    for bad, says in [(ModelRequest(params=1e9, preset="llama3-8b"), "not both"),
                      (ModelRequest(d_model=512), "needs --d-model and --layers"),
                      (ModelRequest(d_model=128, layers=2, heads=4, kv_heads=3),
                       "--kv-heads 3 does not divide heads 4")]:
        with pytest.raises(PlanError, match=says):
            bad.shape()


def test_memory_items_are_the_policys_or_the_total():
    assert MemoryRequest().items() == ("bf16-master", {
        "weights bf16": 2, "gradients bf16": 2, "master weights fp32": 4,
        "AdamW m fp32": 4, "AdamW v fp32": 4})
    assert MemoryRequest(bytes_per_param=10).items() == ("explicit", {"--bytes-per-param": 10})
    assert MemoryRequest(weight_format="nvfp4").items()[0] == "bf16-master, nvfp4 weights"
    assert MemoryRequest(weight_format="nvfp4").bytes_per_param_total() == 14.5625


def test_a_plan_asked_from_code_is_the_command_lines(capsys):
    request = PlanRequest(model=ModelRequest(preset="llama3-8b"),
                          training=TrainingRequest(days=14),
                          hardware=HardwareRequest(gpus=32, vs=("b200",), busbw=400))
    plan = build_plan(request, log=lambda *a: None)
    assert main(["--preset", "llama3-8b", "--days", "14", "--gpus", "32", "--vs", "b200",
                 "--busbw", "400", "--json", "--no-save"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed) == json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(json.loads(printed)) == plan
    assert [v.device for v in plan.versus] == ["h100", "b200"]
    assert plan.gpus == 32 and plan.communication and plan.communication.busbw_gbps == 400


def test_only_the_command_line_reads_the_parsed_arguments():
    """roofline/plan/cli.py builds the request; every other module of the plan reads
    the records (issue: `args.` in roofline/ only in its command-line modules)."""
    readers = sorted(p.name for p in (ROOT / "roofline" / "plan").glob("*.py")
                     if re.search(r"\bargs\.|getattr\(args|Namespace", p.read_text()))
    assert readers == ["cli.py"]
