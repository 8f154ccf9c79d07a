"""What a plan is asked, typed and nested by concern: the model, the run's tokens and
length, the hardware, where the MFU comes from, the state's memory, the output.  The
command line (roofline/plan/cli.py) builds it once from its flags; everything below it
(planner.py, efficiency.py, comm.py) reads these records, never the parsed arguments.
The defaults here are the command line's (roofline/plan/flags.py takes them from here).
A record refuses a value no command line can give (PlanError, one line), so that a plan
asked from code fails as one asked from the shell does."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Literal

from contract.devices import ROOF_CLASS
from contract.models import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, PRESETS, ModelShape
from roofline.plan.arithmetic import DEFAULT_POLICY, MEMORY_POLICIES, WEIGHT_FORMATS, policy_items
from roofline.plan.model import PlanError

MEASURES = ("gemms", "step")
PROVIDERS = ("torch", "triton")


def _positive(owner: object, names: tuple[str, ...]) -> None:
    """PlanError for a field of `owner` that is given and not a positive number, named
    as its flag (each field is named as its flag)."""
    for name in names:
        v = getattr(owner, name)
        if v is not None and not v > 0:
            raise PlanError(f"--{name.replace('_', '-')} must be positive, got {v}")


def _one_of(name: str, value: str | None, allowed: Collection[str]) -> None:
    """PlanError for a value given that is not one of `allowed`."""
    if value is not None and value not in allowed:
        raise PlanError(f"{name} '{value}' is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class ModelRequest:
    """The model: --params alone (no shape: no GEMMs), or a shape: a --preset and/or
    --d-model and --layers, the other shape flags overriding the preset's or the
    defaults.  None: not given."""

    preset: str | None = None
    params: float | None = None
    d_model: int | None = None
    layers: int | None = None
    d_ff: int | None = None
    vocab: int | None = None
    seq_len: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    gated: bool | None = None
    tied: bool | None = None

    def __post_init__(self) -> None:
        _positive(self, ("params", "d_model", "layers", "d_ff", "vocab", "seq_len", "heads",
                         "kv_heads"))

    def shape_flags(self) -> dict[str, int | bool]:
        """The shape flags given, by ModelShape's field names."""
        over = {"d_model": self.d_model, "n_layers": self.layers, "d_ff": self.d_ff,
                "vocab": self.vocab, "seq_len": self.seq_len, "heads": self.heads,
                "kv_heads": self.kv_heads, "gated": self.gated, "tied": self.tied}
        return {k: v for k, v in over.items() if v is not None}

    def shape(self) -> ModelShape | None:
        """The model's shape (None for --params alone, or no model at all); PlanError for
        flags that describe none."""
        over = self.shape_flags()
        if self.params is not None and (over or self.preset):
            raise PlanError("give --params or a shape (--preset, --d-model/--layers), not both")
        if self.preset:
            if self.preset not in PRESETS:
                raise PlanError(f"unknown preset '{self.preset}' (choose from "
                                f"{', '.join(PRESETS)})")
            base = PRESETS[self.preset]
        elif over:
            if self.d_model is None or self.layers is None:
                raise PlanError("a model shape needs --d-model and --layers")
            d = self.d_model
            heads = self.heads or (d // 64 if d % 64 == 0 else 1)
            base = ModelShape("custom", d, self.layers, 4 * d, DEFAULT_VOCAB, DEFAULT_SEQ_LEN,
                              heads, heads, tied=False)
        else:
            return None
        if "d_model" in over and "d_ff" not in over and not self.preset:
            over["d_ff"] = 4 * over["d_model"]
        if "heads" in over and "kv_heads" not in over:
            over["kv_heads"] = over["heads"]
        shape = replace(base, **over)
        if self.preset and over:
            shape = replace(shape, name=f"{self.preset} (modified)")
        if shape.d_model % shape.heads:
            raise PlanError(f"--heads {shape.heads} does not divide d_model {shape.d_model}")
        if shape.heads % shape.kv_heads:
            raise PlanError(f"--kv-heads {shape.kv_heads} does not divide heads "
                            f"{shape.heads}")
        return shape


@dataclass(frozen=True)
class TrainingRequest:
    """The run's length: its tokens (--tokens, or --chinchilla's 20 per parameter), the
    --days budget, and a step's sequences per device (--micro-batch)."""

    tokens: float | None = None
    chinchilla: bool = False
    days: float | None = None
    micro_batch: int = 1

    def __post_init__(self) -> None:
        _positive(self, ("tokens", "days", "micro_batch"))
        if self.tokens is not None and self.chinchilla:
            raise PlanError("give --tokens or --chinchilla, not both")


@dataclass(frozen=True)
class HardwareRequest:
    """The devices: which (None: h100, the device present with --measure, the run's with
    --from-run), how many, their memory (None: the table's), the devices to compare days
    on (--vs), and their collectives' bus bandwidth: given (--busbw GB/s) or a fleet
    run's (--busbw-run, --force-busbw-run for one of another kind of device)."""

    device: str | None = None
    gpus: int = 1
    gpu_memory_gb: float | None = None
    vs: tuple[str, ...] = ()
    busbw: float | None = None
    busbw_run: str | None = None
    force_busbw_run: bool = False

    def __post_init__(self) -> None:
        _positive(self, ("gpus", "gpu_memory_gb", "busbw"))
        if self.busbw is not None and self.busbw_run is not None:
            raise PlanError("give --busbw or --busbw-run, not both")


@dataclass(frozen=True)
class EfficiencyRequest:
    """Where the MFU comes from, one of: assumed (--mfu, else the default), a saved run's
    matmul rows (--from-run), or measured now (--measure gemms|step); and how: the GEMMs'
    --dtype and --provider, a --rep-ms timing budget, the step's --steps, a slice of
    --measure-layers blocks, its kernels timed alone (--explain)."""

    mfu: float | None = None
    from_run: str | None = None
    measure: Literal["gemms", "step"] | None = None
    measure_layers: int | None = None
    explain: bool = False
    steps: int = 5
    dtype: str = "bf16"
    provider: str = "torch"
    rep_ms: float | None = None

    def __post_init__(self) -> None:
        _positive(self, ("mfu", "measure_layers", "steps", "rep_ms"))
        if self.mfu is not None and self.mfu > 1:
            raise PlanError(f"--mfu {self.mfu} is not a fraction in (0, 1]")
        if sum(x is not None for x in (self.mfu, self.from_run, self.measure)) > 1:
            raise PlanError("give one of --mfu, --from-run and --measure")
        _one_of("--measure", self.measure, MEASURES)
        _one_of("--dtype", self.dtype, ROOF_CLASS)
        _one_of("--provider", self.provider, PROVIDERS)


@dataclass(frozen=True)
class MemoryRequest:
    """The training state per parameter: a precision --policy (with the GEMMs' weights in
    another --weight-format) or --bytes-per-param in all."""

    policy: str = DEFAULT_POLICY
    bytes_per_param: float | None = None
    weight_format: str | None = None

    def __post_init__(self) -> None:
        _positive(self, ("bytes_per_param",))
        _one_of("--policy", self.policy, MEMORY_POLICIES)
        _one_of("--weight-format", self.weight_format, WEIGHT_FORMATS)

    def items(self) -> tuple[str, dict[str, float]]:
        """(the policy's name as the plan says it, its bytes per parameter itemized)."""
        if self.bytes_per_param is not None:
            return "explicit", {"--bytes-per-param": self.bytes_per_param}
        wf = self.weight_format
        return (self.policy + (f", {wf} weights" if wf else ""),
                policy_items(self.policy, wf))

    def bytes_per_param_total(self) -> float:
        return float(sum(self.items()[1].values()))


@dataclass(frozen=True)
class OutputRequest:
    """Where the plan goes: files in --out (None: results/plans/<timestamp>/) unless not
    saved (--no-save), tables or the JSON document (--json) on stdout."""

    out: str | None = None
    save: bool = True
    json: bool = False


@dataclass(frozen=True)
class PlanRequest:
    """Everything `python -m roofline plan` is asked, by concern."""

    model: ModelRequest = field(default_factory=ModelRequest)
    training: TrainingRequest = field(default_factory=TrainingRequest)
    hardware: HardwareRequest = field(default_factory=HardwareRequest)
    efficiency: EfficiencyRequest = field(default_factory=EfficiencyRequest)
    memory: MemoryRequest = field(default_factory=MemoryRequest)
    output: OutputRequest = field(default_factory=OutputRequest)
