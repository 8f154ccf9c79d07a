"""The regression gate: a run compared with a stored baseline row by row from raw timing
samples (statistics, verdicts), the runs read and checked, the report rendered (markdown,
CI step summary, benchmark JSON), and baselines promoted.  Saved results only: no kernel
is launched here (re-timing is a callback that run_bench.py provides).

    python -m roofline compare BASELINE RUN [--threshold PCT] [--allow LIST]
                                            [--allow-device-mismatch] [--md PATH] [--json PATH]
    python -m roofline promote RUN [RUN ...] [--device KEY] [--baselines DIR] [--force]
"""

from roofline.gate.cli import (
    check_outputs,
    main,
    threshold_help,
)
from roofline.gate.promote import (
    baseline_path,
    pool_rows,
    promote,
)
from roofline.gate.render import (
    append_step_summary,
    benchmark_entries,
    compare_and_report,
    render_markdown,
    retime_line,
    short_summary,
)
from roofline.gate.rules import (
    ALLOWABLE,
    ALLOWABLE_VERDICTS,
    BENCHMARK_JSON,
    COMPARE_MD,
    DEFAULT_BASELINES_DIR,
    DEFAULT_THRESHOLD,
    DEFAULT_THRESHOLDS,
    FAMILY_ALPHA,
    FP8_DTYPES,
    GROSS_RATIO_FLOOR,
    HISTORY_DIR,
    REGRESSION_VERDICTS,
    ROW_ALPHA_MAX,
    TFLOPS_KERNELS,
    VERDICT_ORDER,
    CompareError,
    Key,
    Retime,
    check_threshold,
    default_threshold,
    parse_allow,
    time_problem,
)
from roofline.gate.runs import (
    CONFIRM_MIN_ROUNDS,
    check_baseline,
    compare_runs,
    confirm_slower,
    incomplete_reasons,
    run_device_key,
)
from roofline.gate.stats import (
    Timing,
    fast_end,
    fast_end_ratio,
    gross_ratio,
    min_p_value,
    row_alpha,
    shift_p_value,
)
from roofline.gate.verdicts import (
    CompareResult,
    Problem,
    compare_frames,
    judge,
)

__all__ = [
    "ALLOWABLE",
    "ALLOWABLE_VERDICTS",
    "BENCHMARK_JSON",
    "COMPARE_MD",
    "CONFIRM_MIN_ROUNDS",
    "CompareError",
    "CompareResult",
    "DEFAULT_BASELINES_DIR",
    "DEFAULT_THRESHOLD",
    "DEFAULT_THRESHOLDS",
    "FAMILY_ALPHA",
    "FP8_DTYPES",
    "GROSS_RATIO_FLOOR",
    "HISTORY_DIR",
    "Key",
    "Problem",
    "REGRESSION_VERDICTS",
    "ROW_ALPHA_MAX",
    "Retime",
    "TFLOPS_KERNELS",
    "Timing",
    "VERDICT_ORDER",
    "append_step_summary",
    "baseline_path",
    "benchmark_entries",
    "check_baseline",
    "check_outputs",
    "check_threshold",
    "compare_and_report",
    "compare_frames",
    "compare_runs",
    "confirm_slower",
    "default_threshold",
    "fast_end",
    "fast_end_ratio",
    "gross_ratio",
    "incomplete_reasons",
    "judge",
    "main",
    "min_p_value",
    "parse_allow",
    "pool_rows",
    "promote",
    "render_markdown",
    "retime_line",
    "row_alpha",
    "run_device_key",
    "shift_p_value",
    "short_summary",
    "threshold_help",
    "time_problem",
]
