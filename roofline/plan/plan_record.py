"""The plan as a typed record (Plan, what build_plan returns) and its parts that only the
plan holds (PlanModel, Budget, Versus).  Plan.to_json is the one writer of the plan's
JSON document (plan.json, --json), in the key order its readers have always had;
Plan.from_json reads that document back (tests, and scripts that read --json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import NotRequired, TypedDict, cast

from contract.models import ModelShape
from roofline.plan.arithmetic import Gemm, GemmJson, StepSummary, matrix_bytes
from roofline.plan.comm import Communication, CommunicationJson
from roofline.plan.efficiency import StepMeasured, StepMeasuredJson
from roofline.plan.sources import GemmsTimed, GemmsTimedJson, RunGemms, RunGemmsJson


@dataclass(frozen=True)
class LargestMatrix:
    """A model's largest weight matrix (unfused): its name, rows x cols, fp32 bytes."""

    name: str
    rows: int
    cols: int
    bytes_fp32: int

    @property
    def shape(self) -> list[int]:
        return [self.rows, self.cols]


class LargestMatrixJson(TypedDict):
    name: str
    shape: list[int]
    bytes_fp32: int


class ModelJson(TypedDict, total=False):
    """The plan's `model`: a shape's fields and counts, or --params' name and count."""

    name: str
    d_model: int
    n_layers: int
    d_ff: int
    vocab: int
    seq_len: int
    heads: int
    kv_heads: int
    tied: bool
    gated: bool
    bias: bool
    learned_pos: bool
    norm_params: int
    head_size: int
    description: str
    params_itemized: dict[str, int]
    params: float
    params_12d2l: int
    matmul_params: int
    largest_matrix: LargestMatrixJson


@dataclass(frozen=True)
class PlanModel:
    """The plan's model: a shape (its parameters itemized and its largest matrix), or
    the count --params gives (name "--params", no shape)."""

    name: str
    params: float
    shape: ModelShape | None = None

    @property
    def largest_matrix(self) -> LargestMatrix | None:
        if self.shape is None:
            return None
        # Per-layer matrices unfused (q, o: d x d; MLP: d_ff x d): GPT-3's MLP matrix,
        # [49152, 12288], is 2.4 GB in fp32.
        d, f = self.shape.d_model, self.shape.d_ff
        name, rows, cols = ("mlp", f, d) if f >= d else ("attention", d, d)
        return LargestMatrix(name, rows, cols, matrix_bytes(rows, cols, "fp32"))

    def to_json(self) -> ModelJson:
        s, lm = self.shape, self.largest_matrix
        if s is None or lm is None:
            return ModelJson(name=self.name, params=self.params)
        return ModelJson(**asdict(s), description=s.describe(),  # type: ignore[typeddict-item]
                         params_itemized=s.param_items(), params=s.params,
                         params_12d2l=s.approx_12d2l, matmul_params=s.matmul_params,
                         largest_matrix=LargestMatrixJson(name=lm.name, shape=lm.shape,
                                                          bytes_fp32=lm.bytes_fp32))

    @classmethod
    def from_json(cls, doc: ModelJson) -> PlanModel:
        if "d_model" not in doc:
            return cls(doc["name"], doc["params"])
        shape = ModelShape(**{f.name: doc[f.name] for f in fields(ModelShape)})  # type: ignore[literal-required]
        return cls(shape.name, shape.params, shape)


class BudgetJson(TypedDict):
    days: float
    flops: float
    max_params_compute_optimal: float
    tokens_compute_optimal: float
    tokens_for_this_model: NotRequired[float]
    static_bytes_compute_optimal: NotRequired[float]
    fits_compute_optimal: NotRequired[bool | None]


@dataclass(frozen=True)
class Budget:
    """--days: the compute the budget buys and the compute-optimal model it trains; with
    a model, its tokens; with the devices' memory, whether that model's state fits."""

    days: float
    flops: float
    max_params_compute_optimal: float
    tokens_compute_optimal: float
    tokens_for_this_model: float | None = None
    static_bytes_compute_optimal: float | None = None
    fits_compute_optimal: bool | None = None

    def to_json(self) -> BudgetJson:
        doc = BudgetJson(days=self.days, flops=self.flops,
                         max_params_compute_optimal=self.max_params_compute_optimal,
                         tokens_compute_optimal=self.tokens_compute_optimal)
        if self.tokens_for_this_model is not None:
            doc["tokens_for_this_model"] = self.tokens_for_this_model
        if self.static_bytes_compute_optimal is not None:
            doc["static_bytes_compute_optimal"] = self.static_bytes_compute_optimal
            doc["fits_compute_optimal"] = self.fits_compute_optimal
        return doc

    @classmethod
    def from_json(cls, doc: BudgetJson) -> Budget:
        return cls(**doc)


@dataclass(frozen=True)
class Versus:
    """--vs: the plan's days on one device at its datasheet peak, and over the plan's
    own device's days (`vs_plan`); a row of the plan's `versus` (asdict)."""

    device: str
    name: str
    peak_tflops: float
    days: float
    days_with_attention: float | None
    vs_plan: float


class VersusJson(TypedDict):
    device: str
    name: str
    peak_tflops: float
    days: float
    days_with_attention: float | None
    vs_plan: float


class StepSummaryJson(TypedDict):
    tokens: int | None
    gemm_flops: int
    ms: float | None
    tflops: float | None
    mfu: float | None
    timed: int
    total: int


