"""`python -m roofline plan`: the plan document from the flags (roofline/plan/flags.py)
and its files.  Measuring is passed in by the entry point (roofline/__main__.py), since
roofline/ never imports benches/."""


import argparse
import errno
import json
import os
import sys
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from roofline.model.devices import DEVICES, DeviceError
from roofline.plan.arithmetic import (
    CHINCHILLA_TOKENS_PER_PARAM,
    DEFAULT_MFU,
    attention_score_flops,
    budget_flops,
    compute_optimal,
    days_for,
    device_memory_bytes,
    matrix_bytes,
    max_params_fit,
    policy_items,
    step_gemms,
    summarize_step,
    train_flops,
)
from roofline.plan.comm import plan_communication
from roofline.plan.explain import explain_report, step_kernels
from roofline.plan.flags import build_parser, model_from_args
from roofline.plan.harness import DeviceCeilings, Harness
from roofline.plan.model import PlanError
from roofline.plan.render import print_tables, render_markdown
from roofline.plan.sources import gemms_from_run, measured_ceilings, peak_of
from roofline.plan.step import gemms_from_step, step_report

STEP_DTYPES = ("bf16", "fp16", "fp32")
# The step's ops as they run: torch's.
EXPLAIN_PROVIDER = "torch"


def _measuring_device(args: argparse.Namespace) -> tuple[str, list[str]]:
    """(device key, warnings) of a --measure, either kind: --device, or the device
    present.  DeviceError (one line, exit 2) before anything is measured when --device
    names a GPU and none is present."""
    from roofline.model.devices import detect, host_cpu, resolve

    if args.device and args.device != "auto":
        present = host_cpu() if args.device == "cpu" else detect()
        model, warnings = resolve(args.device, present)
        return model.key, warnings
    return detect().key, []


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def build_plan(args: argparse.Namespace, log: Any = _stderr,
               harness: Harness | None = None) -> dict[str, Any]:
    """Everything the plan says, as a JSON-able dict (the --json document).
    The harness (roofline/plan/harness.py) times GEMMs, training steps and the step's
    kernels on the device present and measures the ceilings of a device without a
    datasheet; without its functions --measure, --explain and such a device are
    refused."""
    harness = harness or Harness()
    measure_gemms, measure_step = harness.measure_gemms, harness.measure_step
    measure_kernels, device_ceilings = harness.measure_kernels, harness.device_ceilings
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
    explain = getattr(args, "explain", False)
    if explain and args.measure != "step":
        raise PlanError("--explain goes with --measure step")
    if explain and measure_kernels is None:
        raise PlanError("--explain times the step's kernels through the benchmark harness: "
                        "run it as `python -m roofline plan ... --measure step --explain`")
    weight_format = getattr(args, "weight_format", None)
    if weight_format and args.bytes_per_param is not None:
        raise PlanError("--weight-format changes a --policy's weights; --bytes-per-param "
                        "already gives the total")
    step_measured: dict[str, Any] | None = None

    # Efficiency and the peak it is a fraction of.
    if args.measure == "step":
        assert shape is not None
        if measure_step is None:
            raise PlanError("--measure step runs the model through the benchmark harness: "
                            "run it as `python -m roofline plan ... --measure step`")
        device, device_warnings = _measuring_device(args)
        warnings += device_warnings
        on_gpu = DEVICES[device].kind == "cuda"
        step_dtype = args.dtype if on_gpu else "fp32"
        if step_dtype not in STEP_DTYPES:
            raise PlanError(f"--measure step trains in {', '.join(STEP_DTYPES)} "
                            f"(autocast), not {step_dtype}")
        if not on_gpu and args.dtype != "fp32":
            warnings.append(f"the step ran in fp32 on the CPU (--dtype {args.dtype} applies "
                            "to GPU steps)")
        device_bytes = device_memory_bytes(device, args.gpu_memory_gb)[0]
        result = measure_step(shape, args.micro_batch, "cuda" if on_gpu else "cpu",
                              step_dtype, args.measure_layers, device_bytes, args.steps, log)
        peak, peak_source = peak_of(device, step_dtype, log, device_ceilings)
        bpp_policy = args.bytes_per_param if args.bytes_per_param is not None else \
            float(sum(policy_items(args.policy, weight_format).values()))
        report = step_report(shape, result, peak, bpp_policy, device_bytes, peak_source)
        gemms_timed = gemms_from_step(gemms, result.get("gemm_calls"), peak)
        ceilings = None if DEVICES[device].peaks_tflops else \
            measured_ceilings(device, log, device_ceilings).to_json()  # cached by peak_of
        step_measured = {"report": report, "measurement": result, "ceilings": ceilings}
        if explain:
            assert measure_kernels is not None
            kernels = step_kernels(shape, args.micro_batch, step_dtype)
            timed = measure_kernels([k.request() for k in kernels], device,
                                    EXPLAIN_PROVIDER, args.rep_ms, log)
            step_measured["explain"] = explain_report(
                kernels, timed, result["profile_explain_ms"], result.get("profile_span_ms"))
            step_measured["explain_measurement"] = timed
        args.dtype = step_dtype
        mfu_source = "measured step"
        mfu_from = (f"--measure step: {report['step_ms']:.4g} ms per step of "
                    f"{int(report['tokens_per_step'])} tokens on {DEVICES[device].name}"
                    + (f", extrapolated from {args.measure_layers} of {shape.n_layers} "
                       "blocks" if report["slice"] else "")
                    + "; PaLM's 6 N + 12 L H Q T, the full attention square")
    elif args.measure:
        if measure_gemms is None:
            raise PlanError("--measure times GEMMs through the benchmark harness: run it as "
                            "`python -m roofline plan ... --measure`")
        # The GEMM timer resolves the device again and logs its warnings.
        device, _ = _measuring_device(args)
        measured = measure_gemms(gemms, device, args.dtype, args.provider, args.rep_ms, log)
        device = measured["device_key"]
        peak, peak_source = measured["peak_tflops"], measured["peak_source"]
        mfu_source, mfu_from = "measured", f"--measure: timed now on {measured['device_name']}"
        gemms_timed = "each timed alone (--measure)"
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
            peak, peak_source = peak_of(device, args.dtype, log, device_ceilings)
            warnings.append(f"MFU measured on '{run_key}' applied to '{device}'")
        mfu_source, mfu_from = "measured", f"--from-run {args.from_run}"
        gemms_timed = f"the nearest matmul rows of {args.from_run}"
        if measured["worst_shape_ratio"] > 2:
            sizes = ";".join(sorted({g.shape for g in gemms}))
            warnings.append(
                f"the run's nearest matmul shapes are up to {measured['worst_shape_ratio']:.1f}x "
                f"off the model's; time the exact ones with --measure, or "
                f"`python run_bench.py --kernels matmul --dtypes {args.dtype} "
                f"--sizes '{sizes}'`")
    else:
        device = args.device or "h100"
        peak, peak_source = peak_of(device, args.dtype, log, device_ceilings)
        mfu_source, mfu_from = "assumed", "--mfu" if args.mfu else "default assumption"
        gemms_timed = "not timed: --measure, --from-run RUN or --measure step times them"

    step = summarize_step(gemms, peak)
    mfu = step["mfu"] if measured is not None else (args.mfu or DEFAULT_MFU)
    if step_measured is not None:
        mfu = step_measured["report"]["mfu"]
    if measured is not None and not mfu:
        raise PlanError("no measured MFU could be derived")
    if mfu > 1 and peak_source == "datasheet":
        warnings.append(f"MFU {mfu:.0%} is above 100% of the {peak:.4g} TFLOP/s datasheet "
                        "peak: an accounting error (FLOPs counted that did not run, or a "
                        "time that misses work), not a rate")
    elif mfu > 1:
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

    versus = _versus(args, device, peak, mfu, device_ceilings, flops, attn, log)

    # Memory.
    if args.bytes_per_param is not None:
        policy, items = "explicit", {"--bytes-per-param": args.bytes_per_param}
    else:
        policy = args.policy + (f", {weight_format} weights" if weight_format else "")
        items = policy_items(args.policy, weight_format)
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
        "versus": versus,
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
        "gemms_timed": gemms_timed if gemms else None,
        "warnings": warnings,
    }
    if measured is not None:
        plan["measurement"] = {k: v for k, v in measured.items() if k != "rows"}
    plan["communication"] = plan_communication(args, shape, params, peak, mfu, tokens, items,
                                               warnings, device)
    if step_measured is not None:
        plan["step_measured"] = step_measured
        warnings += step_measured["report"]["notes"]
    return plan


