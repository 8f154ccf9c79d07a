"""The regression gate (roofline/gate/) on synthetic pairs of runs: verdicts from raw
samples, the gate's semantics and exit codes, re-timing, reports, baseline validation,
promote, and the compare and promote command lines."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.schema import COLUMNS, KEY, SAMPLES
from roofline.gate.cli import main
from roofline.gate.promote import baseline_path
from roofline.gate.render import compare_and_report
from roofline.gate.rules import (
    ALLOWABLE,
    DEFAULT_THRESHOLDS,
    CompareError,
    check_threshold,
    default_threshold,
    parse_allow,
)
from roofline.gate.runs import check_baseline, compare_runs
from roofline.gate.stats import Timing, min_p_value, row_alpha
from roofline.gate.verdicts import compare_frames, judge

ROOT = Path(__file__).resolve().parents[1]

# (kernel, dtype, shape, flops, bytes): a bandwidth-bound and a compute-bound family.
SPECS = [
    ("add", "bf16", "n=1048576", 1048576, 3 * 1048576 * 2),
    ("add", "bf16", "n=16777216", 16777216, 3 * 16777216 * 2),
    ("matmul", "bf16", "M=1024,N=1024,K=1024", 2 * 1024**3, 3 * 1024 * 1024 * 2),
    ("matmul", "bf16", "M=4096,N=4096,K=4096", 2 * 4096**3, 3 * 4096 * 4096 * 2),
]
BASE_MS = [0.010, 0.100, 0.050, 0.200]
N = 25  # samples per row, the suite's floor


def spread_samples(ms: float, spread: float = 0.01, n: int = N) -> list[float]:
    """n evenly spread samples around ms, p20/p80 about `spread` (fraction) away."""
    return [ms * (1 + spread * q) for q in np.linspace(-1.6, 1.6, n)]


def make_row(kernel: str, dtype: str, shape: str, flops: float, nbytes: float,
             ms: float | None, spread: float = 0.01, status: str = "ok",
             provider: str = "triton", reason: str = "", samples: list[float] | None = None,
             timer: str = "do_bench") -> dict[str, Any]:
    """A row with consistent derived columns; its times come from its samples."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(kernel=kernel, provider=provider, dtype=dtype, shape=shape, flops=flops,
               bytes=nbytes, intensity=flops / nbytes, status=status, reason=reason,
               device="h100", gpu_name="NVIDIA H100 80GB HBM3")
    if status == "ok":
        assert ms is not None or samples is not None
        s = list(samples) if samples is not None else spread_samples(ms, spread)
        p20, p50, p80 = (float(x) for x in np.percentile(s, [20, 50, 80]))
        row.update(ms_median=p50, ms_p20=p20, ms_p80=p80, n_samples=len(s),
                   tflops=flops / (p50 * 1e-3) / 1e12, gbps=nbytes / (p50 * 1e-3) / 1e9,
                   correct=True, rel_err=1e-3, timer=timer)
        row[SAMPLES] = s
    else:
        row.update(correct=status != "failed", rel_err=0.5 if status == "failed" else None)
    return row


def base_rows(scale: dict[int, float] | None = None, spread: float = 0.01,
              provider: str = "triton") -> list[dict[str, Any]]:
    scale = scale or {}
    return [make_row(k, d, s, f, b, ms * scale.get(i, 1.0), spread, provider=provider)
            for i, ((k, d, s, f, b), ms) in enumerate(zip(SPECS, BASE_MS, strict=True))]


def write_run(folder: Path, rows: list[dict[str, Any]], device_key: str = "h100",
              run_id: str | None = None, created: str = "2025-01-01T00:00:00+00:00",
              **meta_extra: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"device_key": device_key, "device_name": "NVIDIA H100 80GB HBM3",
            "run_id": run_id or folder.name, "created": created,
            "git_commit": "0123456789abcdef", "command": "run_bench.py",
            "interrupted": False, "aborted": False, "abort_reason": None, "complete": True,
            "fp8_accum": "fast", **meta_extra}
    (folder / "results.json").write_text(json.dumps({"metadata": meta, "rows": rows}))
    return folder


LATER = "2025-01-02T00:00:00+00:00"  # the run is made after the baseline


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_run(tmp_path / "base", base_rows())


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(baseline: Path, run: Path, threshold: float = 5.0,
             **kw: Any) -> dict[tuple, str]:
    result = compare_runs(baseline, run, threshold, **kw)
    return {tuple(r[k] for k in KEY): r["verdict"] for r in result.rows.to_dict("records")}


def ts(samples: list[float] | np.ndarray, timer: str = "") -> Timing:
    s = tuple(float(x) for x in samples)
    return Timing("ok", float(np.median(s)), samples=s, timer=timer)


def noisy(rng: np.random.Generator, ms: float, n: int = N, drift: float = 0.015) -> np.ndarray:
    """Heavy-tailed samples like a shared CPU's: a per-run drift of the whole row
    (clocks, load), lognormal jitter, and 10% of samples hit by Pareto-tailed stalls."""
    level = ms * math.exp(rng.normal(0.0, drift))
    s = level * np.exp(rng.normal(0.0, 0.03, n))
    hit = rng.random(n) < 0.1
    s[hit] *= 1.0 + 0.2 * (rng.pareto(1.5, int(hit.sum())) + 1.0)
    return s


# ---------------------------------------------------------------------- the verdict rule


def test_row_alpha_is_one_percent_per_comparison_capped_at_one_per_mille() -> None:
    assert row_alpha(26) == pytest.approx(0.01 / 26)
    assert row_alpha(1000) == pytest.approx(1e-5)
    assert row_alpha(5) == 0.001 and row_alpha(0) == 0.001


def test_min_p_value_is_complete_separation() -> None:
    assert min_p_value(6, 6) == pytest.approx(1 / 924)  # > 0.001: too few for a verdict
    assert min_p_value(7, 7) == pytest.approx(1 / 3432)
    assert min_p_value(25, 1) == pytest.approx(1 / 26)
    assert min_p_value(871, 871) == 0.0  # no overflow (the CPU sweep has such rows)


def test_identical_samples_are_same() -> None:
    s = spread_samples(1.0, 0.3)
    assert judge(ts(s), ts(s), 5.0) == ("same", "")


