"""Where a plan's peak and efficiency come from, besides an assumption: the device table
or measured ceilings, and a saved run's matmul rows (--from-run).  Timing GEMMs now
(--measure) is benches/step/gemms.py's job."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, TypedDict

from contract.devices import DEVICES, ROOF_CLASS, DeviceModel, Present
from contract.meta_parts import CeilingsJson
from roofline.plan.arithmetic import Gemm
from roofline.plan.model import PlanError

if TYPE_CHECKING:
    from contract.ceilings import Ceilings
    from contract.record import RunRow
    from roofline.plan.harness import DeviceCeilings


class GemmsTimedJson(TypedDict):
    """The plan's `measurement` after --measure: what benches.step.gemms.measure_gemms
    answered (the harness's document), less its rows."""

    device_key: str
    device_name: str
    peak_source: str
    ceilings: CeilingsJson | None
    peak_tflops: float


@dataclass(frozen=True)
class GemmsTimed:
    """--measure: the device the GEMMs were timed on, its peak's source, its ceilings
    and the peak the GEMMs' MFU is over."""

    device_key: str
    device_name: str
    peak_source: str
    ceilings: CeilingsJson | None
    peak_tflops: float

    def to_json(self) -> GemmsTimedJson:
        return GemmsTimedJson(**asdict(self))  # type: ignore[typeddict-item]

    @classmethod
    def from_json(cls, doc: GemmsTimedJson) -> GemmsTimed:
        """From measure_gemms' answer (its rows, which the Gemms already hold, left
        out) or from the plan's `measurement`."""
        return cls(*(doc[f.name] for f in fields(cls)))  # type: ignore[literal-required]


class RunGemmsJson(TypedDict):
    """The plan's `measurement` after --from-run (RunGemms.to_json)."""

    device_key: str | None
    device_name: str | None
    peak_tflops: float
    ceilings: CeilingsJson | None
    worst_shape_ratio: float
    run_id: str | None


@dataclass(frozen=True)
class RunGemms:
    """--from-run: the run's device, the highest peak its matmul rows were held to, its
    ceilings, the worst ratio of a GEMM's shape to its nearest row's, and the run's id."""

    device_key: str | None
    device_name: str | None
    peak_tflops: float
    ceilings: CeilingsJson | None
    worst_shape_ratio: float
    run_id: str | None

    def to_json(self) -> RunGemmsJson:
        return RunGemmsJson(**asdict(self))  # type: ignore[typeddict-item]

    @classmethod
    def from_json(cls, doc: RunGemmsJson) -> RunGemms:
        return cls(**doc)


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


def gemms_from_run(gemms: list[Gemm], run: str, dtype: str, provider: str) -> RunGemms:
    """Give each step GEMM the TFLOP/s of the run's matmul row nearest its shape (in log
    space over M, N, K); MFU is that row's TFLOP/s over the peak the run held it to.
    Returns the plan's `measurement`: the run's device, its ceilings and the worst
    shape ratio."""
    from contract.schema import load_doc

    doc = load_doc(run)
    if not doc.rows:
        raise PlanError(f"{run} has no rows")
    timed = [r for r in doc.rows if r.case.kernel == "matmul" and r.status == "ok"
             and (r.metrics.tflops or 0) > 0 and (r.accounting.peak_tflops or 0) > 0]
    rows = _matmul_rows(run, timed, dtype, provider)
    worst = _nearest(gemms, rows)
    peaks = sorted({float(r.accounting.peak_tflops or 0) for r in rows})
    meta = doc.meta
    return RunGemms(meta.device.device_key, meta.device.device_name, peaks[-1],
                    meta.ceilings or None, worst, meta.provenance.run_id or None)


def _matmul_rows(run: str, timed: list[RunRow], dtype: str, provider: str
                 ) -> list[RunRow]:
    """The run's timed matmul rows of `dtype` and `provider`, or PlanError naming what
    it has instead."""
    if not timed:
        raise PlanError(f"{run} has no timed (ok) matmul rows")
    sel = [r for r in timed if r.case.dtype == dtype]
    if not sel:
        have = ", ".join(sorted({r.case.dtype for r in timed}))
        raise PlanError(f"{run} has no ok {dtype} matmul rows (it has {have}; use --dtype)")
    sel2 = [r for r in sel if r.case.provider == provider]
    if not sel2:
        have = ", ".join(sorted({r.case.provider for r in sel}))
        raise PlanError(f"{run} has no ok {provider} {dtype} matmul rows (it has {have}; "
                        "use --provider)")
    return sel2


def _nearest(gemms: list[Gemm], rows: list[RunRow]) -> float:
    """Each GEMM given the figures of the row nearest its shape; the worst per-dimension
    ratio of a GEMM's shape to its row's."""
    from contract.schema import parse_shape

    cands = [(parse_shape(r.case.shape), float(r.metrics.tflops or 0),
              float(r.accounting.peak_tflops or 0)) for r in rows]
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
    return worst
