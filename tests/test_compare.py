"""roofline.compare on synthetic pairs of runs: verdicts, exit codes, reports, promote."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from roofline import compare
from roofline.compare import (
    CompareError,
    Timing,
    baseline_path,
    compare_and_report,
    compare_frames,
    judge,
    main,
)
from roofline.schema import COLUMNS, KEY

ROOT = Path(__file__).resolve().parents[1]

# (kernel, dtype, shape, flops, bytes): a bandwidth-bound and a compute-bound family.
SPECS = [
    ("add", "bf16", "n=1048576", 1048576, 3 * 1048576 * 2),
    ("add", "bf16", "n=16777216", 16777216, 3 * 16777216 * 2),
    ("matmul", "bf16", "M=1024,N=1024,K=1024", 2 * 1024**3, 3 * 1024 * 1024 * 2),
    ("matmul", "bf16", "M=4096,N=4096,K=4096", 2 * 4096**3, 3 * 4096 * 4096 * 2),
]
BASE_MS = [0.010, 0.100, 0.050, 0.200]


def make_row(kernel: str, dtype: str, shape: str, flops: float, nbytes: float,
             ms: float | None, spread: float = 0.01, status: str = "ok",
             provider: str = "triton", reason: str = "") -> dict[str, Any]:
    """A row with consistent derived columns; spread is the p20/p80 distance from the
    median as a fraction of it."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(kernel=kernel, provider=provider, dtype=dtype, shape=shape, flops=flops,
               bytes=nbytes, intensity=flops / nbytes, status=status, reason=reason,
               device="h100", gpu_name="NVIDIA H100 80GB HBM3")
    if status == "ok":
        assert ms is not None
        row.update(ms_median=ms, ms_p20=ms * (1 - spread), ms_p80=ms * (1 + spread),
                   n_samples=100, tflops=flops / (ms * 1e-3) / 1e12,
                   gbps=nbytes / (ms * 1e-3) / 1e9, correct=True, rel_err=1e-3)
    else:
        row.update(correct=status != "failed", rel_err=0.5 if status == "failed" else None)
    return row


def base_rows(scale: dict[int, float] | None = None, spread: float = 0.01,
              provider: str = "triton") -> list[dict[str, Any]]:
    scale = scale or {}
    return [make_row(k, d, s, f, b, ms * scale.get(i, 1.0), spread, provider=provider)
            for i, ((k, d, s, f, b), ms) in enumerate(zip(SPECS, BASE_MS, strict=True))]


def write_run(folder: Path, rows: list[dict[str, Any]], device_key: str = "h100",
              run_id: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"device_key": device_key, "device_name": "NVIDIA H100 80GB HBM3",
            "run_id": run_id or folder.name, "created": "2025-01-01T00:00:00Z",
            "git_commit": "0123456789abcdef", "command": "run_bench.py"}
    (folder / "results.json").write_text(json.dumps({"metadata": meta, "rows": rows}))
    return folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_run(tmp_path / "base", base_rows())


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def verdicts(baseline: Path, run: Path, threshold: float = 5.0) -> dict[tuple, str]:
    result = compare.compare_runs(baseline, run, threshold)
    return {tuple(r[k] for k in KEY): r["verdict"] for r in result.rows.to_dict("records")}


# ---------------------------------------------------------------------- the verdict rule


def t(median: float, spread: float = 0.01, status: str = "ok") -> Timing:
    return Timing(status, median, median * (1 - spread), median * (1 + spread))


@pytest.mark.parametrize("new, expected", [
    (t(1.00), "same"),
    (t(1.04), "same"),  # inside the threshold even though the spreads barely overlap
    (t(0.96), "same"),
    (t(1.10), "slower"),  # beyond 5%, spreads 0.99..1.01 vs 1.089..1.111 are disjoint
    (t(0.90), "faster"),
    (t(1.10, spread=0.2), "ambiguous"),  # beyond 5% but within the noise
    (t(0.90, spread=0.2), "ambiguous"),
    (t(2.00, spread=0.6), "slower"),  # 2x is caught even when the spreads overlap
    (t(0.50, spread=0.6), "faster"),
])
def test_judge_timing(new: Timing, expected: str) -> None:
    assert judge(t(1.0), new, 5.0)[0] == expected


