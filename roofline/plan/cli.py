"""`python -m roofline plan`: the plan document from the flags (roofline/plan/flags.py)
and its files.  Measuring is passed in by the entry point (roofline/__main__.py), since
roofline/ never imports benches/."""


import argparse
import errno
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from contract.devices import DEVICES, DeviceError
from contract.models import ModelShape
from roofline.plan.arithmetic import (
    CHINCHILLA_TOKENS_PER_PARAM,
    DEFAULT_MFU,
    Gemm,
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
from roofline.plan.efficiency import Efficiency, plan_efficiency
from roofline.plan.flags import build_parser, model_from_args
from roofline.plan.harness import DeviceCeilings, Harness
from roofline.plan.model import PlanError
from roofline.plan.render import print_tables, render_markdown
from roofline.plan.sources import peak_of


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


@dataclass(frozen=True)
class Tokens:
    """The training tokens and where the number comes from (None: not given)."""

    tokens: float | None = None
    source: str | None = None


@dataclass(frozen=True)
class Budget:
    """--days: the compute the budget buys and the compute-optimal model it trains; with
    a model, its tokens; with the devices' memory, whether that model's state fits."""

    days: float
    flops: float
    max_params_compute_optimal: float
    tokens_compute_optimal: float
    tokens_for_this_model: float | None = None
    static_bytes_compute_optimal: float | None = None
    fits_compute_optimal: bool | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "days": self.days, "flops": self.flops,
            "max_params_compute_optimal": self.max_params_compute_optimal,
            "tokens_compute_optimal": self.tokens_compute_optimal}
        if self.tokens_for_this_model is not None:
            doc["tokens_for_this_model"] = self.tokens_for_this_model
        if self.static_bytes_compute_optimal is not None:
            doc["static_bytes_compute_optimal"] = self.static_bytes_compute_optimal
            doc["fits_compute_optimal"] = self.fits_compute_optimal
        return doc


@dataclass(frozen=True)
class Training:
    """The run's FLOPs (train_flops: total, forward, backward; None without a model and
    its tokens), the attention scores' on top, and the days each takes."""

    flops: dict[str, float] | None
    attention: float | None
    days: float | None
    days_with_attention: float | None


@dataclass(frozen=True)
class Memory:
    """The model's state per parameter (a --policy's items, or --bytes-per-param), on the
    devices' memory: what it takes, what there is, whether it fits."""

    policy: str
    items: dict[str, float]
    bytes_per_param: float
    gpu_bytes: float | None
    gpu_source: str
    static_bytes: float | None
    total_bytes: float | None
    max_params_fit: float | None


def build_plan(args: argparse.Namespace, log: Any = _stderr,
               harness: Harness | None = None) -> dict[str, Any]:
    """Everything the plan says, as a JSON-able dict (the --json document).
    The harness (roofline/plan/harness.py) times GEMMs, training steps and the step's
    kernels on the device present and measures the ceilings of a device without a
    datasheet; without its functions --measure, --explain and such a device are
    refused.  The steps run in this order, so a refusal comes before what it would
    waste (flags before measuring)."""
    harness = harness or Harness()
    shape = model_from_args(args)
    params: float | None = float(shape.params) if shape else args.params
    gemms = step_gemms(shape, args.micro_batch) if shape else []
    check_flags(args, shape, harness)
    eff = plan_efficiency(args, shape, gemms, harness, log)
    warnings = list(eff.warnings)
    step, mfu = _plan_mfu(eff, gemms, args.mfu)
    warnings += _mfu_warnings(mfu, eff)
    budget, tokens = _plan_budget(args, params, eff.peak, mfu, _plan_tokens(args, params))
    training = _training(params, shape, tokens.tokens, args.gpus, eff.peak, mfu)
    versus = _versus(getattr(args, "vs", None), eff, mfu, args.gpus, training,
                     harness.device_ceilings, log)
    memory = _plan_memory(args, params, eff.device)
    if budget is not None and memory.total_bytes:
        static = budget.max_params_compute_optimal * memory.bytes_per_param
        budget = replace(budget, static_bytes_compute_optimal=static,
                         fits_compute_optimal=static <= memory.total_bytes)
    plan = _document(args, shape, params, eff, mfu, step, tokens, budget, training, versus,
                     memory, gemms, warnings)
    if eff.measured is not None:
        plan["measurement"] = {k: v for k, v in eff.measured.items() if k != "rows"}
    plan["communication"] = plan_communication(args, shape, params, eff.peak, mfu,
                                               tokens.tokens, memory.items, warnings,
                                               eff.device)
    if eff.step is not None:
        plan["step_measured"] = eff.step.to_json()
        warnings += eff.step.report["notes"]
    return plan


