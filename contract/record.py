"""A run's row as a typed record: what the case is (its identity and accounting: FLOPs,
bytes, the roofs it is held against), its outcome, and one group of columns per stage that
fills them (the check, the Triton config, the timing, the metrics derived from it, the
clocks, the energy, the kernel profile, the fleet rank, the comparison with the baseline
provider), plus the values the physics check withheld.

Each column belongs to exactly one group: adding a column means adding a field to one
group (tests/test_record.py holds every column to one group and the flat order).  On disk
a row stays flat (results.csv's columns, results.json's keys, contract/schema.py's
ALL_COLUMNS order): `flat` is the one writer of that form and `parse_row` the one
loader, runs written before any column existed included.  Every string key of a row is
read here and nowhere else.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from contract.modes import DEFAULT_CACHE, row_cache
from contract.physics import Withheld, withheld_of

SAMPLES = "samples_ms"
RowKey = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class CaseId:
    """Which case a row measured: kernel, provider, dtype, shape ("n=1048576",
    "M=4096,N=4096,K=4096"), cache mode (cold: caches flushed or rotated past; warm:
    back-to-back calls on the same buffers) and, under --sizes model:NAME, the model
    layer(s) the shape stands for."""

    kernel: str
    provider: str
    dtype: str
    shape: str
    cache: str = DEFAULT_CACHE
    layer: str | None = None

    @property
    def key(self) -> RowKey:
        """The one key every part of the suite matches rows by."""
        return (self.kernel, self.provider, self.dtype, self.shape, self.cache)

    @property
    def case(self) -> tuple[str, str, str, str]:
        """The key without the provider: the rows a speedup compares."""
        return (self.kernel, self.dtype, self.shape, self.cache)


@dataclass(frozen=True)
class Accounting:
    """What the case costs and what it is held against: its FLOPs and compulsory bytes,
    intensity, the roof class (fp32 vector units, or a dtype's tensor cores), the device
    model and the device present, and the datasheet and measured ceilings of its class."""

    flops: int = 0
    bytes: int = 0
    intensity: float | None = None
    roof_class: str | None = None
    device: str = ""
    gpu_name: str = ""
    peak_tflops: float | None = None
    peak_gbps: float | None = None
    meas_peak_tflops: float | None = None
    meas_peak_gbps: float | None = None


@dataclass(frozen=True)
class Check:
    """The correctness gate: the relative error against the float64 reference and the
    dtype's tolerance it was held to."""

    correct: bool | None = None
    rel_err: float | None = None
    tolerance: float | None = None


@dataclass(frozen=True)
class Build:
    """A Triton row's configs ("kernel[BLOCK_M=..,num_warps=..]; ...") and where each came
    from (shipped, tuned, cached, fixed, given); a compiled provider's compile seconds."""

    config: str | None = None
    config_source: str | None = None
    compile_s: float | None = None


@dataclass(frozen=True)
class Timing:
    """The timer's samples (ms): median, 20th and 80th percentiles, count, the raw
    samples (results.json only), the method (`timer`), the host's dispatch per call (GPU)
    and, for a CPU row an interrupt cut short, "timed/planned" rounds."""

    ms_median: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    n_samples: int = 0
    timer: str | None = None
    host_us: float | None = None
    cut_short: str | None = None
    samples_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class Metrics:
    """What the timing says against the accounting (contract/metrics.py derive): TFLOP/s,
    GB/s, the roofline bound (datasheet and measured), MFU and % of roof."""

    tflops: float | None = None
    gbps: float | None = None
    roof_tflops: float | None = None
    mfu: float | None = None
    pct_roof: float | None = None
    meas_roof_tflops: float | None = None
    pct_meas_roof: float | None = None
    above_roof: bool | None = None


@dataclass(frozen=True)
class Clocks:
    """GPU: the median SM clock of the row's own samples, whether it stayed throttled,
    and how many samples the per-sample throttle rule left out."""

    sm_clock_mhz: float | None = None
    throttled: bool | None = None
    throttled_samples: int | None = None


@dataclass(frozen=True)
class Energy:
    """Energy per call (J) from the mean power over the row's energy window (NVML's
    counter on a GPU, RAPL on a CPU) x its median time, what it buys, and the limit."""

    energy_j: float | None = None
    tflop_per_j: float | None = None
    gb_per_j: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None


@dataclass(frozen=True)
class Profile:
    """GPU: the device kernels' time per call (torch.profiler, in the row's cache mode),
    their names, and the library they come from."""

    kernel_ms: float | None = None
    kernels: str | None = None
    library: str | None = None


@dataclass(frozen=True)
class Fleet:
    """Fleet runs: the rank, host and GPU that measured the row; collectives' algorithm
    and bus bandwidth (nccl-tests' definitions)."""

    rank: int | None = None
    host: str | None = None
    gpu_uuid: str | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None


@dataclass(frozen=True)
class Comparison:
    """The run's baseline provider's median over this row's, same kernel, dtype, shape
    and cache mode (contract/speedup.py)."""

    speedup: float | None = None


GROUPS = ("check", "build", "timing", "metrics", "clocks", "energy", "profile", "fleet",
          "comparison")


@dataclass(frozen=True)
class RunRow:
    """One row of a run (see the module's docstring)."""

    case: CaseId
    accounting: Accounting = field(default_factory=Accounting)
    status: str = "skipped"  # ok (correct and timed), failed, skipped
    reason: str | None = None
    check: Check = field(default_factory=Check)
    build: Build = field(default_factory=Build)
    timing: Timing = field(default_factory=Timing)
    metrics: Metrics = field(default_factory=Metrics)
    clocks: Clocks = field(default_factory=Clocks)
    energy: Energy = field(default_factory=Energy)
    profile: Profile = field(default_factory=Profile)
    fleet: Fleet = field(default_factory=Fleet)
    comparison: Comparison = field(default_factory=Comparison)
    withheld: tuple[Withheld, ...] = ()

    @property
    def key(self) -> RowKey:
        return self.case.key

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def with_note(self, note: str) -> RunRow:
        """The row with `note` added to its reason ("; "-joined)."""
        if not note:
            return self
        return replace(self, reason="; ".join(x for x in (self.reason, note) if x))


# The flat columns each part of a row owns, in the part's own order.
_PARTS: dict[str, type] = {"case": CaseId, "accounting": Accounting, **{
    g: t for g, t in (("check", Check), ("build", Build), ("timing", Timing),
                      ("metrics", Metrics), ("clocks", Clocks), ("energy", Energy),
                      ("profile", Profile), ("fleet", Fleet), ("comparison", Comparison))}}
OUTCOME = ("status", "reason")
OWNER: dict[str, str] = {f.name: part for part, t in _PARTS.items() for f in fields(t)}
OWNER.update(dict.fromkeys(OUTCOME, "outcome"))
OWNER["withheld"] = "withheld"


def flat(row: RunRow, columns: list[str], samples: bool = True) -> dict[str, Any]:
    """The row as the files hold it: `columns` in order (contract/schema.py ALL_COLUMNS),
    then its raw samples, where it has any and `samples` (results.json, not the CSV)."""
    values: dict[str, Any] = {"status": row.status, "reason": row.reason,
                              "withheld": [w.to_json() for w in row.withheld] or None}
    for part in _PARTS:
        values.update(asdict(getattr(row, part)))
    values.pop(SAMPLES)
    out = {c: values.get(c) for c in columns}
    if samples and row.timing.samples_ms:
        out[SAMPLES] = list(row.timing.samples_ms)
    return out


def _clean(v: Any) -> Any:
    """A file's empty cell as None: JSON null, pandas' NaN, a CSV's empty text."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return None
    return v


def _bool(v: Any) -> bool:
    """A bool cell: Python's or numpy's bool, or a CSV's "True"/"true"."""
    return v.strip().lower() == "true" if isinstance(v, str) else bool(v)


def _converter(hint: Any) -> Any:
    """How a file's cell becomes a field's value, by the field's type: numpy's and a CSV's
    numbers and bools to Python's; None stays None."""
    args = set(typing.get_args(hint)) or {hint}
    for t, conv in ((bool, _bool), (int, lambda v: int(float(v))), (float, float),
                    (str, str)):
        if t in args:
            return conv
    return lambda v: v


@functools.cache
def _converters(t: type) -> dict[str, Any]:
    return {name: _converter(h) for name, h in typing.get_type_hints(t).items()}


def _part(t: type, d: Mapping[str, Any]) -> Any:
    conv = _converters(t)
    kw = {f.name: _clean(d.get(f.name)) for f in fields(t) if f.name in d}
    return t(**{k: conv[k](v) for k, v in kw.items() if v is not None})


def parse_row(d: Mapping[str, Any]) -> RunRow:
    """A row as the files hold it (results.json's object, a CSV record, a journal line),
    back as a record; a column a run lacks (written before it existed) keeps its default;
    the cache mode of a row written before that column is its device's native one."""
    case = CaseId(str(d["kernel"]), str(d["provider"]), str(d["dtype"]), str(d["shape"]),
                  row_cache(d), _clean(d.get("layer")))
    samples = d.get(SAMPLES)
    timing = _part(Timing, {k: v for k, v in d.items() if k != SAMPLES})
    if isinstance(samples, list | tuple):
        timing = replace(timing, samples_ms=tuple(float(x) for x in samples))
    parts = {g: _part(_PARTS[g], d) for g in GROUPS if g != "timing"}
    return RunRow(case=case, accounting=_part(Accounting, d),
                  status=str(d.get("status") or "skipped"),
                  reason=r if isinstance(r := d.get("reason"), str) else None,
                  timing=timing, withheld=tuple(withheld_of(d)), **parts)
