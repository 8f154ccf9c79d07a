"""`python -m roofline plan`: the flags, the model they describe, the plan document and
its files.  Measuring is passed in by the entry point (roofline/__main__.py), since
roofline/ never imports benches/."""


import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from roofline.devices import DEVICES, ROOF_CLASS, DeviceError
from roofline.plan.arithmetic import (
    CHINCHILLA_TOKENS_PER_PARAM,
    DEFAULT_MFU,
    DEFAULT_POLICY,
    MEMORY_POLICIES,
    Gemm,
    attention_score_flops,
    budget_flops,
    compute_optimal,
    days_for,
    device_memory_bytes,
    matrix_bytes,
    max_params_fit,
    step_gemms,
    summarize_step,
    train_flops,
)
from roofline.plan.comm import plan_communication
from roofline.plan.model import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, PRESETS, ModelShape, PlanError
from roofline.plan.render import print_tables, render_markdown
from roofline.plan.sources import _ceilings_for, gemms_from_run, peak_of
from roofline.plan.step import step_report

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'70e9', '70B', '15T', '124M' -> a positive number."""
    s = text.strip().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1].lower() in _SUFFIX:
        mult, s = _SUFFIX[s[-1].lower()], s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number (e.g. 70e9 or 70B)") \
            from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be positive")
    return v


def _positive_int(text: str) -> int:
    v = parse_count(text)
    if v != int(v):
        raise argparse.ArgumentTypeError(f"'{text}' must be a whole number")
    return int(v)


def _positive_float(text: str) -> float:
    return parse_count(text)


def _mfu(text: str) -> float:
    v = parse_count(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a fraction in (0, 1] (0.5 = 50%)")
    return v


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints a usage block and exits 2; the contract is one line.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m roofline plan",
                description="How big a model, on how many tokens, in how many days, in how "
                            "much memory; MFU assumed or measured (DESIGN.md section 11).")
    m = p.add_argument_group("model (--params, or a shape, or a preset; shape flags "
                             "override a preset's)")
    m.add_argument("--preset", help=f"published shape: {', '.join(PRESETS)}")
    m.add_argument("--params", type=_positive_float, metavar="N",
                   help="parameter count, e.g. 70e9 or 70B (no shape: no GEMMs)")
    m.add_argument("--d-model", type=_positive_int)
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--d-ff", type=_positive_int, help="MLP width (default 4 d_model)")
    m.add_argument("--vocab", type=_positive_int, help=f"default {DEFAULT_VOCAB}")
    m.add_argument("--seq-len", type=_positive_int, help=f"default {DEFAULT_SEQ_LEN}")
    m.add_argument("--heads", type=_positive_int, help="default d_model / 64")
    m.add_argument("--kv-heads", type=_positive_int,
                   help="key/value heads (grouped-query attention; default = heads)")
    m.add_argument("--gated", action=argparse.BooleanOptionalAction, default=None,
                   help="SwiGLU MLP with 3 d x d_ff matrices (default: not gated)")
    tie = m.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="LM head shares the token embedding")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="separate LM head (default for shape-only models)")
    m.add_argument("--micro-batch", type=_positive_int, default=1,
                   help="sequences per GPU per step: GEMM M = micro-batch x seq-len "
                        "(default 1)")
    d = p.add_argument_group("data")
    dd = d.add_mutually_exclusive_group()
    dd.add_argument("--tokens", type=_positive_float, metavar="D", help="e.g. 15e12 or 15T")
    dd.add_argument("--chinchilla", action="store_true", help="D = 20 N")
    h = p.add_argument_group("hardware")
    h.add_argument("--device", help="device key (roofline.devices): default h100, or the "
                                    "device present with --measure, or the run's with "
                                    "--from-run")
    h.add_argument("--gpus", type=_positive_int, default=1, metavar="G")
    bw = h.add_mutually_exclusive_group()
    bw.add_argument("--busbw", type=_positive_float, metavar="GB/s",
                    help="collective bus bandwidth (nccl-tests' busbw) for the step's "
                         "communication on --gpus G: data-parallel all-reduce and FSDP")
    bw.add_argument("--busbw-run", metavar="RUN",
                    help="take the busbw from a saved run's largest all_reduce row")
    h.add_argument("--days", type=_positive_float, metavar="T",
                   help="time budget: the largest compute-optimal model it trains")
    h.add_argument("--gpu-memory-gb", type=_positive_float,
                   help="memory per device in GB (default: table in roofline/plan/arithmetic.py)")
    e = p.add_argument_group("efficiency (one of)")
    ee = e.add_mutually_exclusive_group()
    ee.add_argument("--mfu", type=_mfu, help=f"assumed MFU (default {DEFAULT_MFU})")
    ee.add_argument("--from-run", metavar="RUN",
                    help="MFU of a saved run's matmul rows at or near the model's GEMMs")
    ee.add_argument("--measure", nargs="?", const="gemms", choices=("gemms", "step"),
                    help="measure on the device present: 'gemms' (the default) times the "
                         "model's GEMMs; 'step' runs real training steps of the model "
                         "(forward, backward, AdamW) and counts, times and profiles them")
    e.add_argument("--measure-layers", type=_positive_int, metavar="K",
                   help="--measure step on a slice of K blocks (with the embedding and "
                        "head), extrapolated to all layers: for a model too big for the "
                        "device")
    e.add_argument("--steps", type=_positive_int, default=5,
                   help="--measure step: timed steps after 2 warm-up steps (default 5)")
    e.add_argument("--dtype", default="bf16", choices=sorted(ROOF_CLASS),
                   help="GEMM dtype (peak and measurements; default bf16)")
    e.add_argument("--provider", default="torch", choices=("torch", "triton"),
                   help="GEMM implementation measured (default torch)")
    e.add_argument("--rep-ms", type=_positive_float,
                   help="timing budget per GEMM in ms (default: the suite's TimingConfig)")
    mem = p.add_argument_group("memory")
    mm = mem.add_mutually_exclusive_group()
    mm.add_argument("--policy", choices=tuple(MEMORY_POLICIES), default=DEFAULT_POLICY,
                    help=f"precision policy (default {DEFAULT_POLICY})")
    mm.add_argument("--bytes-per-param", type=_positive_float, metavar="B")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR",
                   help="folder for plan.md, plan.json, plan.png (default "
                        "results/plans/<timestamp>/; never overwritten)")
    o.add_argument("--no-save", action="store_true", help="write no files")
    o.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    return p


_SHAPE_FLAGS = ("d_model", "layers", "d_ff", "vocab", "seq_len", "heads", "kv_heads",
                "gated", "tied")


def model_from_args(args: argparse.Namespace) -> ModelShape | None:
    given = [f for f in _SHAPE_FLAGS if getattr(args, f) is not None]
    if args.params is not None and (given or args.preset):
        raise PlanError("give --params or a shape (--preset, --d-model/--layers), not both")
    if args.preset:
        if args.preset not in PRESETS:
            raise PlanError(f"unknown preset '{args.preset}' (choose from "
                            f"{', '.join(PRESETS)})")
        base = PRESETS[args.preset]
    elif given:
        if args.d_model is None or args.layers is None:
            raise PlanError("a model shape needs --d-model and --layers")
        d = args.d_model
        heads = args.heads or (d // 64 if d % 64 == 0 else 1)
        base = ModelShape("custom", d, args.layers, 4 * d, DEFAULT_VOCAB, DEFAULT_SEQ_LEN,
                          heads, heads, tied=False)
    else:
        return None
    over = {"d_model": args.d_model, "n_layers": args.layers, "d_ff": args.d_ff,
            "vocab": args.vocab, "seq_len": args.seq_len, "heads": args.heads,
            "kv_heads": args.kv_heads, "gated": args.gated, "tied": args.tied}
    over = {k: v for k, v in over.items() if v is not None}
    if "d_model" in over and "d_ff" not in over and not args.preset:
        over["d_ff"] = 4 * over["d_model"]
    if "heads" in over and "kv_heads" not in over:
        over["kv_heads"] = over["heads"]
    shape = replace(base, **over)
    if args.preset and over:
        shape = replace(shape, name=f"{args.preset} (modified)")
    if shape.d_model % shape.heads:
        raise PlanError(f"--heads {shape.heads} does not divide d_model {shape.d_model}")
    if shape.heads % shape.kv_heads:
        raise PlanError(f"--kv-heads {shape.kv_heads} does not divide heads {shape.heads}")
    return shape


# (shape, micro-batch, "cuda" | "cpu", dtype, slice blocks or None, device bytes, timed
# steps, log) -> the step's measurements (benches.step.measure_step).
MeasureStep = Callable[[ModelShape, int, str, str, "int | None", "float | None", int, Any],
                       dict[str, Any]]
STEP_DTYPES = ("bf16", "fp16", "fp32")

# (gemms, device key, dtype, provider, timing budget ms, log) -> what was measured; fills
# each Gemm's ms, tflops and mfu (benches.plan_gemms.measure_gemms).
MeasureGemms = Callable[[list[Gemm], str, str, str, "float | None", Any], dict[str, Any]]


def _measuring_device(args: argparse.Namespace) -> str:
    """The device key a --measure runs on: --device, or the device present."""
    if args.device and args.device != "auto":
        return args.device
    from roofline.devices import detect

    return detect().key


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def build_plan(args: argparse.Namespace, log: Any = _stderr,
               measure_gemms: MeasureGemms | None = None,
               measure_step: MeasureStep | None = None) -> dict[str, Any]:
    """Everything the plan says, as a JSON-able dict (the --json document).
    `measure_gemms` times GEMMs on the device present (benches.plan_gemms) and
    `measure_step` runs training steps (benches.step); without them --measure is
    refused."""
    shape = model_from_args(args)
    params: float | None = float(shape.params) if shape else args.params
    gemms = step_gemms(shape, args.micro_batch) if shape else []
    measured: dict[str, Any] | None = None
    warnings: list[str] = []

    if args.device is not None and args.device not in DEVICES:
        raise PlanError(f"unknown device '{args.device}' (choose from {', '.join(DEVICES)})")
    if (args.measure or args.from_run) and shape is None:
        raise PlanError("--measure and --from-run need the model's shape (--preset, or "
                        "--d-model and --layers), not just --params")

    if args.measure_layers is not None and args.measure != "step":
        raise PlanError("--measure-layers goes with --measure step")
    step_measured: dict[str, Any] | None = None

    # Efficiency and the peak it is a fraction of.
    if args.measure == "step":
        assert shape is not None
        if measure_step is None:
            raise PlanError("--measure step runs the model through the benchmark harness: "
                            "run it as `python -m roofline plan ... --measure step`")
        device = _measuring_device(args)
        on_gpu = DEVICES[device].kind == "cuda"
        step_dtype = args.dtype if on_gpu else "fp32"
        if step_dtype not in STEP_DTYPES:
            raise PlanError(f"--measure step trains in {', '.join(STEP_DTYPES)} "
                            f"(autocast), not {step_dtype}")
        if not on_gpu and args.dtype != "fp32":
            warnings.append(f"the step ran in fp32 on the CPU (--dtype {args.dtype} applies "
                            "to GPU steps)")
        result = measure_step(shape, args.micro_batch, "cuda" if on_gpu else "cpu",
                              step_dtype, args.measure_layers,
                              device_memory_bytes(device, args.gpu_memory_gb)[0],
                              args.steps, log)
        peak, peak_source = peak_of(device, step_dtype, log)
        bpp_policy = args.bytes_per_param if args.bytes_per_param is not None else \
            float(sum(MEMORY_POLICIES[args.policy].values()))
        report = step_report(shape, result, peak, bpp_policy)
        ceilings = None if DEVICES[device].peaks_tflops else \
            _ceilings_for(device, log)[2].to_json()  # cached: measured by peak_of
        step_measured = {"report": report, "measurement": result, "ceilings": ceilings}
        args.dtype = step_dtype
        mfu_source = "measured step"
        mfu_from = (f"--measure step: {report['step_ms']:.4g} ms per step of "
                    f"{int(report['tokens_per_step'])} tokens on {DEVICES[device].name}"
                    + (f", extrapolated from {args.measure_layers} of {shape.n_layers} "
                       "blocks" if report["slice"] else ""))
    elif args.measure:
        if measure_gemms is None:
            raise PlanError("--measure times GEMMs through the benchmark harness: run it as "
                            "`python -m roofline plan ... --measure`")
        device = _measuring_device(args)
        measured = measure_gemms(gemms, device, args.dtype, args.provider, args.rep_ms, log)
        device = measured["device_key"]
        peak, peak_source = measured["peak_tflops"], measured["peak_source"]
        mfu_source, mfu_from = "measured", f"--measure: timed now on {measured['device_name']}"
    elif args.from_run:
        measured = gemms_from_run(gemms, args.from_run, args.dtype, args.provider)
        run_key = measured["device_key"]
        device = args.device or run_key
        if device not in DEVICES:
            raise PlanError(f"{args.from_run} was measured on '{run_key}', which is not in "
                            "the device table (pass --device)")
        if device == run_key:
            peak = measured["peak_tflops"]
            peak_source = ("datasheet" if DEVICES[device].peaks_tflops
                           else f"measured (no datasheet), run {args.from_run}")
        else:
            peak, peak_source = peak_of(device, args.dtype, log)
            warnings.append(f"MFU measured on '{run_key}' applied to '{device}'")
        mfu_source, mfu_from = "measured", f"--from-run {args.from_run}"
        if measured["worst_shape_ratio"] > 2:
            sizes = ";".join(sorted({g.shape for g in gemms}))
            warnings.append(
                f"the run's nearest matmul shapes are up to {measured['worst_shape_ratio']:.1f}x "
                f"off the model's; time the exact ones with --measure, or "
                f"`python run_bench.py --kernels matmul --dtypes {args.dtype} "
                f"--sizes '{sizes}'`")
    else:
        device = args.device or "h100"
        peak, peak_source = peak_of(device, args.dtype, log)
        mfu_source, mfu_from = "assumed", "--mfu" if args.mfu else "default assumption"

    step = summarize_step(gemms, peak)
    mfu = step["mfu"] if measured is not None else (args.mfu or DEFAULT_MFU)
    if step_measured is not None:
        mfu = step_measured["report"]["mfu"]
    if measured is not None and not mfu:
        raise PlanError("no measured MFU could be derived")
    if mfu > 1:
        warnings.append(f"MFU {mfu:.0%} is above 100%: the {peak:.4g} TFLOP/s peak is a "
                        "measurement (the best of a few square GEMMs; no datasheet), not a "
                        "hardware limit")

    # Data.
    tokens: float | None = args.tokens
    tokens_source = "--tokens" if tokens else None
    if args.chinchilla:
        if params is None:
            raise PlanError("--chinchilla needs a model (--params, --preset or a shape)")
        tokens, tokens_source = CHINCHILLA_TOKENS_PER_PARAM * params, "chinchilla (D = 20 N)"

    # Budget.
    budget = None
    if args.days:
        c = budget_flops(args.gpus, peak, mfu, args.days)
        n_opt, d_opt = compute_optimal(c)
        budget = {"days": args.days, "flops": c, "max_params_compute_optimal": n_opt,
                  "tokens_compute_optimal": d_opt}
        if params is not None and tokens is None:
            tokens, tokens_source = c / (6 * params), "the --days budget (6 N D = budget)"
        if params is not None:
            budget["tokens_for_this_model"] = c / (6 * params)

    flops = train_flops(params, tokens) if params and tokens else None
    attn = attention_score_flops(shape, tokens) if shape and tokens else None
    days = days_for(flops["total"], args.gpus, peak, mfu) if flops else None
    days_attn = days_for(flops["total"] + attn, args.gpus, peak, mfu) \
        if flops and attn is not None else None

    # Memory.
    if args.bytes_per_param is not None:
        policy, items = "explicit", {"--bytes-per-param": args.bytes_per_param}
    else:
        policy, items = args.policy, dict(MEMORY_POLICIES[args.policy])
    bpp = float(sum(items.values()))
    gpu_bytes, mem_source = device_memory_bytes(device, args.gpu_memory_gb)
    static = params * bpp if params else None
    total_mem = args.gpus * gpu_bytes if gpu_bytes else None
    fit_max = max_params_fit(args.gpus, gpu_bytes, bpp) if gpu_bytes else None
    largest = None
    if shape:
        # Per-layer matrices unfused (q, o: d x d; MLP: d_ff x d): GPT-3's MLP matrix,
        # [49152, 12288], is 2.4 GB in fp32.
        d, f = shape.d_model, shape.d_ff
        name, rows_, cols = ("mlp", f, d) if f >= d else ("attention", d, d)
        largest = {"name": name, "shape": [rows_, cols],
                   "bytes_fp32": matrix_bytes(rows_, cols, "fp32")}

    if budget is not None and total_mem:
        budget["static_bytes_compute_optimal"] = budget["max_params_compute_optimal"] * bpp
        budget["fits_compute_optimal"] = budget["static_bytes_compute_optimal"] <= total_mem

    model_doc: dict[str, Any] | None = None
    if shape:
        model_doc = {**asdict(shape), "description": shape.describe(),
                     "params_itemized": shape.param_items(), "params": shape.params,
                     "params_12d2l": shape.approx_12d2l, "matmul_params": shape.matmul_params,
                     "largest_matrix": largest}
    elif params:
        model_doc = {"name": "--params", "params": params}

    plan: dict[str, Any] = {
        "model": model_doc,
        "params": params,
        "tokens": tokens,
        "tokens_source": tokens_source,
        "train_flops": flops["total"] if flops else None,
        "flops_forward": flops["forward"] if flops else None,
        "flops_backward": flops["backward"] if flops else None,
        "attention_flops": attn,
        "device": device,
        "device_name": DEVICES[device].name if device in DEVICES else device,
        "dtype": args.dtype,
        "gpus": args.gpus,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "mfu": mfu,
        "mfu_source": mfu_source,
        "mfu_from": mfu_from,
        "days": days,
        "days_with_attention": days_attn,
        "budget": budget,
        "policy": policy,
        "bytes_per_param_itemized": items,
        "bytes_per_param": bpp,
        "static_bytes": static,
        "gpu_memory_bytes": gpu_bytes,
        "gpu_memory_source": mem_source,
        "total_memory_bytes": total_mem,
        "fits": (static <= total_mem) if static is not None and total_mem else None,
        "max_params_fit": fit_max,
        "micro_batch": args.micro_batch,
        "step": step,
        "gemms": [g.as_dict() for g in gemms],
        "warnings": warnings,
    }
    if measured is not None:
        plan["measurement"] = {k: v for k, v in measured.items() if k != "rows"}
    plan["communication"] = plan_communication(args, shape, params, peak, mfu, tokens, items,
                                           warnings)
    if step_measured is not None:
        plan["step_measured"] = step_measured
        warnings += step_measured["report"]["notes"]
    return plan


def out_dir(requested: str | None) -> Path:
    """The folder to write into; never one that already holds a plan."""
    if requested:
        p = Path(requested)
        if (p / "plan.md").exists() or (p / "plan.json").exists():
            raise PlanError(f"{p} already holds a plan (choose another --out)")
        return p
    base = Path("results") / "plans" / datetime.now().strftime("%Y%m%d-%H%M%S")
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    return p


def main(argv: list[str], measure_gemms: MeasureGemms | None = None,
         measure_step: MeasureStep | None = None) -> int:
    """`python -m roofline plan ...`; returns the exit code.  The entry point passes
    benches.plan_gemms.measure_gemms and benches.step.measure_step for --measure."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    from roofline.schema import RunLoadError, atomic_write_text

    dest = None
    try:
        if not args.no_save:
            dest = out_dir(args.out)
            # Made before any measurement, so an unwritable --out fails in a second, not
            # after minutes of timing.
            dest.mkdir(parents=True, exist_ok=True)
        plan = build_plan(args, measure_gemms=measure_gemms, measure_step=measure_step)
    except (PlanError, DeviceError, RunLoadError, OSError) as e:
        if dest is not None and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # leave no empty plan folder behind
        what = f"cannot create {dest}: " if isinstance(e, OSError) else ""
        print(f"error: {what}{e}", file=sys.stderr)
        return 2
    png = None
    if dest is not None:
        try:
            if plan["step"]["ms"] is not None:
                from roofline.plan.plot import plot_plan

                plot_plan(plan, dest / "plan.png")
                png = "plan.png"
            if plan.get("step_measured"):
                from roofline.plan.step_plot import plot_step

                plot_step(plan, dest / "step.png")
            plan["out_dir"] = str(dest)
            atomic_write_text(dest / "plan.json", json.dumps(plan, indent=1) + "\n")
            atomic_write_text(dest / "plan.md", render_markdown(plan, png))
        except OSError as e:
            print(f"error: cannot write the plan to {dest}: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(plan, indent=1))
    else:
        print_tables(plan)
        if dest is not None:
            print(f"plan: {dest / 'plan.md'}" + (f", {dest / png}" if png else ""))
    return 0