def check_flags(args: argparse.Namespace, shape: ModelShape | None, harness: Harness
                ) -> None:
    """PlanError for flags that cannot go together, before anything is measured."""
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
    if explain and harness.measure_kernels is None:
        raise PlanError("--explain times the step's kernels through the benchmark harness: "
                        "run it as `python -m roofline plan ... --measure step --explain`")
    if getattr(args, "weight_format", None) and args.bytes_per_param is not None:
        raise PlanError("--weight-format changes a --policy's weights; --bytes-per-param "
                        "already gives the total")


def _plan_mfu(eff: Efficiency, gemms: list[Gemm], assumed: float | None
              ) -> tuple[dict[str, Any], float]:
    """(the step the GEMMs allow at the peak, the plan's MFU): a measured step's, the
    measured GEMMs', or the assumed one."""
    step = summarize_step(gemms, eff.peak)
    mfu = step["mfu"] if eff.measured is not None else (assumed or DEFAULT_MFU)
    if eff.step is not None:
        mfu = eff.step.report["mfu"]
    if eff.measured is not None and not mfu:
        raise PlanError("no measured MFU could be derived")
    return step, mfu


def _mfu_warnings(mfu: float, eff: Efficiency) -> list[str]:
    """What an MFU above 1 means: an accounting error against a datasheet's peak, or a
    measured peak that is not a hardware limit."""
    if mfu > 1 and eff.peak_source == "datasheet":
        return [f"MFU {mfu:.0%} is above 100% of the {eff.peak:.4g} TFLOP/s datasheet "
                "peak: an accounting error (FLOPs counted that did not run, or a "
                "time that misses work), not a rate"]
    if mfu > 1:
        return [f"MFU {mfu:.0%} is above 100%: the {eff.peak:.4g} TFLOP/s peak is a "
                "measurement (the best of a few square GEMMs; no datasheet), not a "
                "hardware limit"]
    return []


def _plan_tokens(args: argparse.Namespace, params: float | None) -> Tokens:
    """--tokens, or Chinchilla's 20 per parameter."""
    if args.chinchilla:
        if params is None:
            raise PlanError("--chinchilla needs a model (--params, --preset or a shape)")
        return Tokens(CHINCHILLA_TOKENS_PER_PARAM * params, "chinchilla (D = 20 N)")
    return Tokens(args.tokens, "--tokens" if args.tokens else None)


def _plan_budget(args: argparse.Namespace, params: float | None, peak: float, mfu: float,
                 tokens: Tokens) -> tuple[Budget | None, Tokens]:
    """The --days budget (None without one), and the tokens: a model without them
    trains on what the budget buys (6 N D = budget)."""
    if not args.days:
        return None, tokens
    c = budget_flops(args.gpus, peak, mfu, args.days)
    n_opt, d_opt = compute_optimal(c)
    if params is None:
        return Budget(args.days, c, n_opt, d_opt), tokens
    if tokens.tokens is None:
        tokens = Tokens(c / (6 * params), "the --days budget (6 N D = budget)")
    return Budget(args.days, c, n_opt, d_opt, tokens_for_this_model=c / (6 * params)), tokens


def _training(params: float | None, shape: ModelShape | None, tokens: float | None,
              gpus: int, peak: float, mfu: float) -> Training:
    """The run's FLOPs and days, with and without the attention scores."""
    flops = train_flops(params, tokens) if params and tokens else None
    attn = attention_score_flops(shape, tokens) if shape and tokens else None
    days = days_for(flops["total"], gpus, peak, mfu) if flops else None
    days_attn = days_for(flops["total"] + attn, gpus, peak, mfu) \
        if flops and attn is not None else None
    return Training(flops, attn, days, days_attn)


def _versus(vs: str | None, eff: Efficiency, mfu: float, gpus: int, training: Training,
            device_ceilings: DeviceCeilings | None, log: Any) -> list[dict[str, Any]]:
    """--vs: the plan's days on other devices, for the same tokens, GPU count and MFU
    (an MFU carried over from another device is an assumption, said in the table), each
    at its own datasheet peak for the plan's dtype; the plan's own device first."""
    keys = [k.strip() for k in (vs or "").split(",") if k.strip()]
    if not keys:
        return []
    unknown = [k for k in keys if k not in DEVICES]
    if unknown:
        raise PlanError(f"--vs: unknown device '{unknown[0]}' (choose from "
                        f"{', '.join(DEVICES)})")
    flops, attn = training.flops, training.attention
    if flops is None:
        raise PlanError("--vs compares days: give the tokens (--tokens, --chinchilla or "
                        "--days) and the model")
    out = []
    for key in [eff.device, *[k for k in keys if k != eff.device]]:
        p = eff.peak if key == eff.device else \
            peak_of(key, eff.dtype, log, device_ceilings)[0]
        days = days_for(flops["total"], gpus, p, mfu)
        out.append({"device": key, "name": DEVICES[key].name, "peak_tflops": p,
                    "days": days,
                    "days_with_attention": days_for(flops["total"] + attn, gpus, p, mfu)
                    if attn is not None else None})
    for row in out:
        row["vs_plan"] = row["days"] / out[0]["days"]
    return out


