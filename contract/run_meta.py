"""A run's metadata as a typed record: the parts each stage of a run records, the request
stored once.

| part | recorded by | holds |
| --- | --- | --- |
| `provenance` | the run's start | run id, when, the command line, the git commit |
| `request` | the command line | the typed request (contract/request.py), stored once |
| `device` | detection | the device model, the device present, its figures, the host's |
| `software` | the run's start | Python, torch, Triton, CUDA, driver, platform, warnings |
| `settings` | the run's start | timing settings and meanings, budgets, fp8 mode, a model's step |
| `ceilings` | the ceilings | datasheet and measured (contract/ceilings.py's format), ready or not |
| `telemetry` | the GPU monitor | NVML at start and end, clocks, power, throttle, energy, profile |
| `compiles` | the Triton cache | tunings on disk, their identity, shipped configs, compile-ahead |
| `state` | the run's end | complete, interrupted, aborted (why), signal, a cut-short row, resumes |
| `time` | the time split | seconds per phase, wall time, each row's own split |
| `fleet` | a fleet run | its ranks' facts |
| `promotion` | `promote` | when and from which runs a baseline was made |

On disk results.json's "metadata" stays one flat JSON object (its keys as before, less
the request's flattened copy): `meta_json` is its one writer and `parse_meta` its one
loader, runs written before any key existed included (a run before the request was
stored gets one rebuilt from its old keys).  Every string key of the metadata is read
here and nowhere else.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, TypedDict

from contract.meta_parts import (
    CeilingsJson,
    ClocksFacts,
    CompiledAhead,
    EnergySource,
    KernelTimeSource,
    ModelStep,
    NotRecorded,
    NvmlSnapshot,
    PowerFacts,
    Resume,
    RowSplit,
    ShippedUseJson,
    ThrottleFacts,
    ThrottleSettings,
    TritonCompiles,
)

# An open JSON object, its keys not fixed here: the timing settings (TimingConfig's
# values, which change with it), the request (RunRequest.to_json's, nested or an older
# flat one), a fleet run's part (benches/fleet writes and reads it), keys this version
# does not know.  Every part with a fixed shape is typed (contract/meta_parts.py).
JsonDoc = dict[str, Any]
# A field's type as typing.get_type_hints gives it: a class (a TypedDict's too), a union
# (`str | None`) or a parametrized one (`tuple[float, ...]`).
TypeHint = type | types.UnionType | types.GenericAlias
DEFAULT_BASELINE = "torch"  # a run's speedups' provider unless its request names one


@dataclass(frozen=True)
class Provenance:
    run_id: str = ""
    created: str | None = None  # ISO 8601, UTC
    command: str | None = None
    git_commit: str | None = None


@dataclass(frozen=True)
class DeviceFacts:
    """The device model the rows are held against (`device_key`), the device present and
    its figures; on a CPU the host's cores, threads, caches and load."""

    device_key: str | None = None
    device_name: str | None = None
    device_model: str | None = None
    device_kind: str | None = None  # "cuda" or "cpu"
    detected_key: str | None = None
    capability: tuple[int, ...] | None = None
    sms: int | None = None
    l2_mb: float | None = None
    llc_mb: float | None = None
    llc_rotation_mb: float | None = None
    gpu_memory_gb: float | None = None
    cpu_cores: int | None = None
    threads: int | None = None
    load_avg_1m: float | None = None

    @property
    def on_gpu(self) -> bool:
        """A GPU run (a run before device_kind: by its device model's key)."""
        if self.device_kind is not None:
            return self.device_kind == "cuda"
        return bool(self.device_key) and self.device_key != "cpu"


@dataclass(frozen=True)
class Software:
    python: str | None = None
    torch: str | None = None
    triton: str | None = None
    triton_interpret: bool | None = None
    cuda: str | None = None
    driver: str | None = None
    platform: str | None = None
    version_warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settings:
    """How the rows were timed: the timing settings with the methods described
    (`timing`), the sweep's budget, the throttle rule, the fp8 accumulation mode, and
    under --sizes model:NAME the model's step (its shapes, layers and counts)."""

    timing: JsonDoc = field(default_factory=dict)
    run_budget_s: float | None = None
    throttle_settings: ThrottleSettings | NotRecorded = field(default_factory=NotRecorded)
    fp8_accum: str | None = None
    model_step: ModelStep | None = None


