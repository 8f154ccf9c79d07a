"""The run request: what `run_bench.py` was asked to do, typed, frozen and nested by
concern, built once from the command line (run_bench.py `request_of`) and read by every
job below it (the sweep, the estimate, inspect, fleet runs and acceptance).

| group | holds |
| --- | --- |
| `selection` | kernels, dtypes, providers, sizes (and shapes), cache modes, seed, |
| | check-only, the speedups' baseline provider |
| `device` | the device model asked for, the fp8 accumulation mode |
| `measurement` | the throttle rule (threshold, recovery delay), the energy windows |
| `budgets` | the row's and the sweep's timing budgets |
| `ceilings` | measure them, again or not at all; a fleet rank's own cache |
| `output` | the results root, run id, the run resumed, figures, the history store |
| `gate` | --compare's baseline, threshold and tolerated failures |
| `fleet` | a torchrun fleet's tolerance, liveness timeout, collectives, acceptance |
| `triton` | --inspect's target, --retune |

A resume keeps the run's own selection, device and measurement; the other groups are
its command line's (RESUME_FROM_COMMAND_LINE).

A run's results.json keeps it once (`metadata["request"]`, `to_json`: one JSON object per
group), and `--resume RUN` rebuilds it from there (`resumed_request`); a request stored
flat by an earlier version reads back the same (`from_json`), and a run written before
any request was stored is rebuilt from its old metadata keys (contract/run_meta.py, then
`request_from_old_metadata`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict

from contract.devices import DEVICES
from contract.models import MODEL_SIZES, ModelConfigError, parse_model_sizes
from contract.run_meta import RunMeta
from contract.schema import CACHE_MODES, DEFAULT_CACHE, parse_shape
from kernels.spec import Shape


class RequestError(ValueError):
    """A request that cannot be run (one-line message; exit 2 before anything runs)."""


@dataclass(frozen=True)
class AcceptanceOptions:
    """--acceptance's settings (benches/fleet/acceptance.py fills in the defaults)."""

    minutes: float
    median_warn_pct: float
    median_critical_pct: float
    busbw_warn_pct: float
    busbw_critical_pct: float
    expected_busbw: float | None = None


@dataclass(frozen=True)
class Selection:
    """Which cases: validated against the registries and "all" expanded (`validated`);
    `sizes` is a preset name, a model (`model:NAME[:tokens=N]`, contract/models.py) or
    "explicit" (then `shapes` holds them); `cache` None means the device's default
    (cold on a GPU, warm on a CPU); each row's speedup is `baseline_provider`'s time over
    its own."""

    kernels: tuple[str, ...] = ("all",)
    dtypes: tuple[str, ...] = ("all",)
    providers: tuple[str, ...] = ("default",)
    sizes: str = "default"
    shapes: tuple[Shape, ...] | None = None
    cache: tuple[str, ...] | None = None
    seed: int = 0
    check_only: bool = False
    baseline_provider: str = "torch"


@dataclass(frozen=True)
class DeviceChoice:
    """The device model the rows are held against (resolved by
    contract.devices.resolve_device) and the fp8 accumulation mode (None: kernels.spec's
    default)."""

    key: str = "auto"
    fp8_accum: str | None = None


@dataclass(frozen=True)
class Measurement:
    """The throttle rule (benches/sweep/throttle.py) and which GPU rows get an energy
    window (ENERGY_ROWS)."""

    throttle_threshold: float = 75.0
    throttle_recovery_delay: float = 0.05
    energy: str = "largest"


@dataclass(frozen=True)
class Budgets:
    """Seconds a row's timing (`row`) and the sweep's (`run`; inf: none) may take; None:
    the defaults (benches/sweep/budget.py)."""

    row: float | None = None
    run: float | None = None


@dataclass(frozen=True)
class CeilingsChoice:
    """Whether the device's ceilings are measured, measured again past the cache, and a
    fleet rank's own cache (default <out>/.ceilings)."""

    measure: bool = True
    remeasure: bool = False
    cache_dir: str | None = None


@dataclass(frozen=True)
class Output:
    out: str = "results"
    run_id: str | None = None
    resume: str | None = None
    plots: bool = True
    history: str | None = None


