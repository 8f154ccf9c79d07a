"""Inspect every Triton kernel for a GPU this machine need not have (docs/inspect.md).

`python run_bench.py --inspect [--arch sm_90]` compiles each kernel x autotune config x
dtype that a GPU run launches, ahead of time, and reads from the result what decides its
speed: registers, spills, shared memory against the arch's limit, the MMA instructions
and their element types (Blackwell's tcgen05 on sm_100, with its tensor memory), TMA use,
the width of the global loads that feed the tensor operands, the fp8 accumulation mode,
and ptxas's warnings (C7515: serialized wgmma).

How a case is built: each kernel module declares its launches once
(`KernelSpec.triton_launches`, shared with the real launch), for the arch's Target
(KernelSpec.launches: a family may give each arch its own configs, and a GPU run on that
arch picks the same ones from its device's capability).  They are bound, with meta
tensors of every default GPU shape, by Triton's own argument binder, so the 16-byte
alignment, divisibility-by-16 and unit-stride specializations are those of a real
launch; each distinct (function, specialization, config) is compiled once with
`triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`.  ptxas (bundled with
Triton) is run again on the PTX with `-v` for the resource report Triton discards, and
nvdisasm (also bundled) lists the SASS, many cubins a call.  A Triton that cannot target
the arch at all says so in one line (exit 0) instead of failing every case.

Also runnable as `python -m benches.inspect` (the form it re-executes itself in when
TRITON_INTERPRET=1 is set: the interpreter replaces every @triton.jit function at import
time, and those cannot be compiled).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from benches.inspect.inspect_report import print_table, summary_lines, write_files
from benches.inspect.inspected import Case, Compiled, Inspected, InspectMeta, Outcome
from benches.inspect.read import (
    WIDE_LOAD_BITS,
    fd2_captured,
    fp8_accumulation,
    global_loads,
    mlir_failure,
    mma_of,
    operands_allow_wide,
    ptxas_report,
    sass_mma,
    sass_reports,
    tensor_load_lines,
    tensor_memory,
    tma_of,
)
from benches.sweep.interrupt import python_handlers_back
from contract.request import (
    DeviceChoice,
    Output,
    RequestError,
    RunRequest,
    Selection,
    TritonChoice,
    validated,
)

# Architectures inspect compiles for: compute capability, the device model whose SM
# count sizes the launches (dot's number of partial sums), and the per-block shared
# memory limit (opt-in maximum: 227 KB on Hopper and on Blackwell's sm_100, whose SM has
# 228 KB of which CUDA keeps 1 KB (NVIDIA's Blackwell tuning guide), 163 KB on A100,
# 99 KB on Ada).  sm_100 compiles for sm_100a (Triton adds the "a": tcgen05 needs it).
ARCHES: dict[str, tuple[int, str, int]] = {
    "sm_80": (80, "a100", 166912),
    "sm_89": (89, "l40s", 101376),
    "sm_90": (90, "h100", 232448),
    "sm_100": (100, "b200", 232448),
}

# SM count of a B200 (148: two dies of 74), used only while contract.devices has no
# "b200" model to read it from.
_SMS_FALLBACK = {"b200": 148}

# Tensor memory of one Blackwell SM: 512 columns of 128 lanes x 32 bits (256 KB).
TMEM_COLUMNS = 512

# The architecture whose compile a failing sm_100 probe is held against (see
# target_unsupported).
REFERENCE_ARCH = "sm_90"

TENSOR_CORE_DTYPES = ("tf32", "fp16", "bf16", "fp8", "fp8e5")


class InspectError(ValueError):
    """Bad --inspect input (one-line message)."""


def gpu_target(cc: int):
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", cc, 32)


def sms_of(model: str) -> int:
    """SM count of a device model (contract.devices, else _SMS_FALLBACK; 0 unknown)."""
    from contract.devices import DEVICES

    dev = DEVICES.get(model)
    return (dev.sms if dev is not None else None) or _SMS_FALLBACK.get(model, 0)


def arch_target(arch: str) -> Any:
    """The kernels.spec.Target of a GPU of `arch` (no interpreter): what a run there has,
    so that each kernel builds that arch's launches (KernelSpec.launches)."""
    from kernels.spec import Target

    cc = ARCHES[arch][0]
    return Target("cuda", (cc // 10, cc % 10), name=arch)


def launches_for(kernel: str, dtype: str, shape: dict[str, int], arch: str) -> list[Any]:
    """The launches a GPU of `arch` makes for one case, on meta tensors."""
    from kernels import REGISTRY

    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    return spec.launches(inputs, spec.alloc_out(inputs, dtype), sms_of(ARCHES[arch][1]),
                         arch_target(arch))


def bind(launch: Any, cfg: Any, cc: int) -> tuple[Any, Any]:
    """(ASTSource, options) of `launch` with `cfg`, as JITFunction.run would build them
    for a GPU of capability `cc`: Triton's own binder decides the specializations."""
    from triton import knobs
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    backend = make_backend(gpu_target(cc))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**launch.constexprs, **cfg.all_kwargs()}
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, options)
    return ASTSource(fn, signature, constexprs, attrs), options


