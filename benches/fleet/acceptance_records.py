"""Fleet acceptance's records: what one rank read and measured (RankRecord: its GPU's NVML
readings, NvmlReading, with the PCIe link read under load, PcieLink; its matmul stress
per dtype, Stress; NVML over the stress, StressNvml; its copy bandwidth; its node's
all_reduce, NodeBusbw), a node to judge (Node), one check's verdict (Check), the
verdicts per GPU, per node and for the fleet (GpuVerdict, NodeVerdict, Judged) and the
run's document (AcceptanceDoc).

acceptance.json holds them as JSON objects (`to_json`, their keys in the order of the
fields here); `from_json` reads one back (a document of an earlier version, whose records
may lack a field, included).  Rank 0 gathers the ranks' records as they are (pickled)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar, cast

from benches.fleet.acceptance_json import (
    AcceptanceDocJson,
    AcceptanceOptionsJson,
    BusbwFailedJson,
    BusbwJson,
    CheckJson,
    GpuVerdictJson,
    JudgedJson,
    NodeJson,
    NodeVerdictJson,
    NvmlReadingJson,
    RankRecordJson,
    RecordJson,
    StressJson,
    StressNvmlJson,
)
from contract.request import AcceptanceOptions

R = TypeVar("R")


def _known(t: type[R], d: RecordJson, **given: Any) -> R:
    """A `t` of the keys of `d` that are fields of `t` (a document of an earlier version
    may lack some: their defaults), `given` in place of those read."""
    names = {f.name for f in fields(cast(Any, t))}  # t: a dataclass
    return t(**{**{k: v for k, v in d.items() if k in names}, **given})


@dataclass(frozen=True)
class PcieLink:
    """The PCIe link's current generation and width, read under the stress (an idle GPU
    lowers its link speed); None where unreadable (NVML's message in `errors`)."""

    pcie_gen: int | None = None
    pcie_width: int | None = None
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NvmlReading:
    """Every passive reading of one GPU (benches/fleet/acceptance_nvml.py: watts, degrees
    C, counts), None where NVML could not give it, with NVML's message per failed reading
    (`errors`); the PCIe link read under load (None: not read)."""

    name: str | None = None
    uuid: str | None = None
    ecc_mode: tuple[int, ...] | None = None  # (current, pending), 1 on
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows: tuple[int, ...] | None = None  # (correctable, uncorrectable, pending, failure)
    retired_pages: int | None = None
    retired_pages_pending: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    nvlink_links: int | None = None
    nvlink_up: int | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    temperature_c: float | None = None
    temp_slowdown_c: float | None = None
    temp_gpu_max_c: float | None = None
    driver: str | None = None
    vbios: str | None = None
    errors: dict[str, str] = field(default_factory=dict)
    pcie: PcieLink | None = None

    @property
    def pcie_gen(self) -> int | None:
        return self.pcie.pcie_gen if self.pcie is not None else None

    @property
    def pcie_width(self) -> int | None:
        return self.pcie.pcie_width if self.pcie is not None else None

    def to_json(self) -> NvmlReadingJson:
        """The readings, then the PCIe link's (read under load; its errors left out)."""
        out = cast(NvmlReadingJson, {f.name: getattr(self, f.name) for f in fields(self)
                                     if f.name != "pcie"})
        out["ecc_mode"] = None if self.ecc_mode is None else list(self.ecc_mode)
        out["remapped_rows"] = None if self.remapped_rows is None else \
            list(self.remapped_rows)
        if self.pcie is not None:
            out.update(pcie_gen=self.pcie.pcie_gen, pcie_width=self.pcie.pcie_width)
        return out

    @classmethod
    def from_json(cls, d: NvmlReadingJson) -> NvmlReading:
        pcie = PcieLink(d.get("pcie_gen"), d.get("pcie_width")) \
            if "pcie_gen" in d or "pcie_width" in d else None
        listed = {k: tuple(v) for k in ("ecc_mode", "remapped_rows")
                  if isinstance(v := d.get(k), list | tuple)}
        return _known(cls, d, **listed, pcie=pcie)


@dataclass(frozen=True)
class Stress:
    """One dtype's matmul stress (acceptance_stress.matmul_stress): n, products made,
    products that differ from the first, the first's digest, its error against the
    float64 reference and the dtype's tolerance, TFLOP/s and ms per call (the median of
    the batches), the seconds it took."""

    n: int = 0
    iterations: int = 0
    mismatches: int = 0
    digest: str = ""
    rel_err: float = math.nan
    tol: float | None = None
    reference_ok: bool = False
    tflops: float | None = None
    ms_per_call: float | None = None
    seconds: float | None = None

    def to_json(self) -> StressJson:
        return cast(StressJson, asdict(self))

    @classmethod
    def from_json(cls, d: StressJson) -> Stress:
        return _known(cls, d)


@dataclass(frozen=True)
class StressNvml:
    """NVML over the stress's busy readings (acceptance_nvml.stress_summary): how many,
    the share carrying each clock-event reason, the hottest temperature, the median SM
    clock and the most it can be."""

    readings: int = 0
    reason_fractions: dict[str, float] = field(default_factory=dict)
    temperature_c_max: float | None = None
    sm_clock_mhz_median: float | None = None
    sm_clock_mhz_max_possible: float | None = None

    def to_json(self) -> StressNvmlJson:
        return cast(StressNvmlJson, asdict(self))

    @classmethod
    def from_json(cls, d: StressNvmlJson) -> StressNvml:
        return _known(cls, d)


@dataclass(frozen=True)
class NodeBusbw:
    """The all_reduce among a node's ranks (acceptance_stress.node_busbw): its busbw,
    bytes, dtype, median ms and ranks; or, where it failed, None and why."""

    busbw_gbps: float | None = None
    why: str | None = None
    bytes: int | None = None
    dtype: str | None = None
    ms_median: float | None = None
    ranks: tuple[int, ...] = ()

    def to_json(self) -> BusbwJson | BusbwFailedJson:
        if self.bytes is None:  # failed
            return {"busbw_gbps": self.busbw_gbps, "why": self.why}
        return {"busbw_gbps": self.busbw_gbps, "bytes": self.bytes, "dtype": self.dtype,
                "ms_median": self.ms_median, "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, d: BusbwJson | BusbwFailedJson | None) -> NodeBusbw | None:
        """The all_reduce back; None where `d` is not an object (absent, null)."""
        if not isinstance(d, Mapping):
            return None
        return _known(cls, d, ranks=tuple(d.get("ranks") or ()))


@dataclass(frozen=True)
class RankRecord:
    """What one rank read and measured (benches/fleet/acceptance.py): who it is, its
    device, its stress per dtype, its GPU's NVML readings (None on a CPU rank or without
    NVML: `nvml_why`) and NVML over the stress, its copy GB/s and its node's all_reduce
    (as every rank of the node measured it)."""

    rank: int
    host: str
    local_rank: int | None = None
    device: str = "cpu"
    device_key: str | None = None
    device_name: str | None = None
    stress: dict[str, Stress] = field(default_factory=dict)
    nvml: NvmlReading | None = None
    nvml_why: str = ""
    stress_nvml: StressNvml | None = None
    copy_gbps: float | None = None
    busbw: NodeBusbw | None = None

    def to_json(self) -> RankRecordJson:
        return {"rank": self.rank, "host": self.host, "local_rank": self.local_rank,
                "device": self.device, "device_key": self.device_key,
                "device_name": self.device_name,
                "stress": {k: v.to_json() for k, v in self.stress.items()},
                "nvml": None if self.nvml is None else self.nvml.to_json(),
                "nvml_why": self.nvml_why,
                "stress_nvml": None if self.stress_nvml is None else self.stress_nvml.to_json(),
                "copy_gbps": self.copy_gbps,
                "busbw": None if self.busbw is None else self.busbw.to_json()}

    @classmethod
    def from_json(cls, d: RankRecordJson) -> RankRecord:
        nvml, summary = d.get("nvml"), d.get("stress_nvml")
        return _known(cls, d, nvml_why=d.get("nvml_why") or "",
                      stress={k: Stress.from_json(v) for k, v in
                              (d.get("stress") or {}).items()},
                      nvml=NvmlReading.from_json(nvml) if nvml else None,
                      stress_nvml=StressNvml.from_json(summary) if summary else None,
                      busbw=NodeBusbw.from_json(d.get("busbw")))


@dataclass(frozen=True)
class Node:
    """A node to judge: its host, its ranks, its all_reduce (rank 0 of the node's) and the
    busbw it should reach (GB/s; None: not known)."""

    host: str
    ranks: tuple[int, ...]
    busbw_gbps: float | None = None
    expected_gbps: float | None = None
    busbw: NodeBusbw | None = None

    @classmethod
    def from_json(cls, d: NodeJson) -> Node:
        return _known(cls, d, ranks=tuple(d["ranks"]),
                      busbw=NodeBusbw.from_json(d.get("busbw")))


@dataclass(frozen=True)
class Check:
    check: str
    value: str
    verdict: str
    why: str = ""

    def as_dict(self) -> CheckJson:
        return CheckJson(check=self.check, value=self.value, verdict=self.verdict,
                         why=self.why)


@dataclass(frozen=True)
class GpuVerdict:
    rank: int
    host: str
    local_rank: int | None
    device_name: str | None
    verdict: str
    checks: tuple[Check, ...]

    @property
    def label(self) -> str:
        return f"rank {self.rank} ({self.host}:{self.local_rank})"

    def to_json(self) -> GpuVerdictJson:
        return {"rank": self.rank, "host": self.host, "local_rank": self.local_rank,
                "device_name": self.device_name, "verdict": self.verdict,
                "checks": [c.as_dict() for c in self.checks]}


@dataclass(frozen=True)
class NodeVerdict:
    host: str
    ranks: tuple[int, ...]
    verdict: str
    checks: tuple[Check, ...]
    busbw: NodeBusbw | None = None

    @property
    def label(self) -> str:
        return f"node {self.host}"

    def to_json(self) -> NodeVerdictJson:
        return {"host": self.host, "ranks": list(self.ranks), "verdict": self.verdict,
                "checks": [c.as_dict() for c in self.checks],
                "busbw": None if self.busbw is None else self.busbw.to_json()}


def _checks(d: GpuVerdictJson | NodeVerdictJson) -> tuple[Check, ...]:
    return tuple(Check(**c) for c in d.get("checks") or ())


@dataclass(frozen=True)
class Judged:
    """The fleet's verdict and exit code (GCM's), the nodes' and the GPUs', worst first."""

    verdict: str
    exit_code: int
    nodes: tuple[NodeVerdict, ...]
    gpus: tuple[GpuVerdict, ...]

    def to_json(self) -> JudgedJson:
        return {"verdict": self.verdict, "exit_code": self.exit_code,
                "nodes": [n.to_json() for n in self.nodes],
                "gpus": [g.to_json() for g in self.gpus]}

    @classmethod
    def from_json(cls, d: JudgedJson) -> Judged:
        nodes = tuple(NodeVerdict(n["host"], tuple(n["ranks"]), n["verdict"], _checks(n),
                                  NodeBusbw.from_json(n.get("busbw"))) for n in d["nodes"])
        gpus = tuple(GpuVerdict(g["rank"], g["host"], g.get("local_rank"),
                                g.get("device_name"), g["verdict"], _checks(g))
                     for g in d["gpus"])
        return cls(d["verdict"], int(d["exit_code"]), nodes, gpus)


@dataclass(frozen=True)
class AcceptanceDoc:
    """acceptance.json (less the rules, which the report adds): the run, its settings,
    the stress's dtypes and seconds each, the verdicts, every rank's record."""

    run_id: str
    command: str
    world: int
    backend: str
    settings: AcceptanceOptions
    stress_dtypes: tuple[str, ...]
    stress_seconds_per_dtype: float
    seconds: float
    judged: Judged
    ranks: tuple[RankRecord, ...]

    @property
    def verdict(self) -> str:
        return self.judged.verdict

    def to_json(self) -> AcceptanceDocJson:
        return {"run_id": self.run_id, "command": self.command, "world": self.world,
                "backend": self.backend,
                "settings": cast(AcceptanceOptionsJson, asdict(self.settings)),
                "stress_dtypes": list(self.stress_dtypes),
                "stress_seconds_per_dtype": self.stress_seconds_per_dtype,
                "seconds": self.seconds, **self.judged.to_json(),
                "ranks": [r.to_json() for r in self.ranks]}

    @classmethod
    def from_json(cls, d: AcceptanceDocJson) -> AcceptanceDoc:
        return cls(d["run_id"], d["command"], d["world"], d["backend"],
                   AcceptanceOptions(**d["settings"]), tuple(d["stress_dtypes"]),
                   d["stress_seconds_per_dtype"], d["seconds"], Judged.from_json(d),
                   tuple(RankRecord.from_json(r) for r in d["ranks"]))
