"""The main job end to end on the CPU: the result contract, metric consistency, bad
inputs, interrupts, and --check-only.  The run's rows are held under the ceilings of a CPU
with fast bf16 and of one without (tests/conftest.py: cpu_ceilings): each has a class
that is no roof, whose rows get no MFU and say why, as its summary does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import run_bench
from contract.request import RunRequest
from contract.run_meta import REQUEST_COPY
from contract.schema import ALL_COLUMNS, COLUMNS
from tests.run_docs import load_run

ROOT = Path(__file__).resolve().parent.parent
SMALL = "n=4099;M=67,K=129;M=48,N=40,K=72"


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, cpu_ceilings) -> Path:
    out = tmp_path_factory.mktemp("results")
    code = run_bench.main(["--device", "cpu", "--sizes", SMALL, "--out", str(out),
                           "--run-id", "t1", "--dtypes", "fp32,bf16,fp8,tf32",
                           "--no-plots"])
    assert code == 0
    return out / "cpu" / "t1"


def test_run_folder_honours_the_contract(cpu_run):
    for name in ("results.csv", "results.json", "summary.md"):
        assert (cpu_run / name).exists(), name
    meta, df = load_run(cpu_run)
    assert list(pd.read_csv(cpu_run / "results.csv").columns) == ALL_COLUMNS
    assert set(COLUMNS) <= set(df.columns)
    for key in ("device_key", "device_name", "cpu_cores", "python", "torch", "triton",
                "git_commit", "command", "request", "timing", "ceilings", "threads"):
        assert key in meta, key
    # The request stored once (its seed among it), no flattened copy beside it.
    assert not set(REQUEST_COPY) & set(meta)
    assert RunRequest.from_json(meta["request"]).selection.seed == 0
    assert meta["ceilings"]["measured"]["hbm_gbps"] > 0
    assert meta["complete"] is True
    # one row per (kernel, provider, dtype, shape)
    assert not df.duplicated(["kernel", "provider", "dtype", "shape"]).any()
    assert set(df["kernel"]) == {"add", "mul", "gelu", "gelu_erf", "dot", "matvec", "matmul"}
    shapes = set(df["shape"])
    assert {"n=4099", "M=67,K=129", "M=48,N=40,K=72"} == shapes


def test_ok_rows_are_correct_and_consistent(cpu_run, cpu_ceilings):
    _, df = load_run(cpu_run)
    ok = df[df.status == "ok"]
    assert len(ok) > 20
    assert ok.correct.all()
    assert (ok.rel_err <= ok.tolerance).all()
    # Each CPU has rows of a class that is no roof (fp8 on the fast-bf16 one, bf16 on the
    # other) and of a reduced-precision class that is one.
    classes = set(ok.roof_class)
    assert classes & set(cpu_ceilings.no_roofs)
    assert {rc for rc in classes - {"fp32"} if cpu_ceilings.peak(rc)}
    for r in ok.itertuples():
        s = r.ms_median * 1e-3
        assert r.ms_p20 <= r.ms_median <= r.ms_p80
        assert r.n_samples >= 1
        assert math.isclose(r.tflops, r.flops / s / 1e12, rel_tol=1e-9)
        assert math.isclose(r.gbps, r.bytes / s / 1e9, rel_tol=1e-9)
        assert math.isclose(r.intensity, r.flops / r.bytes, rel_tol=1e-12)
        assert r.peak_gbps == cpu_ceilings.measured["hbm_gbps"]
        peak = cpu_ceilings.peak(r.roof_class)
        if peak is None:  # no roof: no MFU, the memory slope alone, and the row says why
            assert math.isnan(r.peak_tflops) and math.isnan(r.mfu), r
            roof = r.intensity * r.peak_gbps / 1e3
            assert f"no {r.roof_class} compute roof here (measured under 0.1x fp32's): " \
                "no MFU" in r.reason, r
        else:
            assert r.peak_tflops == peak
            assert math.isclose(r.mfu, r.tflops / r.peak_tflops, rel_tol=1e-9)
            roof = min(r.peak_tflops, r.intensity * r.peak_gbps / 1e3)
            assert "compute roof" not in str(r.reason)
        assert math.isclose(r.roof_tflops, roof, rel_tol=1e-9)
        assert math.isclose(r.pct_roof, 100 * r.tflops / roof, rel_tol=1e-9)


def test_the_summary_says_which_classes_are_no_roof(cpu_run, cpu_ceilings):
    summary = (cpu_run / "summary.md").read_text()
    for rc, tflops in cpu_ceilings.measured["tflops"].items():
        said = f"No {rc} roof: measured {tflops:.3g} TFLOP/s, under 0.1x fp32's"
        assert (said in summary) == (rc in cpu_ceilings.no_roofs), rc


def test_skipped_rows_carry_reasons(cpu_run):
    _, df = load_run(cpu_run)
    sk = df[df.status == "skipped"]
    assert (sk.provider == "triton").sum() > 0  # no GPU: Triton is not timed
    assert sk.reason.str.len().min() > 10
    assert sk[sk.provider == "triton"].ms_median.isna().all()
    tf32 = df[(df.dtype == "tf32") & (df.provider == "torch")]
    assert (tf32.status == "skipped").all() and tf32.reason.str.contains("tf32").all()


@pytest.mark.interpreter
def test_check_only_runs_triton_in_the_interpreter(tmp_path):
    code = run_bench.main(["--device", "cpu", "--check-only", "--sizes", "n=1000;M=33,N=17,K=65",
                           "--kernels", "add,gelu,matmul", "--dtypes", "fp32,fp8",
                           "--out", str(tmp_path), "--run-id", "c", "--no-plots"])
    assert code == 0
    _, df = load_run(tmp_path / "cpu" / "c")
    tri = df[df.provider == "triton"]
    assert len(tri) == 6 and (tri.status == "ok").all() and tri.correct.all()
    assert df.ms_median.isna().all()


@pytest.mark.parametrize("argv,needle", [
    (["--device", "h999"], "unknown device"),
    (["--dtypes", "fp64"], "unknown dtype"),
    (["--kernels", "conv"], "unknown kernel"),
    (["--providers", "cuda"], "unknown provider"),
    (["--sizes", "huge"], "bad size"),
    (["--sizes", "M=4,Q=3"], "bad shape"),
    (["--sizes", "n=-5"], ">= 1"),
    (["--sizes", "n=1e3"], "not an integer"),
    (["--threshold", "-1"], "threshold"),
    (["--bogus"], "unrecognized"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    code = run_bench.main([*argv, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error:") and needle in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "cpu").exists()


def test_gpu_device_without_gpu_is_a_clean_error(capsys, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code = run_bench.main(["--device", "h100", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "needs a CUDA GPU" in err and "Traceback" not in err


def test_no_traceback_from_the_command_line(tmp_path):
    p = subprocess.run([sys.executable, "run_bench.py", "--sizes", "N=1,K=2", "--out",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and p.stderr.startswith("error:")


def test_list_shows_every_family_provider_and_dtype(capsys):
    assert run_bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    for fam in ("add", "mul", "gelu", "gelu_erf", "dot", "matvec", "matmul"):
        assert f"│ {fam} " in out
    for dt in ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8e5"):
        assert dt in out
    assert "2 M N K" in out and "(M K + K N) b_in + M N b_out" in out


def test_help_lists_every_registered_name(capsys, monkeypatch):
    """Every kernel, dtype, provider, device model, size preset and inspect arch in
    --help comes from its registry (the H200's --help listed 7 of 12 kernels, 6 of 9
    dtypes and no h200-nvl)."""
    from benches.inspect.compile import ARCHES
    from benches.sweep.shapes import PRESETS
    from contract.devices import DEVICES
    from kernels import PROVIDERS, REGISTRY
    from kernels.spec import DTYPE_NAMES

    monkeypatch.setenv("COLUMNS", "2000")  # one line per option: no wrapped names
    with pytest.raises(SystemExit) as e:
        run_bench.parse_args(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"KERNELS comma list of {','.join(REGISTRY)};" in text
    assert f"DTYPES comma list of {','.join(DTYPE_NAMES)} " in text
    assert f"PROVIDERS comma list of {','.join(PROVIDERS)};" in text
    devices = text.split("--device DEVICE device model:", 1)[1].split(" --dtypes ", 1)[0]
    assert all(f" {k}," in devices or f" {k} (" in devices for k in DEVICES)
    assert f"--sizes SIZES {'|'.join(PRESETS)}," in text
    arch = text.split("--arch ARCH --inspect target:", 1)[1]
    assert all(f"{a}," in arch or f"{a} (" in arch for a in ARCHES)


def test_list_devices_shows_ridges(capsys):
    assert run_bench.main(["--list-devices"]) == 0
    out = capsys.readouterr().out
    assert "bf16 295" in out  # H100 SXM
    assert "bf16 206" in out  # H200


def test_interrupt_keeps_finished_rows(tmp_path, monkeypatch):
    from benches.sweep import runner

    real = runner.run_case
    calls = {"n": 0}

    def flaky(case, cfg, cache, *rest):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt
        return real(case, cfg, cache, *rest)

    monkeypatch.setattr(runner, "run_case", flaky)
    code = run_bench.main(["--device", "cpu", "--sizes", "n=2048", "--kernels", "add,mul",
                           "--out", str(tmp_path), "--run-id", "i", "--no-plots"])
    assert code == 130
    meta, df = load_run(tmp_path / "cpu" / "i")
    assert len(df) == 5 and meta["interrupted"] is True
    assert len(pd.read_csv(tmp_path / "cpu" / "i" / "results.csv")) == 5
    # no temp files left behind
    assert not [p for p in (tmp_path / "cpu" / "i").iterdir() if p.name.startswith(".")]


def _replace_torch_provider(monkeypatch, kernel: str, fn) -> None:
    """Swap one kernel's torch implementation in the registry for this test."""
    import dataclasses

    from kernels import REGISTRY

    spec = REGISTRY[kernel]
    provs = dict(spec.providers)
    provs["torch"] = dataclasses.replace(provs["torch"], fn=fn)
    monkeypatch.setitem(REGISTRY, kernel, dataclasses.replace(spec, providers=provs))