@pytest.mark.parametrize("factor, expected", [(1.3, {"slower"}), (1 / 1.3, {"faster"}),
                                              (1.02, {"same", "ambiguous"}),
                                              (0.98, {"same", "ambiguous"})])
def test_shift_of_25_heavy_tailed_samples(factor: float, expected: set[str]) -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        b, n = noisy(rng, 1.0), noisy(rng, factor)
        assert judge(ts(b), ts(n), 5.0, row_alpha(26))[0] in expected


def test_ten_identical_noisy_pairs_call_at_most_one_percent_slower() -> None:
    # 10 pairs x 26 rows drawn from the same heavy-tailed distribution: the gate's
    # promise is <= 1% of rows slower (it makes ~0 here; a p < 0.05 test makes ~10%).
    rng = np.random.default_rng(7)
    ms = np.geomspace(0.003, 20.0, 26)
    calls = [judge(ts(noisy(rng, m)), ts(noisy(rng, m)), 5.0, row_alpha(26))[0]
             for _ in range(10) for m in ms]
    assert calls.count("slower") <= 0.01 * len(calls)
    assert calls.count("faster") <= 0.01 * len(calls)


def test_tests_against_the_threshold_not_against_zero() -> None:
    # 6% slower in the median with a wide spread: a test against "no change" is sure
    # (p ~ 1e-7), but whether it is beyond 5% is not (p ~ 0.13): ambiguous.
    b = 1 + 0.004 * np.arange(N)
    verdict, note = judge(ts(b), ts(b * 1.06), 5.0)
    assert verdict == "ambiguous" and "not significant" in note
    # The same 6% with a tight spread is clearly beyond 5%.
    b = 1 + 0.001 * np.arange(N)
    assert judge(ts(b), ts(b * 1.06), 5.0)[0] == "slower"


def test_alpha_decides() -> None:
    # 7 vs 7 completely separated: exact p = 1/3432 = 2.9e-4.
    b = 1 + 0.001 * np.arange(7)
    n = b * 1.2
    assert judge(ts(b), ts(n), 5.0, alpha=1e-3)[0] == "slower"
    assert judge(ts(b), ts(n), 5.0, alpha=5e-4)[0] == "slower"
    # At alpha 1e-4 the test cannot reach it: 1.2x is not gross -> ambiguous.
    verdict, note = judge(ts(b), ts(n), 5.0, alpha=1e-4)
    assert verdict == "ambiguous" and "too few" in note


def test_verdict_flips_exactly_at_alpha() -> None:
    from scipy.stats import mannwhitneyu

    b = 1 + 0.002 * np.arange(N)
    n = b * 1.07  # 25 vs 25, partly overlapping once the baseline is scaled by 1.05
    p = mannwhitneyu(n, b * 1.05, alternative="greater").pvalue
    assert 1e-5 < p < 1e-3
    assert judge(ts(b), ts(n), 5.0, alpha=p * 1.2)[0] == "slower"
    assert judge(ts(b), ts(n), 5.0, alpha=p / 1.2)[0] == "ambiguous"


def test_one_outlier_sample_never_flips() -> None:
    rng = np.random.default_rng(3)
    b = noisy(rng, 1.0, drift=0)
    same = noisy(rng, 1.0, drift=0)
    assert judge(ts(b), ts(same), 5.0)[0] == "same"
    for x in (1000.0, 1e-6):
        s = same.copy()
        s[0] = x
        assert judge(ts(b), ts(s), 5.0)[0] == "same"
        bb = b.copy()
        bb[0] = x
        assert judge(ts(bb), ts(same), 5.0)[0] == "same"
    slow = noisy(rng, 1.3, drift=0)
    for x in (1000.0, 1e-6):
        s = slow.copy()
        s[0] = x
        assert judge(ts(b), ts(s), 5.0)[0] == "slower"


@pytest.mark.parametrize("base_s, new_s, expected", [
    ([1.0], [3.0], "ambiguous"),  # one sample a side may be one outlier
    ([1.0] * 25, [3.0], "ambiguous"),
    ([1.0, 1.01, 1.02], [1.6, 1.61, 1.62], "slower"),  # gross (>= 1.5x), no overlap
    ([1.0, 1.01, 1.02], [0.6, 0.61, 0.62], "faster"),
    ([1.0, 1.01, 1.02], [1.6, 1.61, 0.9], "ambiguous"),  # gross median, sets overlap
    ([1.0, 1.01, 1.02], [1.4, 1.41, 1.42], "ambiguous"),  # not gross: 1.4 < 1.5
    ([1.0, 1.0], [1.5, 1.5], "slower"),
])
def test_tiny_sample_counts(base_s: list[float], new_s: list[float], expected: str) -> None:
    assert judge(ts(base_s), ts(new_s), 5.0)[0] == expected


def test_tiny_samples_gross_ratio_scales_with_a_loose_threshold() -> None:
    # --threshold 60: gross is 2.2x, so a disjoint 2x with 3 samples stays ambiguous.
    assert judge(ts([1.0, 1.01, 1.02]), ts([2.0, 2.01, 2.02]), 60.0)[0] == "ambiguous"
    assert judge(ts([1.0, 1.01, 1.02]), ts([2.3, 2.31, 2.32]), 60.0)[0] == "slower"


def q(median: float, spread: float = 0.01, n: float = 100) -> Timing:
    """A side without raw samples (a run written before samples_ms)."""
    return Timing("ok", median, median * (1 - spread), median * (1 + spread), n_samples=n)


@pytest.mark.parametrize("base_t, new_t, expected", [
    (q(1.0), q(1.04), "same"),
    (q(1.0), q(1.10), "ambiguous"),  # disjoint spreads but no samples: not enough
    (q(1.0), q(1.6), "slower"),  # gross and disjoint
    (q(1.0), q(0.6), "faster"),
    (q(1.0, 0.3), q(1.6, 0.3), "ambiguous"),  # gross but overlapping
    (q(1.0, 0, n=1), q(3.0, 0, n=1), "ambiguous"),  # a single sample each
    (q(1.0, n=math.nan), q(1.6, n=math.nan), "slower"),
])
def test_runs_without_samples_are_judged_conservatively(base_t: Timing, new_t: Timing,
                                                        expected: str) -> None:
    assert judge(base_t, new_t, 5.0)[0] == expected


