"""`python -m roofline plan --measure`: the model's GEMM shapes timed on the device
present through the suite's sweep (benches.runner), so the plan's MFU is measured."""


from dataclasses import fields, replace
from typing import Any

from roofline.devices import ROOF_CLASS
from roofline.plan.arithmetic import Gemm
from roofline.plan.model import PlanError
from roofline.plan.sources import _ceilings_for


def measure_gemms(gemms: list[Gemm], device: str, dtype: str, provider: str,
                  rep_ms: float | None, log: Any) -> dict[str, Any]:
    """Time the step's GEMM shapes on the device present through the suite's sweep
    (benches.runner), fill each Gemm's ms/tflops/mfu, and return what was used."""
    # The device first: a GPU asked for on a machine without one fails before any import.
    model, present, ceilings = _ceilings_for(device, log)
    from benches.cases import RunConfig, build_cases
    from benches.runner import iterate
    from benches.timing import TimingConfig
    from kernels.spec import Target, interpreter_enabled

    rc = ROOF_CLASS[dtype]
    peak = ceilings.peak_tflops(rc)
    if peak is None:
        raise PlanError(f"no {rc} peak for {model.name}")
    target = Target(present.kind, present.capability, interpreter_enabled(), present.name)
    timing = TimingConfig()
    if rep_ms is not None:
        # A smaller budget for quick looks (and tests); only the knobs this TimingConfig
        # has are touched, since benches/timing.py evolves on its own.
        want = {"rep_ms": rep_ms, "warmup_ms": min(getattr(timing, "warmup_ms", rep_ms), rep_ms),
                "min_samples": min(getattr(timing, "min_samples", 5), 5),
                "cpu_min_run_time_s": rep_ms / 1e3}
        have = {f.name for f in fields(timing)}
        timing = replace(timing, **{k: v for k, v in want.items() if k in have})
    shapes: dict[str, dict[str, int]] = {}
    for g in gemms:
        shapes.setdefault(g.shape, {"M": g.M, "N": g.N, "K": g.K})
    cfg = RunConfig(kernels=["matmul"], dtypes=[dtype], providers=[provider],
                    sizes="explicit", explicit_shapes=list(shapes.values()), seed=0,
                    check_only=False, model=model, present=present, target=target,
                    ceilings=ceilings, timing=timing)
    cases = build_cases(cfg)
    log(f"timing {len(cases)} GEMM shapes ({provider} {dtype}) on {present.name}")
    rows: dict[str, dict[str, Any]] = {}
    for case, row in iterate(cases, cfg):
        rows[case.shape_str] = row
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
    return {"device_key": model.key, "device_name": present.name, "peak_tflops": peak,
            "peak_source": "datasheet" if model.peaks_tflops else "measured (no datasheet)",
            "ceilings": ceilings.to_json(), "rows": list(rows.values())}