@dataclass(frozen=True)
class GateChoice:
    compare: str | None = None
    threshold: float | None = None
    allow: str = ""
    allow_device_mismatch: bool = False


@dataclass(frozen=True)
class FleetChoice:
    tolerance: float | None = None
    dist_timeout: float = 120.0
    collectives: bool = True
    acceptance: AcceptanceOptions | None = None


@dataclass(frozen=True)
class TritonChoice:
    arch: str = "sm_90"  # --inspect's target
    retune: bool = False  # tune every launch even where a shipped config exists


@dataclass(frozen=True)
class RunRequest:
    """One run_bench.py request (see the module's docstring)."""

    selection: Selection = field(default_factory=Selection)
    device: DeviceChoice = field(default_factory=DeviceChoice)
    measurement: Measurement = field(default_factory=Measurement)
    budgets: Budgets = field(default_factory=Budgets)
    ceilings: CeilingsChoice = field(default_factory=CeilingsChoice)
    output: Output = field(default_factory=Output)
    gate: GateChoice = field(default_factory=GateChoice)
    fleet: FleetChoice = field(default_factory=FleetChoice)
    triton: TritonChoice = field(default_factory=TritonChoice)

    def to_json(self) -> RequestJson:
        """A JSON-ready dict (results.json's metadata["request"]), one object per group;
        inf budgets as "inf"."""
        d = RequestJson(**asdict(self))
        for group, name in _FLOATS_MAYBE_INF:
            v = d[group][name]
            if isinstance(v, float) and math.isinf(v):
                d[group][name] = "inf"
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunRequest:
        """The request to_json wrote, or one an earlier version stored flat (one key per
        field); RequestError for keys this version does not know."""
        # A group's object marks to_json's form ("device" is also a flat key: a string).
        grouped = any(isinstance(d.get(g), Mapping) for g in _GROUPS)
        nested = {k: dict(v) if isinstance(v, Mapping) else v for k, v in d.items()} \
            if grouped else _nested(d)
        unknown = sorted(set(nested) - set(_GROUPS)) + sorted(
            f"{g}.{k}" for g, v in nested.items() if g in _GROUPS and isinstance(v, dict)
            for k in set(v) - {f.name for f in fields(_GROUPS[g])})
        if unknown:
            raise RequestError(f"cannot read the stored request: unknown field(s) "
                               f"{', '.join(unknown)} (written by a newer version?)")
        sel = nested.get("selection", {})
        for k in ("kernels", "dtypes", "providers", "cache"):
            if sel.get(k) is not None:
                sel[k] = tuple(sel[k])
        if sel.get("shapes") is not None:
            sel["shapes"] = tuple(_shape(s) for s in sel["shapes"])
        for group, name in _FLOATS_MAYBE_INF:
            if nested.get(group, {}).get(name) == "inf":
                nested[group][name] = math.inf
        fleet = nested.get("fleet", {})
        if fleet.get("acceptance") is not None:
            fleet["acceptance"] = AcceptanceOptions(**fleet["acceptance"])
        return cls(**{g: _GROUPS[g](**v) for g, v in nested.items()})


def stored_selection(meta: RunMeta) -> Selection | None:
    """A saved run's requested selection, as its readers show it; None for metadata without
    a request (written by hand, or before the kernels were recorded) or with one this
    version cannot read (a newer run's), whose facts the readers then leave out.  A run
    written before the request was stored has one rebuilt from its old keys (run_meta)."""
    if not meta.request:
        return None
    try:
        return RunRequest.from_json(meta.request).selection
    except (TypeError, ValueError):  # RequestError too
        return None


def baseline_provider(meta: RunMeta) -> str:
    """The provider a saved run's speedups are against (--baseline-provider; the request's
    default where the run does not say)."""
    return (stored_selection(meta) or Selection()).baseline_provider


# The request as results.json's metadata["request"] holds it (to_json writes, from_json
# reads): one object per group, its keys the group's fields; tuples written as lists, an
# inf budget as "inf".  from_json reads any subset (a missing field keeps its default).
class SelectionJson(TypedDict, total=False):
    kernels: Sequence[str]
    dtypes: Sequence[str]
    providers: Sequence[str]
    sizes: str
    shapes: Sequence[Shape | str] | None  # as text in a run's old keys
    cache: Sequence[str] | None
    seed: int
    check_only: bool
    baseline_provider: str


