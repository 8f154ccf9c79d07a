"""`python -m roofline plan --measure`: the model's GEMM shapes timed on the device
present through the suite's sweep (benches.sweep.runner), so the plan's MFU is measured; and
`--measure step --explain`: the step's own kernels (its GEMMs, attention, norms, loss)
timed the same way."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from benches.measured_ceilings import device_ceilings
from contract.record import flat
from contract.schema import ALL_COLUMNS
from roofline.plan.arithmetic import Gemm
from roofline.plan.model import PlanError
from roofline.plan.sources import ceilings_peak

if TYPE_CHECKING:
    from benches.sweep.cases import Case, SweepContext
    from benches.timing.plan import TimingConfig
    from contract.ceilings import Ceilings
    from contract.devices import DeviceModel, Present
    from contract.record import RunRow
    from kernels.spec import KernelSpec

Found = tuple["DeviceModel", "Present", "Ceilings"]  # device_ceilings's answer
CaseKey = tuple[str, str, str]  # (kernel, dtype, shape string in the spec's dim order)


@dataclass(frozen=True)
class KernelAsk:
    """One kernel to time: the planner's {"kernel", "dtype", "shape"} request
    (roofline/plan/explain.py StepKernel.request(); roofline/plan/harness.py)."""

    kernel: str
    dtype: str
    shape: dict[str, int]


@dataclass(frozen=True)
class Swept:
    """What _sweep timed: each case's row by its key, and each ask's key (None: not
    run)."""

    rows: dict[CaseKey, RunRow]
    keys: tuple[CaseKey | None, ...]


def _timing(rep_ms: float | None) -> TimingConfig:
    """The sweep's timing, with a smaller budget for quick looks (and tests)."""
    from benches.timing.plan import TimingConfig

    timing = TimingConfig()
    if rep_ms is None:
        return timing
    # Only the knobs this TimingConfig has are touched, since benches/timing/clock.py
    # evolves on its own.
    want = {"rep_ms": rep_ms, "warmup_ms": min(getattr(timing, "warmup_ms", rep_ms), rep_ms),
            "min_samples": min(getattr(timing, "min_samples", 5), 5),
            "cpu_min_run_time_s": rep_ms / 1e3}
    have = {f.name for f in fields(timing)}
    return replace(timing, **{k: v for k, v in want.items() if k in have})


def _context(asks: list[KernelAsk], device: Found, provider: str, rep_ms: float | None,
             native_cache: bool) -> SweepContext:
    """The sweep's context for the asks, in the device's native cache mode (cold on a GPU,
    warm on a CPU) or the sweep's default one."""
    from benches.sweep.cases import SweepContext
    from contract.modes import DEFAULT_CACHE, native_cache_of
    from contract.request import RunRequest, Selection
    from kernels.spec import Target, interpreter_enabled

    model, present, ceilings = device
    target = Target(present.kind, present.capability, interpreter_enabled(), present.name)
    mode = native_cache_of(present.kind, None) if native_cache else DEFAULT_CACHE
    return SweepContext(RunRequest(Selection(
        kernels=tuple(sorted({a.kernel for a in asks})),
        dtypes=tuple(sorted({a.dtype for a in asks})), providers=(provider,),
        sizes="explicit", shapes=tuple(a.shape for a in asks), cache=(mode,))),
        model, present, target, ceilings=ceilings, timing=_timing(rep_ms))


def _spec(ask: KernelAsk, provider: str) -> KernelSpec | None:
    """The registry's family for the ask; None where it lacks the family, or the dtype or
    provider."""
    from kernels import REGISTRY

    spec = REGISTRY.get(ask.kernel)
    if spec is None or ask.dtype not in spec.dtypes or provider not in spec.providers:
        return None
    return spec


def _case(spec: KernelSpec, provider: str, ask: KernelAsk, cache: str | None = None) -> Case:
    from benches.sweep.cases import Case

    shape = {d: ask.shape[d] for d in spec.dims}
    return Case(spec, provider, ask.dtype, shape) if cache is None \
        else Case(spec, provider, ask.dtype, shape, cache)


def _sweep(asks: list[KernelAsk], device: Found, provider: str, rep_ms: float | None,
           log: Any, what: str, native_cache: bool = False) -> Swept:
    """Run the asks through the suite's sweep on the device present (`device`:
    device_ceilings's model, present device and ceilings), each case once.  Asks of a
    family the registry lacks, or a dtype or provider it does not have, are left out.
    `native_cache`: in the device's native cache mode, as run_bench.py times by default
    (cold on a GPU, warm on a CPU); else the sweep's default mode."""
    from benches.sweep.runner import iterate
    from kernels import REGISTRY

    present = device[1]
    cfg = _context(asks, device, provider, rep_ms, native_cache)
    cases, seen = [], set()
    for a in asks:
        spec = _spec(a, provider)
        if spec is None:
            continue
        case = _case(spec, provider, a, cfg.cache_modes[0])
        if (case.spec.name, case.dtype, case.shape_str) not in seen:
            seen.add((case.spec.name, case.dtype, case.shape_str))
            cases.append(case)
    log(f"timing {len(cases)} {what} ({provider}) on {present.name}")
    rows = {(case.spec.name, case.dtype, case.shape_str): row
            for case, row in iterate(cases, cfg)}
    keys: list[CaseKey | None] = []
    for a in asks:  # each ask's row, by its case's key (shape in the spec's order)
        spec = REGISTRY.get(a.kernel)
        key = None if spec is None else (spec.name, a.dtype, _case(spec, provider, a).shape_str)
        keys.append(key if key in rows else None)
    return Swept(rows, tuple(keys))


