"""Where a plan's MFU comes from, the first step of build_plan (roofline/plan/planner.py): a
training step measured (--measure step), the model's GEMMs timed (--measure), a saved
run's matmul rows (--from-run), or an assumption (--mfu, or the default).  Each gives the
device, its peak and how the MFU was found, as an Efficiency."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NotRequired, TypedDict

from contract.devices import DEVICES
from contract.meta_parts import CeilingsJson
from contract.models import ModelShape
from roofline.plan.arithmetic import Gemm, device_memory_bytes
from roofline.plan.explain import (
    ExplainReport,
    KernelsTimed,
    explain_report,
    step_kernels,
)
from roofline.plan.harness import Harness
from roofline.plan.model import PlanError
from roofline.plan.plan_request import PlanRequest
from roofline.plan.sources import (
    GemmsTimed,
    RunGemms,
    gemms_from_run,
    measured_ceilings,
    peak_of,
)
from roofline.plan.step import gemms_from_step, step_report
from roofline.plan.step_records import StepMeasurement, StepReport

STEP_DTYPES = ("bf16", "fp16", "fp32")
# The step's ops as they run: torch's.
EXPLAIN_PROVIDER = "torch"


class StepMeasuredJson(TypedDict):
    """The plan's `step_measured` (StepMeasured.to_json)."""

    report: dict[str, Any]
    measurement: dict[str, Any]
    ceilings: CeilingsJson | None
    explain: NotRequired[dict[str, Any]]
    explain_measurement: NotRequired[dict[str, Any] | None]


@dataclass(frozen=True)
class StepMeasured:
    """--measure step: the report on the step (roofline/plan/step.py), the harness's
    measurement, the measured ceilings of a device without a datasheet, and with
    --explain the step's kernels timed alone; the plan's `step_measured`."""

    report: StepReport
    measured: StepMeasurement
    # measure_step's answer and measure_kernels' as the harness wrote them, kept whole in
    # plan.json (read through StepMeasurement and explain_report): JSON documents
    # benches/step writes and this package reads.
    measurement: dict[str, Any]
    ceilings: CeilingsJson | None
    explain: ExplainReport | None = None
    explain_measurement: dict[str, Any] | None = None

    def to_json(self) -> StepMeasuredJson:
        doc = StepMeasuredJson(report=self.report.to_json(), measurement=self.measurement,
                               ceilings=self.ceilings)
        if self.explain is not None:
            doc.update(explain=self.explain.to_json(),
                       explain_measurement=self.explain_measurement)
        return doc

    @classmethod
    def from_json(cls, doc: StepMeasuredJson) -> StepMeasured:
        """The plan's `step_measured` back, its report and explain read as records."""
        x = doc.get("explain")
        return cls(StepReport.from_json(doc["report"]),
                   StepMeasurement.from_json(doc["measurement"]), doc["measurement"],
                   doc["ceilings"], ExplainReport.from_json(x) if x else None,
                   doc.get("explain_measurement"))


@dataclass
class Efficiency:
    """The device a plan runs on, its peak for the plan's dtype, and how its MFU was
    found.  `measured`: --measure's or --from-run's record of the GEMMs (its MFU the
    GEMMs'); `step`: --measure step's (its MFU the step's); neither: an assumed MFU."""

    device: str
    dtype: str  # the plan's: --dtype, but fp32 for a step measured on a CPU
    peak: float
    peak_source: str
    mfu_source: str
    mfu_from: str
    gemms_timed: str
    measured: GemmsTimed | RunGemms | None = None
    step: StepMeasured | None = None
    warnings: list[str] = field(default_factory=list)


def plan_efficiency(request: PlanRequest, shape: ModelShape | None, gemms: list[Gemm],
                    harness: Harness, log: Any) -> Efficiency:
    """The plan's Efficiency from its request; measuring fills the Gemms' times.
    PlanError where the request asks for a measurement the harness cannot make."""
    eff = request.efficiency
    if eff.measure == "step":
        assert shape is not None  # checked with the flags
        return _step_efficiency(request, shape, gemms, harness, log)
    if eff.measure:
        return _gemm_efficiency(request, gemms, harness, log)
    if eff.from_run:
        return _run_efficiency(request, gemms, harness, log)
    device = request.hardware.device or "h100"
    peak, peak_source = peak_of(device, eff.dtype, log, harness.device_ceilings)
    return Efficiency(device, eff.dtype, peak, peak_source, "assumed",
                      "--mfu" if eff.mfu else "default assumption",
                      "not timed: --measure, --from-run RUN or --measure step times them")


def _measuring_device(device: str | None) -> tuple[str, list[str]]:
    """(device key, warnings) of a --measure, either kind: --device, or the device
    present.  DeviceError (one line, exit 2) before anything is measured when --device
    names a GPU and none is present."""
    # Looked up at the call: a test fakes the device present in contract.devices.
    from contract.devices import resolve_device

    dev = resolve_device(device or "auto")
    return dev.model.key, list(dev.warnings)


