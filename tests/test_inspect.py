"""`run_bench.py --inspect`: every Triton kernel compiled for sm_90 (and sm_100) ahead of
time.

The compiles run in subprocesses: tests/conftest.py sets TRITON_INTERPRET=1, which
replaces every @triton.jit function at import time, and inspection needs the real ones
(run_inspect re-executes itself without it; the other scripts here unset it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benches.inspect import compile as ins
from benches.inspect import read as ins_read
from benches.inspect.inspected import Compiled, Inspected, Outcome
from kernels import DTYPES, REGISTRY
from kernels.matmul import configs_for
from kernels.spec import BLOCK_SCALED

ROOT = Path(__file__).resolve().parent.parent
SM90_SMEM = 232448

# Element types wgmma must multiply for each matmul dtype on sm_90.
WGMMA_TYPES = {"tf32": "tf32->f32", "fp16": "f16->f32", "bf16": "bf16->f32",
               "fp8": "e4m3->f32", "fp8e5": "e5m2->f32",
               # sm_90 has no block-scaled MMA: Triton upcasts to bf16 for wgmma.
               "mxfp8": "bf16->f32", "mxfp4": "bf16->f32", "nvfp4": "bf16->f32"}


def _triton_at_least(major: int, minor: int) -> bool:
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (major, minor)


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
            if dtype == "nvfp4" and not _triton_at_least(3, 9):
                continue  # triton 3.6's sm_90 emulation cannot compile it: skipped
            assert (spec.name, dtype) in seen, (spec.name, dtype)
    # Each matmul dtype: one compiled case per autotune config (the persistent TMA ones
    # included: every default shape's layout allows them), none dropped or merged.
    for dtype in ("fp32", "tf32", "fp16", "bf16", "fp8", "fp8e5"):
        got = [row for row in rows if row["kernel"] == "matmul" and row["dtype"] == dtype]
        assert len(got) == len(configs_for(dtype, (9, 0), tma=True)), dtype
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
        # Tensor operands move 128 bits per thread wherever the tile allows it (not the
        # bf16 emulation of the block-scaled formats: its A layout is 8 bytes wide).
        if row["wide_allowed"] and row["dtype"] not in BLOCK_SCALED:
            assert row["load_bits"] == 128, name
        # Each row's SASS (read in batches of cubins) is its own: it agrees with its PTX.
        ops = set(row["sass_ops"])
        assert bool(ops & {"HGMMA", "QGMMA"}) == (row["mma"] == "wgmma"), name
        assert bool(ops & {"UTMALDG", "UTMASTG"}) == bool(row["tma"]), name
        assert ("LDGSTS" in ops) == ("cp.async" in row["load_kinds"].split(",")), name
        if row["kernel"] == "matmul":
            dtype = row["dtype"]
            if dtype == "fp32":
                assert row["mma"] == "FMA only", name  # IEEE fp32: no tensor cores
            else:
                assert (row["mma"], row["mma_types"]) == ("wgmma", WGMMA_TYPES[dtype]), name
            assert row["fp8_acc"] == ("fast" if DTYPES[dtype].is_fp8 else ""), name
            kinds = set(row["load_kinds"].split(","))
            if row["tma"]:
                # The persistent TMA configs: tiles in and the result out by the copy
                # engine, no per-thread tile loads at all.
                assert row["tma"] == "load,store" and kinds == {""}, name
            else:
                # Tiles by cp.async; a block-scaled kernel loads its scales with ld.global.
                assert "cp.async" in kinds and row["wide_allowed"], name
                assert kinds == {"cp.async"} or dtype in BLOCK_SCALED, name
        elif not row["matrix_unit"]:
            # The vector kernels (elementwise, dot, matvec, row ops) compute on the CUDA
            # cores; a matrix-unit family other than matmul (attention) has its own tests.
            assert row["mma"] == "none", name
    # The matmul tiles really are Hopper-sized: some config uses most of the smem.
    assert data["metadata"]["max_shared"] >= 128 * 1024


def test_sm90_dot_programs_are_all_resident(sm90):
    """kernels/dot.py launches PROGRAMS_PER_SM programs per SM that stride over the
    whole input: each must fit at once in registers and shared memory, or the last
    ones run as a second wave on a few SMs."""
    from kernels.dot import PROGRAMS_PER_SM, WARPS

    _, data = sm90
    rows = [r for r in data["rows"] if r["kernel"] == "dot"]
    assert rows
    for r in rows:
        allocated = -(-r["registers"] // 8) * 8
        assert PROGRAMS_PER_SM * WARPS * 32 * allocated <= 65536, r
        assert PROGRAMS_PER_SM * (r["shared"] + 1024) <= 233472, r  # 228 KB an SM


def test_sm90_pipelined_matvec_copies_through_shared_memory(sm90):
    """matvec's STAGES > 1 configs move A and x by cp.async (tl.range pipelining); the
    STAGES = 1 ones, the plain loop the H200 run measured, by ld.global."""
    _, data = sm90
    rows = [r for r in data["rows"] if r["kernel"] == "matvec"]
    assert {int(dict(kv.split("=") for kv in r["config"].split(","))["STAGES"]) > 1
            for r in rows} == {False, True}
    for r in rows:
        staged = int(dict(kv.split("=") for kv in r["config"].split(","))["STAGES"]) > 1
        assert ("cp.async" in r["load_kinds"].split(",")) == staged, r["config"]


BAD = textwrap.dedent("""
    import dataclasses, sys
    import kernels, kernels.matmul as mm
    from benches.inspect import compile as ins

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

