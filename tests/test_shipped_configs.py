"""Tuned configs shipped per GPU model (kernels/shipped.py, kernels/configs/): the file
written from a device's runs (python -m roofline configs), the file a sweep picks for the
device present, and what run_launch_with then runs: the shipped config untuned, never a
file of another device, never a config that is no longer a candidate."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import triton

import benches.sweep.row_setup as row_setup
import kernels.triton_utils as triton_utils
from benches.rehearse.tensors import on_device
from contract.schema import ALL_COLUMNS, parse_shape
from kernels import REGISTRY
from kernels.shipped import (
    CONFIG_DIR,
    RETUNE_ENV,
    ShippedDevice,
    ShippedEntry,
    bucket_text,
    document,
    read_shipped,
    retune_requested,
    shipped_for,
)
from kernels.spec import Target, TritonLaunch
from kernels.triton_utils import config_str, run_launch_with
from kernels.tuning import set_device_identity
from roofline.report import configs as configs_cmd

ROOT = Path(__file__).resolve().parents[1]
H200_RUNS = [f"results/h200/2026-11-26/{r}" for r in
             ("quick", "matmul-8192", "fp8-precise", "vectors-fp8", "step-kernels")]
# The runs kernels/configs/h200.json was written from, in that command's order.
CONFIG_RUNS = [f"results/h200/2026-11-27/{r}" for r in
               ("quick-warm2", "quick-warm", "quick", "matmul-8192", "fp8-precise",
                "vectors-fp8", "cache-modes")] + \
    [f"results/h200/2026-11-26/{r}" for r in
     ("fp8-precise", "matmul-8192", "quick", "step-kernels", "vectors-fp8")]
H200 = ("NVIDIA H200", 132, 150.10988032)
H100 = ("NVIDIA H100 80GB HBM3", 132, 85.02)
_ids = itertools.count()


def test_configs_command_writes_the_committed_h200_file(tmp_path: Path) -> None:
    # Compiled launches (no interpreter): their constexprs are a GPU run's.
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = tmp_path / "h200.json"
    p = subprocess.run([sys.executable, "-m", "roofline", "configs", *CONFIG_RUNS,
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert out.read_text() == (CONFIG_DIR / "h200.json").read_text()
    # The runs' matvec configs are no longer candidates, dot is one launch with one
    # config today: dropped and counted, never written.
    assert "config no longer a candidate" in p.stdout and "launch no longer made" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["device"] == {
        "device_name": "NVIDIA H200", "sms": 132, "gpu_memory_gb": 150.10988032,
        "tuning_identity": "NVIDIA H200, 132 SMs, 150.1 GB, L2 60 MiB, max SM clock 1980 MHz"}
    kernels = {e["kernel"] for e in doc["configs"]}
    assert kernels == {"matmul", "matvec", "attention", "attention_bwd", "softmax",
                       "layernorm", "rmsnorm"}
    assert len(doc["configs"]) == 92
    bf16 = [e for e in doc["configs"] if e["kernel"] == "matmul" and e["dtype"] == "bf16"
            and e["bucket"].startswith("M=8192,N=8192,K=8192,")]
    assert [e["config"] for e in bf16] == \
        ["BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=3"]
    assert bf16[0]["bucket"] == ("M=8192,N=8192,K=8192,PRECISION=tf32,SCALED=False,"
                                 "FP8_FAST=True,MBITS=0")


def _run_copy(tmp_path: Path, run: str, **meta: Any) -> str:
    doc = json.loads((ROOT / run / "results.json").read_text())
    doc["metadata"].update(meta)
    folder = tmp_path / Path(run).name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(doc))
    return str(folder)


def test_configs_command_refuses_runs_of_two_device_models(tmp_path: Path, capsys) -> None:
    other = _run_copy(tmp_path, H200_RUNS[1], device_name="NVIDIA H100 80GB HBM3",
                      gpu_memory_gb=85.02)
    code = configs_cmd.main([str(ROOT / H200_RUNS[0]), other, "--out",
                             str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "another device model" in err and "NVIDIA H100 80GB HBM3" in err
    assert not (tmp_path / "x.json").exists()


def test_configs_command_refuses_interpreted_buckets_and_bad_usage(tmp_path: Path,
                                                                   capsys) -> None:
    # This process's kernels are interpreted (tests/conftest.py): MBITS would be set.
    assert configs_cmd.main([str(ROOT / H200_RUNS[1]), "--out", str(tmp_path / "x")]) == 2
    assert "TRITON_INTERPRET=1" in capsys.readouterr().err
    assert configs_cmd.main([str(ROOT / H200_RUNS[1])]) == 2
    assert "--out is required" in capsys.readouterr().err
    cpu = str(ROOT / "results/h200/2026-11-26/quick") + "-missing"
    assert configs_cmd.main([cpu, "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_the_committed_file_is_the_h200s_and_no_other_devices() -> None:
    assert shipped_for(*H200).configs is not None
    assert shipped_for(*H200).configs.path.name == "h200.json"
    h100 = shipped_for(*H100)
    assert h100.configs is None
    assert "h200.json: name 'NVIDIA H100 80GB HBM3', not 'NVIDIA H200'" in h100.reason
    assert h100.to_json()["file"] is None
    # Same name and SMs, other memory (an NVL part under the same name): not it either.
    assert shipped_for("NVIDIA H200", 132, 100.0).configs is None
    assert "100.0 GB of memory" in shipped_for("NVIDIA H200", 132, 100.0).reason
    assert shipped_for("NVIDIA H200", 114, 150.1).configs is None
    assert shipped_for(*H200).to_json()["file"] == "kernels/configs/h200.json"


class FakeKernel:
    """A jit function's stand-in: records each launch's keyword arguments (its config
    and constexprs), runs nothing."""

    def __init__(self, real: Any) -> None:
        self.__name__ = real.__name__
        self.arg_names = real.arg_names
        self.launched: list[dict[str, Any]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.launched.append(kwargs)


def _gpu_launch(kernel: str = "matmul", dtype: str = "bf16",
                shape: str = "M=1024,N=1024,K=1024") -> TritonLaunch:
    """A real launch of a Hopper run, its tensors standing in as CUDA ones and its
    kernel a FakeKernel: run_launch_with takes its GPU path."""
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(parse_shape(shape), dtype, 0, "meta")
    [launch] = spec.launches(inputs, spec.alloc_out(inputs, dtype), 132, Target("cuda", (9, 0)))
    dev = torch.device("cuda", 0)
    args = tuple(on_device(a, dev, (i + 1) << 32) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(launch.args))
    # A fresh identity per test: no tuner or tuning of another test is reused.
    set_device_identity(f"test GPU {next(_ids)}", 0)
    return dataclasses.replace(launch, fn=FakeKernel(launch.fn), args=args)


def _no_tuning(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: Any, **k: Any) -> Any:
        raise AssertionError("a tuner was built")
    monkeypatch.setattr(triton, "autotune", fail)
    monkeypatch.setattr(triton_utils, "make_tuner", fail)


def _shipped_dir(tmp_path: Path, launch: TritonLaunch, config: str,
                 device: tuple[str, int, float] = H200) -> Path:
    entry = ShippedEntry("matmul", launch.name, "bf16", bucket_text(launch), config, "r", 1.0)
    (tmp_path / "h200.json").write_text(json.dumps(document(ShippedDevice(*device), [entry],
                                                            ["r"])))
    return tmp_path


def _row_setup(device: tuple[str, int, float]) -> tuple[Any, Any]:
    case = SimpleNamespace(spec=REGISTRY["matmul"], dtype="bf16")
    cfg = SimpleNamespace(target=Target("cuda", (9, 0)),
                          present=SimpleNamespace(name=device[0], sms=device[1],
                                                  memory_gb=device[2]))
    return case, cfg


def test_matching_device_runs_the_shipped_config_and_builds_no_tuner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _gpu_launch()
    shipped = launch.configs[3]  # not the first candidate: the shipped one is what runs
    folder = _shipped_dir(tmp_path, launch, config_str(shipped))
    monkeypatch.setattr(row_setup, "shipped_for", functools.partial(shipped_for,
                                                                 directory=folder))
    _no_tuning(monkeypatch)
    case, cfg = _row_setup(H200)
    picks, why = row_setup.shipped_configs_of(case, cfg, [launch], None)
    assert picks == [shipped] and why == ""
    ran = run_launch_with(launch, None, picks[0], retune=False)
    assert (ran.config, ran.source) == (shipped, "shipped")
    [kwargs] = launch.fn.launched
    assert kwargs["BLOCK_M"] == shipped.kwargs["BLOCK_M"]
    assert kwargs["num_warps"] == shipped.num_warps
    assert kwargs["num_stages"] == shipped.num_stages
    # A forced config (re-timing) is the row's own, never a shipped one.
    assert row_setup.shipped_configs_of(case, cfg, [launch], "x")[0] == [None]


class FakeTuner:
    """Triton's autotuner as run_launch_with sees it: on its call, the timings of every
    candidate and the winner (the last candidate, 20% faster than the others)."""

    def __init__(self, launch: TritonLaunch) -> None:
        self.launch = launch
        self.built = 1

    def __getitem__(self, grid: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> None:
            cands = self.launch.configs
            self.configs_timings = {c: [1.0 if c is not cands[-1] else 0.8, 0.9, 1.1]
                                    for c in cands}
            self.best_config = cands[-1]
        return run


def test_another_device_uses_nothing_shipped_and_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _gpu_launch()
    case, cfg = _row_setup(H100)
    picks, why = row_setup.shipped_configs_of(case, cfg, [launch], None)
    assert picks == [None]
    assert "no shipped configs for this device" in why and "h200.json: name" in why
    built: list[Any] = []
    monkeypatch.setattr(triton_utils, "make_tuner",
                        lambda ln, identity: built.append(FakeTuner(ln)) or built[-1])
    ran = run_launch_with(launch, None, None)
    assert (ran.config, ran.source) == (launch.configs[-1], "tuned") and len(built) == 1


def test_a_shipped_config_that_is_no_longer_a_candidate_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    launch = _gpu_launch()
    gone = "BLOCK_M=96,BLOCK_N=96,BLOCK_K=32,GROUP_M=8,num_warps=4,num_stages=2"
    folder = _shipped_dir(tmp_path, launch, gone)
    shipped = read_shipped(folder / "h200.json")
    cfg, why = shipped.pick("matmul", "bf16", launch)
    assert cfg is None and shipped.dropped == 1
    assert "is not a candidate of today's launch: dropped" in why
    # The interpreter's small config is not a GPU candidate either.
    folder = _shipped_dir(tmp_path, launch, config_str(launch.interp_config))
    shipped = read_shipped(folder / "h200.json")
    assert shipped.pick("matmul", "bf16", launch)[0] is None and shipped.dropped == 1
    # Another bucket (shape) has no entry: nothing shipped, said so.
    other = _gpu_launch(shape="M=2048,N=1024,K=1024")
    assert "no shipped config for matmul_kernel at this bucket" in \
        shipped.pick("matmul", "bf16", other)[1]


def test_retune_tunes_anyway_and_says_how_much_slower_the_shipped_config_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RETUNE_ENV, "1")
    assert retune_requested()
    launch = _gpu_launch()
    monkeypatch.setattr(triton_utils, "make_tuner", lambda ln, identity: FakeTuner(ln))
    ran = run_launch_with(launch, None, launch.configs[0], retune=retune_requested())
    assert (ran.config, ran.source) == (launch.configs[-1], "tuned")
    assert ran.note.startswith("retune matmul_kernel: shipped [")
    assert "1 ms vs tuned [" in ran.note and "(+25.0%)" in ran.note
    # The same bucket again (another cache mode): the first call's timings and source.
    again = run_launch_with(launch, None, launch.configs[0], retune=True)
    assert again.note == ran.note and again.source == "tuned"
    same = run_launch_with(launch, None, launch.configs[-1], retune=True)
    assert same.note == "retune matmul_kernel: the shipped config is the tuned one"
    monkeypatch.setenv(RETUNE_ENV, "0")
    assert not retune_requested()


def test_sources_of_a_row() -> None:
    launch = _gpu_launch(kernel="softmax", dtype="bf16", shape="M=4096,N=1024")
    assert len(launch.configs) == 1
    assert run_launch_with(launch).source == "fixed"
    assert run_launch_with(launch, launch.configs[0]).source == "given"
    a, b = (triton_utils.Launched(None, s) for s in ("shipped", "fixed"))
    assert triton_utils.sources_text([a, a]) == "shipped"
    assert triton_utils.sources_text([a, b]) == "shipped; fixed"
    assert "config_source" in ALL_COLUMNS
    assert ALL_COLUMNS.index("config_source") == ALL_COLUMNS.index("config") + 1