class DeviceJson(TypedDict, total=False):
    key: str
    fp8_accum: str | None


class MeasurementJson(TypedDict, total=False):
    throttle_threshold: float
    throttle_recovery_delay: float
    energy: str


class BudgetsJson(TypedDict, total=False):
    row: float | str | None
    run: float | str | None


class CeilingsChoiceJson(TypedDict, total=False):
    measure: bool
    remeasure: bool
    cache_dir: str | None


class OutputJson(TypedDict, total=False):
    out: str
    run_id: str | None
    resume: str | None
    plots: bool
    history: str | None


class GateJson(TypedDict, total=False):
    compare: str | None
    threshold: float | None
    allow: str
    allow_device_mismatch: bool


class AcceptanceJson(TypedDict, total=False):
    minutes: float
    median_warn_pct: float
    median_critical_pct: float
    busbw_warn_pct: float
    busbw_critical_pct: float
    expected_busbw: float | None


class FleetJson(TypedDict, total=False):
    tolerance: float | None
    dist_timeout: float | str
    collectives: bool
    acceptance: AcceptanceJson | None


class TritonJson(TypedDict, total=False):
    arch: str
    retune: bool


class RequestJson(TypedDict, total=False):
    selection: SelectionJson
    device: DeviceJson
    measurement: MeasurementJson
    budgets: BudgetsJson
    ceilings: CeilingsChoiceJson
    output: OutputJson
    gate: GateJson
    fleet: FleetJson
    triton: TritonJson


_GROUPS: dict[str, type] = {f.name: f.default_factory for f in fields(RunRequest)}  # type: ignore[misc]
_FLOATS_MAYBE_INF = (("budgets", "row"), ("budgets", "run"), ("fleet", "dist_timeout"))
# A flat request's keys (as an earlier version stored it) whose field is named otherwise.
_FLAT_NAMES = {"device": ("device", "key"), "row_budget": ("budgets", "row"),
               "run_budget": ("budgets", "run"), "measure_ceilings": ("ceilings", "measure"),
               "remeasure_ceilings": ("ceilings", "remeasure"),
               "ceilings_dir": ("ceilings", "cache_dir"),
               "fleet_tolerance": ("fleet", "tolerance")}
_FLAT_OWNER = {f.name: (g, f.name) for g, t in _GROUPS.items() for f in fields(t)
               if f.name not in ("key", "row", "run", "measure", "remeasure", "cache_dir",
                                 "tolerance")} | _FLAT_NAMES


def _nested(flat: Mapping[str, Any]) -> RequestJson:
    """A flat request's keys in their groups; a key no group has is kept at the top (and
    refused by from_json)."""
    out: RequestJson = {}
    for k, v in flat.items():
        group, name = _FLAT_OWNER.get(k, (None, k))
        if group is None:
            out[k] = v
        else:
            out.setdefault(group, {})[name] = v
    return out


def _shape(s: Any) -> Shape:
    """A stored shape: its dict, or its text ("M=4096,K=4096") as a run's old keys hold it."""
    return parse_shape(s) if isinstance(s, str) else dict(s)


# The groups a resume takes from its own command line; every other is the run's own (its
# selection, device and fp8 mode, throttle rule and energy windows).
RESUME_FROM_COMMAND_LINE: tuple[str, ...] = (
    "budgets", "ceilings", "output", "gate", "fleet", "triton")