def test_judge_faster_bound_is_symmetric_in_log_time() -> None:
    # 1/1.05 = 0.952: 0.953 is inside the threshold, 0.951 beyond it.
    assert judge(t(1.0, 0), t(0.953, 0), 5.0)[0] == "same"
    assert judge(t(1.0, 0), t(0.951, 0), 5.0)[0] == "faster"


def test_judge_gross_ratio_scales_with_a_loose_threshold() -> None:
    # With --threshold 60 the override sits at 2.2x, so 2x with overlapping spreads
    # stays ambiguous, while 2.5x is still caught.
    assert judge(t(1.0, 0.5), t(2.0, 0.5), 60.0)[0] == "ambiguous"
    assert judge(t(1.0, 0.5), t(2.5, 0.5), 60.0)[0] == "slower"


def test_judge_without_percentiles_uses_median_and_threshold() -> None:
    assert judge(Timing("ok", 1.0), Timing("ok", 1.2), 5.0)[0] == "slower"
    assert judge(Timing("ok", 1.0), Timing("ok", 1.02), 5.0)[0] == "same"


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
    base = None if base_status is None else t(1.0, status=base_status)
    new = None if new_status is None else t(1.0, status=new_status)
    assert judge(base, new, 5.0)[0] == expected


def test_judge_invalid_median_is_ambiguous() -> None:
    assert judge(t(1.0), Timing("ok", math.nan), 5.0)[0] == "ambiguous"
    assert judge(Timing("ok", 0.0), t(1.0), 5.0)[0] == "ambiguous"


# ---------------------------------------------------------------------- whole runs


def test_identical_runs_all_same(base: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows())
    assert set(verdicts(base, run).values()) == {"same"}
    code, out, err = run_main(capsys, str(base), str(run))
    assert code == 0 and err == ""
    assert "4 rows the same" in out


def test_two_x_slower_is_a_regression(base: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(scale={3: 2.0}))
    v = verdicts(base, run)
    assert v[("matmul", "triton", "bf16", "M=4096,N=4096,K=4096")] == "slower"
    assert list(v.values()).count("same") == 3
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 1
    assert "REGRESSION" in out
    regressions = out.split("### Regressions")[1].split("###")[0]
    assert "M=4096,N=4096,K=4096" in regressions and "2.000x" in regressions


def test_two_x_slower_caught_even_when_noisy(tmp_path: Path) -> None:
    base = write_run(tmp_path / "base", base_rows(spread=0.6))
    run = write_run(tmp_path / "run", base_rows(scale={0: 2.0}, spread=0.6))
    assert verdicts(base, run)[("add", "triton", "bf16", "n=1048576")] == "slower"


def test_change_inside_spread_is_not_a_regression(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "base", base_rows(spread=0.15))
    # +3% (inside the threshold) on one row, +10% (beyond it, inside the spread) on another.
    run = write_run(tmp_path / "run", base_rows(scale={0: 1.03, 1: 1.10}, spread=0.15))
    v = verdicts(base, run)
    assert v[("add", "triton", "bf16", "n=1048576")] == "same"
    assert v[("add", "triton", "bf16", "n=16777216")] == "ambiguous"
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 0
    assert "### Ambiguous" in out and "### Regressions" not in out


def test_faster_is_reported_not_gated(base: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(scale={2: 0.5}))
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 0 and "### Faster (1)" in out


