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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from contract.bounds import (
    CLOCK,
    ENERGY,
    ENERGY_TOLERANCE,
    GBPS,
    KERNEL_TIME,
    POWER,
    TFLOPS,
    TFLOPS_MARGIN,
    UNEQUAL_CLOCKS,
    RunBounds,
    Withheld,
    clocks_differ,
    clocks_text,
    number,
    positive,
    withheld_of,
)
from contract.devices import ROOF_CLASS
from contract.modes import DEFAULT_CACHE, WARM, native_cache_of, row_cache
from contract.run_meta import TypeHint

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

    def withheld(self, b: RunBounds, acc: Accounting, case: CaseId) -> Withheld | None:
        """A time-derived rate beyond its bound: TFLOP/s over the datasheet peak x 1.1,
        or GB/s over the bandwidth bound (RunBounds.bandwidth)."""
        tflops = number(self.tflops)
        rc = acc.roof_class
        if not rc:  # a row written before the column: its dtype's
            rc = ROOF_CLASS.get(case.dtype, case.dtype)
        peak = b.datasheet_tflops.get(rc)
        if tflops is not None and peak and tflops > peak * TFLOPS_MARGIN:
            return Withheld("tflops", tflops, peak * TFLOPS_MARGIN, TFLOPS,
                            f"{tflops:,.1f} TFLOP/s above the datasheet's {rc} peak "
                            f"{peak:,.1f} x {TFLOPS_MARGIN:g}")
        gbps = number(self.gbps)
        bound = b.bandwidth(acc.roof_class, acc.bytes, case.cache, acc.meas_peak_gbps)
        if gbps is not None and bound is not None and gbps > bound[0]:
            return Withheld("gbps", gbps, bound[0], GBPS,
                            f"{gbps:,.0f} GB/s (bytes / ms_median) above {bound[1]}")
        return None


@dataclass(frozen=True)
class Clocks:
    """GPU: the median SM clock of the row's own samples, whether it stayed throttled,
    and how many samples the per-sample throttle rule left out."""

    sm_clock_mhz: float | None = None
    throttled: bool | None = None
    throttled_samples: int | None = None

    def withheld(self, b: RunBounds) -> Withheld | None:
        """An SM clock no device runs at: at or below zero, or above its maximum."""
        v = number(self.sm_clock_mhz)
        if v is None:
            return None
        if v <= 0:
            return Withheld("sm_clock_mhz", v, 0.0, CLOCK, f"SM clock {v:g} MHz: not a clock")
        top = b.max_sm_clock_mhz
        if top is not None and v > top:
            return Withheld("sm_clock_mhz", v, top, CLOCK, f"SM clock {v:,.0f} MHz above "
                            f"the device's maximum {top:,.0f} MHz")
        return None


@dataclass(frozen=True)
class Energy:
    """Energy per call (J) from the mean power over the row's energy window (NVML's
    counter on a GPU, RAPL on a CPU) x its median time, what it buys, and the limit."""

    energy_j: float | None = None
    tflop_per_j: float | None = None
    gb_per_j: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None

    def withheld(self, b: RunBounds, ms_median: float | None) -> Withheld | None:
        """A mean power no card draws (at or below zero, above the enforced limit x the
        run's margin), else an energy per call that is not power x `ms_median`."""
        v = number(self.power_w)
        if v is not None and v <= 0:
            return Withheld("power_w", v, 0.0, POWER, f"mean power {v:g} W: a running GPU "
                            "or CPU draws more than nothing")
        limit = positive(self.power_limit_w) or b.power_limit_w
        if v is not None and limit is not None and v > limit * b.power_margin:
            return Withheld("power_w", v, limit * b.power_margin, POWER,
                            f"mean power {v:,.0f} W above the enforced limit {limit:,.0f} W "
                            f"{b.margin_text}: no card draws that (likely an energy "
                            "window shorter than NVML's counter updates)")
        e, ms = number(self.energy_j), number(ms_median)
        if e is None or v is None or ms is None or not ms > 0:
            return None
        want = v * ms / 1e3
        if abs(e - want) > ENERGY_TOLERANCE * abs(want):
            return Withheld("energy_j", e, want, ENERGY,
                            f"energy {e:.4g} J is not power x time ({v:.4g} W x {ms:.4g} ms "
                            f"= {want:.4g} J) within {ENERGY_TOLERANCE:.0%}")
        return None