def choose(value: str | Sequence[str], allowed: Sequence[str], flag: str,
           named: dict[str, Sequence[str]] | None = None) -> tuple[str, ...]:
    """A comma list (or a list) checked against `allowed`, "all" expanded (to `named`'s
    "all" where given, else to `allowed`) and so is any other name of `named` (the
    providers' "default"), duplicates dropped in order; RequestError naming the first
    unknown value."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) \
        else [str(v).strip() for v in value]
    items = [v for v in items if v]
    if len(items) == 1 and items[0] in (named or {}):
        return tuple((named or {})[items[0]])
    if items == ["all"]:
        return tuple(allowed)
    if not items:
        raise RequestError(f"--{flag} is empty (choose from {','.join(allowed)})")
    for v in items:
        if v not in allowed:
            raise RequestError(f"unknown {flag.rstrip('s')} '{v}' "
                               f"(choose from {','.join(allowed)})")
    return tuple(dict.fromkeys(items))


# Which GPU rows get an energy window (a replay of their timed loop long enough for
# NVML's energy counter, benches/sweep/energy_counter.py): each (kernel, provider, dtype,
# cache mode) series' largest shape, every row, or none.
ENERGY_ROWS = ("largest", "all", "off")


def validated(req: RunRequest) -> RunRequest:
    """The one validation of a request's selection against the registries (the command
    line's and a resumed run's alike): lists as checked tuples, the device name known."""
    from kernels import ALL_PROVIDERS, DEFAULT_PROVIDERS, PROVIDERS, REGISTRY
    from kernels.spec import DTYPE_NAMES

    sel = req.selection
    if req.device.key != "auto" and req.device.key not in DEVICES:
        raise RequestError(f"unknown device '{req.device.key}' "
                           f"(choose from auto, {', '.join(DEVICES)})")
    if sel.baseline_provider not in PROVIDERS:
        raise RequestError(f"unknown baseline provider '{sel.baseline_provider}' "
                           f"(choose from {','.join(PROVIDERS)})")
    if req.measurement.energy not in ENERGY_ROWS:
        raise RequestError(f"unknown --energy '{req.measurement.energy}' "
                           f"(choose from {','.join(ENERGY_ROWS)})")
    if sel.sizes.startswith(MODEL_SIZES):
        try:
            parse_model_sizes(sel.sizes)
        except ModelConfigError as e:
            raise RequestError(str(e)) from None
    return replace(req, selection=replace(
        sel, kernels=choose(sel.kernels, tuple(REGISTRY), "kernels"),
        dtypes=choose(sel.dtypes, DTYPE_NAMES, "dtypes"),
        providers=choose(sel.providers, PROVIDERS, "providers",
                         {"all": ALL_PROVIDERS, "default": DEFAULT_PROVIDERS}),
        cache=None if sel.cache is None else choose(sel.cache, CACHE_MODES, "cache")))


def resumed_request(command_line: RunRequest, meta: RunMeta) -> RunRequest:
    """The request of `--resume RUN`: the run's own stored request with what a resume
    may change taken from this command line (RESUME_FROM_COMMAND_LINE)."""
    if meta.request_from_old_keys:
        return request_from_old_metadata(meta, command_line)
    stored = validated(RunRequest.from_json(meta.request))
    return replace(stored, **{k: getattr(command_line, k) for k in RESUME_FROM_COMMAND_LINE})


def request_from_old_metadata(meta: RunMeta, command_line: RunRequest) -> RunRequest:
    """The request of a run written before results.json stored one, from the request its
    old keys rebuild (contract/run_meta.py: kernels, dtypes, providers, cache, seed,
    check_only, device_key, fp8_accum, sizes, explicit_shapes) and its throttle
    settings; what they do not hold is the command line's."""
    old = RunRequest.from_json(meta.request)
    sel, throttle = old.selection, meta.settings.throttle_settings
    if sel.sizes == "explicit" and not sel.shapes:
        raise RequestError("cannot resume: the run used explicit --sizes that its "
                           "metadata does not list")
    mine = command_line.measurement
    return validated(replace(
        command_line,
        # A run written before --cache existed was timed cold.
        selection=replace(command_line.selection, kernels=sel.kernels, dtypes=sel.dtypes,
                          providers=sel.providers, cache=sel.cache or (DEFAULT_CACHE,),
                          seed=sel.seed, check_only=sel.check_only, sizes=sel.sizes,
                          shapes=sel.shapes if sel.sizes == "explicit" else None),
        device=DeviceChoice(old.device.key,
                            old.device.fp8_accum or command_line.device.fp8_accum),
        measurement=replace(
            mine, throttle_threshold=throttle.get("threshold_pct", mine.throttle_threshold),
            throttle_recovery_delay=throttle.get("recovery_delay_s",
                                                 mine.throttle_recovery_delay))))
