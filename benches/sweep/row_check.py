"""A row's first stage: why it cannot run here (skipped), its inputs, its first call (an
autotuned Triton kernel tunes there; a shipped config runs untuned), then the checked
call against the float64 reference.  What passes is a `Checked` case, ready for its
timer (benches/sweep/runner.py on a CPU, benches/sweep/gpu_case.py on a GPU, where the
providers of a case are timed together); what does not is a finished row."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from benches.sweep.budget import RowBudget
from benches.sweep.cases import Case, InputCache, MakeCall, SweepContext, base_row
from benches.sweep.failures import (
    SweepAborted,
    compile_error_types,
    error_message,
    is_oom,
    is_sticky_cuda_error,
)
from benches.sweep.row_setup import (
    bound_triton_call,
    first_call_tunes,
    footprint_reason,
    shipped_configs_of,
    triton_launches_of,
)
from benches.sweep.time_split import TimeSplit
from contract.record import Build, RunRow
from kernels import DTYPES, Target
from kernels.compiled import first_call
from kernels.shipped import retune_requested
from kernels.spec import Inputs, UnsupportedShape
from kernels.triton_utils import configs_text, parse_configs, run_launch_with, sources_text


@dataclass
class Checked:
    """A case whose checked call was correct, waiting for its timing: its row so far
    (identity, accounting, check, config), its buffers, its call on them (`make_call`
    bound to a Triton row's chosen configs, None for a plain provider), and what ran
    (a library provider's backend, a config note) for the row's reason."""

    case: Case
    row: RunRow
    inputs: Inputs
    out: torch.Tensor
    call: Callable[[], object]
    make_call: MakeCall | None
    ran: str


def sync(target: Target) -> None:
    if target.kind == "cuda":
        torch.cuda.synchronize()


def plain_call(case: Case) -> MakeCall:
    """The provider's call on given buffers, for a row without a bound Triton call."""
    prov = case.spec.providers[case.provider]
    if prov.bind is not None:  # a compiled provider: its graph looked up once per buffers
        return prov.bind
    return lambda ins, o: (lambda: prov.fn(ins, o))


def skip_reason(case: Case, cfg: SweepContext) -> str | None:
    """Why a case cannot run here at all (no such variant, Triton outside the
    interpreter on a CPU, a footprint past the device's memory), None when it may."""
    reason = case.spec.skip_reason(case.provider, case.dtype, cfg.target)
    if reason is None and case.provider == "triton" and cfg.target.kind != "cuda" \
            and not cfg.check_only:
        reason = "Triton on the CPU runs only in the interpreter: checked, not timed (--check-only)"
    return reason or footprint_reason(case, cfg)


def check_case(case: Case, cfg: SweepContext, cache: InputCache, budget: RowBudget,
               split: TimeSplit) -> Checked | RunRow:
    """The case checked: a Checked case, or its finished row (skipped, failed, or ok
    under --check-only).  The checked call's time goes to `budget.call_s` (it sizes a
    CPU row's samples); SweepAborted on a sticky CUDA error."""
    row = base_row(case, cfg)
    reason = skip_reason(case, cfg)
    if reason:
        return replace(row, status="skipped", reason=reason)
    try:
        with split.phase("inputs"):
            inputs = cache.get(case, cfg)
            out = case.spec.alloc_out(inputs, case.dtype)
        call, make_call, config_note, build = _first_call(case, cfg, inputs, out, split)
        row = replace(row, build=build)
        with split.phase("check"):
            rel_err, ran = _checked_call(case, cfg, cache, inputs, out, call, budget, split)
    except Exception as e:
        return error_row(row, e, case, cfg, cache, "")
    ran = "; ".join(x for x in (ran, config_note) if x)
    finite = rel_err != float("inf")
    tol = DTYPES[case.dtype].tol
    row = replace(row, check=replace(row.check, rel_err=rel_err if finite else None,
                                     correct=bool(rel_err <= tol)))
    if not row.check.correct:
        why = (f"rel_err {rel_err:.3g} > tolerance {tol:g}" if finite else
               "output holds NaN/inf (unwritten or overflowed elements)")
        return replace(row, status="failed", reason=why)
    if cfg.check_only:
        return replace(row, status="ok", reason="; ".join(
            x for x in ("check-only: not timed", ran,
                        case.spec.roof_note(case.dtype, cfg.target)) if x))
    return Checked(case, row, inputs, out, call, make_call, ran)


def _first_call(case: Case, cfg: SweepContext, inputs: Inputs, out: torch.Tensor,
                split: TimeSplit
                ) -> tuple[Callable[[], object], MakeCall | None, str, Build]:
    """The untimed first call, then the row's call: (call, make_call, config note, the
    row's Build: a compiled provider's compile seconds, a Triton row's configs).

    An autotuned kernel tunes in the first call, running every candidate config into
    `out`; only then is `out` poisoned (by the checked call), so an element the chosen
    config fails to write stays NaN instead of holding another config's answer."""
    spec = case.spec
    fn = spec.providers[case.provider].fn
    compiles = spec.providers[case.provider].compiles
    launches = triton_launches_of(case, cfg, inputs, out)
    forced = cfg.configs.get(case.key)
    shipped, not_shipped = shipped_configs_of(case, cfg, launches, forced)
    retune = retune_requested()
    tunes = first_call_tunes(launches, forced, cfg) and (retune or any(
        s is None and len(ln.configs) > 1 for ln, s in zip(launches or [], shipped,
                                                           strict=True)))
    call: Callable[[], object] = lambda: fn(inputs, out)  # noqa: E731
    with split.phase("tune" if tunes else "check"):
        if launches is None:
            return call, None, "", Build(
                compile_s=first_call(call, compiles, lambda: sync(cfg.target)))
        # A Triton row runs (and records) its chosen configs; re-timing passes the
        # confirmed row's configs in, so it never tunes to another one; a shipped config
        # (kernels/shipped.py) runs untuned unless --retune.
        chosen = parse_configs(launches, forced) if forced else [None] * len(launches)
        ran_with = [run_launch_with(ln, c, s, retune) for ln, c, s in
                    zip(launches, chosen, shipped, strict=True)]
        chosen = [r.config for r in ran_with]
    # Why a launch tuned where a shipped config could have run, and under --retune how
    # the shipped config timed: in the row's reason.
    note = "; ".join(x for x in (
        not_shipped if any(r.source in ("tuned", "cached") for r in ran_with) else "",
        *(r.note for r in ran_with)) if x)
    if not all(c is not None for c in chosen):
        return call, None, note, Build()
    build = Build(config=configs_text(launches, chosen), config_source=sources_text(ran_with))
    make_call = bound_triton_call(case, cfg, chosen)
    return make_call(inputs, out), make_call, note, build


def _checked_call(case: Case, cfg: SweepContext, cache: InputCache, inputs: Inputs,
                  out: torch.Tensor, call: Callable[[], object], budget: RowBudget,
                  split: TimeSplit) -> tuple[float, str]:
    """The call on a NaN-filled output, timed (budget.call_s), compared with the
    reference: (rel_err, what a library provider ran)."""
    sync(cfg.target)
    out.fill_(float("nan"))
    t0 = time.perf_counter()
    result = call()
    result = out if result is None else result
    sync(cfg.target)
    budget.call_s = time.perf_counter() - t0
    with split.phase("inputs"):
        ref = cache.reference(case)
    rel_err = case.spec.check(result, inputs, case.dtype, ref=ref)
    # What a library provider ran (SDPA's backend): one more call, untimed.
    backend = case.spec.providers[case.provider].backend
    return rel_err, (backend(call) if backend is not None else "")


def error_row(row: RunRow, e: BaseException, case: Case, cfg: SweepContext,
              cache: InputCache, stage: str) -> RunRow:
    """The row of a case whose kernel raised.  Only a shape the library rejects and
    out-of-memory are `skipped` (cannot run here by design); a compile error, a CUDA
    error or any other exception is `failed`.  A sticky CUDA error raises SweepAborted."""
    msg = error_message(e)
    if is_sticky_cuda_error(e):
        row = replace(row, status="failed",
                      reason=f"CUDA error{stage} (context unusable, sweep aborted): {msg}")
        raise SweepAborted(row, f"{case.label}: {msg}") from e
    if isinstance(e, UnsupportedShape):
        return replace(row, status="skipped", reason=str(e))
    if is_oom(e) and not isinstance(e, compile_error_types()):
        cache.clear()
        if cfg.target.kind == "cuda":
            torch.cuda.empty_cache()
        return replace(row, status="skipped",
                       reason=f"out of memory at this shape{stage} ({msg})")
    if isinstance(e, compile_error_types()):
        return replace(row, status="failed", reason=f"Triton compile error: {msg}")
    if "cuda" in str(e).lower() or type(e).__name__ == "AcceleratorError":
        return replace(row, status="failed", reason=f"CUDA error{stage}: {msg}")
    return replace(row, status="failed", reason=f"kernel raised{stage}: {msg}")