def describe_config(launch: Any, cfg: Any) -> str:
    """Tile sizes: the config's, and the launch's fixed BLOCK constexprs."""
    kw = {**{k: v for k, v in launch.constexprs.items() if k.startswith("BLOCK")},
          **cfg.kwargs}
    if {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(kw):
        return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}"
    return ",".join(f"{k.removeprefix('BLOCK_')}={v}" for k, v in kw.items()) or "-"


def _shape_str(shape: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def collect(kernels: list[str], dtypes: list[str], arch: str) -> tuple[list[Case], list[str]]:
    """Distinct compile cases for the selection, and notes on what was left out."""
    from benches.sweep.shapes import preset_shapes
    from kernels import triton_selection

    cc = ARCHES[arch][0]
    cases: dict[str, Case] = {}
    pairs, notes = triton_selection(kernels, dtypes, arch_target(arch))
    for spec, dtype in pairs:
        kernel = spec.name
        for shape in preset_shapes(spec, "default", on_gpu=True):
            for li, launch in enumerate(launches_for(kernel, dtype, shape, arch)):
                for ci, cfg in enumerate(launch.configs):
                    src, options = bind(launch, cfg, cc)
                    key = src.hash() + json.dumps(options.__dict__, sort_keys=True,
                                                  default=str)
                    case = cases.get(key)
                    if case is None:
                        case = cases[key] = Case(
                            kernel, dtype, launch.name, describe_config(launch, cfg),
                            options.num_warps, options.num_stages,
                            where=(dtype, shape, li, ci))
                    case.shapes.append(_shape_str(shape))
                    if dtype not in case.dtype.split(","):
                        # e.g. dot's final sum: fp32 partials whatever the input
                        case.dtype += "," + dtype
    return list(cases.values()), notes


def compile_case(kernel: str, where: tuple[str, dict[str, int], int, int],
                 arch: str, fp8_mode: str) -> Outcome:
    """Compile one case and read its properties (runs in a worker process)."""
    import triton

    from kernels.spec import set_fp8_accum

    set_fp8_accum(fp8_mode)
    # triton 3.9 warns once per process that its fp-fusion default will change; the
    # options used are recorded, the warning would only clutter the table.
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    cc = ARCHES[arch][0]
    dtype, shape, li, ci = where
    fd2: list[str] = []
    try:
        launch = launches_for(kernel, dtype, shape, arch)[li]
        src, options = bind(launch, launch.configs[ci], cc)
        # Triton prints the whole PTX to stdout when ptxas fails, and MLIR writes its
        # diagnostics and a reproducer to fd 2 when a pass fails: keep both off the table.
        with contextlib.redirect_stdout(io.StringIO()), fd2_captured() as fd2:
            k = triton.compile(src, target=gpu_target(cc), options=options.__dict__)
    except Exception as e:  # CompilationError, OutOfResources, PTXASError, ...
        msg = str(e).strip().splitlines()
        diag = mlir_failure("".join(fd2))
        return Outcome(error=(f"{type(e).__name__}: {msg[0] if msg else ''}"
                              + (f" ({diag})" if diag else ""))[:300])
    finally:
        python_handlers_back()  # the compile installed LLVM's signal handlers: out again
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    regs, spill_st, spill_ld, advisories, ptxas_v = ptxas_report(ptx, cc, options)
    lines = tensor_load_lines(ttgir, options.num_warps)
    loads = [(kind, bits, lines[w]) for w, kind, bits in global_loads(ptx) if w in lines]
    family, types, instr = mma_of(ptx)
    if not family:
        family = "FMA only" if launch.matrix_unit else "none"
    tmem_cols, tmem_ops = tensor_memory(ptx)
    narrow = min((b for _, b, _ in loads), default=0)
    # The narrowest load among those whose tile gives each thread 128 bits or more: the
    # number the check is about (small tiles, e.g. matvec's x, cannot do better).
    narrow_wide_ok = min((b for _, b, ok in loads if ok), default=0)
    return Outcome(Compiled(
        registers=regs, spill_stores=spill_st, spill_loads=spill_ld,
        shared=int(k.metadata.shared), mma=family, mma_types=types, mma_shape=instr,
        load_bits=narrow_wide_ok or narrow, load_bits_all=narrow,
        load_kinds=",".join(sorted({kind for kind, _, _ in loads})),
        wide_allowed=bool(loads) and operands_allow_wide(launch, src)
        and any(ok for _, _, ok in loads),
        wide_allowed_min_bits=narrow_wide_ok,
        fp8_acc=fp8_accumulation(ttgir), ptxas_warnings=tuple(advisories), ptxas=ptxas_v,
        matrix_unit=launch.matrix_unit, tmem_cols=tmem_cols, tmem_ops=tmem_ops,
        tma=tma_of(ptx), sass_mma="?", sass_ops={},  # read in _compiled_rows' batch
    ), cubin=k.asm["cubin"])


def flags_of(row: Inspected, arch: str, fp8_mode: str) -> list[str]:
    """What is wrong with a compiled case (empty: nothing)."""
    c = row.compiled
    if c is None:
        return ["compile error"]
    cc, _, smem_limit = ARCHES[arch]
    out = []
    if c.spills:
        out.append("spills")
    if c.shared > smem_limit:
        out.append("shared memory over limit")
    if c.tmem_cols > TMEM_COLUMNS:
        out.append(f"tensor memory over {TMEM_COLUMNS} columns")
    # C7515 / C7514: ptxas serializes every wgmma because non-wgmma code writes / reads
    # the accumulator registers inside the pipeline stage.
    serial = sorted({x for w in c.ptxas_warnings for x in re.findall(r"C751[45]", w)})
    if serial:
        out.append(f"serialized wgmma ({', '.join(serial)})")
    if (cc >= 90 and c.matrix_unit and set(row.dtypes) & set(TENSOR_CORE_DTYPES)
            and c.mma not in ("tcgen05", "wgmma", "mma.sync")):
        out.append("no tensor-core MMA")
    if cc >= 100 and c.mma == "mma.sync" and c.matrix_unit:
        # Blackwell still runs mma.sync, but only tcgen05 reaches its tensor-core peak.
        out.append("mma.sync, not tcgen05")
    # Before sm_100 Triton emulates dot_scaled (upcast to bf16, then bf16 wgmma): the
    # upcast gives A a shared layout 8 bytes wide, so its copies cannot be wider; that is
    # the emulation's, not a config's, and is not flagged.
    from kernels.spec import BLOCK_SCALED  # kernels load lazily (see collect)

    emulated = cc < 100 and bool(set(row.dtypes) & set(BLOCK_SCALED))
    if c.wide_allowed and c.wide_allowed_min_bits < WIDE_LOAD_BITS and not emulated:
        out.append(f"{c.wide_allowed_min_bits}-bit tensor loads (128 possible)")
    # tcgen05 has no fast/precise choice (see fp8_accumulation): only wgmma's is checked.
    if c.fp8_acc and c.fp8_acc != "tcgen05" and c.fp8_acc.split("/")[0] != fp8_mode:
        out.append(f"fp8 accumulation {c.fp8_acc}, asked for {fp8_mode}")
    return out


def _out_dir(root: Path, arch: str) -> Path:
    """<root>/inspect/<arch>-<timestamp>/, a fresh folder (never an existing one)."""
    base = Path(root) / "inspect"
    base.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        d = base / (f"{arch}-{stamp}" + (f"-{i}" if i else ""))
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise InspectError(f"cannot create a fresh folder under {base}")


def _versions(cc: int) -> dict[str, str]:
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    out = subprocess.run([get_ptxas(cc).path, "--version"], capture_output=True,
                         text=True).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return {"triton": triton.__version__, "ptxas": m.group(1) if m else "?"}


def target_unsupported(cases: list[Case], arch: str, fp8_mode: str) -> str | None:
    """Why this Triton cannot compile for `arch` at all, or None when it can: the first
    case is compiled for `arch`, and when that fails while the same case compiles for
    REFERENCE_ARCH, the fault is the target's (Triton's backend or its bundled ptxas),
    not the kernel's."""
    if arch == REFERENCE_ARCH or not cases:
        return None
    first = cases[0]
    got = compile_case(first.kernel, first.where, arch, fp8_mode)
    if not got.error:
        return None
    ref = compile_case(first.kernel, first.where, REFERENCE_ARCH, fp8_mode)
    return None if ref.error else got.error


def _cannot_target(arch: str, reason: str, log) -> tuple[int, None]:
    """The one line an inspect for an arch this Triton cannot target ends with (exit 0:
    nothing is wrong with the kernels; the toolchain is too old for the arch)."""
    import triton

    cc = ARCHES[arch][0]
    try:
        ptxas = f", ptxas {_versions(cc)['ptxas']}"
    except Exception:  # the ptxas lookup itself may not know the arch
        ptxas = ""
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    log(f"inspect {arch}: triton {triton.__version__}{ptxas} cannot target "
        f"{sm_arch_from_capability(cc)}, nothing compiled ({reason})")
    return 0, None


def inspect(kernels: list[str], dtypes: list[str], arch: str, out: Path,
            fp8_mode: str, workers: int = 2, log=print) -> tuple[int, Path | None]:
    """Compile and report; returns (exit code, output folder; None when this Triton
    cannot target `arch`)."""
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    cc, _, smem_limit = ARCHES[arch]
    try:
        cases, notes = collect(kernels, dtypes, arch)
    except Exception as e:
        # Binding builds Triton's backend for the target: an arch it does not know fails
        # here.  Held against the reference arch, so that a kernel's own error still
        # surfaces as one.
        if arch == REFERENCE_ARCH:
            raise
        collect(kernels, dtypes, REFERENCE_ARCH)
        return _cannot_target(arch, f"{type(e).__name__}: {str(e).strip()[:200]}", log)
    reason = target_unsupported(cases, arch, fp8_mode)
    if reason:
        return _cannot_target(arch, reason, log)
    log(f"inspect {arch}: {len(cases)} distinct compile cases "
        f"({len(kernels)} kernels x {len(dtypes)} dtypes), {workers} processes")
    rows = _compiled_rows(cases, arch, fp8_mode, workers)
    folder = _out_dir(out, arch)
    meta = _meta(rows, arch, fp8_mode, notes, dtypes)
    write_files(folder, meta, rows)
    print_table(rows, f"Triton kernels compiled for {arch} (triton {meta.triton}, "
                      f"ptxas {meta.ptxas}, fp8 accumulation {fp8_mode})", cc)
    for n in notes:
        log(f"left out: {n}")
    for line in summary_lines(rows, meta):
        log(line)
    log(f"wrote {folder}")
    if meta.flagged:
        print(f"{len(meta.flagged)} flagged case(s):", file=sys.stderr)
        for f_ in meta.flagged:
            print(f"  {f_}", file=sys.stderr)
        return 1, folder
    return 0, folder


def _compiled_rows(cases: list[Case], arch: str, fp8_mode: str, workers: int
                   ) -> list[Inspected]:
    """Every case compiled (in `workers` processes) and judged (flags_of)."""
    jobs = [(c.kernel, c.where, arch, fp8_mode) for c in cases]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(compile_case, *zip(*jobs, strict=True)))
    else:
        results = [compile_case(*j) for j in jobs]
    counts = sass_reports([r.cubin for r in results], ARCHES[arch][0])
    results = [r if r.compiled is None else replace(r, cubin=b"", compiled=replace(
        r.compiled, sass_mma="?" if n is None else sass_mma(n), sass_ops=n or {}))
        for r, n in zip(results, counts, strict=True)]
    rows = []
    for c, res in zip(cases, results, strict=True):
        row = Inspected(c.kernel, c.dtype, c.fn, c.config, c.warps, c.stages,
                        tuple(c.shapes), res)
        rows.append(replace(row, flags=tuple(flags_of(row, arch, fp8_mode))))
    return rows


