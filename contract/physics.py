"""The physics check: every number a row carries against the bound physics puts on it,
and what must be withheld, each value with its reason.

A value outside its bound is no measurement of the device (a power reading above what
the card can draw, a kernel faster than the memory can feed it) or no measurement of the
code (two providers timed at different SM clocks).  It is withheld: set empty, with the
values computed from it, and recorded on its row in the column WITHHELD (a list of
Withheld records: column, value, bound, kind, reason), so nothing measured is lost and
no reader shows it.  The sweep's writer applies it before a row is written
(benches/sweep/results.py) and schema.load_run when a saved run is read, so an old run's
impossible numbers are withheld wherever they are shown.  Applying it twice changes
nothing.  The bounds, their margins and why: docs/measurement.md, "The physics check".

Pure: no I/O; rows are dicts (a run's JSON rows) or pandas records (NaN for empty).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from contract.devices import DEVICES, ROOF_CLASS
from contract.modes import WARM, row_cache
from contract.rows import run_ceilings
from contract.speedup import baseline_of, case_of

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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

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

    @classmethod
    def of(cls, meta: Mapping[str, Any]) -> RunBounds:
        meta = meta if isinstance(meta, Mapping) else {}

        def sub(key: str) -> Mapping[str, Any]:
            v = meta.get(key)
            return v if isinstance(v, Mapping) else {}

        kind = meta.get("device_kind")
        if kind is None:  # a run written before device_kind: its device model's kind
            model = DEVICES.get(str(meta.get("device_key") or ""))
            kind = model.kind if model is not None else None
        measured = sub("ceilings").get("measured")
        measured = measured if isinstance(measured, Mapping) else {}
        copy = positive(measured.get("hbm_gbps"))
        cache = positive(measured.get("l2_gbps"))
        # A datasheet bounds the device it was written for: a run held against another
        # model's peaks (--device h100 on another GPU) has no datasheet of its own.
        present, model_key = meta.get("detected_key"), meta.get("device_key")
        sheet = run_ceilings(dict(meta)).get("datasheet")
        own = sheet is not None and (not present or not model_key or present == model_key)
        return cls(
            gpu=kind == "cuda",
            power_limit_w=positive(sub("power").get("limit_w"))
            or positive(sub("nvml_start").get("power_limit_w")),
            max_sm_clock_mhz=positive(sub("nvml_start").get("max_sm_clock_mhz"))
            or positive(sub("clocks").get("sm_mhz_max_possible")),
            copy_gbps=copy,
            cache_gbps=max(cache, copy or 0.0) if cache else None,
            datasheet_tflops=dict(sheet.tflops) if own and sheet is not None else {},
            baseline=baseline_of(meta),
            power_margin=POWER_MARGIN if positive(sub("energy").get("precision")) else 1.0)


def _record(column: str, value: float, bound: float | None, kind: str,
            reason: str) -> Withheld:
    return Withheld(column, value, bound, kind, reason)


def _clock(row: Mapping[str, Any], b: RunBounds) -> Withheld | None:
    v = number(row.get("sm_clock_mhz"))
    if v is None:
        return None
    if v <= 0:
        return _record("sm_clock_mhz", v, 0.0, CLOCK, f"SM clock {v:g} MHz: not a clock")
    top = b.max_sm_clock_mhz
    if top is not None and v > top:
        return _record("sm_clock_mhz", v, top, CLOCK, f"SM clock {v:,.0f} MHz above the "
                       f"device's maximum {top:,.0f} MHz")
    return None


def _power(row: Mapping[str, Any], b: RunBounds) -> Withheld | None:
    v = number(row.get("power_w"))
    if v is None:
        return None
    if v <= 0:
        return _record("power_w", v, 0.0, POWER, f"mean power {v:g} W: a running GPU or "
                       "CPU draws more than nothing")
    limit = positive(row.get("power_limit_w")) or b.power_limit_w
    if limit is not None and v > limit * b.power_margin:
        return _record("power_w", v, limit * b.power_margin, POWER,
                       f"mean power {v:,.0f} W above the enforced limit {limit:,.0f} W "
                       f"{b.margin_text}: no card draws that (likely an energy "
                       "window shorter than NVML's counter updates)")
    return None


def _energy(row: Mapping[str, Any], b: RunBounds) -> Withheld | None:
    e, p, ms = (number(row.get(c)) for c in ("energy_j", "power_w", "ms_median"))
    if e is None or p is None or ms is None or not ms > 0:
        return None
    want = p * ms / 1e3
    if abs(e - want) > ENERGY_TOLERANCE * abs(want):
        return _record("energy_j", e, want, ENERGY,
                       f"energy {e:.4g} J is not power x time ({p:.4g} W x {ms:.4g} ms = "
                       f"{want:.4g} J) within {ENERGY_TOLERANCE:.0%}")
    return None


def _is_traffic(row: Mapping[str, Any]) -> bool:
    """A row whose bytes are memory traffic: not a collective (its bytes are an array
    moved over links, roof class `link`; at one rank nothing moves at all)."""
    return row.get("roof_class") != "link" and (positive(row.get("bytes")) or 0) > 0


def _bandwidth_bound(row: Mapping[str, Any], b: RunBounds) -> tuple[float, str] | None:
    """(bound GB/s, what it is) for a GPU row's traffic: a cold row's the measured copy
    x 1.1, a warm row's the measured L2 copy x 1.1; None where not measured or a CPU."""
    if not b.gpu or not _is_traffic(row):
        return None
    if row_cache(row) == WARM:
        return (b.cache_gbps * BANDWIDTH_MARGIN, f"the measured L2 copy {b.cache_gbps:,.0f} "
                f"GB/s x {BANDWIDTH_MARGIN:g}") if b.cache_gbps else None
    copy = b.copy_gbps or positive(row.get("meas_peak_gbps"))
    return (copy * BANDWIDTH_MARGIN, f"the measured copy {copy:,.0f} GB/s x "
            f"{BANDWIDTH_MARGIN:g}") if copy else None