def _step_efficiency(request: PlanRequest, shape: ModelShape, gemms: list[Gemm],
                     harness: Harness, log: Any) -> Efficiency:
    """--measure step: real training steps of the model on the device present."""
    if harness.measure_step is None:
        raise PlanError("--measure step runs the model through the benchmark harness: "
                        "run it as `python -m roofline plan ... --measure step`")
    eff, micro_batch = request.efficiency, request.training.micro_batch
    device, warnings = _measuring_device(request.hardware.device)
    on_gpu = DEVICES[device].kind == "cuda"
    dtype = eff.dtype if on_gpu else "fp32"
    if dtype not in STEP_DTYPES:
        raise PlanError(f"--measure step trains in {', '.join(STEP_DTYPES)} "
                        f"(autocast), not {dtype}")
    if not on_gpu and eff.dtype != "fp32":
        warnings.append(f"the step ran in fp32 on the CPU (--dtype {eff.dtype} applies "
                        "to GPU steps)")
    device_bytes = device_memory_bytes(device, request.hardware.gpu_memory_gb)[0]
    result = harness.measure_step(shape, micro_batch, "cuda" if on_gpu else "cpu",
                                  dtype, eff.measure_layers, device_bytes, eff.steps, log)
    peak, peak_source = peak_of(device, dtype, log, harness.device_ceilings)
    measured = StepMeasurement.from_json(result)
    report = step_report(shape, measured, peak, request.memory.bytes_per_param_total(),
                         device_bytes, peak_source)
    gemms_timed = gemms_from_step(gemms, measured.gemm_calls, peak)
    ceilings = None if DEVICES[device].peaks_tflops else \
        measured_ceilings(device, log, harness.device_ceilings).to_json()  # cached by peak_of
    step = StepMeasured(report, measured, result, ceilings)
    if eff.explain:
        step = _explained(step, micro_batch, eff.rep_ms, shape, dtype, device, harness, log)
    mfu_from = (f"--measure step: {report.step_ms:.4g} ms per step of "
                f"{int(report.tokens_per_step)} tokens on {DEVICES[device].name}"
                + (f", extrapolated from {eff.measure_layers} of {shape.n_layers} "
                   "blocks" if report.slice else "")
                + "; PaLM's 6 N + 12 L H Q T, the full attention square")
    return Efficiency(device, dtype, peak, peak_source, "measured step", mfu_from,
                      gemms_timed, step=step, warnings=warnings)


def _explained(step: StepMeasured, micro_batch: int, rep_ms: float | None,
               shape: ModelShape, dtype: str, device: str, harness: Harness, log: Any
               ) -> StepMeasured:
    """--explain: the step's kernels timed alone beside the profiled step's categories."""
    assert harness.measure_kernels is not None  # checked with the flags
    kernels = step_kernels(shape, micro_batch, dtype)
    timed = harness.measure_kernels([k.request() for k in kernels], device,
                                    EXPLAIN_PROVIDER, rep_ms, log)
    explain = explain_report(kernels, KernelsTimed.from_json(timed),
                             step.measured.profile_explain_ms or {},
                             step.measured.profile_span_ms)
    return replace(step, explain=explain, explain_measurement=timed)


def _gemm_efficiency(request: PlanRequest, gemms: list[Gemm], harness: Harness,
                     log: Any) -> Efficiency:
    """--measure: the model's GEMMs, each timed alone on the device present."""
    if harness.measure_gemms is None:
        raise PlanError("--measure times GEMMs through the benchmark harness: run it as "
                        "`python -m roofline plan ... --measure`")
    eff = request.efficiency
    # The GEMM timer resolves the device again and logs its warnings.
    device, _ = _measuring_device(request.hardware.device)
    measured = GemmsTimed.from_json(
        harness.measure_gemms(gemms, device, eff.dtype, eff.provider, eff.rep_ms, log))
    return Efficiency(measured.device_key, eff.dtype, measured.peak_tflops,
                      measured.peak_source, "measured",
                      f"--measure: timed now on {measured.device_name}",
                      "each timed alone (--measure)", measured=measured)


def _run_efficiency(request: PlanRequest, gemms: list[Gemm], harness: Harness,
                    log: Any) -> Efficiency:
    """--from-run RUN: each GEMM at the speed of the run's nearest matmul row."""
    eff = request.efficiency
    run, dtype = eff.from_run, eff.dtype
    assert run is not None  # plan_efficiency's branch
    measured = gemms_from_run(gemms, run, dtype, eff.provider)
    run_key = measured.device_key
    device = request.hardware.device or run_key
    if device not in DEVICES:
        raise PlanError(f"{run} was measured on '{run_key}', which is not in "
                        "the device table (pass --device)")
    warnings = []
    if device == run_key:
        peak = measured.peak_tflops
        peak_source = ("datasheet" if DEVICES[device].peaks_tflops
                       else f"measured (no datasheet), run {run}")
    else:
        peak, peak_source = peak_of(device, dtype, log, harness.device_ceilings)
        warnings.append(f"MFU measured on '{run_key}' applied to '{device}'")
    if measured.worst_shape_ratio > 2:
        sizes = ";".join(sorted({g.shape for g in gemms}))
        warnings.append(
            f"the run's nearest matmul shapes are up to {measured.worst_shape_ratio:.1f}x "
            f"off the model's; time the exact ones with --measure, or "
            f"`python run_bench.py --kernels matmul --dtypes {dtype} "
            f"--sizes '{sizes}'`")
    return Efficiency(device, dtype, peak, peak_source, "measured",
                      f"--from-run {run}",
                      f"the nearest matmul rows of {run}", measured=measured,
                      warnings=warnings)