def _meta(rows: list[Inspected], arch: str, fp8_mode: str, notes: list[str],
          dtypes: list[str]) -> InspectMeta:
    """The inspection's metadata (inspect.json): the arch, the toolchain, the flagged
    cases and the summary's figures."""
    cc, _, smem_limit = ARCHES[arch]
    versions = _versions(cc)
    ok = [c for r in rows if (c := r.compiled) is not None]

    def mma(c: Compiled) -> str:
        sass = f" ({c.sass_mma})" if c.sass_mma else ""
        return f"{c.mma} {c.mma_types}".strip() + sass

    return InspectMeta(
        arch=arch, capability=cc, smem_limit=smem_limit,
        tmem_columns=TMEM_COLUMNS if cc >= 100 else None, triton=versions["triton"],
        ptxas=versions["ptxas"], fp8_accum=fp8_mode, python=sys.version.split()[0],
        created=datetime.now().isoformat(timespec="seconds"), command=" ".join(sys.argv),
        cases=len(rows), left_out=tuple(notes),
        flagged=tuple(f"{r.name}: {'; '.join(r.flags)}" for r in rows if r.flags),
        registers_range=(min((c.registers for c in ok), default=None),
                         max((c.registers for c in ok), default=None)),
        max_shared=max((c.shared for c in ok), default=None),
        mma_per_dtype={d: sorted({mma(r.compiled) for r in rows if r.compiled is not None
                                  and d in r.dtypes and r.compiled.matrix_unit})
                       for d in dtypes})