def test_faster_bound_is_symmetric_in_log_time() -> None:
    b = 1 + 1e-4 * np.arange(N)
    assert judge(ts(b), ts(b * 0.953), 5.0)[0] == "same"  # 1/1.05 = 0.952
    assert judge(ts(b), ts(b * 0.951 * 0.99), 5.0)[0] == "faster"


@pytest.mark.parametrize("base_status, new_status, expected", [
    ("ok", "failed", "failed"),
    ("skipped", "failed", "failed"),
    (None, "failed", "failed"),
    ("failed", "failed", "still-failed"),
    ("ok", "skipped", "now-skipped"),
    ("skipped", "skipped", "skipped"),
    ("failed", "skipped", "skipped"),
    (None, "skipped", "skipped"),
    ("failed", "ok", "fixed"),
    ("skipped", "ok", "new"),
    (None, "ok", "new"),
    ("ok", None, "missing"),
    ("failed", None, "missing"),
])
def test_judge_status(base_status: str | None, new_status: str | None, expected: str) -> None:
    def side(status: str | None) -> Timing | None:
        return None if status is None else Timing(status, 1.0, samples=(1.0,) * 3)

    assert judge(side(base_status), side(new_status), 5.0)[0] == expected


def test_method_change_is_not_a_speed_verdict() -> None:
    s = spread_samples(1.0)
    verdict, note = judge(ts(s, "do_bench"), ts([x * 3 for x in s], "cudagraph"), 5.0)
    assert verdict == "method-changed" and "do_bench -> cudagraph" in note
    # An unknown timer (older runs) is not a change.
    assert judge(ts(s, ""), ts(s, "cudagraph"), 5.0)[0] == "same"


def test_invalid_sides() -> None:
    good = ts(spread_samples(1.0))
    assert judge(good, Timing("ok", math.nan), 5.0)[0] == "invalid"
    assert judge(good, Timing("ok", 1.0, samples=(1.0, -1.0)), 5.0)[0] == "invalid"
    with pytest.raises(CompareError, match="baseline"):
        judge(Timing("ok", 0.0), good, 5.0)


# ---------------------------------------------------------------------- whole runs


def test_identical_runs_all_same(base: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(), created=LATER)
    assert set(verdicts(base, run).values()) == {"same"}
    code, out, err = run_main(capsys, str(base), str(run))
    assert code == 0 and err == ""
    assert "OK (4 same)" in out and "4 rows the same" in out


def test_thirty_percent_slower_is_a_regression(base: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(scale={3: 1.3}), created=LATER)
    v = verdicts(base, run)
    assert v[("matmul", "triton", "bf16", "M=4096,N=4096,K=4096")] == "slower"
    assert list(v.values()).count("same") == 3
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 1
    assert "REGRESSION (1 slower; 3 same)" in out
    regressions = out.split("### Regressions")[1].split("###")[0]
    assert "M=4096,N=4096,K=4096" in regressions and "1.300x" in regressions


def test_ambiguous_and_faster_are_not_gated(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "base", base_rows(spread=0.15))
    # +3% (inside the threshold), +10% inside a wide spread, 2x faster.
    run = write_run(tmp_path / "run", base_rows(scale={0: 1.03, 1: 1.10, 2: 0.5},
                                                spread=0.15), created=LATER)
    v = verdicts(base, run)
    assert v[("add", "triton", "bf16", "n=1048576")] == "same"
    assert v[("add", "triton", "bf16", "n=16777216")] == "ambiguous"
    assert v[("matmul", "triton", "bf16", "M=1024,N=1024,K=1024")] == "faster"
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 0
    assert "### Ambiguous" in out and "### Faster (1)" in out and "### Regressions" not in out
    assert "2x or more faster" in out  # a too-slow baseline hides slowdowns: say so


