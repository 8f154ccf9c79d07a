"""The shapes of a run's metadata parts that stay JSON objects (contract/run_meta.py's
fields): each written by one stage of a run with a known set of keys, read back by the
report.  `total=False` where a run may lack keys: an older run's, a CPU run's empty
part, an NVML snapshot that could not read everything."""

from __future__ import annotations

from typing import TypedDict

from kernels.shipped_json import ShippedUseJson

__all__ = ["ShippedUseJson"]  # metadata.shipped_configs, defined beside its writer


class NotRecorded(TypedDict):
    """{}: a part with required keys that the run did not record (a CPU run's, an older
    run's; the loader reads null as {} too)."""


class ThrottleSettings(TypedDict):
    """metadata.throttle_settings: benches/sweep/throttle.py ThrottleConfig's values."""

    threshold_pct: float
    recovery_delay_s: float
    retries: int


class StepLayer(TypedDict):
    kernel: str
    layer: str
    shape: str  # as contract.schema.format_shape writes it
    count: int  # runs per forward pass


class ModelStep(TypedDict):
    """metadata.model_step: `--sizes model:NAME`'s model and its forward pass's shapes."""

    model: str
    describe: str
    tokens: int
    layers: list[StepLayer]


class DuringRun(TypedDict, total=False):
    """nvml_end's `during_run`: the GPU monitor's summary (gpu_monitor.MonitorSummary)."""

    readings: int
    readings_idle: int
    readings_all: int
    interval_s: float
    sm_clock_mhz_min: float | None
    sm_clock_mhz_median: float | None
    sm_clock_mhz_max: float | None
    power_w_max: float | None
    throttled_fraction: float | None
    throttle_reasons_seen: list[str]


class NvmlSnapshot(TypedDict, total=False):
    """metadata.nvml_start and nvml_end: benches/sweep/gpu_monitor.py nvml_snapshot's
    document, each key NVML could read (`nvml_device` None: no device matched)."""

    nvml_device: None
    nvml_match: str
    driver: str
    nvml_uuid: str
    sm_clock_mhz: int | None
    power_w: float | None
    temperature_c: int | None
    clock_reasons: int | None
    gpu_util_pct: int | None
    energy_mj: int | None
    mem_clock_mhz: int | None
    max_sm_clock_mhz: int | None
    power_limit_w: float | None
    throttle_reasons: list[str] | None
    during_run: DuringRun


class ClocksFacts(TypedDict, total=False):
    """metadata.clocks (benches/sweep/throttle.py run_clock_facts)."""

    sm_mhz_min: float | None
    sm_mhz_median: float | None
    sm_mhz_max: float | None
    sm_mhz_max_possible: float | None
    mem_mhz: float | None


class PowerFacts(TypedDict, total=False):
    """metadata.power (run_clock_facts)."""

    max_w: float | None
    limit_w: float | None


class ThrottleFacts(TypedDict, total=False):
    """metadata.throttle (run_clock_facts)."""

    threshold_pct: float
    recovery_delay_s: float
    retries: int
    readings: int | None
    readings_idle_left_out: int | None
    throttled_fraction_of_readings: float | None
    reasons_seen: list[str]
    throttled_rows: int


class CounterProbe(TypedDict, total=False):
    """metadata.energy's `counter`: benches/sweep/energy_counter.py CounterProbe.to_json."""

    period_s: float | None
    period_min_s: float | None
    period_max_s: float | None
    step_mj: float | None
    changes: int
    reads: int
    read_s: float
    probed_s: float
    monotonic: bool
    reason: str
    how: str


class EnergySource(TypedDict, total=False):
    """metadata.energy (energy_counter.energy_metadata): where a row's energy comes
    from or why not; on a GPU how its counter moves and the replay a row needs."""

    source: str | None
    reason: str
    counter: CounterProbe
    row_window_s: float | None
    precision: float
    bounds: str


class KernelTimeSource(TypedDict):
    """metadata.kernel_time (benches/sweep/kernel_time.py): where kernel_ms comes from."""

    source: str | None
    reason: str


class CompiledAhead(TypedDict, total=False):
    """metadata.compiled_ahead (benches/sweep/triton_cache.py CompileAhead.record)."""

    workers: int
    cases: int
    cases_done: int
    cases_failed: int
    kernels_compiled: int
    kernels_built: int
    launchers_built: int
    started_early: int  # 1: spawned before the ceilings
    waited_s: float
    wait_ended: str
    worker_errors: list[str]


class TritonCompiles(TypedDict, total=False):
    """metadata.triton_compiles (benches/sweep/time_split.py TimeSplit.compiles)."""

    compiled: int
    from_cache: int


class Resume(TypedDict):
    """One of metadata.resumed: a --resume of the run, with the split of the process
    before it."""

    at: str  # ISO 8601, UTC
    command: str
    rows_before: int
    retimed_cut_short: int
    time_split_s: dict[str, float] | None
    wall_s: float | None


class RowSplit(TypedDict):
    """One of metadata.row_split_s: a row's key and its seconds per phase."""

    row: list[str]
    s: dict[str, float]


class Datasheet(TypedDict):
    """metadata.ceilings' `datasheet` (contract/ceilings.py datasheet_of)."""

    tflops: dict[str, float]  # roof class -> TFLOP/s
    hbm_gbps: float | None
    l2_gbps: float | None


class Measured(TypedDict, total=False):
    """metadata.ceilings' `measured` (benches/measured_ceilings.py); `left_out` and
    `seconds` since later versions, a failed class's `<class>_error` in `method`."""

    tflops: dict[str, float]
    hbm_gbps: float | None
    l2_gbps: float | None
    method: dict[str, str]
    measured_at: str
    seconds: float
    left_out: dict[str, str]


class CeilingsJson(TypedDict):
    """metadata.ceilings (contract/ceilings.py Ceilings.to_json)."""

    datasheet: Datasheet | None
    measured: Measured | None