def run_inspect(req: RunRequest) -> int:
    """Entry point of `run_bench.py --inspect`: the request's kernels and dtypes for
    req.triton.arch, written under req.output.out, with req.device.fp8_accum when given."""
    from kernels.spec import fp8_accum, interpreter_enabled, set_fp8_accum

    if req.triton.arch not in ARCHES:
        print(f"error: unknown --arch '{req.triton.arch}' (choose from {', '.join(ARCHES)})",
              file=sys.stderr)
        return 2
    if req.device.fp8_accum:
        set_fp8_accum(req.device.fp8_accum)
    if interpreter_enabled():
        # The interpreter swapped every @triton.jit function for an interpreted one at
        # import time: compile in a fresh process without it, given the request itself.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = replace(req, device=replace(req.device, fp8_accum=fp8_accum()))
        cmd = [sys.executable, "-m", "benches.inspect", "--request",
               json.dumps(child.to_json())]
        root = Path(__file__).resolve().parents[2]  # the repository root
        return subprocess.run(cmd, env=env, cwd=root).returncode
    code, _ = inspect(list(req.selection.kernels), list(req.selection.dtypes),
                      req.triton.arch, Path(req.output.out),
                      fp8_accum(), workers=int(os.environ.get("GPUBENCH_INSPECT_WORKERS", 2)))
    return code


def main(argv: list[str] | None = None) -> int:
    """`python -m benches.inspect`: its own flags, or --request JSON (run_inspect's child:
    the parent's request as it stands, not re-parsed)."""
    from kernels.spec import FP8_ACCUM_MODES

    p = argparse.ArgumentParser(prog="python -m benches.inspect",
                                description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--kernels", default="all")
    p.add_argument("--dtypes", default="all")
    p.add_argument("--out", default="results")
    p.add_argument("--fp8-accum", choices=FP8_ACCUM_MODES, default="fast")
    p.add_argument("--request", default=None, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    try:
        if ns.request is not None:
            req = validated(RunRequest.from_json(json.loads(ns.request)))
        else:
            req = validated(RunRequest(
                Selection(kernels=tuple(ns.kernels.split(",")),
                          dtypes=tuple(ns.dtypes.split(",")), providers=("all",)),
                DeviceChoice(fp8_accum=ns.fp8_accum), output=Output(out=ns.out),
                triton=TritonChoice(arch=ns.arch)))
    except (RequestError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_inspect(req)


if __name__ == "__main__":
    sys.exit(main())