def _versus(args: argparse.Namespace, device: str, peak: float, mfu: float,
            device_ceilings: DeviceCeilings | None,
            flops: dict[str, float] | None, attn: float | None, log: Any
            ) -> list[dict[str, Any]]:
    """--vs: the plan's days on other devices, for the same tokens, GPU count and MFU
    (an MFU carried over from another device is an assumption, said in the table), each
    at its own datasheet peak for the plan's dtype; the plan's own device first."""
    keys = [k.strip() for k in (getattr(args, "vs", None) or "").split(",") if k.strip()]
    if not keys:
        return []
    unknown = [k for k in keys if k not in DEVICES]
    if unknown:
        raise PlanError(f"--vs: unknown device '{unknown[0]}' (choose from "
                        f"{', '.join(DEVICES)})")
    if flops is None:
        raise PlanError("--vs compares days: give the tokens (--tokens, --chinchilla or "
                        "--days) and the model")
    out = []
    for key in [device, *[k for k in keys if k != device]]:
        p = peak if key == device else peak_of(key, args.dtype, log, device_ceilings)[0]
        days = days_for(flops["total"], args.gpus, p, mfu)
        out.append({"device": key, "name": DEVICES[key].name, "peak_tflops": p,
                    "days": days,
                    "days_with_attention": days_for(flops["total"] + attn, args.gpus, p, mfu)
                    if attn is not None else None})
    for row in out:
        row["vs_plan"] = row["days"] / out[0]["days"]
    return out


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


def check_writable(dest: Path) -> None:
    """OSError unless `dest` can be created: its nearest existing ancestor must be a
    folder this process may write into.  Nothing is created."""
    p = dest
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(p))
    if not os.access(p, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable", str(p))


def main(argv: list[str], harness: Harness | None = None) -> int:
    """`python -m roofline plan ...`; returns the exit code.  The entry point passes the
    harness (roofline/plan/harness.py) for --measure, --explain and measured ceilings."""
    parser = build_parser()
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    from roofline.model.schema import RunLoadError, atomic_write_text

    dest = None
    try:
        if not args.no_save:
            dest = out_dir(args.out)
            # Checked before any measurement, so an unwritable --out fails in a second,
            # not after minutes of timing; made only once there is a plan to write, so a
            # plan refused for its input leaves nothing behind.
            check_writable(dest)
        plan = build_plan(args, harness=harness)
    except (PlanError, DeviceError, RunLoadError, OSError) as e:
        what = f"cannot create {dest}: " if isinstance(e, OSError) else ""
        print(f"error: {what}{e}", file=sys.stderr)
        return 2
    png = None
    if dest is not None:
        try:
            dest.mkdir(parents=True, exist_ok=True)
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
