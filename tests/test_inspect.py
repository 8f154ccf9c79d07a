"""`run_bench.py --inspect`: every Triton kernel compiled for sm_90 ahead of time.

The compiles run in subprocesses: tests/conftest.py sets TRITON_INTERPRET=1, which
replaces every @triton.jit function at import time, and inspection needs the real ones
(run_inspect re-executes itself without it; the other scripts here unset it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benches import inspect as ins
from kernels import DTYPES, REGISTRY
from kernels.matmul import CONFIGS

ROOT = Path(__file__).resolve().parent.parent
SM90_SMEM = 232448

# Element types wgmma must multiply for each matmul dtype on sm_90.
WGMMA_TYPES = {"tf32": "tf32->f32", "fp16": "f16->f32", "bf16": "bf16->f32",
               "fp8": "e4m3->f32", "fp8e5": "e5m2->f32"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def sm90(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    """One full inspect run for sm_90 over every kernel and dtype, as a user runs it
    (with TRITON_INTERPRET=1 inherited from conftest: exercises the re-exec)."""
    out = tmp_path_factory.mktemp("inspect")
    r = subprocess.run([sys.executable, "run_bench.py", "--inspect", "--arch", "sm_90",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=900)
    folders = list((out / "inspect").glob("sm_90-*"))
    assert len(folders) == 1, (r.stdout[-2000:], r.stderr[-2000:])
    assert (folders[0] / "inspect.csv").exists()
    return r, json.loads((folders[0] / "inspect.json").read_text())


def test_sm90_exits_zero_and_covers_every_kernel_and_dtype(sm90):
    r, data = sm90
    assert r.returncode == 0, r.stderr[-3000:]
    rows = data["rows"]
    seen = {(row["kernel"], d) for row in rows for d in row["dtype"].split(",")}
    for spec in REGISTRY.values():
        for dtype in spec.providers["triton"].dtypes:
            assert (spec.name, dtype) in seen, (spec.name, dtype)
    # Each matmul dtype: one compiled case per autotune config, none dropped or merged.
    for dtype, family in [("fp32", "ieee"), ("tf32", "tf32"), ("fp16", "16bit"),
                          ("bf16", "16bit"), ("fp8", "fp8"), ("fp8e5", "fp8")]:
        got = [row for row in rows if row["kernel"] == "matmul" and row["dtype"] == dtype]
        assert len(got) == len(CONFIGS[family]), dtype
    assert data["metadata"]["smem_limit"] == SM90_SMEM
    assert data["metadata"]["fp8_accum"] == "fast"
    assert data["metadata"]["ptxas"] != "?"


def test_sm90_properties_of_point_3(sm90):
    _, data = sm90
    for row in data["rows"]:
        name = f"{row['kernel']} {row['dtype']} {row['config']}"
        assert not row["error"], name
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, name
        assert 0 < row["registers"] <= 255, name
        assert row["shared"] <= SM90_SMEM, name
        assert not any("C7515" in w or "C7514" in w for w in row["ptxas_warnings"]), name
        # Tensor operands move 128 bits per thread wherever the tile allows it.
        if row["wide_allowed"]:
            assert row["load_bits"] == 128, name
        if row["kernel"] == "matmul":
            dtype = row["dtype"]
            if dtype == "fp32":
                assert row["mma"] == "FMA only", name  # IEEE fp32: no tensor cores
            else:
                assert (row["mma"], row["mma_types"]) == ("wgmma", WGMMA_TYPES[dtype]), name
            assert row["fp8_acc"] == ("fast" if DTYPES[dtype].is_fp8 else ""), name
            assert row["load_kinds"] == "cp.async" and row["wide_allowed"], name
        else:
            assert row["mma"] == "none", name
    # The matmul tiles really are Hopper-sized: some config uses most of the smem.
    assert data["metadata"]["max_shared"] >= 128 * 1024


BAD = textwrap.dedent("""
    import dataclasses, sys
    import kernels, kernels.matmul as mm
    from benches import inspect as ins

    orig = mm.SPEC.make_inputs

    def row_major_b(shape, dtype, seed, device):
        d = orig(shape, dtype, seed, device)
        d["B"] = d["B"].contiguous()  # the old tf32 layout: B row-major
        return d

    kernels.REGISTRY["matmul"] = dataclasses.replace(mm.SPEC, make_inputs=row_major_b)
    # 128x256x32 as shipped; 256x256x32 with 4 stages: 4 x (256 + 256) x 32 x 4 bytes =
    # 262144 bytes of shared memory, over the 232448 of an H100.
    mm.CONFIGS["tf32"] = [mm._cfg(128, 256, 32, 3, 8), mm._cfg(256, 256, 32, 4, 8)]
    sys.exit(ins.main(["--arch", "sm_90", "--kernels", "matmul", "--dtypes", "tf32",
                       "--out", sys.argv[1]]))