@dataclass(frozen=True)
class Telemetry:
    """GPU: NVML at the run's start and end, the clocks, power and throttle facts over
    the timings; where energy and kernel_ms come from (or why not), everywhere."""

    nvml_start: NvmlSnapshot | None = None
    nvml_end: NvmlSnapshot | None = None
    clocks: ClocksFacts = field(default_factory=ClocksFacts)
    power: PowerFacts = field(default_factory=PowerFacts)
    throttle: ThrottleFacts = field(default_factory=ThrottleFacts)
    energy: EnergySource = field(default_factory=EnergySource)
    kernel_time: KernelTimeSource | NotRecorded = field(default_factory=NotRecorded)


@dataclass(frozen=True)
class Compiles:
    autotune_on_disk: bool | None = None
    tuning_identity: str | None = None
    shipped_configs: ShippedUseJson | NotRecorded = field(default_factory=NotRecorded)
    compiled_ahead: CompiledAhead = field(default_factory=CompiledAhead)
    triton_compiles: TritonCompiles = field(default_factory=TritonCompiles)


@dataclass(frozen=True)
class RunState:
    complete: bool = False
    interrupted: bool = False
    aborted: bool = False
    abort_reason: str | None = None
    signal: str | None = None
    cut_short: str | None = None
    resumed: tuple[Resume, ...] = ()


@dataclass(frozen=True)
class TimeSpent:
    """Seconds per phase (contract/phases.py), the wall time they add up to, and each
    row's own split where rows ran one by one ({"row": key, "s": {phase: seconds}})."""

    time_split_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    wall_s: float | None = None
    row_split_s: tuple[RowSplit, ...] = ()


@dataclass(frozen=True)
class Promotion:
    promoted_at: str | None = None
    promoted_from: tuple[str, ...] = ()
    promoted_from_device_key: str | None = None
    promoted_with_force: bool | None = None
    replaced_baseline_kept_at: str | None = None


_PARTS: dict[str, type] = {
    "provenance": Provenance, "device": DeviceFacts, "software": Software,
    "settings": Settings, "telemetry": Telemetry, "compiles": Compiles, "state": RunState,
    "time": TimeSpent, "promotion": Promotion}
# Keys a run's metadata held that the request now holds (its flattened copy, before the
# request was stored whole or beside it): read only to rebuild an old run's request.
REQUEST_COPY = ("seed", "sizes", "explicit_shapes", "kernels", "dtypes", "providers",
                "check_only", "cache")


@dataclass(frozen=True)
class RunMeta:
    """A run's metadata (see the module's docstring).  `request` is the stored request's
    JSON (contract/request.py RunRequest.from_json types it: the contract's bottom layer
    cannot import the request's validation, which needs the kernel registry)."""

    provenance: Provenance = field(default_factory=Provenance)
    request: JsonDoc = field(default_factory=dict)
    device: DeviceFacts = field(default_factory=DeviceFacts)
    software: Software = field(default_factory=Software)
    settings: Settings = field(default_factory=Settings)
    ceilings: CeilingsJson | NotRecorded = field(default_factory=NotRecorded)
    ceilings_ready: bool = False
    telemetry: Telemetry = field(default_factory=Telemetry)
    compiles: Compiles = field(default_factory=Compiles)
    state: RunState = field(default_factory=RunState)
    time: TimeSpent = field(default_factory=TimeSpent)
    fleet: JsonDoc | None = None
    promotion: Promotion = field(default_factory=Promotion)
    # Keys this version does not know (a newer run's): kept, written back as they came.
    unknown: JsonDoc = field(default_factory=dict)
    # Read, not written: the request was rebuilt from a run's old keys (written before
    # the request was stored), which --resume completes (contract/request.py).
    request_from_old_keys: bool = False

    @property
    def baseline_provider(self) -> str:
        """The provider each row's speedup is measured against: the stored request's
        (a request stored flat by an earlier version too), else torch."""
        req = self.request
        sel = req.get("selection")
        got = (sel if isinstance(sel, Mapping) else req).get("baseline_provider")
        return str(got or DEFAULT_BASELINE)

    def updated(self, **parts: Any) -> RunMeta:
        """The metadata with some parts replaced: `state=...`, or a part's fields by
        `part__field=value` (`time__wall_s=12.3`)."""
        whole = {k: v for k, v in parts.items() if "__" not in k}
        named = [(*k.split("__", 1), v) for k, v in parts.items() if "__" in k]
        for part in dict.fromkeys(p for p, _, _ in named):
            whole[part] = replace(whole.get(part, getattr(self, part)),
                                  **{name: v for p, name, v in named if p == part})
        return replace(self, **whole)