def _plan_memory(args: argparse.Namespace, params: float | None, device: str) -> Memory:
    """The state's bytes per parameter and on the devices, against their memory."""
    weight_format = getattr(args, "weight_format", None)
    if args.bytes_per_param is not None:
        policy, items = "explicit", {"--bytes-per-param": args.bytes_per_param}
    else:
        policy = args.policy + (f", {weight_format} weights" if weight_format else "")
        items = policy_items(args.policy, weight_format)
    bpp = float(sum(items.values()))
    gpu_bytes, source = device_memory_bytes(device, args.gpu_memory_gb)
    return Memory(policy, items, bpp, gpu_bytes, source,
                  static_bytes=params * bpp if params else None,
                  total_bytes=args.gpus * gpu_bytes if gpu_bytes else None,
                  max_params_fit=max_params_fit(args.gpus, gpu_bytes, bpp)
                  if gpu_bytes else None)


def _model_doc(shape: ModelShape | None, params: float | None) -> dict[str, Any] | None:
    """The plan's `model`: the shape, its parameters itemized and its largest matrix."""
    if shape:
        # Per-layer matrices unfused (q, o: d x d; MLP: d_ff x d): GPT-3's MLP matrix,
        # [49152, 12288], is 2.4 GB in fp32.
        d, f = shape.d_model, shape.d_ff
        name, rows_, cols = ("mlp", f, d) if f >= d else ("attention", d, d)
        largest = {"name": name, "shape": [rows_, cols],
                   "bytes_fp32": matrix_bytes(rows_, cols, "fp32")}
        return {**asdict(shape), "description": shape.describe(),
                "params_itemized": shape.param_items(), "params": shape.params,
                "params_12d2l": shape.approx_12d2l, "matmul_params": shape.matmul_params,
                "largest_matrix": largest}
    if params:
        return {"name": "--params", "params": params}
    return None


def _document(args: argparse.Namespace, shape: ModelShape | None, params: float | None,
              eff: Efficiency, mfu: float, step: dict[str, Any], tokens: Tokens,
              budget: Budget | None, training: Training, versus: list[dict[str, Any]],
              memory: Memory, gemms: list[Gemm], warnings: list[str]) -> dict[str, Any]:
    """The plan's JSON document from its steps' records, in the order its readers
    (roofline/plan/render.py, plan.json) have always had it."""
    flops, m = training.flops, memory
    return {
        "model": _model_doc(shape, params),
        "params": params,
        "tokens": tokens.tokens,
        "tokens_source": tokens.source,
        "train_flops": flops["total"] if flops else None,
        "flops_forward": flops["forward"] if flops else None,
        "flops_backward": flops["backward"] if flops else None,
        "attention_flops": training.attention,
        "device": eff.device,
        "device_name": DEVICES[eff.device].name if eff.device in DEVICES else eff.device,
        "dtype": eff.dtype,
        "gpus": args.gpus,
        "peak_tflops": eff.peak,
        "peak_source": eff.peak_source,
        "mfu": mfu,
        "mfu_source": eff.mfu_source,
        "mfu_from": eff.mfu_from,
        "days": training.days,
        "days_with_attention": training.days_with_attention,
        "budget": budget.to_json() if budget is not None else None,
        "versus": versus,
        "policy": m.policy,
        "bytes_per_param_itemized": m.items,
        "bytes_per_param": m.bytes_per_param,
        "static_bytes": m.static_bytes,
        "gpu_memory_bytes": m.gpu_bytes,
        "gpu_memory_source": m.gpu_source,
        "total_memory_bytes": m.total_bytes,
        "fits": (m.static_bytes <= m.total_bytes)
        if m.static_bytes is not None and m.total_bytes else None,
        "max_params_fit": m.max_params_fit,
        "micro_batch": args.micro_batch,
        "step": step,
        "gemms": [g.as_dict() for g in gemms],
        "gemms_timed": eff.gemms_timed if gemms else None,
        "warnings": warnings,
    }


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
    from contract.schema import RunLoadError, atomic_write_text

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