def _rates(row: Mapping[str, Any], b: RunBounds) -> Withheld | None:
    """A time-derived rate beyond its bound: TFLOP/s over the datasheet peak x 1.1, or
    GB/s over the bandwidth bound."""
    tflops = number(row.get("tflops"))
    rc = row.get("roof_class")
    if not isinstance(rc, str) or not rc:  # a row written before the column: its dtype's
        rc = ROOF_CLASS.get(str(row.get("dtype")), str(row.get("dtype")))
    peak = b.datasheet_tflops.get(rc)
    if tflops is not None and peak and tflops > peak * TFLOPS_MARGIN:
        return _record("tflops", tflops, peak * TFLOPS_MARGIN, TFLOPS,
                       f"{tflops:,.1f} TFLOP/s above the datasheet's {rc} peak "
                       f"{peak:,.1f} x {TFLOPS_MARGIN:g}")
    gbps, bound = number(row.get("gbps")), _bandwidth_bound(row, b)
    if gbps is not None and bound is not None and gbps > bound[0]:
        return _record("gbps", gbps, bound[0], GBPS,
                       f"{gbps:,.0f} GB/s (bytes / ms_median) above {bound[1]}")
    return None


def _kernel_time(row: Mapping[str, Any], b: RunBounds) -> Withheld | None:
    ms = number(row.get("kernel_ms"))
    if ms is None:
        return None
    if ms <= 0:
        return _record("kernel_ms", ms, 0.0, KERNEL_TIME, f"kernel time {ms:g} ms: no "
                       "kernel takes no time")
    bound, nbytes = _bandwidth_bound(row, b), positive(row.get("bytes"))
    if bound is None or nbytes is None:
        return None
    least = nbytes / bound[0] / 1e6  # ms at the bound
    if ms < least:
        mode = ("profiled back to back on the same buffers (warm), not this cold row's "
                "time" if row_cache(row) != WARM else "faster than the cache")
        return _record("kernel_ms", ms, least, KERNEL_TIME,
                       f"kernel-only {ms:.4g} ms implies {nbytes / ms / 1e6:,.0f} GB/s, "
                       f"above {bound[1]}: {mode}")
    return None


_CHECKS = (_clock, _power, _energy, _rates, _kernel_time)


def row_findings(row: Mapping[str, Any], bounds: RunBounds) -> list[Withheld]:
    """The values of one row that break their own bound (not the derived ones, not the
    speedup: apply does those).  A withheld power skips the energy check: its energy is
    withheld with it."""
    out: list[Withheld] = []
    for check in _CHECKS:
        if check is _energy and any(w.column == "power_w" for w in out):
            continue
        found = check(row, bounds)
        if found is not None:
            out.append(found)
    return out


