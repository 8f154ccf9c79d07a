"""acceptance.json's shapes: the JSON object each record of acceptance_records.py writes
(`to_json`) and reads back (`from_json`), its keys in the order written.  A key marked
NotRequired is one a record leaves out (the PCIe link not read under load), or one an
earlier version's document may lack.  (No postponed annotations: NotRequired stays
visible at run time, in __optional_keys__.)"""

from typing import NotRequired, TypedDict


class NvmlReadingJson(TypedDict):
    """NvmlReading: the passive readings, then the PCIe link read under load."""

    name: str | None
    uuid: str | None
    ecc_mode: list[int] | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    remapped_rows: list[int] | None
    retired_pages: int | None
    retired_pages_pending: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    nvlink_links: int | None
    nvlink_up: int | None
    power_limit_w: float | None
    power_default_w: float | None
    temperature_c: float | None
    temp_slowdown_c: float | None
    temp_gpu_max_c: float | None
    driver: str | None
    vbios: str | None
    errors: dict[str, str]
    pcie_gen: NotRequired[int | None]
    pcie_width: NotRequired[int | None]


class StressJson(TypedDict):
    """Stress (one dtype's matmul stress), its fields in order."""

    n: int
    iterations: int
    mismatches: int
    digest: str
    rel_err: float
    tol: float | None
    reference_ok: bool
    tflops: float | None
    ms_per_call: float | None
    seconds: float | None


class StressNvmlJson(TypedDict):
    """StressNvml (NVML over the stress), its fields in order."""

    readings: int
    reason_fractions: dict[str, float]
    temperature_c_max: float | None
    sm_clock_mhz_median: float | None
    sm_clock_mhz_max_possible: float | None


class BusbwJson(TypedDict):
    """NodeBusbw of an all_reduce that ran."""

    busbw_gbps: float | None
    bytes: int
    dtype: str | None
    ms_median: float | None
    ranks: list[int]


class BusbwFailedJson(TypedDict):
    """NodeBusbw of one that failed: no busbw, and why."""

    busbw_gbps: float | None
    why: str | None


class RankRecordJson(TypedDict):
    """RankRecord: what one rank read and measured."""

    rank: int
    host: str
    local_rank: int | None
    device: str
    device_key: str | None
    device_name: str | None
    stress: dict[str, StressJson]
    nvml: NvmlReadingJson | None
    nvml_why: str
    stress_nvml: StressNvmlJson | None
    copy_gbps: float | None
    busbw: BusbwJson | BusbwFailedJson | None


class NodeJson(TypedDict):
    """Node (read only: a node to judge, as the tests give it)."""

    host: str
    ranks: list[int]
    busbw_gbps: NotRequired[float | None]
    expected_gbps: NotRequired[float | None]
    busbw: NotRequired[BusbwJson | BusbwFailedJson | None]


class CheckJson(TypedDict):
    check: str
    value: str
    verdict: str
    why: str


class GpuVerdictJson(TypedDict):
    rank: int
    host: str
    local_rank: int | None
    device_name: str | None
    verdict: str
    checks: list[CheckJson]


class NodeVerdictJson(TypedDict):
    host: str
    ranks: list[int]
    verdict: str
    checks: list[CheckJson]
    busbw: NotRequired[BusbwJson | BusbwFailedJson | None]


class JudgedJson(TypedDict):
    """Judged: the fleet's verdict and exit code, the nodes', the GPUs'."""

    verdict: str
    exit_code: int
    nodes: list[NodeVerdictJson]
    gpus: list[GpuVerdictJson]


class AcceptanceOptionsJson(TypedDict):
    """contract.request.AcceptanceOptions as acceptance.json's `settings` (asdict's)."""

    minutes: float
    median_warn_pct: float
    median_critical_pct: float
    busbw_warn_pct: float
    busbw_critical_pct: float
    expected_busbw: float | None


class AcceptanceDocJson(JudgedJson):
    """acceptance.json less the rules (the report adds them): the run, its settings, the
    stress's dtypes and seconds each, the verdicts (Judged's keys), every rank's record.
    Key order written: run_id .. seconds, the verdicts, ranks."""

    run_id: str
    command: str
    world: int
    backend: str
    settings: AcceptanceOptionsJson
    stress_dtypes: list[str]
    stress_seconds_per_dtype: float
    seconds: float
    ranks: list[RankRecordJson]


# The objects a record is read back from by its fields (acceptance_records._known).
RecordJson = NvmlReadingJson | StressJson | StressNvmlJson | BusbwJson | BusbwFailedJson \
    | RankRecordJson | NodeJson