def test_one_bad_run_row_does_not_hide_the_others(base: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows(scale={3: 1.3})
    rows[0]["ms_median"] = "fast"
    run = write_run(tmp_path / "run", rows, created=LATER)
    v = verdicts(base, run)
    assert v[("add", "triton", "bf16", "n=1048576")] == "invalid"
    assert v[("matmul", "triton", "bf16", "M=4096,N=4096,K=4096")] == "slower"
    assert run_main(capsys, str(base), str(run))[0] == 1


def test_newly_failed_row_is_a_regression(base: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()
    rows[2] = make_row(*SPECS[2], ms=None, status="failed", reason="rel_err 0.5 > 0.016")
    run = write_run(tmp_path / "run", rows, created=LATER)
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 1
    assert "**failed**" in out and "rel_err 0.5" in out


def test_skipped_in_both_is_neutral(tmp_path: Path) -> None:
    rows = base_rows() + [make_row(*SPECS[0], ms=None, status="skipped", provider="torch",
                                   reason="no GPU")]
    base = write_run(tmp_path / "base", rows)
    run = write_run(tmp_path / "run", rows, created=LATER)
    result = compare_runs(base, run)
    assert result.counts == {"skipped": 1, "same": 4} and result.exit_code == 0


def test_compare_frames_sorts_regressions_first() -> None:
    import pandas as pd

    base = pd.DataFrame(base_rows())
    run = pd.DataFrame(base_rows(scale={3: 3.0, 1: 0.5}))
    df = compare_frames(base, run)
    assert list(df["verdict"]) == ["slower", "faster", "same", "same"]


# ---------------------------------------------------------------------- gate semantics


def _gate(capsys: pytest.CaptureFixture[str], base: Path, run: Path,
          *extra: str) -> tuple[int, str]:
    code, out, err = run_main(capsys, str(base), str(run), *extra)
    assert err == "" or err.startswith("warning"), err
    return code, out


def test_missing_rows_fail_unless_allowed(base: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()[1:]  # the first row removed...
    rows.append(make_row("gelu", "bf16", "n=1048576", 1048576 * 8, 2 * 1048576 * 2, 0.02))
    run = write_run(tmp_path / "run", rows, created=LATER)  # ...and a new kernel added
    v = verdicts(base, run)
    assert v[("add", "triton", "bf16", "n=1048576")] == "missing"
    assert v[("gelu", "triton", "bf16", "n=1048576")] == "new"
    code, out = _gate(capsys, base, run)
    assert code == 1 and "FAIL (1 missing; 1 new, 3 same)" in out
    assert "--allow missing" in out
    code, out = _gate(capsys, base, run, "--allow", "missing")
    assert code == 0 and "OK (1 missing, 1 new, 3 same)" in out


def test_method_change_fails_unless_allowed(base: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows(scale={0: 0.3})
    rows[0]["timer"] = "cudagraph"
    run = write_run(tmp_path / "run", rows, created=LATER)
    assert verdicts(base, run)[("add", "triton", "bf16", "n=1048576")] == "method-changed"
    assert _gate(capsys, base, run)[0] == 1
    assert _gate(capsys, base, run, "--allow", "method-change")[0] == 0


def test_fp8_accumulation_change_is_a_method_change(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows() + [make_row("matmul", "fp8", "M=4096,N=4096,K=4096", 2 * 4096**3,
                                   2 * 4096**2, 0.1)]
    base = write_run(tmp_path / "base", rows, fp8_accum="fast")
    run = write_run(tmp_path / "run", rows, created=LATER, fp8_accum="precise")
    v = verdicts(base, run)
    assert v[("matmul", "triton", "fp8", "M=4096,N=4096,K=4096")] == "method-changed"
    assert list(v.values()).count("same") == 4
    code, out = _gate(capsys, base, run)
    assert code == 1 and "fp8 accumulation differs" in out
    # Without fp8 rows the mode does not matter: a warning only.
    base2 = write_run(tmp_path / "base2", base_rows(), fp8_accum="fast")
    run2 = write_run(tmp_path / "run2", base_rows(), created=LATER, fp8_accum="precise")
    code, out = _gate(capsys, base2, run2)
    assert code == 0 and "fp8 accumulation differs" in out


@pytest.mark.parametrize("meta, shown", [
    ({"interrupted": True, "complete": False}, "run interrupted"),
    ({"aborted": True, "abort_reason": "CUDA error: illegal address", "complete": False},
     "run aborted (CUDA error: illegal address)"),
    ({"complete": False}, "run incomplete"),
])
def test_incomplete_run_fails_unless_allowed(base: Path, tmp_path: Path, meta: dict,
                                             shown: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(), created=LATER, **meta)
    code, out = _gate(capsys, base, run)
    assert code == 1 and f"FAIL ({shown}; 4 same)" in out
    code, out = _gate(capsys, base, run, "--allow", "incomplete")
    assert code == 0 and "allowed (incomplete)" in out


def test_interrupted_two_row_run_against_full_baseline(base: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    run = write_run(tmp_path / "run", base_rows()[:2], created=LATER, interrupted=True,
                    complete=False)
    assert _gate(capsys, base, run)[0] == 1
    assert _gate(capsys, base, run, "--allow", "incomplete")[0] == 1  # rows still missing
    assert _gate(capsys, base, run, "--allow", "incomplete,missing")[0] == 0


def test_swapped_arguments_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write_run(tmp_path / "old", base_rows())
    new = write_run(tmp_path / "new", base_rows(scale=dict.fromkeys(range(4), 1.3)),
                    created=LATER)
    assert _gate(capsys, old, new)[0] == 1  # the real regression
    code, out = _gate(capsys, new, old)  # swapped: reads "4 faster", must not pass
    assert code == 1 and "baseline newer than run" in out and "swapped" in out
    assert _gate(capsys, new, old, "--allow", "newer-baseline")[0] == 0


def test_unknown_creation_time_warns(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "base", base_rows(), created="yesterday")
    run = write_run(tmp_path / "run", base_rows(), created=LATER)
    code, out = _gate(capsys, base, run)
    assert code == 0 and "cannot tell whether the baseline is older" in out


def test_allow_values_are_validated(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ALLOWABLE == ("missing", "method-change", "incomplete", "newer-baseline",
                         "throttled", "slower")
    code, out, err = run_main(capsys, str(base), str(base), "--allow", "missing,bogus")
    _assert_one_line_error(code, out, err)
    assert "bogus" in err and "newer-baseline" in err
    with pytest.raises(CompareError, match="bogus"):
        compare_runs(base, base, allow=["bogus"])
    assert parse_allow(["missing", "incomplete,newer-baseline"]) == {
        "missing", "incomplete", "newer-baseline"}


def test_run_drifting_as_a_whole_is_flagged(base: Path, tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", base_rows(scale=dict.fromkeys(range(4), 1.4)),
                    created=LATER)
    result = compare_runs(base, run)
    assert result.exit_code == 1
    assert any("moved slower past the threshold together" in w for w in result.warnings)


# ---------------------------------------------------------------------- re-timing


SLOW_KEY = ("matmul", "triton", "bf16", "M=4096,N=4096,K=4096", "cold")


@pytest.mark.parametrize("factors, expected, code", [
    ([1.3, 1.3, 1.3], "slower", 1),
    ([1.3, 1.3, 1.3, 1.3, 1.3], "slower", 1),
    ([1.3, 2.5, 1.3, 1.3, 1.3], "slower", 1),  # a neighbour slows a round: still slower
    ([1.3, 1.0, 1.3], "not-confirmed", 0),  # one round as fast as the baseline: no
    ([1.3, 1.3, 1.3, 1.3, 1.0], "not-confirmed", 0),
    ([1.3, 1.0, 1.0], "not-confirmed", 0),
    ([1.0, 1.0, 1.0], "not-confirmed", 0),
    ([1.3, 1.3, 1.04], "not-confirmed", 0),  # one round inside the 5% threshold
    ([1.3, 1.3, 1.06], "slower", 1),  # just past it
    ([1.0, 1.0], "slower", 1),  # 2 valid rounds are too few to clear (or confirm) a row
    ([], "slower", 1),  # could not be re-timed: kept
])
def test_retime_confirms_when_every_round_is_slower(
        base: Path, tmp_path: Path, factors: list[float], expected: str, code: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(scale={3: 1.3}), created=LATER)
    asked: list[list[tuple]] = []

    def retime(keys: list[tuple[str, ...]]) -> dict[tuple, list[list[float]]]:
        asked.append(list(keys))
        return {k: [spread_samples(0.2 * f) for f in factors] for k in keys}

    assert compare_and_report(base, run, retime=retime) == code
    assert asked == [[SLOW_KEY]]
    out = capsys.readouterr().out
    assert "re-timed 1 row that looked slower" in out
    assert f"{int(expected == 'slower')} confirmed" in out
    report = (run / "compare.md").read_text()
    assert f"**{expected}**" in report and "re-timed 1 row" in report


@pytest.mark.parametrize("factor, code", [(1.0, 0), (1.3, 1)])
def test_compare_cli_retimes_with_the_wired_retimer(
        base: Path, tmp_path: Path, factor: float, code: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m roofline compare --retime`: the command line's retimer re-times the
    row that looks slower; the rows of the run, on its device, are what it is given."""
    run = write_run(tmp_path / "run", base_rows(scale={3: 1.3}), created=LATER)
    given: list[tuple[str, int]] = []

    def factory(device: str, meta: dict, rows: list) -> Any:
        given.append((device, len(rows)))
        return lambda keys: {k: [spread_samples(0.2 * factor)] * 3 for k in keys}

    assert main(["compare", str(base), str(run), "--retime"], retimer=factory) == code
    assert given == [("h100", len(base_rows()))]
    assert "re-timed 1 row" in capsys.readouterr().out
    # Without the harness wired in (the gate's own entry point), --retime is refused.
    assert main(["compare", str(base), str(run), "--retime"]) == 2
    assert "--retime needs the benchmark harness" in capsys.readouterr().err


def test_retime_not_called_without_slower_rows(base: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(), created=LATER)

    def retime(keys: list) -> dict:
        raise AssertionError("no row looked slower")

    assert compare_and_report(base, run, retime=retime) == 0
    assert "re-timed" not in capsys.readouterr().out


def test_retime_failure_keeps_the_regression(base: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(scale={3: 1.3}), created=LATER)

    def retime(keys: list) -> dict:
        raise RuntimeError("CUDA error")

    assert compare_and_report(base, run, retime=retime) == 1
    assert "re-timing failed (CUDA error)" in capsys.readouterr().out


# ---------------------------------------------------------------------- usage errors


def _assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [
    None, "", "not json {", '{"metadata": {}}', "[1, 2]",
    '{"metadata": [1], "rows": []}',  # metadata a list: was a traceback
    '{"metadata": {}, "rows": {}}',
    '{"metadata": {}, "rows": [1]}',
])
def test_bad_baseline_file(tmp_path: Path, base: Path, content: str | None,
                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "baselines" / "h100.json"
    if content is not None:
        bad.parent.mkdir()
        bad.write_text(content)
    _assert_one_line_error(*run_main(capsys, str(bad), str(base)))
    _assert_one_line_error(*run_main(capsys, str(base), str(bad)))
    with pytest.raises(CompareError):
        check_baseline(bad)


@pytest.mark.parametrize("field, value", [
    ("ms_median", 0.0), ("ms_median", -1.0), ("ms_median", None), ("ms_median", "8.04"),
    ("ms_p20", None), ("ms_p80", True), (SAMPLES, [1.0, 0.0]), (SAMPLES, [1.0, None]),
    (SAMPLES, "1,2"), (SAMPLES, []),
])
def test_bad_baseline_row_is_an_error(tmp_path: Path, field: str, value: Any,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()
    rows[1][field] = value
    bad = write_run(tmp_path / "bad", rows)
    run = write_run(tmp_path / "run", base_rows(scale=dict.fromkeys(range(4), 1.5)),
                    created=LATER)
    code, out, err = run_main(capsys, str(bad), str(run))
    _assert_one_line_error(code, out, err)
    assert "add/triton/bf16/n=16777216" in err and field in err
    with pytest.raises(CompareError, match="n=16777216"):
        check_baseline(bad)


def test_all_bad_baseline_times_are_an_error(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    for i, value in enumerate([0, float("nan"), "x"]):
        rows = base_rows()
        for r in rows:
            r.update(ms_median=value, ms_p20=value, ms_p80=value)
            r.pop(SAMPLES)
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(json.dumps({"metadata": {"device_key": "h100"}, "rows": rows}))
        _assert_one_line_error(*run_main(capsys, str(bad), str(bad)))


def test_baseline_without_ok_rows_is_an_error(tmp_path: Path) -> None:
    rows = [make_row(*s, ms=None, status="skipped", reason="no GPU") for s in SPECS]
    with pytest.raises(CompareError, match="no ok rows"):
        check_baseline(write_run(tmp_path / "b", rows))


def test_check_baseline_device(base: Path) -> None:
    read = check_baseline(base, "h100")
    assert read.doc.meta.device.device_key == "h100" and len(read.doc.rows) == 4
    with pytest.raises(CompareError, match="'h100'.*'a100'"):
        check_baseline(base, "a100")
    assert check_baseline(base, "a100", allow_device_mismatch=True).doc.meta == read.doc.meta


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "x"])
def test_bad_threshold(base: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*run_main(capsys, str(base), str(base), "--threshold", value))
    with pytest.raises(CompareError):
        check_threshold(value)  # type: ignore[arg-type]


def test_check_threshold_accepts() -> None:
    assert check_threshold(0) == 0.0 and check_threshold("7.5") == 7.5  # type: ignore


def test_missing_baseline_names_it(tmp_path: Path, base: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, str(tmp_path / "nope.json"), str(base))
    assert code == 2 and err.startswith("error: baseline:") and "nope.json" in err


@pytest.mark.parametrize("argv", [[], ["only-one"], ["a", "b", "--bogus"]])
def test_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*run_main(capsys, *argv))


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": [], "rows": []}')
    # timeout: a hang guard only, generous for a loaded machine's interpreter start-up
    proc = subprocess.run([sys.executable, "-m", "roofline", "compare", str(bad), str(bad)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_device_mismatch(base: Path, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(), device_key="a100", created=LATER)
    code, _, err = run_main(capsys, str(base), str(run))
    _assert_one_line_error(code, "", err)
    assert "h100" in err and "a100" in err and "--allow-device-mismatch" in err
    code, out, _ = run_main(capsys, str(base), str(run), "--allow-device-mismatch")
    assert code == 0 and "warning: comparing different devices" in out


def test_compare_and_report_raises_compare_error(tmp_path: Path, base: Path) -> None:
    with pytest.raises(CompareError, match="baseline"):
        compare_and_report(tmp_path / "missing.json", base)


# ---------------------------------------------------------------------- outputs


def test_compare_and_report_writes_files(base: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    summary = tmp_path / "step_summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run = write_run(tmp_path / "run", base_rows(scale={3: 2.0}), created=LATER)
    code = compare_and_report(base / "results.json", run)
    out = capsys.readouterr().out
    assert code == 1
    assert "REGRESSION" in out and "matmul triton bf16 M=4096,N=4096,K=4096" in out
    report = (run / "compare.md").read_text()
    assert report.index("### Regressions") < report.index("the same within")
    assert "Mann-Whitney" in report and "p < 0.001" in report
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "### Regressions" in text  # appended

    entries = json.loads((run / "benchmark.json").read_text())
    assert len(entries) == 4
    for e in entries:
        assert set(e) == {"name", "unit", "value", "extra"}
        assert isinstance(e["value"], float) and e["value"] > 0
    by_name = {e["name"]: e for e in entries}
    mm = by_name["matmul/triton/bf16/M=4096,N=4096,K=4096"]
    assert mm["unit"] == "TFLOP/s"
    assert mm["value"] == pytest.approx(2 * 4096**3 / 0.4e-3 / 1e12)
    assert "slower" in mm["extra"]
    add = by_name["add/triton/bf16/n=1048576"]
    assert add["unit"] == "GB/s"
    assert add["value"] == pytest.approx(3 * 1048576 * 2 / 0.01e-3 / 1e9)


def test_cli_md_and_json_outputs(base: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    run = write_run(tmp_path / "run", base_rows(), created=LATER)
    md, js = tmp_path / "out" / "r.md", tmp_path / "out" / "b.json"
    code, out, _ = run_main(capsys, str(base), str(run / "results.json"),
                            "--md", str(md), "--json", str(js))
    assert code == 0 and md.read_text().strip() == out.strip()
    assert [e["unit"] for e in json.loads(js.read_text())].count("TFLOP/s") == 2


def test_step_summary_unwritable_only_warns(base: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "dir" / "f"))
    code, out, err = run_main(capsys, str(base), str(base))
    assert code == 0 and err.startswith("warning:")
    assert "the same run" in out  # a run compared with itself proves nothing: said


# ---------------------------------------------------------------------- promote


def promote_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["promote", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_promote(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = promote_main(capsys, str(base))
    assert code == 0 and err == ""  # nothing replaced
    dest = Path(out.strip())
    assert dest == Path("results/baselines/h100.json") == baseline_path("h100")
    doc = json.loads(dest.read_text())
    original = json.loads((base / "results.json").read_text())
    assert doc["rows"] == original["rows"]
    assert doc["metadata"]["device_key"] == "h100"
    assert doc["metadata"]["run_id"] == original["metadata"]["run_id"]
    # The promoted file works as a baseline for a compare.
    assert main(["compare", str(dest), str(base)]) == 0


def test_promote_keeps_the_replaced_baseline(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bl = tmp_path / "bl"
    first = write_run(tmp_path / "first", base_rows())
    second = write_run(tmp_path / "second", base_rows(scale={0: 1.1}), created=LATER)
    third = write_run(tmp_path / "third", base_rows(scale={0: 1.2}), created=LATER)
    assert promote_main(capsys, str(first), "--baselines", str(bl))[0] == 0
    before = (bl / "h100.json").read_bytes()
    code, out, err = promote_main(capsys, str(second), "--baselines", str(bl))
    assert code == 0 and out.strip() == str(bl / "h100.json")
    kept = sorted((bl / "history").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == before
    assert kept[0].name.startswith("h100.") and str(kept[0]) in err
    assert json.loads((bl / "h100.json").read_text())["metadata"]["run_id"] == "second"
    # Twice in the same second: a second copy, never over the first.
    assert promote_main(capsys, str(third), "--baselines", str(bl))[0] == 0
    kept = sorted((bl / "history").iterdir())
    assert len(kept) == 2
    assert {json.loads(p.read_text())["metadata"]["run_id"] for p in kept} == {"first",
                                                                                "second"}
    assert oct(kept[0].stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("meta, why", [
    ({"interrupted": True, "complete": False}, "interrupted"),
    ({"aborted": True, "abort_reason": "illegal address", "complete": False}, "aborted"),
    ({"complete": False}, "incomplete"),
])
def test_promote_refuses_incomplete_runs(tmp_path: Path, meta: dict, why: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bl = tmp_path / "bl"
    good = write_run(tmp_path / "good", base_rows())
    assert promote_main(capsys, str(good), "--baselines", str(bl))[0] == 0
    before = (bl / "h100.json").read_bytes()
    run = write_run(tmp_path / "run", base_rows()[:1], created=LATER, **meta)
    code, out, err = promote_main(capsys, str(run), "--baselines", str(bl))
    _assert_one_line_error(code, out, err)
    assert why in err and "--force" in err
    assert (bl / "h100.json").read_bytes() == before and not (bl / "history").exists()
    assert promote_main(capsys, str(run), "--baselines", str(bl), "--force")[0] == 0
    assert (bl / "history").exists()
    meta_now = json.loads((bl / "h100.json").read_text())["metadata"]
    assert meta_now["promoted_with_force"]


def test_promote_refuses_all_skipped_run(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    rows = [make_row(*s, ms=None, status="skipped", reason="no GPU") for s in SPECS]
    run = write_run(tmp_path / "run", rows)
    code, out, err = promote_main(capsys, str(run), "--baselines", str(tmp_path / "bl"))
    _assert_one_line_error(code, out, err)
    assert "no ok rows" in err and not (tmp_path / "bl" / "h100.json").exists()


def test_promote_refuses_bad_times_even_forced(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()
    rows[0]["ms_median"] = 0
    run = write_run(tmp_path / "run", rows)
    code, out, err = promote_main(capsys, str(run), "--baselines", str(tmp_path / "bl"),
                                  "--force")
    _assert_one_line_error(code, out, err)
    assert "add/triton/bf16/n=1048576" in err


def test_promote_refuses_another_device(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bl = tmp_path / "bl"
    h100 = write_run(tmp_path / "h100", base_rows())
    # An h100 run as the h200 baseline: refused, unless forced.
    code, out, err = promote_main(capsys, str(h100), "--device", "h200", "--baselines",
                                  str(bl))
    _assert_one_line_error(code, out, err)
    assert "'h100', not 'h200'" in err
    assert promote_main(capsys, str(h100), "--device", "h200", "--baselines", str(bl),
                        "--force")[0] == 0
    meta = json.loads((bl / "h200.json").read_text())["metadata"]
    assert meta["device_key"] == "h200" and meta["promoted_from_device_key"] == "h100"
    # A baseline file whose content is another device's than the run replacing it.
    (bl / "a100.json").write_text((bl / "h200.json").read_text().replace(
        '"device_key": "h200"', '"device_key": "a100"'))
    a100_run = write_run(tmp_path / "a100run", base_rows(), device_key="l4")
    code, out, err = promote_main(capsys, str(a100_run), "--device", "a100", "--baselines",
                                  str(bl))
    assert code == 2 and "'l4'" in err


def test_promote_errors(tmp_path: Path, base: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*promote_main(capsys, str(tmp_path / "missing")))
    _assert_one_line_error(*promote_main(capsys, str(base), "--device", "h9000"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": [1], "rows": []}')
    _assert_one_line_error(*promote_main(capsys, str(bad)))


def test_promote_pools_several_runs_into_one_baseline(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A fast spell of one run must not become the yardstick: the pooled baseline holds
    every run's samples, and a new run inside that range is not slower."""
    bl = tmp_path / "bl"
    fast = write_run(tmp_path / "a", base_rows())
    slow = write_run(tmp_path / "b", base_rows(scale={0: 1.3}), created=LATER)
    code, out, _ = promote_main(capsys, str(fast), str(slow), "--baselines", str(bl))
    assert code == 0
    doc = json.loads(Path(out.strip()).read_text())
    row = doc["rows"][0]
    assert row["n_samples"] == len(row[SAMPLES]) == 2 * N and row["pooled_runs"] == 2
    lo, hi = BASE_MS[0], BASE_MS[0] * 1.3
    assert lo < row["ms_median"] < hi  # the median of the pool, between the two runs
    assert math.isclose(row["gbps"], row["bytes"] / (row["ms_median"] * 1e-3) / 1e9)
    assert doc["rows"][1]["ms_median"] == pytest.approx(BASE_MS[1], rel=1e-9)
    assert len(doc["metadata"]["promoted_from"]) == 2
    # against the one-run baseline of the fast spell a slow-spell run is "slower";
    # against the pool it is not
    again = write_run(tmp_path / "c", base_rows(scale={0: 1.3}), created="2025-01-03T00:00")
    key = ("add", "triton", "bf16", SPECS[0][2])
    assert verdicts(fast, again)[key] == "slower"
    assert verdicts(Path(out.strip()), again)[key] != "slower"


def test_promote_refuses_to_pool_different_sweeps(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", base_rows())
    b = write_run(tmp_path / "b", base_rows()[:2], created=LATER)
    code, _, err = promote_main(capsys, str(a), str(b), "--baselines", str(tmp_path / "bl"))
    assert code == 2 and "different rows" in err
    assert not (tmp_path / "bl" / "h100.json").exists()
    c = write_run(tmp_path / "c", base_rows(), interrupted=True)
    code, _, err = promote_main(capsys, str(c), str(a), "--baselines", str(tmp_path / "bl"))
    assert code == 2 and "interrupted" in err


# ------------------------------------------------- default threshold and the fast end


def test_default_threshold_by_device_kind(tmp_path: Path) -> None:
    # Pinned: 5% on a GPU runner, 20% on a CPU (above the shared CI VM's run-to-run
    # noise); an unknown device gets the GPU's (stricter) one.
    assert DEFAULT_THRESHOLDS == {"cuda": 5.0, "cpu": 20.0}
    assert default_threshold("h100") == 5.0
    assert default_threshold("cpu") == 20.0
    assert default_threshold("tpu-v9") == 5.0 == default_threshold(None)
    # 15% slower everywhere: past the GPU default, within the CPU one.
    for key, verdict in (("h100", "slower"), ("cpu", "same")):
        b = write_run(tmp_path / f"b-{key}", base_rows(), device_key=key)
        r = write_run(tmp_path / f"r-{key}", base_rows(scale={i: 1.15 for i in range(4)}),
                      device_key=key, created=LATER)
        result = compare_runs(b, r)
        assert result.threshold == default_threshold(key)
        assert set(result.rows["verdict"]) == {verdict}


def test_a_moved_median_with_a_steady_fast_end_is_ambiguous() -> None:
    # A slow spell covering most of the new row's samples: median 1.5x, but the fastest
    # samples are where they were -> not called slower.
    b = 1 + 0.002 * np.arange(N)
    n = np.concatenate([b[:6], b[6:] * 1.5])
    verdict, note = judge(ts(b), ts(n), 5.0)
    assert verdict == "ambiguous" and "fast end" in note
    # The same with every sample slower is a slowdown.
    assert judge(ts(b), ts(b * 1.5), 5.0)[0] == "slower"


def test_one_fast_outlier_cannot_hide_a_slowdown() -> None:
    # The fast end is the second-fastest sample: one new sample as fast as the
    # baseline's fastest leaves the verdict slower; two make it ambiguous.
    b = 1 + 0.002 * np.arange(N)
    one = np.concatenate([[b[0]], b[1:] * 1.5])
    two = np.concatenate([b[:2], b[2:] * 1.5])
    assert judge(ts(b), ts(one), 5.0)[0] == "slower"
    assert judge(ts(b), ts(two), 5.0)[0] == "ambiguous"


def test_ambiguous_rows_past_the_threshold_are_retimed(base: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    # Row 3: median 1.3x but too spread for the rank test -> ambiguous; row 1: 3% slower
    # (within the threshold) is not re-timed.  The rounds settle row 3 either way.
    rows = base_rows(scale={1: 1.03})
    wide = list(0.2 * np.geomspace(1.0, 2.2, N))
    rows[3] = make_row(*SPECS[3], None, samples=wide)
    run = write_run(tmp_path / "run", rows, created=LATER)
    first = compare_runs(base, run, 5.0)
    assert first.rows.set_index("shape").loc["M=4096,N=4096,K=4096", "verdict"] == "ambiguous"
    for factor, expected, code in ((1.3, "slower", 1), (1.0, "ambiguous", 0)):
        asked: list[list[tuple]] = []

        def retime(keys: list[tuple[str, str, str, str]], f: float = factor,
                   asked: list[list[tuple]] = asked) -> dict[tuple, list[list[float]]]:
            asked.append(list(keys))
            return {k: [spread_samples(0.2 * f) for _ in range(5)] for k in keys}

        assert compare_and_report(base, run, 5.0, retime=retime) == code
        assert asked == [[SLOW_KEY]]
        md = (run / "compare.md").read_text()
        assert f"| M=4096,N=4096,K=4096 | **{expected}** |" in md
        out = capsys.readouterr().out
        assert f"re-timed 1 row that looked slower (5 rounds): " \
               f"{1 if expected == 'slower' else 0} confirmed" in out


def test_tight_rounds_confirm_against_a_wide_baseline(tmp_path: Path) -> None:
    # A baseline pooled over noisy runs: 50 samples near 1x, 25 in a 2x slow spell; the
    # run and every re-timed round are tight at 1.45x its median (its fast end 1.45x too):
    # confirmed, though a rank test of them against the wide baseline is not significant.
    wide = list(0.2 * np.concatenate([np.linspace(1.0, 1.05, 50), np.linspace(2.0, 2.1, 25)]))
    base_r = base_rows()
    base_r[3] = make_row(*SPECS[3], None, samples=wide)
    b = write_run(tmp_path / "b", base_r)
    med = float(np.median(wide))
    tight = [med * 1.45 * (1 + 0.002 * q) for q in range(N)]
    run_r = base_rows()
    run_r[3] = make_row(*SPECS[3], None, samples=tight)
    r = write_run(tmp_path / "r", run_r, created=LATER)
    assert judge(ts(wide), ts(tight), 20.0)[0] == "ambiguous"  # the rank test alone
    assert compare_and_report(b, r, 20.0, retime=lambda keys: {
        k: [tight] * 5 for k in keys}) == 1
    # Rounds back at the baseline's median: not confirmed.
    assert compare_and_report(b, r, 20.0, retime=lambda keys: {
        k: [[med * (1 + 0.002 * q) for q in range(N)]] * 5 for k in keys}) == 0


def test_too_few_rounds_leave_an_ambiguous_row_ambiguous(base: Path, tmp_path: Path) -> None:
    rows = base_rows()
    rows[3] = make_row(*SPECS[3], None, samples=list(0.2 * np.geomspace(1.0, 2.2, N)))
    run = write_run(tmp_path / "run", rows, created=LATER)
    code = compare_and_report(base, run, 5.0, retime=lambda keys: {
        k: [spread_samples(0.26)] * 2 for k in keys})
    assert code == 0  # 2 rounds 1.3x slower: not enough to turn ambiguous into slower
    assert "| M=4096,N=4096,K=4096 | **ambiguous** |" in (run / "compare.md").read_text()


def test_the_retime_child_runs_from_the_checkouts_root(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A GPU runner runs the project from a checkout, not installed: `python -m
    benches.sweep.retime` finds the package only from the repository's root (the H200
    run of 2026-11-27 ran it from benches/: 'No module named benches', every round)."""
    import benches.sweep.retime as retime

    seen: list[Path] = []

    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
        seen.append(Path(kw["cwd"]))
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.setattr(retime.subprocess, "run", fake_run)
    monkeypatch.setattr(retime, "RETIME_SPACING_S", 0.0)
    retime.Retimer("h200", retime.RetimeSettings(), [], say=lambda _: None)(
        [("add", "triton", "bf16", "n=4096")])
    assert seen and all((cwd / "benches" / "sweep" / "retime.py").is_file()
                        and (cwd / "run_bench.py").is_file() for cwd in seen)


@pytest.mark.checkout
def test_compare_retimes_in_real_children_from_the_checkout(tmp_path: Path) -> None:
    """`python -m roofline compare --retime` run as the GPU job runs it, from the
    repository's root, its re-timing rounds real child processes: a GPU machine runs the
    project from its checkout, not installed (CI's oldest leg does too), and the H200's
    children of 2026-11-27 could not import it from where they were started.  A baseline
    ten times as fast as the run makes its row a suspect, re-timed and confirmed (a busy
    CPU's re-timing can come out twice as fast as the run itself)."""
    out = tmp_path / "runs"
    p = subprocess.run([sys.executable, "run_bench.py", "--device", "cpu", "--kernels", "add",
                        "--dtypes", "fp32", "--providers", "torch", "--sizes", "n=65536",
                        "--no-measure-ceilings", "--run-budget", "2", "--row-budget", "0.3",
                        "--no-plots", "--out", str(out), "--run-id", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    run = out / "cpu" / "run"
    doc = json.loads((run / "results.json").read_text())
    for row in doc["rows"]:
        row["samples_ms"] = [t / 10 for t in row["samples_ms"]]
        for k in ("ms_median", "ms_p20", "ms_p80"):
            row[k] /= 10
    base = tmp_path / "base.json"
    base.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "roofline", "compare", str(base), str(run),
                        "--retime", "--md", str(tmp_path / "compare.md")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "re-timing round" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "fast end slower in 5 of 5 re-timed rounds" in p.stdout


def test_a_gpu_baseline_sampled_one_provider_at_a_time_is_method_changed(tmp_path):
    """The committed H200 baseline timed a case's providers one after the other; a run
    that times them in turns at a sustained clock measures its compute-bound rows at
    another clock by design: those rows are method-changed (never slower or faster), the
    memory-bound ones judged as ever, and the report says why."""
    import json

    from contract.run_meta import parse_meta
    from roofline.gate.runs import INTERLEAVED, ONE_AT_A_TIME, compare_runs, gpu_sampling

    base = ROOT / "results" / "h200" / "2026-11-27" / "cache-modes"  # add and matmul
    doc = json.loads((base / "results.json").read_text())
    assert gpu_sampling(parse_meta(doc["metadata"])) == ONE_AT_A_TIME
    doc["metadata"]["timing"]["interleave_ms"] = 10.0
    doc["metadata"]["created"] = "2026-12-01T00:00:00+00:00"
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(doc))
    assert gpu_sampling(parse_meta(doc["metadata"])) == INTERLEAVED
    result = compare_runs(str(base), str(run))
    changed = result.rows["verdict"] == "method-changed"
    ok = result.rows["base_status"] == "ok"
    # Every ok matmul row is compute-bound at these shapes; no add row is.
    assert set(result.rows[changed]["kernel"]) == {"matmul"}
    assert changed[ok & (result.rows["kernel"] == "matmul")].all()
    assert not changed[result.rows["kernel"] == "add"].any()
    assert any("GPU sampling differs" in w for w in result.warnings)
    # The same method on both sides: judged on their times.
    same = compare_runs(str(run), str(run))
    assert "method-changed" not in set(same.rows["verdict"])