COMPILED = Compiled(
    registers=128, spill_stores=0, spill_loads=0, shared=0, mma="wgmma",
    mma_types="bf16->f32", mma_shape="", load_bits=128, load_bits_all=128,
    load_kinds="cp.async", wide_allowed=True, wide_allowed_min_bits=128, fp8_acc="",
    ptxas_warnings=(), ptxas="-", matrix_unit=True, tmem_cols=0, tmem_ops="", tma="",
    sass_mma="", sass_ops={})


def _row(dtype: str = "bf16", error: str = "", **kw) -> Inspected:
    """A case of `dtype` whose compile read as COMPILED but for `kw` (failed: `error`)."""
    outcome = Outcome(error=error) if error else Outcome(dataclasses.replace(COMPILED, **kw))
    return Inspected("matmul", dtype, "matmul_kernel", "128x128x64", 4, 4, (), outcome)


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
    assert ins.flags_of(_row(ptxas_warnings=(warn,)), "sm_90", "fast") == [
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


# ---- sm_100 (Blackwell) -----------------------------------------------------------------

SM100 = textwrap.dedent("""
    import sys
    import kernels.matmul as mm
    from benches.inspect import compile as ins

    # One config per dtype family keeps the test to two compiles.  Set in sm_100's own
    # table: were inspect to compile sm_90's (7 configs each) for sm_100, rows would be 14.
    mm.SM100_CONFIGS["16bit"] = [mm._cfg(128, 128, 64, 4, 4)]
    mm.SM100_CONFIGS["fp8"] = [mm._cfg(128, 128, 128, 4, 4)]
    mm.TMA_CONFIGS.clear()  # the cp.async kernel's tcgen05 path is what is checked here
    sys.exit(ins.main(["--arch", "sm_100", "--kernels", "matmul", "--dtypes", "bf16,fp8",
                       "--out", sys.argv[1]]))
""")


def test_sm100_matmul_gets_tcgen05_and_tensor_memory(tmp_path):
    r = subprocess.run([sys.executable, "-c", SM100, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600,
                       env=_env(GPUBENCH_INSPECT_WORKERS="1"))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    data = json.loads(next((tmp_path / "inspect").glob("sm_100-*/inspect.json")).read_text())
    meta = data["metadata"]
    assert (meta["capability"], meta["smem_limit"], meta["tmem_columns"]) == (100, 232448, 512)
    rows = {row["dtype"]: row for row in data["rows"]}
    assert set(rows) == {"bf16", "fp8"}
    for dtype, types, shape, sass in [
            ("bf16", "bf16->f32", "kind::f16 m128n128k16", "UTCHMMA"),
            ("fp8", "e4m3->f32", "kind::f8f6f4 m128n128k32", "UTCQMMA")]:
        row = rows[dtype]
        assert not row["error"] and row["status"] == "ok", row
        # Blackwell's MMA: tcgen05 (not Hopper's wgmma), its accumulator in tensor memory
        # (128 fp32 columns for a 128x128 tile, moved by tcgen05.ld/st), issued as UTC*MMA.
        assert (row["mma"], row["mma_types"], row["mma_shape"]) == ("tcgen05", types, shape)
        assert row["sass_mma"] == sass and row["sass_ops"]["LDTM"] >= 1
        assert (row["tmem_cols"], row["tmem_ops"]) == (128, "ld,st")
        assert row["tma"] == "" and row["load_kinds"] == "cp.async"  # pointer loads, no TMA
        assert row["spill_stores"] == row["spill_loads"] == 0
        assert 0 < row["registers"] <= 255 and 0 < row["shared"] <= 232448
    assert rows["fp8"]["fp8_acc"] == "tcgen05" and rows["bf16"]["fp8_acc"] == ""
    assert "MMA per dtype: bf16 tcgen05 bf16->f32 (UTCHMMA); fp8 tcgen05 e4m3->f32 " \
           "(UTCQMMA)" in r.stdout
    assert "tensor memory: 128-128 of 512 columns in 2 cases" in r.stdout
    assert "TMA: none" in r.stdout


# A Triton that cannot target sm_100, faked where it would fail: triton.compile (its
# bundled ptxas rejecting the arch) or the backend that binding builds for the target.
NO_SM100 = textwrap.dedent("""
    import sys
    import triton, triton.compiler
    from benches.inspect import compile as ins

    how = sys.argv[2]
    compile_, backend = triton.compile, triton.compiler.make_backend

    def fake_compile(src, target=None, options=None):
        if how == "every arch" or target.arch >= 100:
            raise RuntimeError("ptxas fatal   : Value 'sm_100a' is not defined for option "
                               "'gpu-name'")
        return compile_(src, target=target, options=options)

    def fake_backend(target):
        if target.arch >= 100:
            raise ValueError(f"unsupported target {target}")
        return backend(target)

    if how == "backend":
        triton.compiler.make_backend = fake_backend
    else:
        triton.compile = fake_compile
    sys.exit(ins.main(["--arch", "sm_100", "--kernels", "add", "--dtypes", "fp16",
                       "--out", sys.argv[1]]))
""")


@pytest.mark.parametrize("how", ["compile", "backend"])
def test_arch_this_triton_cannot_target_is_one_line_and_exit_zero(tmp_path, how):
    r = subprocess.run([sys.executable, "-c", NO_SM100, str(tmp_path), how], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env=_env(GPUBENCH_INSPECT_WORKERS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1, r.stdout
    assert lines[0].startswith("inspect sm_100: triton ") and "cannot target sm_100a" in lines[0]
    assert ("'sm_100a' is not defined" if how == "compile" else "unsupported target") in lines[0]
    assert not r.stderr.strip()
    assert not (tmp_path / "inspect").exists() or not any((tmp_path / "inspect").iterdir())


def test_kernel_failing_on_every_arch_is_a_compile_error_not_an_unsupported_arch(tmp_path):
    r = subprocess.run([sys.executable, "-c", NO_SM100, str(tmp_path), "every arch"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=_env(GPUBENCH_INSPECT_WORKERS="1"))
    assert r.returncode == 1, r.stdout[-3000:]
    assert "cannot target" not in r.stdout
    assert "compile error" in r.stderr


# Recorded from triton 3.9 (ptx .version 9.x) and triton 3.6 (the GPU machines') for
# sm_100a: the instruction descriptor is a constant moved into the register the MMA takes.
TCGEN05_PTX = {
    "bf16": ("mov.b32 %r143, 138478736;\n"
             "@%p23 tcgen05.mma.cta_group::1.kind::f16 [ %r424 + 0 ], %rd73, %rd74, %r143, %p22;",
             ("bf16->f32", "kind::f16 m128n256k16")),
    "fp16": ("mov.b32 %r143, 138477584;\n"
             "@%p23 tcgen05.mma.cta_group::1.kind::f16 [ %r424 + 0 ], %rd73, %rd74, %r143, %p22;",
             ("f16->f32", "kind::f16 m128n256k16")),
    "tf32": ("mov.b32 %r116, 138414352;\n"
             "@%p15 tcgen05.mma.cta_group::1.kind::tf32 [ %r442 + 0 ], %rd60, %rd61, %r116, %p14;",
             ("tf32->f32", "kind::tf32 m128n256k8")),
    "fp8": ("mov.b32 %r113, 136314896;\n"
            "@%p10 tcgen05.mma.cta_group::1.kind::f8f6f4 [ %r368 + 0 ], %rd63, %rd64, %r113, %p9;",
            ("e4m3->f32", "kind::f8f6f4 m128n128k32")),
    "fp8e5": ("mov.b32 %r115, 136316048;\n"
              "@%p15 tcgen05.mma.cta_group::1.kind::f8f6f4 [ %r388 + 0 ], %rd51, %rd56, %r115, "
              "%p14;", ("e5m2->f32", "kind::f8f6f4 m128n128k32")),
    "mxfp8 3.9": ("mov.b32 %r82, 144769024;\n"
                  "@%p7 tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.block32 "
                  "[ %r357 + 0 ], %rd275, %rd276, %r82, [ %r83 + 0 ], [ %r84 + 0 ], %p6;",
                  ("e4m3->f32 ue8m0/32", "kind::mxf8f6f4 m128n128k32")),
    "mxfp8 3.6": ("mov.b32 %r39, 144769024;\n"
                  "@%p5 tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X "
                  "[ %r307 + 0 ], %rd275, %rd276, %r39, [ %r40 + 0 ], [ %r41 + 0 ], %p4;",
                  ("e4m3->f32 ue8m0/32", "kind::mxf8f6f4 m128n128k32")),
    "mxfp4 3.9": ("mov.b32 %r199, 144704640;\n"
                  "@%p7 tcgen05.mma.cta_group::1.kind::mxf4.block_scale.block32 [ %r468 + 0 ], "
                  "%rd150, %rd151, %r199, [ %r200 + 0 ], [ %r201 + 0 ], %p6;",
                  ("e2m1->f32 ue8m0/32", "kind::mxf4 m128n128k64")),
    "mxfp4 3.6": ("mov.b32 %r156, 144704640;\n"
                  "@%p5 tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::2X "
                  "[ %r422 + 0 ], %rd150, %rd151, %r156, [ %r157 + 0 ], [ %r158 + 0 ], %p4;",
                  ("e2m1->f32 ue8m0/32", "kind::mxf4 m128n128k64")),
    "nvfp4 3.9": ("mov.b32 %r259, 136316032;\n"
                  "@%p7 tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16 "
                  "[ %r529 + 0 ], %rd158, %rd159, %r259, [ %r260 + 0 ], [ %r261 + 0 ], %p6;",
                  ("e2m1->f32 ue4m3/16", "kind::mxf4nvf4 m128n128k64")),
    "nvfp4 3.6": ("mov.b32 %r165, 136316032;\n"
                  "@%p5 tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X "
                  "[ %r432 + 0 ], %rd158, %rd159, %r165, [ %r166 + 0 ], [ %r167 + 0 ], %p4;",
                  ("e2m1->f32 ue4m3/16", "kind::mxf4nvf4 m128n128k64")),
}


@pytest.mark.parametrize("name", list(TCGEN05_PTX))
def test_tcgen05_mma_read_from_its_instruction_descriptor(name):
    ptx, (types, shape) = TCGEN05_PTX[name]
    ptx = "// begin inline asm\n" + ptx + "\n// end inline asm\n"
    assert ins.mma_of(ptx) == ("tcgen05", types, shape)


def test_tcgen05_mma_edge_cases():
    wgmma = ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, p, "
             "1, 1, 0, 1;")
    assert ins.mma_of(wgmma) == ("wgmma", "bf16->f32", "m64n256k16")
    # A descriptor computed at run time: the kind is known, the types are not.
    assert ins.mma_of("tcgen05.mma.cta_group::1.kind::f16 [ %r1 + 0 ], %rd1, %rd2, %r9, "
                      "%p1;") == ("tcgen05", "?", "kind::f16")
    # An immediate descriptor, and the two-CTA form (M spans the CTA pair).
    two = ("tcgen05.mma.cta_group::2.kind::f16 [ %r1 + 0 ], %rd1, %rd2, 0x10400490, %p1;")
    assert ins.mma_of(two) == ("tcgen05", "bf16->f32", "kind::f16 m256n256k16, 2 CTAs")


def test_tensor_memory_and_tma_read_from_ptx():
    ptx = textwrap.dedent("""
        @%p1 tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r31], 256;
        @%p19 tcgen05.st.sync.aligned.32x32b.x128.b32 [%r341 + 0], {%r642, %r642};
        tcgen05.ld.sync.aligned.32x32b.x128.b32 {%r213, %r214}, [%r1 + 0];
        @%p1 tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r406, 256;
    """)
    assert ins.tensor_memory(ptx) == (256, "ld,st")
    assert ins.tensor_memory("mov.b32 %r7, 128;\n tcgen05.alloc.cta_group::1.sync.aligned."
                             "shared::cta.b32 [%r3], %r7;\n tcgen05.cp.cta_group::1.128x256b "
                             "[%r1], %rd2;") == (128, "cp")
    assert ins.tensor_memory("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r3], "
                             "%r8;") == (-1, "")
    assert ins.tensor_memory("cp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10;") \
        == (0, "")
    tma = textwrap.dedent("""
        @%p5 cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%r18], [%rd15, {%r19, %r20}], [%r17];
        @%p7 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd16, {%r19, %r20}], [%r18];
        cp.async.bulk.commit_group;
    """)  # noqa: E501 (recorded lines)
    assert ins.tma_of(tma) == "load,store"
    assert ins.tma_of("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::"
                      "complete_tx::bytes [%r1], [%rd1, {%r2, %r3, %r4}], [%r5];") == "load"
    assert ins.tma_of("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group "
                      "[%rd1, {%r1, %r2}], [%r3];") == "reduce"
    assert ins.tma_of("cp.async.cg.shared.global [ %r1 + 0 ], [ %rd1 + 0 ], 0x10;") == ""


def test_sass_counts_from_a_listing():
    # Recorded listing lines (cuobjdump -sass; nvdisasm lists alike): sm_100a (tcgen05 ->
    # UTC*MMA, tensor memory, TMA) and sm_90a (wgmma -> HGMMA).  UTCBAR / UTCATOMSWS
    # (barriers, TMEM allocation) and WARPGROUP.ARRIVE are not counted.
    sass = textwrap.dedent("""
        /*0130*/   UTCATOMSWS.FIND_AND_SET.ALIGN UP0, UR5, UR5 ;   /* 0x00000005000575e3 */
        /*1360*/   STTM.x128 tmem[UR12], RZ ;                      /* 0x000000ff000079ed */
        /*1580*/   LDGSTS.E.BYPASS.128 [R63+0x18000], desc[UR18][R28.64], P5 ;  /* 0x1 */
        /*1ca0*/   UTCHMMA gdesc[UR6], gdesc[UR8], tmem[UR20], tmem[UR30], idesc[UR31], !UPT ;
        /*1cd0*/   @UP0 UTCHMMA gdesc[UR28], gdesc[UR26], tmem[UR20], tmem[UR32], idesc[UR33], UPT ;
        /*1d60*/   UTCQMMA gdesc[UR8], gdesc[UR16], tmem[UR11], tmem[UR20], idesc[UR21], !UPT ;
        /*1970*/   UTCOMMA gdesc[UR6], gdesc[UR8], tmem[UR15], tmem[UR22], idesc[UR23], tmem[UR16], UPT ;
        /*1e00*/   UTCBAR [UR4], URZ ;
        /*1f00*/   @!P0 LDTM.x128 R24, tmem[UR4] ;
        /*0ad0*/   @UP1 UTMALDG.2D [UR12], [UR6] ;                 /* 0x0000000c060015b4 */
        /*0db0*/   @UP1 UTMASTG.2D [UR12], [UR8] ;                 /* 0x0000000c080013b5 */
        /*2460*/   WARPGROUP.ARRIVE ;                              /* 0x00000000000079c5 */
        /*2490*/   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8].tnspB, R24 ;  /* 0x43e0000008 */
    """)  # noqa: E501 (recorded lines)
    ops = ins_read.sass_ops(sass)
    # each offset read as hex, past a predicate (the batch gives instructions back by it)
    assert len(ops) == 13 and ops[:2] == [(0x130, "UTCATOMSWS"), (0x1360, "STTM")]
    assert ops[4] == (0x1CD0, "UTCHMMA") and ops[8] == (0x1F00, "LDTM")
    counts = ins_read.sass_counts(op for _, op in ops)
    assert counts == {"HGMMA": 1, "LDGSTS": 1, "LDTM": 1, "STTM": 1, "UTCHMMA": 2,
                      "UTCOMMA": 1, "UTCQMMA": 1, "UTMALDG": 1, "UTMASTG": 1}
    assert ins_read.sass_mma(counts) == "HGMMA+UTCHMMA+UTCOMMA+UTCQMMA"
    assert ins_read.sass_mma({"LDGSTS": 4}) == ""


def _cubin(*ops: str) -> bytes:
    """An ELF64 whose one executable section holds a 16-byte 'instruction' per opcode
    (its name, zero-padded), for the stand-in disassembler below."""
    code = b"".join(op.encode().ljust(16, b"\0") for op in ops)
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    struct.pack_into("<Q", head, 0x28, 64 + len(code))  # the section headers follow
    struct.pack_into("<HH", head, 0x3A, 64, 2)
    text = struct.pack("<IIQQQQIIQQ", 0, 1, 0x6, 0, 64, len(code), 0, 0, 16, 0)
    return bytes(head) + code + bytes(64) + text


def test_sass_is_read_many_cubins_a_call_each_given_back_its_own(monkeypatch):
    """The cubins' code goes to the disassembler as one raw stream per SASS_BATCH
    cubins (one start-up for them) and each instruction back to its cubin by offset;
    a cubin that is no ELF, or a call that fails, reads as None."""
    calls, run = [], subprocess.run

    def disassembler(args, **kwargs):  # nvdisasm -b SMxx -ndf FILE, 16-byte words
        if "-b" not in args:  # Triton asking the tool its version
            return run(args, **kwargs)
        calls.append(args[2])
        raw = Path(args[-1]).read_bytes()
        return subprocess.CompletedProcess(args, 0, "".join(
            f"        /*{i:04x}*/   {raw[i:i + 16].rstrip(bytes(1)).decode()} ;\n"
            for i in range(0, len(raw), 16)), "")

    monkeypatch.setattr(ins_read.subprocess, "run", disassembler)
    cubins = [_cubin("HGMMA", "NOP", "HGMMA", "LDGSTS"), b"no cubin", b"",
              _cubin("UTMALDG", "EXIT"), _cubin("QGMMA")]
    want = [{"HGMMA": 2, "LDGSTS": 1}, None, None, {"UTMALDG": 1}, {"QGMMA": 1}]
    assert ins_read.sass_reports(cubins, 90) == want and calls == ["SM90a"]
    monkeypatch.setattr(ins_read, "SASS_BATCH", 2)
    assert ins_read.sass_reports(cubins, 90) == want and calls == ["SM90a"] * 3
    assert ins_read.sass_reports(cubins[3:4], 100) == [{"UTMALDG": 1}]
    assert calls[-1] == "SM100a"
    monkeypatch.setattr(ins_read.subprocess, "run", lambda args, **kw: run(args, **kw) if "-b"
                        not in args else subprocess.CompletedProcess(args, 1, "", "no"))
    assert ins_read.sass_reports(cubins, 90) == [None] * 5


def test_fp8_on_tcgen05_has_no_fast_or_precise_mode():
    dot = ("ttng.tc_gen5_mma %a_53, %b_61, %acc, %false, %acc_49, %acc_47[%true] {is_async} : "
           "!ttg.memdesc<256x128xf8E4M3FN, #shared1, #smem, mutable>, !ttg.memdesc<128x128x"
           "f8E4M3FN, #shared2, #smem, mutable>, !ttg.memdesc<256x128xf32, #tmem, "
           "#ttng.tensor_memory, mutable>, !ttg.memdesc<1xi64, #shared, #smem, mutable>")
    assert ins.fp8_accumulation(dot) == "tcgen05"
    assert ins.fp8_accumulation(dot.replace("f8E4M3FN", "bf16")) == ""
    # Either mode asked for: tcgen05 is not flagged (the code is the same for both).
    for mode in ("fast", "precise"):
        assert ins.flags_of(_row(dtype="fp8", mma="tcgen05", fp8_acc="tcgen05"), "sm_100",
                            mode) == []


def test_flags_on_sm100():
    assert ins.flags_of(_row(mma="tcgen05"), "sm_100", "fast") == []
    assert ins.flags_of(_row(mma="tcgen05", shared=232448), "sm_100", "fast") == []
    assert ins.flags_of(_row(mma="tcgen05", shared=232449), "sm_100", "fast") == [
        "shared memory over limit"]
    assert ins.flags_of(_row(mma="tcgen05", tmem_cols=512), "sm_100", "fast") == []
    assert ins.flags_of(_row(mma="tcgen05", tmem_cols=1024), "sm_100", "fast") == [
        "tensor memory over 512 columns"]
    # Blackwell runs mma.sync, but below its tensor-core peak (Hopper's rule unchanged).
    assert ins.flags_of(_row(mma="mma.sync"), "sm_100", "fast") == ["mma.sync, not tcgen05"]
    assert ins.flags_of(_row(mma="mma.sync"), "sm_90", "fast") == []
    assert ins.flags_of(_row(mma="FMA only"), "sm_100", "fast") == ["no tensor-core MMA"]
    assert ins.flags_of(_row(mma="FMA only", dtype="fp32"), "sm_100", "fast") == []


def test_fd2_captured_keeps_cxx_diagnostics_off_the_terminal(capfd):
    with ins_read.fd2_captured() as text:
        os.write(2, b"k.py:1:2: error: boom\n")  # as C++ writes, past sys.stderr
    assert text == ["k.py:1:2: error: boom\n"]
    assert capfd.readouterr().err == ""
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"


def test_mlir_pass_failure_named():
    text = textwrap.dedent("""
        /k/matmul_blockscaled.py:45:0: error: Failures have been detected while processing an MLIR pass pipeline
        /k/matmul_blockscaled.py:45:0: note: Pipeline failed while executing [`TritonGPUAccelerateMatmul` on 'builtin.module' operation]: reproducer generated at `std::errs`
    """)  # noqa: E501 (recorded lines)
    assert ins.mlir_failure(text) == "in TritonGPUAccelerateMatmul"
    assert ins.mlir_failure("x.py:3:4: error: operand #0 does not dominate this use\n" + text) \
        == "operand #0 does not dominate this use; in TritonGPUAccelerateMatmul"
    assert ins.mlir_failure("") == ""


def test_sm100_sm_count_from_the_device_model_else_b200s(monkeypatch):
    from contract import devices

    b200 = devices.DEVICES.get("b200")
    assert ins.sms_of("b200") == (b200.sms if b200 and b200.sms else 148)
    monkeypatch.delitem(devices.DEVICES, "b200", raising=False)
    assert ins.sms_of("b200") == 148
    monkeypatch.setitem(devices.DEVICES, "b200",
                        devices.DEVICES["h100"].__class__(**{**vars(devices.DEVICES["h100"]),
                                                             "sms": 160}))
    assert ins.sms_of("b200") == 160
