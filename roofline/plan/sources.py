"""Where a plan's peak and efficiency come from, besides an assumption: the device table
or measured ceilings, and a saved run's matmul rows (--from-run).  Timing GEMMs now
(--measure) is benches/step/gemms.py's job."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from contract.devices import DEVICES, ROOF_CLASS, DeviceModel, Present
from roofline.plan.arithmetic import Gemm
from roofline.plan.model import PlanError

if TYPE_CHECKING:
    from contract.ceilings import Ceilings
    from roofline.plan.harness import DeviceCeilings


def measured_ceilings(key: str, log: Any, device_ceilings: DeviceCeilings | None
                      ) -> Ceilings:
    """The ceilings of device `key` as the harness gives them (measured on the device
    present where the model has no datasheet), or PlanError where there is no harness."""
    return _device(key, log, device_ceilings)[2]


def _device(key: str, log: Any, device_ceilings: DeviceCeilings | None
            ) -> tuple[DeviceModel, Present, Ceilings]:
    if device_ceilings is None:
        raise PlanError(f"the peaks of '{key}' are measured on the device (no datasheet): "
                        "run the plan through python -m roofline plan")
    return device_ceilings(key, log)


def ceilings_peak(model: DeviceModel, present: Present, ceilings: Ceilings,
                  dtype: str) -> float:
    """The peak TFLOP/s `ceilings` hold `dtype` to (the datasheet's, else the measured
    one), or PlanError saying why there is none.  A class measured under 0.1x fp32's rate
    is no roof (contract.ceilings.no_roofs: bf16 and fp16 on a CPU without their units),
    and the refusal says so with the figures, and to plan in fp32."""
    rc = ROOF_CLASS[dtype]
    peak = ceilings.peak_tflops(rc)
    if peak is not None:
        return peak
    if model.peaks_tflops:
        raise PlanError(f"{model.name} has no {dtype} units (no {rc} peak in the table)")
    where = f"{model.name} ({present.name})"
    why = ceilings.no_roofs().get(rc)
    if why:
        raise PlanError(f"no {rc} peak for {where}: its {rc} matmul {why}; "
                        "run with --dtype fp32 instead")
    raise PlanError(f"no {rc} ceiling could be measured on {where}")


def peak_of(key: str, dtype: str, log: Any, device_ceilings: DeviceCeilings | None = None
            ) -> tuple[float, str]:
    """(dense peak TFLOP/s of `dtype` on device `key`, source): the datasheet's, else the
    one `device_ceilings` (the harness's) measures."""
    model = DEVICES[key]
    rc = ROOF_CLASS[dtype]
    if model.peaks_tflops:
        peak = model.peak(dtype)
        if peak is None:
            raise PlanError(f"{model.name} has no {dtype} units (no {rc} peak in the table)")
        return peak, "datasheet"
    return ceilings_peak(*_device(key, log, device_ceilings), dtype), "measured (no datasheet)"


def _log_distance(a: dict[str, int], b: dict[str, int]) -> tuple[float, float]:
    """(Euclidean distance in log space, worst per-dimension ratio)."""
    logs = [math.log(a[k] / b[k]) for k in ("M", "N", "K")]
    return math.sqrt(sum(x * x for x in logs)), math.exp(max(abs(x) for x in logs))


def gemms_from_run(gemms: list[Gemm], run: str, dtype: str, provider: str) -> dict[str, Any]:
    """Give each step GEMM the TFLOP/s of the run's matmul row nearest its shape (in log
    space over M, N, K); MFU is that row's TFLOP/s over the peak the run held it to."""
    import pandas as pd

    from contract.schema import load_run, parse_shape

    meta, df = load_run(run)
    if df.empty or "kernel" not in df.columns:
        raise PlanError(f"{run} has no rows")
    mm = df[(df["kernel"] == "matmul") & (df["status"] == "ok")].copy()
    mm["tflops"] = pd.to_numeric(mm["tflops"], errors="coerce")
    mm["peak_tflops"] = pd.to_numeric(mm["peak_tflops"], errors="coerce")
    mm = mm[(mm["tflops"] > 0) & (mm["peak_tflops"] > 0)]
    if mm.empty:
        raise PlanError(f"{run} has no timed (ok) matmul rows")
    sel = mm[mm["dtype"] == dtype]
    if sel.empty:
        have = ", ".join(sorted(mm["dtype"].unique()))
        raise PlanError(f"{run} has no ok {dtype} matmul rows (it has {have}; use --dtype)")
    sel2 = sel[sel["provider"] == provider]
    if sel2.empty:
        have = ", ".join(sorted(sel["provider"].unique()))
        raise PlanError(f"{run} has no ok {provider} {dtype} matmul rows (it has {have}; "
                        "use --provider)")
    cands = [(parse_shape(s), float(t), float(pk))
             for s, t, pk in zip(sel2["shape"], sel2["tflops"], sel2["peak_tflops"],
                                 strict=True)]
    worst = 1.0
    for g in gemms:
        want = {"M": g.M, "N": g.N, "K": g.K}
        shape, tflops, peak = min(cands, key=lambda c: _log_distance(want, c[0])[0])
        ratio = _log_distance(want, shape)[1]
        worst = max(worst, ratio)
        g.tflops, g.mfu = tflops, tflops / peak
        g.ms = g.flops / (tflops * 1e12) * 1e3
        g.measured_shape = ",".join(f"{k}={shape[k]}" for k in ("M", "N", "K"))
        g.note = "exact" if ratio == 1.0 else f"nearest, up to {ratio:.1f}x off"
    peaks = sorted(set(float(p) for p in sel2["peak_tflops"]))
    return {"device_key": meta.get("device_key"), "device_name": meta.get("device_name"),
            "peak_tflops": peaks[-1], "ceilings": meta.get("ceilings"),
            "worst_shape_ratio": worst, "run_id": meta.get("run_id")}
