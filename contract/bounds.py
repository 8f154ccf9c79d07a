"""The bounds physics puts on a row's numbers and the record of a value withheld for
breaking one (contract/physics.py applies them; docs/measurement.md, "The physics check",
says why each bound is what it is): the kinds of bound and their margins, what a column
takes with it when it goes, a run's bounds from its metadata, and how the readers show a
withheld value or a ratio of two rows' times.  Pure: no I/O."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from contract.devices import DEVICES
from contract.modes import WARM
from contract.rows import run_ceilings
from contract.run_meta import RunMeta

WITHHELD = "withheld"  # the row column holding a row's records (contract/schema.py Row)

# The kinds of bound, in the order the check's count line names them.
POWER, ENERGY, KERNEL_TIME, CLOCK = "power", "energy", "kernel_time", "clock"
UNEQUAL_CLOCKS, TFLOPS, GBPS = "unequal_clocks", "tflops", "gbps"
KINDS = (POWER, ENERGY, KERNEL_TIME, CLOCK, UNEQUAL_CLOCKS, TFLOPS, GBPS)

# Margins (docs/measurement.md, "The physics check", says why each is what it is).
# Of the enforced power limit, for a power measured with a stated precision (the energy
# meter's, metadata.energy.precision: 5%); a power without one (runs before the meter:
# a timing window's counter rise) is held to the limit itself.
POWER_MARGIN = 1.05
BANDWIDTH_MARGIN = 1.10  # of the measured copy (or L2 copy): a read-heavy kernel's edge
TFLOPS_MARGIN = 1.10  # of the datasheet peak: quoted at a boost clock below the maximum
CLOCK_SPREAD = 0.02  # two rows' SM clocks further apart than this: unequal clocks
ENERGY_TOLERANCE = 0.01  # energy_j against power_w x ms_median

# Each kind's bound in words, as the readers print it.
BOUNDS = {
    POWER: (f"mean power above 0 and at most the enforced power limit x {POWER_MARGIN:g} "
            "where the run states its power's precision, else the limit itself"),
    ENERGY: f"energy per call = mean power x median time, within {ENERGY_TOLERANCE:.0%}",
    KERNEL_TIME: f"the kernel-only time's GB/s within the measured copy x "
                 f"{BANDWIDTH_MARGIN:g} (a warm row's: the L2 copy)",
    CLOCK: "SM clock within (0, the device's maximum]",
    UNEQUAL_CLOCKS: f"a speedup's two rows timed at SM clocks within {CLOCK_SPREAD:.0%} of "
                    "each other",
    TFLOPS: f"TFLOP/s within the datasheet peak x {TFLOPS_MARGIN:g}",
    GBPS: f"GB/s within the measured copy x {BANDWIDTH_MARGIN:g} (a warm row's: the L2 "
          "copy)",
}

# The columns computed from a column, withheld with it.  A time-derived rate (TFLOP/s or
# GB/s) beyond its bound means the time is not the kernel's: every rate of that time
# goes (ms_median itself, the measurement, stays, with its samples).
_RATES = ("tflops", "gbps", "mfu", "pct_roof", "pct_meas_roof", "tflop_per_j", "gb_per_j",
          "speedup")
DERIVED: dict[str, tuple[str, ...]] = {
    "power_w": ("energy_j", "tflop_per_j", "gb_per_j"),
    "energy_j": ("tflop_per_j", "gb_per_j"),
    "tflops": tuple(c for c in _RATES if c != "tflops"),
    "gbps": tuple(c for c in _RATES if c != "gbps"),
}
UNITS = {"power_w": "W", "energy_j": "J", "sm_clock_mhz": "MHz", "kernel_ms": "ms",
         "tflops": "TFLOP/s", "gbps": "GB/s", "speedup": "x", "tflop_per_j": "TFLOP/J",
         "gb_per_j": "GB/J", "mfu": "", "pct_roof": "%", "pct_meas_roof": "%"}


class WithheldJson(TypedDict):
    """A Withheld as a row stores it (its `withheld` list)."""

    column: str
    value: float
    bound: float | None
    kind: str
    reason: str
    derived_from: str | None


@dataclass(frozen=True)
class Withheld:
    """One withheld value of a row: its column, the value it had, the bound it broke (in
    the column's unit: an upper bound, or for kernel_time the least time; None for
    unequal clocks and for a value derived from another withheld one), the kind of bound
    (KINDS), and why in words; `derived_from` names the column whose withholding took
    this one with it (None: it broke its own bound)."""

    column: str
    value: float
    bound: float | None
    kind: str
    reason: str
    derived_from: str | None = None

    def to_json(self) -> WithheldJson:
        return WithheldJson(**asdict(self))

    @classmethod
    def from_json(cls, doc: Any) -> Withheld | None:
        """A record as a row stores it; None for anything that is not one."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("column"), str):
            return None
        value, bound = number(doc.get("value")), number(doc.get("bound"))
        derived = doc.get("derived_from")
        return cls(doc["column"], math.nan if value is None else value, bound,
                   str(doc.get("kind") or ""), str(doc.get("reason") or ""),
                   derived if isinstance(derived, str) else None)

    def bound_text(self) -> str:
        """The bound as a line of the check prints it: '<= 735 W', '>= 0.00263 ms'."""
        if self.derived_from:
            return f"derived from {self.derived_from}"
        if self.kind == UNEQUAL_CLOCKS:
            return f"clocks within {CLOCK_SPREAD:.0%}"
        if self.bound is None:
            return "-"
        op = {KERNEL_TIME: ">=", ENERGY: "="}.get(self.kind, "<=")
        return f"{op} {value_text(self.bound, self.column)}"