def test_new_and_missing_rows(base: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()[1:]  # the first row removed...
    rows.append(make_row("gelu", "bf16", "n=1048576", 1048576 * 8, 2 * 1048576 * 2, 0.02))
    run = write_run(tmp_path / "run", rows)  # ...and a new kernel added
    v = verdicts(base, run)
    assert v[("add", "triton", "bf16", "n=1048576")] == "missing"
    assert v[("gelu", "triton", "bf16", "n=1048576")] == "new"
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 0 and "### New and missing (2)" in out


def test_newly_failed_row_is_a_regression(base: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rows = base_rows()
    rows[2] = make_row(*SPECS[2], ms=None, status="failed", reason="rel_err 0.5 > 0.016")
    run = write_run(tmp_path / "run", rows)
    code, out, _ = run_main(capsys, str(base), str(run))
    assert code == 1
    assert "**failed**" in out and "rel_err 0.5" in out


def test_skipped_in_both_is_neutral(tmp_path: Path) -> None:
    rows = base_rows() + [make_row(*SPECS[0], ms=None, status="skipped", provider="torch",
                                   reason="no GPU")]
    base = write_run(tmp_path / "base", rows)
    run = write_run(tmp_path / "run", rows)
    result = compare.compare_runs(base, run)
    assert result.counts == {"skipped": 1, "same": 4} and result.exit_code == 0


def test_compare_frames_sorts_regressions_first() -> None:
    import pandas as pd

    base = pd.DataFrame(base_rows())
    run = pd.DataFrame(base_rows(scale={3: 3.0, 1: 0.5}))
    df = compare_frames(base, run)
    assert list(df["verdict"]) == ["slower", "faster", "same", "same"]


# ---------------------------------------------------------------------- usage errors


def _assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [None, "not json {", '{"metadata": {}}', "[1, 2]"])
def test_bad_baseline_file(tmp_path: Path, base: Path, content: str | None,
                           capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "baselines" / "h100.json"
    if content is not None:
        bad.parent.mkdir()
        bad.write_text(content)
    _assert_one_line_error(*run_main(capsys, str(bad), str(base)))
    _assert_one_line_error(*run_main(capsys, str(base), str(bad)))


def test_missing_baseline_names_it(tmp_path: Path, base: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, str(tmp_path / "nope.json"), str(base))
    assert code == 2 and err.startswith("error: baseline:") and "nope.json" in err


@pytest.mark.parametrize("argv", [[], ["only-one"], ["a", "b", "--threshold", "x"],
                                  ["a", "b", "--bogus"]])
def test_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*run_main(capsys, *argv))


def test_negative_threshold(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(*run_main(capsys, str(base), str(base), "--threshold", "-1"))


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    proc = subprocess.run([sys.executable, "-m", "roofline", "compare", str(bad), str(bad)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_device_mismatch(base: Path, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", base_rows(), device_key="a100")
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
    run = write_run(tmp_path / "run", base_rows(scale={3: 2.0}))
    code = compare_and_report(base / "results.json", run)
    out = capsys.readouterr().out
    assert code == 1
    assert "REGRESSION" in out and "matmul triton bf16 M=4096,N=4096,K=4096" in out
    report = (run / "compare.md").read_text()
    assert report.index("### Regressions") < report.index("the same within")
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
    run = write_run(tmp_path / "run", base_rows())
    md, js = tmp_path / "out" / "r.md", tmp_path / "out" / "b.json"
    code, out, _ = run_main(capsys, str(base), str(run / "results.json"),
                            "--md", str(md), "--json", str(js))
    assert code == 0 and md.read_text().strip() == out.strip()
    assert [e["unit"] for e in json.loads(js.read_text())].count("TFLOP/s") == 2


def test_step_summary_unwritable_only_warns(base: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "no" / "such" / "dir" / "f"))
    code, _, err = run_main(capsys, str(base), str(base))
    assert code == 0 and err.startswith("warning:")


# ---------------------------------------------------------------------- promote


def test_promote(base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["promote", str(base)]) == 0
    dest = Path(capsys.readouterr().out.strip())
    assert dest == Path("results/baselines/h100.json") == baseline_path("h100")
    doc = json.loads(dest.read_text())
    original = json.loads((base / "results.json").read_text())
    assert doc["rows"] == original["rows"]
    assert doc["metadata"]["device_key"] == "h100"
    assert doc["metadata"]["run_id"] == original["metadata"]["run_id"]
    # The promoted file works as a baseline for a compare.
    assert main(["compare", str(dest), str(base)]) == 0


def test_promote_device_and_dir(base: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "bl"
    assert main(["promote", str(base / "results.json"), "--device", "h200",
                 "--baselines", str(out_dir)]) == 0
    dest = out_dir / "h200.json"
    assert capsys.readouterr().out.strip() == str(dest)
    meta = json.loads(dest.read_text())["metadata"]
    assert meta["device_key"] == "h200" and meta["promoted_from_device_key"] == "h100"


def test_promote_errors(tmp_path: Path, base: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(main(["promote", str(tmp_path / "missing")]),
                           *capsys.readouterr())
    _assert_one_line_error(main(["promote", str(base), "--device", "h9000"]),
                           *capsys.readouterr())