""")


def test_bad_layout_and_oversized_config_are_flagged(tmp_path):
    r = subprocess.run([sys.executable, "-c", BAD, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=_env(GPUBENCH_INSPECT_WORKERS="1"))
    assert r.returncode == 1, r.stderr[-3000:]
    flagged = [ln.strip() for ln in r.stderr.splitlines() if ln.startswith("  matmul tf32")]
    assert len(flagged) == 2, r.stderr
    # Row-major B: tf32 wgmma wants K-major tiles, so the copies shrink to 4 bytes.
    assert "128x256x32" in flagged[0] and "32-bit tensor loads (128 possible)" in flagged[0]
    assert "256x256x32" in flagged[1] and "shared memory over limit" in flagged[1]
    data = json.loads(next((tmp_path / "inspect").glob("sm_90-*/inspect.json")).read_text())
    big = data["rows"][1]
    assert big["shared"] == 262144


# ---- the readers and the verdicts, on synthetic input ------------------------------------

def _row(**kw) -> dict:
    row = {"error": "", "dtype": "bf16", "spill_stores": 0, "spill_loads": 0, "shared": 0,
           "ptxas_warnings": [], "matrix_unit": True, "mma": "wgmma", "wide_allowed": True,
           "wide_allowed_min_bits": 128, "fp8_acc": ""}
    row.update(kw)
    return row


def test_flags_thresholds():
    assert ins.flags_of(_row(), "sm_90", "fast") == []
    assert ins.flags_of(_row(shared=SM90_SMEM), "sm_90", "fast") == []
    assert ins.flags_of(_row(shared=SM90_SMEM + 1), "sm_90", "fast") == [
        "shared memory over limit"]
    # sm_80's limit is 166912: what fits an H100 does not fit an A100.
    assert ins.flags_of(_row(shared=166913), "sm_80", "fast") == ["shared memory over limit"]
    assert ins.flags_of(_row(spill_loads=4), "sm_90", "fast") == ["spills"]
    assert ins.flags_of(_row(wide_allowed_min_bits=64), "sm_90", "fast") == [
        "64-bit tensor loads (128 possible)"]
    assert ins.flags_of(_row(wide_allowed=False, wide_allowed_min_bits=32), "sm_90",
                        "fast") == []
    assert ins.flags_of(_row(mma="FMA only", dtype="tf32"), "sm_90", "fast") == [
        "no tensor-core MMA"]
    assert ins.flags_of(_row(mma="FMA only", dtype="fp32"), "sm_90", "fast") == []
    assert ins.flags_of(_row(mma="FMA only", dtype="fp16"), "sm_80", "fast") == []
    warn = "(C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized"
    assert ins.flags_of(_row(ptxas_warnings=[warn]), "sm_90", "fast") == [
        "serialized wgmma (C7515)"]
    assert ins.flags_of(_row(dtype="fp8", fp8_acc="precise/128"), "sm_90", "fast") == [
        "fp8 accumulation precise/128, asked for fast"]
    assert ins.flags_of(_row(error="PTXASError: x"), "sm_90", "fast") == ["compile error"]


def test_ptx_loads_and_inline_asm_locations():
    ptx = textwrap.dedent("""
        .file 1 "/k.py"
        .loc 1 45 9
        // begin inline asm
        .loc 1 46 9
        mov.u32 %r2, 0x0;
        @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
        // end inline asm
        .loc 1 50 3
        ld.global.b16 %rs1, [ %rd2 + 0 ];
        cp.async.cg.shared.global [ %r16 + 0 ], [ %rd17 + 0 ], 0x10, %r18;
        cp.async.ca.shared.global [ %r16 + 0 ], [ %rd17 + 0 ], 4, %r18;
    """)
    assert ins.global_loads(ptx) == [(("/k.py", 45), "ld.global", 128),
                                     (("/k.py", 50), "ld.global", 16),
                                     (("/k.py", 50), "cp.async", 128),
                                     (("/k.py", 50), "cp.async", 32)]


def test_fp8_accumulation_read_from_the_ir():
    dot = ("%acc = ttng.warp_group_dot %a, %b, %c {inputPrecision = 0 : i32, "
           "maxNumImpreciseAcc = {} : i32} : !ttg.memdesc<128x128xf8E4M3FN, #s> * "
           "!ttg.memdesc<128x256xf8E4M3FN, #s> -> tensor<128x256xf32, #mma>")
    assert ins.fp8_accumulation(dot.replace("{}", "1073741824")) == "fast"
    assert ins.fp8_accumulation(dot.replace("{}", "128")) == "precise/128"
    # No limit printed (0): promoted after every k32 wgmma.
    assert ins.fp8_accumulation(dot.replace(", maxNumImpreciseAcc = {} : i32", "")) == \
        "precise/32"
    assert ins.fp8_accumulation(dot.replace("f8E4M3FN", "bf16")) == ""


def test_unknown_arch_is_a_usage_error():
    r = subprocess.run([sys.executable, "run_bench.py", "--inspect", "--arch", "sm_70"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