def number(v: Any) -> float | None:
    """v as a finite float (ints count, bools and text do not), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def value_text(v: float | None, column: str) -> str:
    """A value with its column's unit: '4365 W', '0.00237 ms', '0.863x'."""
    if v is None or not math.isfinite(v):
        return "-"
    unit = UNITS.get(column, "")
    text = f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return f"{text}x" if unit == "x" else f"{text} {unit}".strip()


def clocks_text(mhz: Any, base_mhz: Any) -> str | None:
    """'1,545 vs 1,770 MHz' (a row's SM clock, then its baseline's), None unless both
    are known."""
    a, b = positive(mhz), positive(base_mhz)
    return None if a is None or b is None else f"{a:,.0f} vs {b:,.0f} MHz"


def clocks_differ(mhz: Any, base_mhz: Any) -> bool:
    """Whether two rows' SM clocks (both known) are more than CLOCK_SPREAD apart: a time
    ratio of the two then measures the clocks as much as the code."""
    a, b = positive(mhz), positive(base_mhz)
    return a is not None and b is not None and max(a, b) / min(a, b) - 1 > CLOCK_SPREAD


def ratio_text(ratio: Any, mhz: Any = None, base_mhz: Any = None, digits: int = 2) -> str:
    """A provider ratio as the readers show it, with both rows' SM clocks where known:
    '0.99x (1,980 vs 1,965 MHz)'; clocks more than CLOCK_SPREAD apart make it no code
    ratio: 'unequal clocks: 0.86x (1,545 vs 1,770 MHz)'; '-' for none."""
    r = number(ratio)
    if r is None:
        return "-"
    text = f"{r:.{digits}f}x"
    clocks = clocks_text(mhz, base_mhz)
    if clocks is None:
        return text
    text += f" ({clocks})"
    return f"unequal clocks: {text}" if clocks_differ(mhz, base_mhz) else text


def positive(v: Any) -> float | None:
    f = number(v)
    return f if f is not None and f > 0 else None


def withheld_of(row: Mapping[str, Any]) -> list[Withheld]:
    """A row's records: its WITHHELD cell as a list (results.json), as JSON text (the
    CSV), or empty (None, NaN, absent: a row checked clean, or one written before)."""
    cell = row.get(WITHHELD)
    if isinstance(cell, str):
        try:
            cell = json.loads(cell)
        except json.JSONDecodeError:
            return []
    if not isinstance(cell, list):
        return []
    return [w for w in (Withheld.from_json(d) for d in cell) if w is not None]


def withheld_text(cell: Any) -> str | None:
    """A WITHHELD cell as the CSV stores it: JSON text, None when there is none."""
    if isinstance(cell, str):
        return cell or None
    return json.dumps(cell, separators=(",", ":")) if isinstance(cell, list) and cell \
        else None


