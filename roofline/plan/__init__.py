"""Resource accounting (docs/plan.md): model shapes and parameter counts, the
FLOP and memory arithmetic of a training run, and the plan rendered as text and a figure.
The measuring a plan asks for (--measure) is done by benches/ and passed in."""

from roofline.plan.arithmetic import (
    CHINCHILLA_TOKENS_PER_PARAM,
    DEFAULT_MFU,
    DEFAULT_POLICY,
    DTYPE_BYTES,
    GPU_MEMORY_GB,
    MEMORY_POLICIES,
    SECONDS_PER_DAY,
    WEIGHT_FORMATS,
    Gemm,
    attention_score_flops,
    budget_flops,
    compute_optimal,
    days_for,
    device_memory_bytes,
    host_memory_bytes,
    matrix_bytes,
    max_params_fit,
    policy_items,
    step_gemms,
    summarize_step,
    train_flops,
)
from roofline.plan.cli import (
    MeasureGemms,
    build_parser,
    build_plan,
    main,
    model_from_args,
    out_dir,
    parse_count,
)
from roofline.plan.model import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, PRESETS, ModelShape, PlanError
from roofline.plan.render import gb, print_tables, render_markdown, sections, si
from roofline.plan.sources import gemms_from_run, peak_of

__all__ = [
    "CHINCHILLA_TOKENS_PER_PARAM", "DEFAULT_MFU", "DEFAULT_POLICY", "DEFAULT_SEQ_LEN",
    "DEFAULT_VOCAB", "DTYPE_BYTES", "GPU_MEMORY_GB", "MEMORY_POLICIES", "PRESETS",
    "SECONDS_PER_DAY", "WEIGHT_FORMATS", "Gemm", "MeasureGemms", "ModelShape", "PlanError",
    "attention_score_flops", "budget_flops", "build_parser", "build_plan",
    "compute_optimal", "days_for", "device_memory_bytes", "gb", "gemms_from_run",
    "host_memory_bytes", "main", "matrix_bytes", "max_params_fit", "model_from_args",
    "out_dir", "parse_count", "peak_of", "policy_items", "print_tables", "render_markdown",
    "sections", "si", "step_gemms", "summarize_step", "train_flops",
]