_OWN = {f.name: part for part, t in _PARTS.items() for f in fields(t)}
_TOP = ("request", "ceilings", "ceilings_ready", "fleet")


def _value(hint: TypeHint, v: Any) -> Any:
    """A JSON value as a field's type: lists to tuples where the field is a tuple."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if (origin is tuple or tuple in {typing.get_origin(a) for a in args}) \
            and isinstance(v, list):
        return tuple(v)
    return v


@functools.cache
def _hints(t: type) -> dict[str, TypeHint]:
    return typing.get_type_hints(t)


@functools.cache
def _factories(t: type) -> frozenset[str]:
    """The fields of `t` whose default is a container (an empty one stands for None)."""
    return frozenset(f.name for f in fields(t) if f.default_factory is not MISSING)


class OldKeysRequest(TypedDict, total=False):
    """The request of a run written before the request was stored, as its old keys
    rebuild it: one key per field, as RunRequest.from_json reads a flat request."""

    kernels: list[str]
    dtypes: list[str]
    providers: list[str]
    seed: int
    check_only: bool
    cache: list[str]
    sizes: str
    device: str
    fp8_accum: str
    shapes: list[str | dict[str, int]]  # explicit shapes, as text or by dimension


def _old_request(doc: Mapping[str, Any]) -> OldKeysRequest:
    """The request of a run written before the request was stored: its flattened keys."""
    shapes = doc.get("explicit_shapes")
    req = {"kernels": doc.get("kernels"), "dtypes": doc.get("dtypes"),
           "providers": doc.get("providers"), "seed": doc.get("seed", 0),
           "check_only": bool(doc.get("check_only")), "cache": doc.get("cache"),
           "sizes": doc.get("sizes") or "default", "device": doc.get("device_key") or "auto",
           "fp8_accum": doc.get("fp8_accum")}
    if shapes:
        req["shapes"] = shapes
    return OldKeysRequest(**{k: v for k, v in req.items() if v is not None})


P = typing.TypeVar("P")


def _part(t: type[P], doc: Mapping[str, Any]) -> P:
    """One part's record from the keys of `doc` it owns (a None where the field is a
    container: its empty default stands for it)."""
    own = {f.name for f in fields(t)}
    return t(**{k: _value(_hints(t)[k], v) for k, v in doc.items()
                if k in own and not (v is None and k in _factories(t))})


def parse_meta(doc: Mapping[str, Any] | None) -> RunMeta:
    """results.json's metadata as a record; a key it lacks keeps its default, a key this
    version does not know is kept in `unknown`; a run written before its request was
    stored gets one from its old keys."""
    doc = dict(doc or {})
    request = doc.get("request")
    old = not isinstance(request, dict) and "kernels" in doc
    if old:
        request = _old_request(doc)
    ceilings = doc.get("ceilings")
    return RunMeta(**{p: _part(t, doc) for p, t in _PARTS.items()},
                   request=dict(request or {}),
                   ceilings=dict(ceilings) if isinstance(ceilings, Mapping) else {},
                   ceilings_ready=bool(doc.get("ceilings_ready")),
                   fleet=doc.get("fleet"), request_from_old_keys=old,
                   unknown={k: v for k, v in doc.items()
                            if k not in _OWN and k not in _TOP and k not in REQUEST_COPY})


# results.json's "metadata" as the file's JSON object: open (a newer run's keys kept).
def meta_json(meta: RunMeta) -> dict[str, Any]:
    """The record as results.json's "metadata" object: one flat JSON object."""
    out = {k: list(v) if isinstance(v, tuple) else v
           for part in _PARTS for k, v in asdict(getattr(meta, part)).items()}
    out.update(request=meta.request, ceilings=meta.ceilings,
               ceilings_ready=meta.ceilings_ready)
    if meta.fleet is not None:
        out["fleet"] = meta.fleet
    out.update(meta.unknown)
    return out