@dataclass(frozen=True)
class Profile:
    """GPU: the device kernels' time per call (torch.profiler, in the row's cache mode),
    their names, and the library they come from."""

    kernel_ms: float | None = None
    kernels: str | None = None
    library: str | None = None

    def withheld(self, b: RunBounds, acc: Accounting, case: CaseId) -> Withheld | None:
        """A kernel-only time at or below zero, or faster than the row's bytes can move
        at the bandwidth bound (RunBounds.bandwidth)."""
        ms = number(self.kernel_ms)
        if ms is None:
            return None
        if ms <= 0:
            return Withheld("kernel_ms", ms, 0.0, KERNEL_TIME, f"kernel time {ms:g} ms: no "
                            "kernel takes no time")
        bound = b.bandwidth(acc.roof_class, acc.bytes, case.cache, acc.meas_peak_gbps)
        nbytes = positive(acc.bytes)
        if bound is None or nbytes is None:
            return None
        least = nbytes / bound[0] / 1e6  # ms at the bound
        if ms >= least:
            return None
        mode = ("profiled back to back on the same buffers (warm), not this cold row's "
                "time" if case.cache != WARM else "faster than the cache")
        return Withheld("kernel_ms", ms, least, KERNEL_TIME,
                        f"kernel-only {ms:.4g} ms implies {nbytes / ms / 1e6:,.0f} GB/s, "
                        f"above {bound[1]}: {mode}")


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

    def withheld(self, clock_mhz: float | None, base: RunRow) -> Withheld | None:
        """A speedup against a baseline row (`base`, timed at `base`'s clock against
        this row's `clock_mhz`) whose time is withheld, or timed at another SM clock
        (more than CLOCK_SPREAD apart)."""
        s = number(self.speedup)
        if s is None:
            return None
        rates = next((w for w in base.withheld if w.kind in (TFLOPS, GBPS)
                      and w.derived_from is None), None)
        if rates is not None:
            return Withheld("speedup", s, None, rates.kind, "against a baseline row whose "
                            f"time is withheld: {rates.reason}", "baseline's " + rates.column)
        base_mhz = base.clocks.sm_clock_mhz
        if clocks_differ(clock_mhz, base_mhz):
            return Withheld("speedup", s, None, UNEQUAL_CLOCKS,
                            f"unequal clocks ({clocks_text(clock_mhz, base_mhz)})")
        return None


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

    @property
    def mode_tag(self) -> str:
        """"" for a row timed in its device's native cache mode, else its mode ("warm" on
        a GPU, "cold" on a CPU): schema.mode_tag of the record."""
        native = native_cache_of(self.accounting.device, self.timing.timer)
        return "" if self.case.cache == native else self.case.cache

    def label(self, sep: str = "/") -> str:
        """kernel/provider/dtype/shape, then its mode tag: schema.row_name of the record."""
        c = self.case
        tag = self.mode_tag
        return sep.join([c.kernel, c.provider, c.dtype, c.shape, *([tag] if tag else [])])

    def value(self, column: str) -> Any:
        """A column's value, from the group that owns it (OWNER)."""
        part = OWNER[column]
        if part == "outcome":
            return getattr(self, column)
        return getattr(getattr(self, part), column)

    def emptied(self, column: str) -> RunRow:
        """The row with one group column set empty (the physics check's withholding)."""
        part = OWNER[column]
        return replace(self, **{part: replace(getattr(self, part), **{column: None})})

    def findings(self, b: RunBounds) -> list[Withheld]:
        """The values of the row that break their own bound, each checked by the group
        that owns it, in this order: the clock, the power (or else the energy), the
        rates, the kernel-only time (contract/physics.py withholds them and what they
        take with them, and checks the speedup)."""
        found = (self.clocks.withheld(b),
                 self.energy.withheld(b, self.timing.ms_median),
                 self.metrics.withheld(b, self.accounting, self.case),
                 self.profile.withheld(b, self.accounting, self.case))
        return [w for w in found if w is not None]

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

# The order of the columns in the files as it has been (results.csv's header): the
# contract's required columns, through `reason`, then the ones the suite added over
# time.  A field added to a group is a new column, written after these.
_FILE_ORDER = (
    "kernel", "provider", "dtype", "shape", "flops", "bytes", "intensity", "ms_median",
    "ms_p20", "ms_p80", "n_samples", "tflops", "gbps", "peak_tflops", "peak_gbps",
    "roof_tflops", "mfu", "pct_roof", "correct", "rel_err", "status", "reason",
    "device", "gpu_name", "meas_peak_tflops", "meas_peak_gbps", "meas_roof_tflops",
    "pct_meas_roof", "roof_class", "tolerance", "timer", "cache", "above_roof",
    "sm_clock_mhz", "throttled", "host_us", "kernel_ms", "kernels", "energy_j",
    "tflop_per_j", "gb_per_j", "power_w", "power_limit_w", "throttled_samples",
    "config", "config_source", "layer", "compile_s", "library", "speedup", "algbw_gbps",
    "busbw_gbps", "rank", "host", "gpu_uuid", "cut_short", "withheld")