def withheld_value(row: Mapping[str, Any], column: str) -> Withheld | None:
    """The record of `column` on a row, if that value was withheld."""
    return next((w for w in withheld_of(row) if w.column == column), None)


@dataclass(frozen=True)
class RunBounds:
    """A run's physical bounds, from its metadata (and rows where it says nothing)."""

    gpu: bool
    power_limit_w: float | None = None  # the enforced limit (a row's own is preferred)
    max_sm_clock_mhz: float | None = None
    copy_gbps: float | None = None  # the measured large copy (a row's own is preferred)
    cache_gbps: float | None = None  # the measured L2 copy, never below the DRAM copy
    datasheet_tflops: dict[str, float] = field(default_factory=dict)
    baseline: str = "torch"
    power_margin: float = 1.0  # of the limit: 1 + the run's stated power precision

    @property
    def margin_text(self) -> str:
        return f"x {self.power_margin:g}" if self.power_margin != 1.0 else "itself"

    def bandwidth(self, roof_class: Any, nbytes: Any, cache: str,
                  meas_peak_gbps: Any = None) -> tuple[float, str] | None:
        """(bound GB/s, what it is) for a GPU row's traffic: a cold row's the measured
        copy x 1.1 (the run's, else the row's own `meas_peak_gbps`), a warm row's the
        measured L2 copy x 1.1; None where not measured, on a CPU, or for a row whose
        bytes are no memory traffic (a collective's are an array moved over links, roof
        class `link`; at one rank nothing moves at all)."""
        if not self.gpu or roof_class == "link" or not (positive(nbytes) or 0) > 0:
            return None
        if cache == WARM:
            return (self.cache_gbps * BANDWIDTH_MARGIN, f"the measured L2 copy "
                    f"{self.cache_gbps:,.0f} GB/s x {BANDWIDTH_MARGIN:g}") \
                if self.cache_gbps else None
        copy = self.copy_gbps or positive(meas_peak_gbps)
        return (copy * BANDWIDTH_MARGIN, f"the measured copy {copy:,.0f} GB/s x "
                f"{BANDWIDTH_MARGIN:g}") if copy else None

    @classmethod
    def of(cls, meta: RunMeta) -> RunBounds:
        dev, tel = meta.device, meta.telemetry
        kind = dev.device_kind
        if kind is None:  # a run written before device_kind: its device model's kind
            model = DEVICES.get(str(dev.device_key or ""))
            kind = model.kind if model is not None else None
        measured = _sub(meta.ceilings.get("measured"))
        copy = positive(measured.get("hbm_gbps"))
        cache = positive(measured.get("l2_gbps"))
        # A datasheet bounds the device it was written for: a run held against another
        # model's peaks (--device h100 on another GPU) has no datasheet of its own.
        present, model_key = dev.detected_key, dev.device_key
        sheet = run_ceilings(meta).get("datasheet")
        own = sheet is not None and (not present or not model_key or present == model_key)
        start = _sub(tel.nvml_start)
        return cls(
            gpu=kind == "cuda",
            power_limit_w=positive(_sub(tel.power).get("limit_w"))
            or positive(start.get("power_limit_w")),
            max_sm_clock_mhz=positive(start.get("max_sm_clock_mhz"))
            or positive(_sub(tel.clocks).get("sm_mhz_max_possible")),
            copy_gbps=copy,
            cache_gbps=max(cache, copy or 0.0) if cache else None,
            datasheet_tflops=dict(sheet.tflops) if own and sheet is not None else {},
            baseline=meta.baseline_provider,
            power_margin=POWER_MARGIN if positive(_sub(tel.energy).get("precision"))
            else 1.0)


def _sub(v: Any) -> Mapping[str, Any]:
    """A metadata sub-document, {} where a run holds none (or something else)."""
    return v if isinstance(v, Mapping) else {}


def counts(records: Iterable[Withheld]) -> dict[str, int]:
    """Values withheld by kind, every kind of KINDS (then any other) named."""
    out = dict.fromkeys(KINDS, 0)
    for w in records:
        out[w.kind] = out.get(w.kind, 0) + 1
    return out
