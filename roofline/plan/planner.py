"""A plan from its request (roofline/plan/plan_request.py): the steps of build_plan, each
a record (Tokens, Budget, Training, Memory), and the JSON document they make (plan.json,
--json).  The command line (roofline/plan/cli.py) builds the request and writes the
files; measuring is the harness's, passed in (roofline/plan/harness.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

from contract.devices import DEVICES
from contract.models import ModelShape
from roofline.plan.arithmetic import (
    CHINCHILLA_TOKENS_PER_PARAM,
    DEFAULT_MFU,
    Gemm,
    StepSummary,
    attention_score_flops,
    budget_flops,
    compute_optimal,
    days_for,
    device_memory_bytes,
    max_params_fit,
    step_gemms,
    summarize_step,
    train_flops,
)
from roofline.plan.comm import Communication, plan_communication
from roofline.plan.efficiency import Efficiency, plan_efficiency
from roofline.plan.harness import DeviceCeilings, Harness
from roofline.plan.model import PlanError
from roofline.plan.plan_record import Budget, Plan, PlanModel, Versus
from roofline.plan.plan_request import (
    HardwareRequest,
    MemoryRequest,
    PlanRequest,
    TrainingRequest,
)
from roofline.plan.sources import peak_of


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


@dataclass(frozen=True)
class Tokens:
    """The training tokens and where the number comes from (None: not given)."""

    tokens: float | None = None
    source: str | None = None


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


def build_plan(request: PlanRequest, log: Any = _stderr,
               harness: Harness | None = None) -> Plan:
    """Everything the plan says, as a Plan (its to_json: the --json document).
    The harness (roofline/plan/harness.py) times GEMMs, training steps and the step's
    kernels on the device present and measures the ceilings of a device without a
    datasheet; without its functions --measure, --explain and such a device are
    refused.  The steps run in this order, so a refusal comes before what it would
    waste (flags before measuring)."""
    harness = harness or Harness()
    run, hw = request.training, request.hardware
    shape = request.model.shape()
    params: float | None = float(shape.params) if shape else request.model.params
    gemms = step_gemms(shape, run.micro_batch) if shape else []
    check_request(request, shape, harness)
    eff = plan_efficiency(request, shape, gemms, harness, log)
    warnings = list(eff.warnings)
    step, mfu = _plan_mfu(eff, gemms, request.efficiency.mfu)
    warnings += _mfu_warnings(mfu, eff)
    budget, tokens = _plan_budget(run, hw.gpus, params, eff.peak, mfu,
                                  _plan_tokens(run, params))
    training = _training(params, shape, tokens.tokens, hw.gpus, eff.peak, mfu)
    versus = _versus(hw.vs, eff, mfu, hw.gpus, training, harness.device_ceilings, log)
    memory = _plan_memory(request.memory, hw, params, eff.device)
    if budget is not None and memory.total_bytes:
        static = budget.max_params_compute_optimal * memory.bytes_per_param
        budget = replace(budget, static_bytes_compute_optimal=static,
                         fits_compute_optimal=static <= memory.total_bytes)
    communication = plan_communication(hw, run.micro_batch, shape, params, eff.peak, mfu,
                                       tokens.tokens, memory.items, warnings, eff.device)
    if eff.step is not None:
        warnings += eff.step.report.notes
    return _plan(request, _plan_model(shape, params), params, eff, mfu, step, tokens,
                 budget, training, versus, memory, gemms, warnings, communication)


def check_request(request: PlanRequest, shape: ModelShape | None, harness: Harness
                  ) -> None:
    """PlanError for flags that cannot go together, before anything is measured."""
    device, eff = request.hardware.device, request.efficiency
    if device is not None and device not in DEVICES:
        raise PlanError(f"unknown device '{device}' (choose from {', '.join(DEVICES)})")
    if (eff.measure or eff.from_run) and shape is None:
        raise PlanError("--measure and --from-run need the model's shape (--preset, or "
                        "--d-model and --layers), not just --params")
    if eff.measure_layers is not None and eff.measure != "step":
        raise PlanError("--measure-layers goes with --measure step")
    if eff.explain and eff.measure != "step":
        raise PlanError("--explain goes with --measure step")
    if eff.explain and harness.measure_kernels is None:
        raise PlanError("--explain times the step's kernels through the benchmark harness: "
                        "run it as `python -m roofline plan ... --measure step --explain`")
    if request.memory.weight_format and request.memory.bytes_per_param is not None:
        raise PlanError("--weight-format changes a --policy's weights; --bytes-per-param "
                        "already gives the total")


def _plan_mfu(eff: Efficiency, gemms: list[Gemm], assumed: float | None
              ) -> tuple[StepSummary, float]:
    """(the step the GEMMs allow at the peak, the plan's MFU): a measured step's, the
    measured GEMMs', or the assumed one."""
    step = summarize_step(gemms, eff.peak)
    mfu = step.mfu if eff.measured is not None else (assumed or DEFAULT_MFU)
    if eff.step is not None:
        mfu = eff.step.report.mfu
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


def _plan_tokens(run: TrainingRequest, params: float | None) -> Tokens:
    """--tokens, or Chinchilla's 20 per parameter."""
    if run.chinchilla:
        if params is None:
            raise PlanError("--chinchilla needs a model (--params, --preset or a shape)")
        return Tokens(CHINCHILLA_TOKENS_PER_PARAM * params, "chinchilla (D = 20 N)")
    return Tokens(run.tokens, "--tokens" if run.tokens else None)


def _plan_budget(run: TrainingRequest, gpus: int, params: float | None, peak: float,
                 mfu: float, tokens: Tokens) -> tuple[Budget | None, Tokens]:
    """The --days budget (None without one), and the tokens: a model without them
    trains on what the budget buys (6 N D = budget)."""
    if not run.days:
        return None, tokens
    c = budget_flops(gpus, peak, mfu, run.days)
    n_opt, d_opt = compute_optimal(c)
    if params is None:
        return Budget(run.days, c, n_opt, d_opt), tokens
    if tokens.tokens is None:
        tokens = Tokens(c / (6 * params), "the --days budget (6 N D = budget)")
    return Budget(run.days, c, n_opt, d_opt, tokens_for_this_model=c / (6 * params)), tokens


def _training(params: float | None, shape: ModelShape | None, tokens: float | None,
              gpus: int, peak: float, mfu: float) -> Training:
    """The run's FLOPs and days, with and without the attention scores."""
    flops = train_flops(params, tokens) if params and tokens else None
    attn = attention_score_flops(shape, tokens) if shape and tokens else None
    days = days_for(flops["total"], gpus, peak, mfu) if flops else None
    days_attn = days_for(flops["total"] + attn, gpus, peak, mfu) \
        if flops and attn is not None else None
    return Training(flops, attn, days, days_attn)


def _versus(keys: tuple[str, ...], eff: Efficiency, mfu: float, gpus: int,
            training: Training, device_ceilings: DeviceCeilings | None, log: Any
            ) -> list[Versus]:
    """--vs: the plan's days on other devices, for the same tokens, GPU count and MFU
    (an MFU carried over from another device is an assumption, said in the table), each
    at its own datasheet peak for the plan's dtype; the plan's own device first."""
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
    own = days_for(flops["total"], gpus, eff.peak, mfu)
    out = []
    for key in [eff.device, *[k for k in keys if k != eff.device]]:
        p = eff.peak if key == eff.device else \
            peak_of(key, eff.dtype, log, device_ceilings)[0]
        days = days_for(flops["total"], gpus, p, mfu)
        out.append(Versus(key, DEVICES[key].name, p, days,
                          days_for(flops["total"] + attn, gpus, p, mfu)
                          if attn is not None else None, days / own))
    return out


def _plan_memory(mem: MemoryRequest, hw: HardwareRequest, params: float | None,
                 device: str) -> Memory:
    """The state's bytes per parameter and on the devices, against their memory."""
    policy, items = mem.items()
    bpp = float(sum(items.values()))
    gpu_bytes, source = device_memory_bytes(device, hw.gpu_memory_gb)
    return Memory(policy, items, bpp, gpu_bytes, source,
                  static_bytes=params * bpp if params else None,
                  total_bytes=hw.gpus * gpu_bytes if gpu_bytes else None,
                  max_params_fit=max_params_fit(hw.gpus, gpu_bytes, bpp)
                  if gpu_bytes else None)


def _plan_model(shape: ModelShape | None, params: float | None) -> PlanModel | None:
    """The plan's model: the shape, or the count --params gives."""
    if shape:
        return PlanModel(shape.name, shape.params, shape)
    if params:
        return PlanModel("--params", params)
    return None


def _plan(request: PlanRequest, model: PlanModel | None, params: float | None,
          eff: Efficiency, mfu: float, step: StepSummary, tokens: Tokens,
          budget: Budget | None, training: Training, versus: list[Versus], memory: Memory,
          gemms: list[Gemm], warnings: list[str], communication: Communication | None
          ) -> Plan:
    """The Plan from its steps' records."""
    flops, m = training.flops, memory
    return Plan(
        model=model, params=params, tokens=tokens.tokens,
        tokens_source=tokens.source,
        train_flops=flops["total"] if flops else None,
        flops_forward=flops["forward"] if flops else None,
        flops_backward=flops["backward"] if flops else None,
        attention_flops=training.attention, device=eff.device,
        device_name=DEVICES[eff.device].name if eff.device in DEVICES else eff.device,
        dtype=eff.dtype, gpus=request.hardware.gpus, peak_tflops=eff.peak,
        peak_source=eff.peak_source, mfu=mfu, mfu_source=eff.mfu_source,
        mfu_from=eff.mfu_from, days=training.days,
        days_with_attention=training.days_with_attention, budget=budget,
        versus=tuple(versus), policy=m.policy, bytes_per_param_itemized=m.items,
        bytes_per_param=m.bytes_per_param, static_bytes=m.static_bytes,
        gpu_memory_bytes=m.gpu_bytes, gpu_memory_source=m.gpu_source,
        total_memory_bytes=m.total_bytes,
        fits=(m.static_bytes <= m.total_bytes)
        if m.static_bytes is not None and m.total_bytes else None,
        max_params_fit=m.max_params_fit, micro_batch=request.training.micro_batch,
        step=step, gemms=tuple(gemms), gemms_timed=eff.gemms_timed if gemms else None,
        warnings=tuple(warnings), measurement=eff.measured, communication=communication,
        step_measured=eff.step)