# The planner's harness document (roofline/plan/harness.py), which the planner reads.
def _document(device: Found, **parts: Any) -> dict[str, Any]:
    """What was used (the device, its peak's source, its ceilings), then `parts`."""
    model, present, ceilings = device
    return {"device_key": model.key, "device_name": present.name,
            "peak_source": "datasheet" if model.peaks_tflops else "measured (no datasheet)",
            "ceilings": ceilings.to_json(), **parts}


def measure_gemms(gemms: list[Gemm], device: str, dtype: str, provider: str,
                  rep_ms: float | None, log: Any) -> dict[str, Any]:
    """Time the step's GEMM shapes on the device present through the suite's sweep
    (benches.sweep.runner), fill each Gemm's ms/tflops/mfu, and return what was used."""
    # The device first: a GPU asked for on a machine without one fails before any import.
    found_device = device_ceilings(device, log)
    peak = ceilings_peak(*found_device, dtype)
    shapes: dict[str, dict[str, int]] = {}
    for g in gemms:
        shapes.setdefault(g.shape, {"M": g.M, "N": g.N, "K": g.K})
    asks = [KernelAsk("matmul", dtype, s) for s in shapes.values()]
    swept = _sweep(asks, found_device, provider, rep_ms, log, f"GEMM shapes ({dtype})")
    rows = {shape: row for (_, _, shape), row in swept.rows.items()}
    problems = []
    for g in gemms:
        row = rows.get(g.shape)
        if row is None or row.status != "ok" or not row.metrics.tflops \
                or row.timing.ms_median is None:
            why = (row.reason if row is not None else None) or "not run"
            problems.append(f"{g.shape}: {why}")
            continue
        g.ms, g.tflops = float(row.timing.ms_median), float(row.metrics.tflops)
        g.mfu = g.tflops / peak
    if problems:
        raise PlanError(f"{len(problems)} GEMM(s) could not be timed, e.g. {problems[0]}")
    # The planner reads the rows as the files hold them (contract.record.flat).
    return _document(found_device, peak_tflops=peak,
                     rows=[flat(r, ALL_COLUMNS) for r in rows.values()])


def _missing(asks: list[KernelAsk], provider: str) -> dict[str, str]:
    """Why an ask is not run, by "kernel dtype": no such family in the registry, or no
    such dtype or provider in it."""
    from kernels import REGISTRY

    missing = {}
    for a in asks:
        spec = REGISTRY.get(a.kernel)
        key = f"{a.kernel} {a.dtype}"
        if spec is None:
            missing[key] = f"no '{a.kernel}' family in the harness (run_bench.py --list)"
        elif a.dtype not in spec.dtypes:
            missing[key] = f"'{a.kernel}' has no {a.dtype}"
        elif provider not in spec.providers:
            missing[key] = f"'{a.kernel}' has no {provider} provider"
    return missing


# The planner's harness request (roofline/plan/explain.py) and document (harness.py).
def measure_kernels(requests: list[dict[str, Any]], device: str, provider: str,
                    rep_ms: float | None, log: Any) -> dict[str, Any]:
    """Time each {"kernel", "dtype", "shape"} request through the suite's sweep (the same
    correctness gate and timers as run_bench.py, in the device's native cache mode as
    run_bench.py by default: cold on a GPU, warm on a CPU; a shape asked twice is timed
    once).
    `results`, in the requests' order: the request with its sweep `row` (ok, failed or
    skipped, each with its reason), or `why` it was not run: no such family in the
    registry, or no such dtype or provider in it."""
    found_device = device_ceilings(device, log)  # before any import, as measure_gemms
    asks = [KernelAsk(**req) for req in requests]
    missing = _missing(asks, provider)
    swept = _sweep(asks, found_device, provider, rep_ms, log,
                   "of the step's kernel shapes", native_cache=True)
    results = [{"kernel": a.kernel, "dtype": a.dtype, "shape": a.shape,
                "row": flat(swept.rows[key], ALL_COLUMNS) if key else None,
                "why": missing.get(f"{a.kernel} {a.dtype}")}
               for a, key in zip(asks, swept.keys, strict=True)]
    return _document(found_device, provider=provider, results=results)