def _withhold(row: MutableMapping[str, Any], found: Withheld,
              records: list[Withheld]) -> int:
    """Empty the found value on the row and record it (once per column); 1 if it was
    recorded now."""
    row[found.column] = None
    if any(w.column == found.column for w in records):
        return 0
    records.append(found)
    return 1


def _derived(row: MutableMapping[str, Any], records: list[Withheld]) -> int:
    """Withhold what the row's withheld values take with them (DERIVED)."""
    n = 0
    for w in list(records):
        if w.derived_from is not None:
            continue
        for col in DERIVED.get(w.column, ()):
            v = number(row.get(col))
            if v is None:
                continue
            n += _withhold(row, Withheld(col, v, None, w.kind, f"computed from {w.column}, "
                                         "which is withheld", w.column), records)
    return n


def _speedup(row: MutableMapping[str, Any], base: Mapping[str, Any] | None,
             records: list[Withheld]) -> int:
    """A speedup against a baseline row whose time is withheld, or timed at another SM
    clock (more than CLOCK_SPREAD apart)."""
    s = number(row.get("speedup"))
    if s is None or base is None or base is row:
        return 0
    rates = next((w for w in withheld_of(base) if w.kind in (TFLOPS, GBPS)
                  and w.derived_from is None), None)
    if rates is not None:
        return _withhold(row, Withheld("speedup", s, None, rates.kind, "against a baseline "
                                       f"row whose time is withheld: {rates.reason}",
                                       "baseline's " + rates.column), records)
    mhz, base_mhz = row.get("sm_clock_mhz"), base.get("sm_clock_mhz")
    if clocks_differ(mhz, base_mhz):
        return _withhold(row, Withheld("speedup", s, None, UNEQUAL_CLOCKS,
                                       f"unequal clocks ({clocks_text(mhz, base_mhz)})"),
                         records)
    return 0


def _baselines(rows: Iterable[Mapping[str, Any]], baseline: str) -> dict[tuple, Mapping]:
    """Each case's baseline row, as set_speedups picks it (ok and timed; the last)."""
    return {case_of(r): r for r in rows if r.get("provider") == baseline
            and r.get("status") == "ok" and (positive(r.get("ms_median")) is not None)}


def _store(row: MutableMapping[str, Any], records: list[Withheld]) -> None:
    if records:
        row[WITHHELD] = [w.to_json() for w in records]


def apply_row(row: MutableMapping[str, Any], meta: Mapping[str, Any],
              others: Sequence[Mapping[str, Any]] = (),
              bounds: RunBounds | None = None) -> int:
    """Check one row in place (its speedup against its baseline row among `others`, the
    rows written before it); returns how many values it withheld now."""
    b = bounds or RunBounds.of(meta)
    records = withheld_of(row)
    n = sum(_withhold(row, f, records) for f in row_findings(row, b))
    n += _derived(row, records)
    if number(row.get("speedup")) is not None and row.get("provider") != b.baseline:
        # The latest baseline row of its case, as set_speedups takes it; searched from
        # the end, where a sweep has just written it, so a row costs little however
        # many came before.
        case = case_of(row)
        base = next((r for r in reversed(others) if r.get("provider") == b.baseline
                     and r.get("status") == "ok" and positive(r.get("ms_median"))
                     and case_of(r) == case), None)
        n += _speedup(row, base, records)
    _store(row, records)
    return n


def apply(rows: Sequence[MutableMapping[str, Any]], meta: Mapping[str, Any]) -> int:
    """Check every row of a run in place: each failing value emptied and recorded with
    the values derived from it, then each speedup against its baseline row; returns how
    many values were withheld now (0 for rows checked before: idempotent)."""
    b = RunBounds.of(meta)
    n = 0
    for row in rows:
        records = withheld_of(row)
        n += sum(_withhold(row, f, records) for f in row_findings(row, b))
        n += _derived(row, records)
        _store(row, records)
    base = _baselines(rows, b.baseline)
    for row in rows:
        records = withheld_of(row)
        n += _speedup(row, base.get(case_of(row)), records)
        _store(row, records)
    return n


def check(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[list[Withheld]]:
    """What each row must have withheld (its records, those it carried included), the
    rows left as they are."""
    copies = [dict(r) for r in rows]
    apply(copies, meta)
    return [withheld_of(r) for r in copies]


def counts(records: Iterable[Withheld]) -> dict[str, int]:
    """Values withheld by kind, every kind of KINDS (then any other) named."""
    out = dict.fromkeys(KINDS, 0)
    for w in records:
        out[w.kind] = out.get(w.kind, 0) + 1
    return out