class PlanJson(TypedDict):
    """plan.json (and --json): Plan.to_json's, in the order of Plan's fields."""

    model: ModelJson | None
    params: float | None
    tokens: float | None
    tokens_source: str | None
    train_flops: float | None
    flops_forward: float | None
    flops_backward: float | None
    attention_flops: float | None
    device: str
    device_name: str
    dtype: str
    gpus: int
    peak_tflops: float
    peak_source: str
    mfu: float
    mfu_source: str
    mfu_from: str
    days: float | None
    days_with_attention: float | None
    budget: BudgetJson | None
    versus: list[VersusJson]
    policy: str
    bytes_per_param_itemized: dict[str, float]
    bytes_per_param: float
    static_bytes: float | None
    gpu_memory_bytes: float | None
    gpu_memory_source: str
    total_memory_bytes: float | None
    fits: bool | None
    max_params_fit: float | None
    micro_batch: int
    step: StepSummaryJson
    gemms: list[GemmJson]
    gemms_timed: str | None
    warnings: list[str]
    measurement: NotRequired[GemmsTimedJson | RunGemmsJson]
    communication: CommunicationJson | None
    step_measured: NotRequired[StepMeasuredJson]
    out_dir: NotRequired[str]


@dataclass(frozen=True)
class Plan:
    """Everything a plan says (build_plan's answer), its fields in plan.json's order:
    the model and its training FLOPs, the device, its peak and the MFU, the days, the
    --days budget, --vs, the memory, the step's GEMMs, the warnings, and what was
    measured (`measurement`: --measure's or --from-run's GEMMs; `step_measured`),
    the communication (--busbw), and the folder it was written to (`out_dir`)."""

    model: PlanModel | None
    params: float | None
    tokens: float | None
    tokens_source: str | None
    train_flops: float | None
    flops_forward: float | None
    flops_backward: float | None
    attention_flops: float | None
    device: str
    device_name: str
    dtype: str
    gpus: int
    peak_tflops: float
    peak_source: str
    mfu: float
    mfu_source: str
    mfu_from: str
    days: float | None
    days_with_attention: float | None
    budget: Budget | None
    versus: tuple[Versus, ...]
    policy: str
    bytes_per_param_itemized: dict[str, float]
    bytes_per_param: float
    static_bytes: float | None
    gpu_memory_bytes: float | None
    gpu_memory_source: str
    total_memory_bytes: float | None
    fits: bool | None
    max_params_fit: float | None
    micro_batch: int
    step: StepSummary
    gemms: tuple[Gemm, ...]
    gemms_timed: str | None
    warnings: tuple[str, ...]
    measurement: GemmsTimed | RunGemms | None = None
    communication: Communication | None = None
    step_measured: StepMeasured | None = None
    out_dir: str | None = None

    def to_json(self) -> PlanJson:
        """plan.json's document (the one writer of it): each part as its record writes
        it; `measurement`, `step_measured` and `out_dir` only where there is one."""
        parts = {
            "model": self.model.to_json() if self.model is not None else None,
            "budget": self.budget.to_json() if self.budget is not None else None,
            "versus": [asdict(v) for v in self.versus], "step": asdict(self.step),
            "gemms": [g.to_json() for g in self.gemms], "warnings": list(self.warnings),
            "measurement": self.measurement.to_json() if self.measurement else None,
            "communication": self.communication.to_json() if self.communication else None,
            "step_measured": self.step_measured.to_json() if self.step_measured else None}
        doc = {f.name: parts[f.name] if f.name in parts else getattr(self, f.name)
               for f in fields(self)}
        return cast(PlanJson, {k: v for k, v in doc.items()
                               if v is not None or k not in _OPTIONAL})

    @classmethod
    def from_json(cls, doc: PlanJson) -> Plan:
        """A plan back from its document (to_json's, or a saved plan.json)."""
        meas, sm = doc.get("measurement"), doc.get("step_measured")
        model, budget, comm = doc["model"], doc["budget"], doc["communication"]
        return cls(**{**{k: v for k, v in doc.items() if k not in _NESTED},  # type: ignore[arg-type]
                      "model": PlanModel.from_json(model) if model else None,
                      "budget": Budget.from_json(budget) if budget else None,
                      "versus": tuple(Versus(**v) for v in doc["versus"]),
                      "step": StepSummary(**doc["step"]),
                      "gemms": tuple(Gemm.from_json(g) for g in doc["gemms"]),
                      "warnings": tuple(doc["warnings"]),
                      "measurement": _measurement_of(meas),
                      "communication": Communication.from_json(comm) if comm else None,
                      "step_measured": StepMeasured.from_json(sm) if sm else None})


def _measurement_of(doc: GemmsTimedJson | RunGemmsJson | None) -> GemmsTimed | RunGemms | None:
    """A plan's `measurement` back: --from-run's names its run (`run_id`)."""
    if doc is None:
        return None
    if "run_id" in doc:
        return RunGemms.from_json(cast(RunGemmsJson, doc))
    return GemmsTimed.from_json(cast(GemmsTimedJson, doc))


# Plan's fields whose JSON is their record's (to_json), not the value itself.
_NESTED = frozenset({"model", "budget", "versus", "step", "gemms", "warnings",
                     "measurement", "communication", "step_measured"})
# The keys a plan's document has only where there is something to say.
_OPTIONAL = frozenset({"measurement", "step_measured", "out_dir"})
