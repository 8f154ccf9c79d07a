"""What a row needs settled before its first call: whether it fits the device's memory
(decided before anything is allocated), and for a Triton row its declared launches, the
shipped config of each (kernels/shipped.py: the file of the GPU present, never another's)
and whether its first call tunes.  Used by the sweep's runner and priced alike by the
estimate (benches/estimate/price.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from benches.sweep.cases import Case, MakeCall, SweepContext
from kernels.shipped import shipped_for
from kernels.spec import Inputs, TritonLaunch
from kernels.triton_utils import prepared_call


def device_memory_bytes(cfg: SweepContext) -> float | None:
    """Memory of the device the cases run on: the GPU's total, or the host's RAM."""
    if cfg.target.kind == "cuda":
        gb = cfg.present.memory_gb
        return gb * 1e9 if gb else None
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def footprint_reason(case: Case, cfg: SweepContext) -> str | None:
    """Why a case cannot fit, decided before anything is allocated: its compulsory bytes
    (inputs and output once, the spec's byte count) exceed the device's memory."""
    need = case.spec.nbytes(case.shape, case.dtype)
    have = device_memory_bytes(cfg)
    if have is None or need <= have:
        return None
    return (f"out of memory at this shape: inputs and output need {need / 1e9:.6g} GB, "
            f"the device has {have / 1e9:.4g} GB (not allocated)")


def first_call_tunes(launches: list[TritonLaunch] | None, forced: str | None,
                     cfg: SweepContext) -> bool:
    """Whether a row's first call autotunes (a Triton launch with candidates on a GPU,
    no config forced): its time is the run's `tune`."""
    return bool(launches) and not forced and cfg.target.kind == "cuda" \
        and any(len(ln.configs) > 1 for ln in launches)


def shipped_configs_of(case: Case, cfg: SweepContext, launches: list[TritonLaunch] | None,
                       forced: str | None) -> tuple[list[Any], str]:
    """The shipped config of each launch of a GPU row (None where none applies) and why
    none applied (kernels/shipped.py: the file of the device present, never another's)."""
    n = len(launches or [])
    if not launches or forced or cfg.target.kind != "cuda" or cfg.target.interpret:
        return [None] * n, ""
    choice = shipped_for(cfg.present.name, cfg.present.sms, cfg.present.memory_gb)
    if choice.configs is None:
        return [None] * n, choice.reason
    # A launch with one candidate never tunes: nothing to ship, nothing to say.
    picks = [choice.configs.pick(case.spec.name, case.dtype, ln) if len(ln.configs) > 1
             else (None, "") for ln in launches]
    return [c for c, _ in picks], "; ".join(why for _, why in picks if why)


def triton_launches_of(case: Case, cfg: SweepContext, inputs: Inputs,
                     out: torch.Tensor) -> list[TritonLaunch] | None:
    """The declared launches of a Triton row (None for torch rows)."""
    if case.provider != "triton" or case.spec.triton_launches is None:
        return None
    sms = (cfg.present.sms or 0) if cfg.target.kind == "cuda" else 0
    return case.spec.triton_launches(inputs, out, sms)


def bound_triton_call(case: Case, cfg: SweepContext, configs: list[Any]) -> MakeCall:
    def make(ins: Inputs, o: torch.Tensor) -> Callable[[], object]:
        launches = triton_launches_of(case, cfg, ins, o)
        assert launches is not None
        return prepared_call(launches, configs)
    return make