def test_kernel_errors_become_skipped_rows(tmp_path, monkeypatch):
    import torch

    def oom(inputs, out):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    _replace_torch_provider(monkeypatch, "mul", oom)
    code = run_bench.main(["--device", "cpu", "--sizes", "n=1024", "--kernels", "mul,add",
                           "--dtypes", "fp32", "--providers", "torch", "--out", str(tmp_path),
                           "--run-id", "o", "--no-plots"])
    assert code == 0
    _, df = load_run(tmp_path / "cpu" / "o")
    mul = df[df.kernel == "mul"].iloc[0]
    assert mul.status == "skipped" and "out of memory" in mul.reason
    assert (df[df.kernel == "add"].status == "ok").all()


def test_wrong_kernel_is_failed_and_exit_1(tmp_path, monkeypatch):
    _replace_torch_provider(monkeypatch, "add", lambda i, o: i["x"] - i["y"])
    code = run_bench.main(["--device", "cpu", "--sizes", "n=1024", "--kernels", "add",
                           "--dtypes", "fp32", "--providers", "torch", "--out", str(tmp_path),
                           "--run-id", "w", "--no-plots"])
    assert code == 1
    _, df = load_run(tmp_path / "cpu" / "w")
    r = df.iloc[0]
    assert r.status == "failed" and not r.correct and "tolerance" in r.reason
    assert pd.isna(r.tflops)  # never timed, never plotted as fast


