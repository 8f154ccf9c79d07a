"""The measured training step's records (roofline/plan/step.py computes them): what
benches.step.measure.measure_step measured (StepMeasurement, its memory StepMemory), and
the report made of it (StepReport: its kinds of work StepCategory, its memory against the
device's MemoryFit), with the report's JSON form (plan.json's `step_measured.report`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StepMemory:
    """The measured step's bytes by category (benches/step/measure.py): the training
    state's parts, the saved activations (all, in the blocks), autocast's weight casts,
    the peak allocated (GPU only).  `doc`: every category as measured, as the plan's
    JSON keeps it."""

    parameters: float
    gradients: float
    optimizer_state: float
    activations: float | None
    activations_in_blocks: float | None
    weight_casts: float | None
    peak_allocated: float | None
    doc: dict[str, float | None]

    @property
    def state(self) -> float:
        """Parameters, gradients and optimizer state: what FSDP shards."""
        return self.parameters + self.gradients + self.optimizer_state

    @classmethod
    def from_json(cls, doc: dict[str, float | None]) -> StepMemory:
        return cls(doc["parameters"] or 0, doc["gradients"] or 0,
                   doc["optimizer_state"] or 0, doc.get("activations"),
                   doc.get("activations_in_blocks"), doc.get("weight_casts"),
                   doc.get("peak_allocated"), doc)


@dataclass(frozen=True)
class StepMeasurement:
    """What benches.step.measure.measure_step measured of a step, read once from its
    JSON-able answer (the harness's; roofline/ never imports benches/): per category
    FLOPs forward, backward and in the optimizer, profiled ms by kind of work, and by
    kind and pass for --explain; the step time's median and spread."""

    dtype: str
    micro_batch: int
    tokens: float
    layers: int | None
    measured_layers: int | None
    ms_median: float
    ms_p20: float
    ms_p80: float
    flops_forward: dict[str, float]
    flops_backward: dict[str, float]
    flops_optimizer: dict[str, float]
    memory: StepMemory
    profile_ms: dict[str, float]
    profile_explain_ms: dict[str, dict[str, float]] | None
    profile_span_ms: float | None
    gemm_calls: dict[str, dict[str, float]] | None
    attention_counting: str | None
    notes: tuple[str, ...]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StepMeasurement:
        """The one reading of measure_step's answer (a document benches writes and the
        plan reads; kept whole in plan.json)."""
        t = doc["time_ms"]
        return cls(doc["dtype"], doc["micro_batch"], float(doc["tokens"]), doc.get("layers"),
                   doc.get("measured_layers"), t["median"], t["p20"], t["p80"],
                   doc["flops_forward"], doc["flops_backward"], doc["flops_optimizer"],
                   StepMemory.from_json(doc["memory"]), doc["profile_ms"],
                   doc.get("profile_explain_ms"), doc.get("profile_span_ms"),
                   doc.get("gemm_calls"), doc.get("attention_counting"),
                   tuple(doc.get("notes") or ()))


@dataclass(frozen=True)
class MemoryFit:
    """The step's peak against the device's memory and, estimated, the peak under each
    way to bring it down (memory_fit)."""

    peak: float
    device: float
    fits: bool
    state: float
    rest: float
    checkpointing: float
    checkpointing_fits: bool
    fsdp_gpus: int | None
    fsdp_peak: float | None
    micro_batch: int | None
    seq_len: int | None
    fixed: float
    smaller_peak: float | None


@dataclass(frozen=True)
class StepCategory:
    """One kind of work in the profiled step: its time and share, and where known its
    FLOPs, bytes, rate and FLOP/byte (the points of step.png)."""

    category: str
    ms: float
    share: float
    flops: float | None
    bytes: float | None
    tflops: float | None
    over_peak: bool
    intensity: float | None


@dataclass(frozen=True)
class StepReport:
    """What the measured step says about the lectures' claims (step_report); the plan's
    `step_measured.report`, its fields in the document's order."""

    params: float
    tokens_per_step: float
    step_ms: float
    step_ms_p20: float
    step_ms_p80: float
    tokens_per_s: float
    flops_forward: float
    flops_backward: float
    flops_optimizer: float
    counted_per_token: float
    six_n_per_token: float
    attention_per_token: float
    attention_causal_per_token: float
    attention_counting: str | None
    counted_over_6n: float
    counted_over_6n_attn: float
    counted_over_6n_attn_causal: float
    six_n_holds: bool
    backward_over_forward: float | None
    gemm_backward_over_forward: float | None
    mfu: float
    mfu_causal: float
    hfu: float
    gemm_mfu: float | None
    peak_tflops: float
    peak_source: str
    memory_fit: MemoryFit | None
    bytes_per_param_measured: float | None
    bytes_per_param_policy: float
    optimizer_bytes_per_param: float
    activations_per_token_per_layer: float | None
    activations_estimate_per_token_per_layer: float
    memory: StepMemory
    categories: tuple[StepCategory, ...]
    notes: tuple[str, ...]
    slice: bool

    def to_json(self) -> dict[str, Any]:
        """The plan's `step_measured.report` (plan.json): the memory as measured."""
        return {**asdict(self), "memory": self.memory.doc,
                "categories": [asdict(c) for c in self.categories],
                "notes": list(self.notes)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StepReport:
        """The report back from the plan's document (to_json's), for its renderers."""
        fit = doc["memory_fit"]
        return cls(**{**doc, "memory_fit": MemoryFit(**fit) if fit else None,
                      "memory": StepMemory.from_json(doc["memory"]),
                      "categories": tuple(StepCategory(**c) for c in doc["categories"]),
                      "notes": tuple(doc["notes"])})
