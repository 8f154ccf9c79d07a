"""`python -m roofline plan --measure`: the model's GEMM shapes timed on the device
present through the suite's sweep (benches.sweep.runner), so the plan's MFU is measured; and
`--measure step --explain`: the step's own kernels (its GEMMs, attention, norms, loss)
timed the same way."""


from dataclasses import fields, replace
from typing import Any

from benches.measured_ceilings import device_ceilings
from roofline.plan.arithmetic import Gemm
from roofline.plan.model import PlanError
from roofline.plan.sources import ceilings_peak


def _sweep(requests: list[dict[str, Any]], device: tuple[Any, Any, Any], provider: str,
           rep_ms: float | None, log: Any, what: str, native_cache: bool = False
           ) -> tuple[dict[tuple[str, str, str], dict[str, Any]], dict[str, Any]]:
    """Run (kernel, dtype, shape) requests through the suite's sweep on the device
    present (`device`: device_ceilings's model, present device and ceilings): ({(kernel,
    dtype, shape string): row}, what was used).  Requests of a family the registry
    lacks, or a dtype or provider it does not have, are left out.  `native_cache`: in
    the device's native cache mode, as run_bench.py times by default (cold on a GPU,
    warm on a CPU); else the sweep's default mode."""
    from contract.record import flat
    from contract.request import RunRequest, Selection
    from contract.schema import ALL_COLUMNS, DEFAULT_CACHE
    from contract.schema import native_cache as native_mode

    model, present, ceilings = device
    from benches.sweep.cases import Case, SweepContext
    from benches.sweep.runner import iterate
    from benches.timing.plan import TimingConfig
    from kernels import REGISTRY
    from kernels.spec import Target, interpreter_enabled

    target = Target(present.kind, present.capability, interpreter_enabled(), present.name)
    timing = TimingConfig()
    if rep_ms is not None:
        # A smaller budget for quick looks (and tests); only the knobs this TimingConfig
        # has are touched, since benches/timing/clock.py evolves on its own.
        want = {"rep_ms": rep_ms, "warmup_ms": min(getattr(timing, "warmup_ms", rep_ms), rep_ms),
                "min_samples": min(getattr(timing, "min_samples", 5), 5),
                "cpu_min_run_time_s": rep_ms / 1e3}
        have = {f.name for f in fields(timing)}
        timing = replace(timing, **{k: v for k, v in want.items() if k in have})
    mode = native_mode({"device": present.kind}) if native_cache else DEFAULT_CACHE
    cfg = SweepContext(RunRequest(Selection(
        kernels=tuple(sorted({r["kernel"] for r in requests})),
        dtypes=tuple(sorted({r["dtype"] for r in requests})), providers=(provider,),
        sizes="explicit", shapes=tuple(r["shape"] for r in requests), cache=(mode,))),
        model, present, target, ceilings=ceilings, timing=timing)
    cases, seen = [], set()
    for r in requests:
        spec = REGISTRY.get(r["kernel"])
        if spec is None or r["dtype"] not in spec.dtypes or provider not in spec.providers:
            continue
        case = Case(spec, provider, r["dtype"], {d: r["shape"][d] for d in spec.dims},
                    cfg.cache_modes[0])
        if (case.spec.name, case.dtype, case.shape_str) not in seen:
            seen.add((case.spec.name, case.dtype, case.shape_str))
            cases.append(case)
    log(f"timing {len(cases)} {what} ({provider}) on {present.name}")
    # The planner reads the rows as the files hold them (contract.record.flat).
    rows = {(case.spec.name, case.dtype, case.shape_str): flat(row, ALL_COLUMNS)
            for case, row in iterate(cases, cfg)}
    for r in requests:  # each request's row, by its case's key (shape in the spec's order)
        spec = REGISTRY.get(r["kernel"])
        if spec is not None:
            key = (spec.name, r["dtype"],
                   Case(spec, provider, r["dtype"], {d: r["shape"][d] for d in spec.dims}
                        ).shape_str)
            if key in rows:
                r["_key"] = key
    used = {"device_key": model.key, "device_name": present.name,
            "peak_source": "datasheet" if model.peaks_tflops else "measured (no datasheet)",
            "ceilings": ceilings.to_json()}
    return rows, used


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
    requests = [{"kernel": "matmul", "dtype": dtype, "shape": s} for s in shapes.values()]
    found, used = _sweep(requests, found_device, provider, rep_ms, log,
                         f"GEMM shapes ({dtype})")
    rows = {shape: row for (_, _, shape), row in found.items()}
    problems = []
    for g in gemms:
        row = rows.get(g.shape)
        if row is None or row.get("status") != "ok" or not row.get("tflops"):
            why = (row or {}).get("reason") or "not run"
            problems.append(f"{g.shape}: {why}")
            continue
        g.ms, g.tflops = float(row["ms_median"]), float(row["tflops"])
        g.mfu = g.tflops / peak
    if problems:
        raise PlanError(f"{len(problems)} GEMM(s) could not be timed, e.g. {problems[0]}")
    return {**used, "peak_tflops": peak, "rows": list(rows.values())}


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
    from kernels import REGISTRY

    missing = {}
    for r in requests:
        spec = REGISTRY.get(r["kernel"])
        key = f"{r['kernel']} {r['dtype']}"
        if spec is None:
            missing[key] = f"no '{r['kernel']}' family in the harness (run_bench.py --list)"
        elif r["dtype"] not in spec.dtypes:
            missing[key] = f"'{r['kernel']}' has no {r['dtype']}"
        elif provider not in spec.providers:
            missing[key] = f"'{r['kernel']}' has no {provider} provider"
    asked = [dict(r) for r in requests]
    rows, used = _sweep(asked, found_device, provider, rep_ms, log,
                        "of the step's kernel shapes", native_cache=True)
    results = []
    for r in asked:
        key = r.pop("_key", None)
        results.append({**r, "row": rows[key] if key else None,
                        "why": missing.get(f"{r['kernel']} {r['dtype']}")})
    return {**used, "provider": provider, "results": results}
