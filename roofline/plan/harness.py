"""What the planner asks of the benchmark harness.  The command line
(roofline/__main__.py) passes the harness's functions in, so that roofline/ never
imports benches/: the planner is arithmetic over saved or measured numbers, the
measuring is the harness's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

from contract.ceilings import Ceilings
from contract.devices import DeviceModel, Present
from contract.models import ModelShape
from roofline.plan.arithmetic import Gemm


class KernelRequest(TypedDict):
    """One kernel --explain asks the harness to time (StepKernel.request)."""

    kernel: str
    dtype: str
    shape: dict[str, int]


# (shape, micro-batch, "cuda" | "cpu", dtype, slice blocks or None, device bytes, timed
# steps, log) -> the step's measurements (benches.step.measure.measure_step).
# The answer is a JSON document benches/step/measure.py writes and only the plan reads
# (StepMeasurement.from_json), kept whole in plan.json's step_measured.measurement.
MeasureStep = Callable[[ModelShape, int, str, str, "int | None", "float | None", int, Any],
                       dict[str, Any]]
# (gemms, device key, dtype, provider, timing budget ms, log) -> what was measured; fills
# each Gemm's ms, tflops and mfu (benches.step.gemms.measure_gemms).
# The answer is a JSON document benches/step/gemms.py writes (_document) and only the plan
# reads (sources.GemmsTimed.from_json).
MeasureGemms = Callable[[list[Gemm], str, str, str, "float | None", Any], dict[str, Any]]
# (requests, device key, provider, timing budget ms, log) -> each request's sweep row
# (benches.step.gemms.measure_kernels), for --explain.
# The answer is a JSON document benches/step/gemms.py writes and only the plan reads
# (explain.KernelsTimed.from_json), kept whole in step_measured.explain_measurement.
MeasureKernels = Callable[[list[KernelRequest], str, str, "float | None", Any],
                          dict[str, Any]]
# (device key, log) -> (its model, the device present, its ceilings: measured where the
# model has no datasheet, as a CPU's) (benches.measured_ceilings.device_ceilings).
DeviceCeilings = Callable[[str, Any], tuple[DeviceModel, Present, Ceilings]]


@dataclass(frozen=True)
class Harness:
    """The harness's functions the planner may call; None where a caller has none (a
    plan from datasheets alone)."""

    measure_gemms: MeasureGemms | None = None
    measure_step: MeasureStep | None = None
    measure_kernels: MeasureKernels | None = None
    device_ceilings: DeviceCeilings | None = None