# Every column a row has on disk, in order (contract/schema.py ALL_COLUMNS); the raw
# samples (SAMPLES, results.json only) apart.
COLUMNS: tuple[str, ...] = (*_FILE_ORDER, *(c for c in OWNER
                                            if c not in _FILE_ORDER and c != SAMPLES))


@functools.cache
def column_types() -> dict[str, TypeHint]:
    """Each column's type as its record's field declares it (contract/schema.py's Row
    gives the files' form of them)."""
    hints = {c: typing.get_type_hints(t)[c] for part, t in _PARTS.items()
             for c in (f.name for f in fields(t))}
    hints.update(typing.get_type_hints(RunRow, include_extras=False))
    return {c: hints[c] for c in (*COLUMNS, SAMPLES)}


# The row as one flat JSON object of the files (contract/schema.py's Row types its columns).
def flat(row: RunRow, columns: list[str], samples: bool = True) -> dict[str, Any]:
    """The row as the files hold it: `columns` in order (contract/schema.py ALL_COLUMNS),
    then its raw samples, where it has any and `samples` (results.json, not the CSV)."""
    out = {c: _cell(row, c) for c in columns}
    if samples and row.timing.samples_ms:
        out[SAMPLES] = list(row.timing.samples_ms)
    return out


def _cell(row: RunRow, column: str) -> Any:
    """A column's value as the files hold it (the withheld records as JSON objects, None
    where there are none); None for a column no group owns, and for the raw samples
    (flat writes them last)."""
    if column == "withheld":
        return [w.to_json() for w in row.withheld] or None
    if column == SAMPLES or column not in OWNER:
        return None
    return row.value(column)


def _clean(v: Any) -> Any:
    """A file's empty cell as None: JSON null, pandas' NaN, a CSV's empty text."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v == "":
        return None
    return v


def _bool(v: Any) -> bool:
    """A bool cell: Python's or numpy's bool, or a CSV's "True"/"true"."""
    return v.strip().lower() == "true" if isinstance(v, str) else bool(v)


def _converter(hint: TypeHint) -> Callable[[Any], Any]:
    """How a file's cell becomes a field's value, by the field's type: numpy's and a CSV's
    numbers and bools to Python's; None stays None."""
    args = set(typing.get_args(hint)) or {hint}
    for t, conv in ((bool, _bool), (int, lambda v: int(float(v))), (float, float),
                    (str, str)):
        if t in args:
            return conv
    return lambda v: v


@functools.cache
def _converters(t: type) -> dict[str, Callable[[Any], Any]]:
    return {name: _converter(h) for name, h in typing.get_type_hints(t).items()}


def _part(t: type, d: Mapping[str, Any], lenient: bool = False) -> Any:
    conv = _converters(t)
    kw = {f.name: _clean(d.get(f.name)) for f in fields(t) if f.name in d}
    out = {}
    for k, v in kw.items():
        if v is None:
            continue
        try:
            out[k] = conv[k](v)
        except (TypeError, ValueError):
            if not lenient:
                raise
    return t(**out)


def parse_row(d: Mapping[str, Any], lenient: bool = False) -> RunRow:
    """A row as the files hold it (results.json's object, a CSV record, a journal line),
    back as a record; a column a run lacks (written before it existed) keeps its default;
    the cache mode of a row written before that column is its device's native one.
    `lenient`: a cell that is not of its column's type (a hand-edited "tflops": "abc")
    is read as empty instead of refused (the physics check of rows as they are)."""
    case = CaseId(str(d.get("kernel")), str(d.get("provider")), str(d.get("dtype")),
                  str(d.get("shape")), row_cache(d), _clean(d.get("layer"))) if lenient \
        else CaseId(str(d["kernel"]), str(d["provider"]), str(d["dtype"]), str(d["shape"]),
                    row_cache(d), _clean(d.get("layer")))
    samples = d.get(SAMPLES)
    timing = _part(Timing, {k: v for k, v in d.items() if k != SAMPLES}, lenient)
    if isinstance(samples, list | tuple):
        try:
            timing = replace(timing, samples_ms=tuple(float(x) for x in samples))
        except (TypeError, ValueError):
            if not lenient:
                raise
    parts = {g: _part(_PARTS[g], d, lenient) for g in GROUPS if g != "timing"}
    return RunRow(case=case, accounting=_part(Accounting, d, lenient),
                  status=str(d.get("status") or "skipped"),
                  reason=r if isinstance(r := d.get("reason"), str) else None,
                  timing=timing, withheld=tuple(withheld_of(d)), **parts)