def test_results_json_has_no_nan(cpu_run):
    text = (cpu_run / "results.json").read_text()
    json.loads(text)  # strict JSON
    assert "NaN" not in text and "Infinity" not in text


@pytest.mark.parametrize("load, cores, threads, warns", [
    (1.0, 2, 2, False),  # this process alone
    (1.4, 2, 2, False),
    (1.6, 2, 2, True),  # another process keeps one of the 2 cores busy
    (5.0, 2, 1, False),  # one thread waits for no other thread: shared, not stalled
    (3.0, 16, 8, False),  # 8 threads, 13 idle cores
    (10.0, 16, 8, True),
    (None, 2, 2, False),  # no load average on this platform
])
def test_a_busy_cpu_is_said_before_the_run(load, cores, threads, warns):
    from benches.sweep.results import busy_cpu_warning

    got = busy_cpu_warning(load, cores, threads)
    assert (got is not None) == warns
    if warns:
        assert f"load average {load:g} on {cores} cores" in got


def test_every_written_row_and_metadata_key_is_declared(cpu_run):
    """The run's rows are Rows (contract/schema.py) column by column and type by type,
    and each metadata key is one of RunMeta's parts (contract/run_meta.py): a column or
    key added without its declaration fails here."""
    from contract.run_meta import meta_json, parse_meta
    from contract.schema import row_problems

    doc = json.loads((cpu_run / "results.json").read_text())
    problems = {p for row in doc["rows"] for p in row_problems(row)}
    assert not problems
    meta = parse_meta(doc["metadata"])
    assert not meta.unknown, set(meta.unknown)
    assert meta_json(meta) == doc["metadata"]  # read back as written
