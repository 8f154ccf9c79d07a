"""Failures and bad input found by reading the suite against the GPU machines' libraries:
library errors that poison the CUDA context, shapes rejected for no reason, allocation
failures, reports written over measurements, unplottable numbers, a Ctrl-C at exit, the
reported statistic itself, and an unknown `python -m roofline` command."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import run_bench
from benches.sweep import failures, row_setup
from benches.sweep.cases import InputCache
from benches.sweep.failures import SweepAborted
from benches.sweep.runner import run_case
from benches.timing.clock import summarize
from kernels.matmul import scaled_mm_rejects
from roofline.gate.cli import check_outputs, main
from roofline.report import plot_cli
from tests.test_measurement import case, cpu_cfg, raising

ROOT = Path(__file__).resolve().parent.parent


# ---- CUDA libraries' device faults are sticky --------------------------------------------

@pytest.mark.parametrize("msg", [
    "CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, "
    "opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, "
    "CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`",
    "CUBLAS_STATUS_EXECUTION_FAILED when calling cublasLtMatmul",
    "cuDNN error: CUDNN_STATUS_EXECUTION_FAILED",
    "cuFFT error: CUFFT_EXEC_FAILED",
])
def test_library_execution_failures_abort_the_sweep(msg):
    assert failures.is_sticky_cuda_error(RuntimeError(msg))
    with pytest.raises(SweepAborted):
        run_case(case(fn=raising(RuntimeError(msg))), cpu_cfg(), InputCache())


@pytest.mark.parametrize("msg", [
    "CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul",  # a refusal, not a fault
    "CUBLAS_STATUS_INVALID_VALUE when calling cublasGemmEx",
])
def test_library_refusals_are_not_sticky(msg):
    assert not failures.is_sticky_cuda_error(RuntimeError(msg))


# ---- fp8 _scaled_mm shapes ------------------------------------------------------------------

@pytest.mark.parametrize("m, n, k, rejected", [
    (33, 32, 64, False),  # M is free
    (1, 16, 16, False),
    (32, 17, 64, True),
    (32, 32, 65, True),
])
def test_scaled_mm_checks_k_and_n_only(m, n, k, rejected):
    assert scaled_mm_rejects(m, n, k) is rejected


def test_scaled_mm_accepts_an_m_that_is_not_a_multiple_of_16():
    """What the rule rests on: torch's own shape checks for _scaled_mm (its meta
    function, torch/_meta_registrations.py, the checks CUDA shares) take M = 33 and
    refuse N = 17."""
    f8 = torch.float8_e4m3fn
    one = torch.tensor(1.0, device="meta")
    a = torch.empty(33, 64, dtype=f8, device="meta")
    b = torch.empty(32, 64, dtype=f8, device="meta").t()
    assert torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16).shape == (33, 32)
    with pytest.raises(RuntimeError, match="divisible by 16"):
        torch._scaled_mm(a, torch.empty(17, 64, dtype=f8, device="meta").t(), one, one,
                         out_dtype=torch.bfloat16)


# ---- memory -------------------------------------------------------------------------------

def test_a_case_larger_than_memory_is_skipped_before_allocating(monkeypatch):
    made = []
    monkeypatch.setattr(row_setup, "device_memory_bytes", lambda cfg: 1e9)
    c = case(shape={"n": 10**13})
    c = dataclasses.replace(c, spec=dataclasses.replace(
        c.spec, make_inputs=lambda *a: made.append(a)))
    row = run_case(c, cpu_cfg(), InputCache())
    assert made == []
    assert row.status == "skipped"
    assert "out of memory at this shape" in row.reason and "120000 GB" in row.reason


def test_a_cpu_allocation_failure_is_out_of_memory():
    err = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                       "can't allocate memory: you tried to allocate 40000000000000 bytes. "
                       "Error code 12 (Cannot allocate memory)")
    row = run_case(case(fn=raising(err)), cpu_cfg(), InputCache())
    assert row.status == "skipped" and "out of memory" in row.reason


def test_n_1e13_is_a_skipped_row_and_exit_0(tmp_path, capsys):
    code = run_bench.main(["--device", "cpu", "--kernels", "add", "--dtypes", "fp32",
                           "--providers", "torch", "--sizes", "n=10000000000000",
                           "--out", str(tmp_path), "--no-plots", "--run-id", "big"])
    assert code == 0
    row = json.loads((tmp_path / "cpu" / "big" / "results.json").read_text())["rows"][0]
    assert row["status"] == "skipped" and "not allocated" in row["reason"]


# ---- reports never overwrite measurements ---------------------------------------------

def _run_doc(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"metadata": {"device_key": "cpu"}, "rows": []}))
    return path


@pytest.mark.parametrize("target", ["baseline", "run_json", "run_dir", "named", "other"])
def test_compare_refuses_to_write_over_a_run(tmp_path, capsys, target):
    base = _run_doc(tmp_path / "base.json")
    run_dir = tmp_path / "run"
    _run_doc(run_dir / "results.json")
    other = _run_doc(tmp_path / "baselines" / "h100.json")
    out = {"baseline": base, "run_json": run_dir / "results.json", "run_dir": run_dir,
           "named": tmp_path / "new" / "results.json", "other": other}[target]
    before = {p: p.read_text() for p in (base, run_dir / "results.json", other)}
    code = main(["compare", str(base), str(run_dir), "--md", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "would overwrite measured results" in err[0]
    assert {p: p.read_text() for p in before} == before


def test_compare_writes_a_report_to_a_fresh_path(tmp_path):
    check_outputs({"--md": str(tmp_path / "report.md"), "--json": None},
                          [str(tmp_path / "base.json")])


# ---- plot: metrics that are not numbers -------------------------------------------------

@pytest.mark.parametrize("field, value", [("tflops", "abc"), ("flops", None),
                                          ("mfu", "high")])
def test_plot_refuses_metrics_that_are_not_numbers(tmp_path, capsys, field, value):
    from contract.schema import row_json
    from tests.test_writes import written_row

    # A hand-edited file: the row as written, then one cell replaced.
    row = row_json(written_row(0)) | {"intensity": 1 / 12, "tflops": 1e-6, "gbps": 1.0,
                                      "mfu": 0.01, field: value}
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"metadata": {"device_key": "cpu"}, "rows": [row]}))
    code = plot_cli.main([str(p), "--out", str(tmp_path / "r.png")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"'{field}'" in err[0] and "not a number" in err[0]
    assert not (tmp_path / "r.png").exists()


# ---- Ctrl-C while the interpreter exits -----------------------------------------------------

def test_sigint_after_a_complete_run_exits_0_or_130(tmp_path):
    """Before: 12 of 12 such runs died by SIGINT (status -2) or aborted (-6)."""
    codes = []
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for delay in (0.0, 0.02, 0.1):
        p = subprocess.Popen(
            [sys.executable, "run_bench.py", "--device", "cpu", "--sizes", "n=1024",
             "--kernels", "add", "--providers", "torch", "--dtypes", "fp32", "--no-plots",
             "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("results:"):
                break
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGINT)
        p.communicate(timeout=120)
        codes.append(p.returncode)
    assert all(c in (0, 130) for c in codes), codes


# ---- the reported statistic -------------------------------------------------------------

def test_summarize_reports_the_median_and_the_20th_and_80th_percentiles():
    t = summarize([10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0], "x")
    assert t.ms_median == pytest.approx(5.5)
    assert t.ms_p20 == pytest.approx(2.8)  # numpy's linear interpolation
    assert t.ms_p80 == pytest.approx(8.2)
    assert t.n_samples == 10
    assert t.samples_ms == (10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0)
    odd = summarize([3.0, 1.0, 2.0], "x")
    assert odd.ms_median == 2.0


# ---- python -m roofline ------------------------------------------------------------------

def test_an_unknown_command_is_one_line_naming_the_commands_and_the_usage():
    from roofline.__main__ import COMMANDS

    for argv in (["bogus"], ["--plot"], ["Plot", "run"]):
        p = subprocess.run([sys.executable, "-m", "roofline", *argv], cwd=ROOT,
                           capture_output=True, text=True)
        assert p.returncode == 2 and p.stdout == "", argv
        assert p.stderr.splitlines() == [
            f"error: unknown command '{argv[0]}' (choose from {', '.join(COMMANDS)}; "
            "usage: python -m roofline --help)"]
