""".ci/gpu (the GPU runner's job) as far as a CPU can test it: its refusals without a GPU
and on bad input, and its summary (`python -m roofline targets`) of saved synthetic runs:
section 7's ratios, verdicts, "not measured" with why, the steps file and the fleet
check."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.schema import COLUMNS
from roofline.__main__ import main as roofline_main
from roofline.report import targets
from roofline.report.targets import MET, MISSED, NOT_MEASURED

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu"
COPY_GBPS = 3000.0  # the synthetic runs' measured copy bandwidth
MiB = 2**20


def _script(*args: str, cuda: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, also on a GPU machine
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)


def test_script_is_executable_bash() -> None:
    assert os.access(SCRIPT, os.X_OK)
    p = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean() -> None:
    p = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_refuses_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _script(str(out))
    assert p.returncode == 2
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "torch.cuda.is_available() is False" in lines[0]
    assert p.stdout == ""
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("args, says", [
    ((), "usage: .ci/gpu OUT_DIR"),
    (("{tmp}/out", "no-such-step"), "unknown step 'no-such-step'"),
    (("{tmp}/full",), "is not an empty folder"),
])
def test_usage_errors_are_one_line(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "results.json").write_text("{}")  # measured: never overwritten
    p = _script(*(a.format(tmp=tmp_path) for a in args), cuda=True)
    assert p.returncode == 2
    assert len(p.stderr.splitlines()) == 1 and says in p.stderr
    assert (tmp_path / "full" / "results.json").read_text() == "{}"


def test_script_writes_the_steps_file_the_summary_reads() -> None:
    text = SCRIPT.read_text()
    assert "printf '" + "\\t".join(targets.STEP_FIELDS) + "\\n'" in text
    assert "results/baselines/$DEVICE.json" in text and "-m roofline compare" in text


def _step_table() -> list[tuple[str, int, int]]:
    """(step, cap, expected seconds) from the script's own table."""
    text = SCRIPT.read_text()
    table = text.split("STEP_TABLE='", 1)[1].split("'", 1)[0]
    return [(ln.split()[0], int(ln.split()[1]), int(ln.split()[2]))
            for ln in table.strip().splitlines()]


def _setting(name: str) -> int:
    return int(SCRIPT.read_text().split(f"\n{name}=", 1)[1].split()[0])


def test_plan_prints_every_step_and_the_caps_fit_the_budget() -> None:
    """`.ci/gpu --plan` runs nothing (no GPU needed); the caps of every step but the
    whole suite, the grace a stopped step has before SIGKILL and the summary's reserve
    fit the job's default budget, so no step is starved by the others' time on an H100
    or H200, and a step killed at the end of its grace has not eaten the summary's."""
    p = _script("--plan")
    assert p.returncode == 0, p.stderr
    steps = _step_table()
    text = SCRIPT.read_text()
    budget, reserve = _setting("DEFAULT_BUDGET_S"), _setting("SUMMARY_RESERVE_S")
    grace = _setting("KILL_GRACE_S")
    assert budget <= 570  # within the device's 600 s a command, 30 s left to pack the output
    assert 0 < grace <= 20 and "--kill-after=$KILL_GRACE_S" in text
    leftover = text.split('\nLEFTOVER_STEPS="', 1)[1].split('"', 1)[0].split()
    assert leftover == ["sweep-warm", "pytest"]  # the last steps, in the table's order
    assert [n for n, _, _ in steps[-len(leftover):]] == leftover
    total = sum(cap for name, cap, _ in steps if name not in leftover)
    assert total + grace + reserve <= budget
    assert f"caps: {total} s + {grace} s of kill grace + {reserve} s for the summary = " \
           f"{total + grace + reserve} s of a {budget} s budget" in p.stdout
    # The job's own work between the steps (the CUDA check, a finalize after a stopped
    # step, its SIGINT-to-exit) took 42 s of the 2026-11-27 job: 45 s are kept for it.
    outside = budget - total - grace - reserve
    assert _setting("MIN_OUTSIDE_S") >= 45 and outside >= _setting("MIN_OUTSIDE_S")
    assert f"outside them: {outside} s for the job's own work between the steps" in p.stdout
    for name, cap, expect in steps:
        assert 0 < expect <= cap, name
        assert f"run_step {name} " in text or f"run_step --log-outside {name} " in text \
            or f"run_step {name} \\" in text, f"{name} is never run"
        assert p.stdout.count(f"\n{name} ") == 1, name
    # What the first H200 job never reached is a step now.
    for step in ("resume", "cache-modes", "throttle", "acceptance", "ncu", "history",
                 "pytest-gpu", "pytest"):
        assert step in dict((n, c) for n, c, _ in steps)


def test_every_cap_says_whether_it_is_measured_or_estimated() -> None:
    """Each step's cap has its basis in the comment under the table: a measurement (the
    table's measured column holds it) or an estimate saying how it was made."""
    text = SCRIPT.read_text()
    basis = {}
    for line in text.split("# Where each cap comes from", 1)[1].splitlines()[1:]:
        if line.startswith("#   "):
            name, kind = line[4:].split()[:2]
            basis[name] = kind
        elif basis:
            break
    table = text.split("STEP_TABLE='", 1)[1].split("'", 1)[0].strip().splitlines()
    measured = {ln.split()[0]: ln.split()[3] for ln in table}
    assert set(basis) == set(measured)  # every step, no other
    for name, kind in basis.items():
        assert kind in ("measured:", "estimate:"), name
        # a measured cap's time is in the table (">N": stopped at its cap then, a lower
        # bound); an estimated one's may be (an old run)
        if kind == "measured:":
            assert re.fullmatch(r">?\d+", measured[name]), name
        assert measured[name] == "-" or re.fullmatch(r">?\d+", measured[name]), name


def _rehearse(out: Path, *steps: str, budget: int | None = None, timeout: int = 120,
              env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", **(env_extra or {}))
    if budget is not None:
        env["GPU_CI_BUDGET_S"] = str(budget)
    return subprocess.run(["bash", str(SCRIPT), "--rehearse", str(out), *steps],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_a_step_is_given_the_budget_less_the_summarys_reserve_and_the_kill_grace(tmp_path
                                                                                ) -> None:
    """A step's limit leaves the summary's reserve and the grace its SIGKILL may come
    after: a step stopped at its limit and killed at the end of its grace still leaves
    the summary its time.  With too little left it is not started."""
    reserve, grace = _setting("SUMMARY_RESERVE_S"), _setting("KILL_GRACE_S")
    p = _rehearse(tmp_path / "a", "ncu", budget=reserve + grace + 20)
    assert p.returncode == 0, p.stdout + p.stderr
    # 20 s: not the rehearsal's 300 s cap, nor 20 + grace; a second or two less where a
    # loaded machine took that long to reach the step (the budget counts from the start)
    limit = re.search(r"\[ncu\] .*\(limit (\d+) s\)", p.stdout)
    assert limit and 20 - 5 <= int(limit.group(1)) <= 20, p.stdout
    p = _rehearse(tmp_path / "b", "ncu", budget=reserve + grace + 5)
    assert p.returncode == 0, p.stdout + p.stderr
    tsv = (tmp_path / "b" / "steps.tsv").read_text()
    left = re.search(r"ncu\tskipped\t0\t-\tnot started: it needs about 10 s, (\d+) s of the "
                     r"job's \d+ s budget were left", tsv)
    assert left and 5 - 3 <= int(left.group(1)) <= 5, tsv  # as above, a loaded machine's


def test_a_leftover_step_is_started_only_with_its_whole_cap_left(tmp_path) -> None:
    """The warm sweep and the whole suite run on what the other steps leave, and only
    when their whole cap is left: never cut short (a cut would fail the job)."""
    reserve, grace = _setting("SUMMARY_RESERVE_S"), _setting("KILL_GRACE_S")
    p = _rehearse(tmp_path / "a", "sweep-warm", budget=reserve + grace + 100)
    assert p.returncode == 0, p.stdout + p.stderr
    tsv = (tmp_path / "a" / "steps.tsv").read_text()
    # the rehearsal's cap (300 s) is each step's there
    assert "sweep-warm\tskipped\t0\t-\tnot started: it needs about 300 s, " in tsv


def test_a_step_without_its_expected_time_left_is_skipped_with_the_reason() -> None:
    text = SCRIPT.read_text()
    assert 'local why="not started: it needs about ${expect} s' in text
    assert 'record "$name" skipped 0 "$why"' in text
    assert '"$SKIPPED_RC") record "$name" skipped' in text


def test_the_gpu_tests_are_never_skipped_for_time(tmp_path: Path) -> None:
    """A step not started for lack of time is a skip, which reads as a pass: pytest-gpu
    is not skipped so.  The steps before it leave it its expected time (ncu is not
    started, saying why), and when it still cannot start it fails, and the job too."""
    reserve, grace = _setting("SUMMARY_RESERVE_S"), _setting("KILL_GRACE_S")
    p = _rehearse(tmp_path / "a", "ncu", "pytest-gpu", budget=reserve + grace + 15,
                  env_extra={"GPU_CI_REHEARSE_CAP_S": "2"})
    status = _statuses(tmp_path / "a")
    assert status["ncu"][0] == "skipped", p.stdout
    assert status["ncu"][1].startswith("not started: it needs about 10 s, 5 s of the job's")
    assert "(10 s kept for pytest-gpu after it)" in status["ncu"][1]
    assert status["pytest-gpu"] == ("timeout", "stopped after its 2 s limit")  # started
    p = _rehearse(tmp_path / "b", "ncu", "pytest-gpu", budget=reserve + grace + 5)
    assert p.returncode == 1, p.stdout + p.stderr
    st, note = _statuses(tmp_path / "b")["pytest-gpu"]
    assert st == "fail" and note.startswith("not started: it needs about 10 s")
    assert note.endswith("the job fails without it")


def _statuses(out: Path) -> dict[str, tuple[str, str]]:
    rows = [ln.split("\t") for ln in (out / "steps.tsv").read_text().splitlines()[1:]]
    return {r[0]: (r[1], r[4]) for r in rows}


def _function(name: str) -> str:
    """A shell function of the script, as written there."""
    text = SCRIPT.read_text()
    body = text[text.index(f"\n{name}() {{") + 1:]
    return body[:body.index("\n}\n") + 3]


def test_only_an_unfinished_run_costs_a_finalize(tmp_path: Path) -> None:
    """After a stopped step the job finalizes what a kill left unfinished: a Python start
    each for runs/ and fleet-run/, which cost every one of the 2026-11-27 job's 5
    timeouts two, finalizing nothing; now only a journal or a fleet folder without its
    fleet.md calls it."""
    def unfinished(tree: Path) -> bool:
        script = _function("unfinished") + '\nunfinished "$1"'
        return subprocess.run(["bash", "-c", script, "bash", str(tree)]).returncode == 0

    done = tmp_path / "runs" / "h200" / "quick"
    done.mkdir(parents=True)
    (done / "results.json").write_text("{}")
    assert not unfinished(tmp_path / "runs") and not unfinished(tmp_path / "none")
    (done / "rows.jsonl").write_text("{}\n")
    assert unfinished(tmp_path / "runs")
    fleet = tmp_path / "fleet-run" / "fleet" / "quick"
    (fleet / "ranks" / "rank-0").mkdir(parents=True)
    assert unfinished(tmp_path / "fleet-run")
    (fleet / "fleet.md").write_text("")
    assert not unfinished(tmp_path / "fleet-run")


def _compare_step(base: Path, run: Path, out: Path, limit: int) -> subprocess.CompletedProcess:
    """The script's compare step (its compare_step; run_step and the step's limit
    stubbed): what it prints and its exit code, which run_step records (0 pass, its
    `verdict:` line the note; else fail, its last line the note)."""
    script = "\n".join([
        f"step_limit() {{ echo {limit}; }}", 'run_step() { shift; "$@"; }',
        f"COMPARE_OWN_S={_setting('COMPARE_OWN_S')}", _function("compare_step"),
        'compare_step "$1" "$2"'])
    env = dict(os.environ, PY=sys.executable, OUT=str(out))
    return subprocess.run(["bash", "-c", script, "bash", str(base), str(run)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.checkout
def test_compare_fails_on_the_gates_checks_and_reports_a_regression(tmp_path: Path) -> None:
    """The compare step told a FAIL of the gate's own checks (a baseline newer than the
    run, as the committed H200 baseline is than the 2026-11-27 run) from rows measured
    slower: it printed `verdict: REGRESSION` and passed for either.  Now the FAIL fails
    the step with its reason; a regression is its note and it passes, the rows re-timed
    within the step's limit less compare's own work (here 1 s: none is, and the report
    says why), the report written."""
    out = tmp_path / "runs"
    p = subprocess.run([sys.executable, "run_bench.py", "--device", "cpu", "--kernels", "add",
                        "--dtypes", "fp32", "--providers", "torch", "--sizes", "n=65536",
                        "--no-measure-ceilings", "--run-budget", "2", "--row-budget", "0.3",
                        "--no-plots", "--out", str(out), "--run-id", "run"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    run = out / "cpu" / "run"
    doc = json.loads((run / "results.json").read_text())
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**doc, "metadata": {**doc["metadata"],
                                                    "created": "2099-01-01T00:00:00+00:00"}}))
    p = _compare_step(newer, run, tmp_path / "a", 36)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.rstrip().splitlines()[-1].startswith(
        "verdict: FAIL (baseline newer than run")
    # A baseline made before the run, its samples tight and ten times as fast as the
    # run's fastest: its row is slower past doubt.
    for row in doc["rows"]:
        fast = min(row["samples_ms"]) / 10
        row["samples_ms"] = [fast * (1 + 0.001 * q) for q in range(30)]
        row.update(ms_median=fast, ms_p20=fast, ms_p80=fast * 1.03, n_samples=30)
    doc["metadata"]["created"] = "2000-01-01T00:00:00+00:00"
    faster = tmp_path / "faster.json"
    faster.write_text(json.dumps(doc))
    own = _setting("COMPARE_OWN_S")
    p = _compare_step(faster, run, tmp_path / "b", own + 1)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.rstrip().splitlines()[-1].startswith("verdict: REGRESSION (1 slower")
    md = (tmp_path / "b" / "compare.md").read_text()
    assert "- not re-timed: 1 row that looked slower, their verdicts unconfirmed: add " \
           "torch fp32 n=65536" in md and "(re-timing bound 1 s)" in md


def test_the_providers_step_leaves_out_the_largest_shape() -> None:
    """providers stopped at its cap on 2026-11-27 after 35 of 36 rows: its float64 checks
    took 9.6 s, and S = 16384 held 3/4 of the references' work (B H S^2) and sdpa-math's
    40-83 ms calls.  It runs quick's other shapes, both masks, every provider."""
    from benches.sweep.shapes import parse_sizes, preset_shapes
    from kernels import REGISTRY

    text = SCRIPT.read_text()
    block = text[text.index('providers_sizes="'):text.index("run_step providers")]
    sizes = ";".join(re.findall(r'"([^"]*)"', block)).strip(";")
    shapes = parse_sizes(sizes, [REGISTRY["attention"]])
    quick = preset_shapes(REGISTRY["attention"], "quick", True)

    def work(shapes: list[dict[str, int]]) -> int:
        return sum(s["B"] * s["H"] * s["S"] ** 2 for s in shapes)

    assert all(s in quick for s in shapes) and max(s["S"] for s in shapes) == 4096
    assert {s["causal"] for s in shapes} == {0, 1} and len(shapes) == len(quick) - 2
    assert work(shapes) <= 0.25 * work(quick)
    line = text[text.index("run_step providers"):].split("\n", 3)
    assert "torch,compile,sdpa-flash,sdpa-cudnn,sdpa-efficient,sdpa-math" in "".join(line)


# ---- the summary of saved runs ------------------------------------------------------------

def ci_row(kernel: str, provider: str, dtype: str, shape: str, nbytes: float, *,
         gbps: float | None = None, tflops: float | None = None, flops: float = 1.0,
         status: str = "ok", reason: str = "") -> dict[str, Any]:
    """A row in results.json's format; its time follows from gbps or tflops."""
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(kernel=kernel, provider=provider, dtype=dtype, shape=shape, bytes=nbytes,
               flops=flops, intensity=flops / nbytes, status=status, reason=reason)
    if status == "ok":
        ms = nbytes / (gbps * 1e9) * 1e3 if gbps else flops / (tflops * 1e12) * 1e3
        row.update(ms_median=ms, ms_p20=ms, ms_p80=ms, n_samples=10, correct=True,
                   gbps=nbytes / (ms * 1e-3) / 1e9, tflops=flops / (ms * 1e-3) / 1e12)
    return row


def mm_row(provider: str, dtype: str, s: int, tflops: float, **kw: Any) -> dict[str, Any]:
    return ci_row("matmul", provider, dtype, f"M={s},N={s},K={s}", 3.0 * s * s * 2,
                tflops=tflops, flops=2.0 * s**3, **kw)


def write_ci_run(folder: Path, rows: list[dict[str, Any]], *, measured: bool = True,
           fp8_accum: str = "fast") -> Path:
    ceilings = {"datasheet": {"tflops": {"bf16": 989.4, "fp8": 1978.9}, "hbm_gbps": 3350.0,
                              "l2_gbps": None},
                "measured": {"tflops": {"fp32": 60.0, "bf16": 800.0, "fp8": 1300.0},
                             "hbm_gbps": COPY_GBPS, "l2_gbps": None} if measured else None}
    # A finished run's metadata, as the sweep writes it: `complete` says so (a run without
    # the key reads as not whole, contract/run_meta.py RunState).
    meta = {"run_id": folder.name, "device_key": "h100", "device_name": "NVIDIA H100 80GB HBM3",
            "fp8_accum": fp8_accum, "ceilings": ceilings, "complete": True}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"metadata": meta, "rows": rows}))
    return folder


N26 = 1 << 26


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    quick = write_ci_run(tmp_path / "quick", [
        # add bf16, 384 MiB: 0.95 of copy and 1.056x torch eager: met
        ci_row("add", "triton", "bf16", f"n={N26}", 3 * 2 * N26, gbps=2850),
        ci_row("add", "torch", "bf16", f"n={N26}", 3 * 2 * N26, gbps=2700),
        # add fp16 without a torch row at that shape: half measured
        ci_row("add", "triton", "fp16", f"n={N26}", 3 * 2 * N26, gbps=2850),
        # mul fp32: 0.90 of copy, under 0.92: missed
        ci_row("mul", "triton", "fp32", f"n={N26}", 3 * 4 * N26, gbps=2700),
        ci_row("mul", "torch", "fp32", f"n={N26}", 3 * 4 * N26, gbps=2600),
        # gelu bf16 at 4 MiB only: not large enough
        ci_row("gelu", "triton", "bf16", "n=1048576", 2 * 2 * 2**20, gbps=2000),
        # dot fp32 at a large size, but failed
        ci_row("dot", "triton", "fp32", f"n={N26}", 2 * 4 * N26 + 4, status="failed",
             reason="rel_err 0.9 > tolerance\ntraceback"),
        # matvec bf16 8192 x 8192 at 0.8667 of copy (>= 0.85); 4096 x 4096 ignored
        ci_row("matvec", "triton", "bf16", "M=8192,K=8192", 2.0 * (8192 * 8192 + 2 * 8192),
             gbps=2600),
        ci_row("matvec", "triton", "bf16", "M=4096,K=4096", 2.0 * (4096 * 4096 + 2 * 4096),
             gbps=100),
        mm_row("triton", "bf16", 4096, 700),  # 0.933 of torch: missed (timed throttled)
        {**mm_row("torch", "bf16", 4096, 750), "throttled": True},
        mm_row("torch", "bf16", 8192, 800),  # no Triton row at 8192
    ])
    big = write_ci_run(tmp_path / "matmul-8192", [
        mm_row("triton", "fp8", 8192, 1250), mm_row("torch", "fp8", 8192, 1300),  # 0.96: met
        mm_row("torch", "bf16", 8192, 790),  # given later: the headline's cuBLAS bf16
    ])
    precise = write_ci_run(tmp_path / "fp8-precise", [mm_row("torch", "fp8", 8192, 1100)],
                     measured=False, fp8_accum="precise")
    return [quick, big, precise]


def _checks(paths: list[Path]) -> dict[str, targets.Check]:
    return {c.target: c for c in targets.checks([targets.load(str(p)) for p in paths])}


def test_ratios_and_verdicts(runs: list[Path]) -> None:
    c = _checks(runs)
    add = c["add bf16"]
    assert add.verdict == MET
    assert [p.value for p in add.parts] == pytest.approx([0.95, 2850 / 2700])
    assert add.case == "n=67108864, 384 MiB (quick)"
    mul = c["mul fp32"]
    assert mul.verdict == MISSED and mul.parts[0].value == pytest.approx(0.90)
    assert "missed: of copy: 2.2% short" in mul.cells()[-1]
    assert c["matvec bf16"].verdict == MET
    assert c["matvec bf16"].parts[0].value == pytest.approx(2600 / COPY_GBPS)
    mm = c["matmul bf16 4096^3"]
    assert mm.verdict == MISSED and mm.parts[0].value == pytest.approx(700 / 750)
    assert mm.case == "M=4096,N=4096,K=4096 (quick, throttled)"
    fp8 = c["matmul fp8 8192^3"]
    assert fp8.verdict == MET and fp8.parts[0].value == pytest.approx(1250 / 1300)
    assert fp8.case == "M=8192,N=8192,K=8192 (matmul-8192)"


def test_not_measured_says_why(runs: list[Path]) -> None:
    c = _checks(runs)
    why = {t: c[t].cells()[-1] for t in ("gelu bf16", "dot fp32", "add fp8", "add fp16",
                                          "matmul bf16 8192^3", "matvec fp32")}
    assert all(w.startswith(NOT_MEASURED) for w in why.values()), why
    assert "no row at >= 256 MiB (largest: n=1048576, 4 MiB)" in why["gelu bf16"]
    assert "Triton row failed (rel_err 0.9 > tolerance)" in why["dot fp32"]
    assert "no Triton row" in why["add fp8"]
    # vs copy measured (met), vs eager not: the target as a whole is not measured
    assert c["add fp16"].parts[0].verdict == MET
    assert "no torch row at that shape" in why["add fp16"]
    assert why["matmul bf16 8192^3"] == "not measured: no Triton row"


def test_a_row_needs_its_own_runs_copy_bandwidth(tmp_path: Path) -> None:
    run = write_ci_run(tmp_path / "r", [ci_row("add", "triton", "bf16", f"n={N26}", 6 * N26,
                                       gbps=2850)], measured=False)
    check = _checks([run])["add bf16"]
    assert check.verdict == NOT_MEASURED
    assert "run r has no measured copy bandwidth" in check.cells()[-1]


def test_the_largest_footprint_counts(tmp_path: Path) -> None:
    n27, n = 1 << 27, 3 << 25  # 384 MiB and 288 MiB of fp8 add: both large
    a = write_ci_run(tmp_path / "a",
                     [ci_row("add", "triton", "fp8", f"n={n27}", 3 * n27, gbps=2700),
                      ci_row("add", "torch", "fp8", f"n={n27}", 3 * n27, gbps=900)])
    b = write_ci_run(tmp_path / "b", [ci_row("add", "triton", "fp8", f"n={n}", 3 * n, gbps=100)])
    check = _checks([a, b])["add fp8"]  # a's row is the larger, though b is given later
    assert check.verdict == MET and check.case == "n=134217728, 384 MiB (a)"
    assert [p.value for p in check.parts] == pytest.approx([0.90, 3.0])


def test_headline_figures(runs: list[Path]) -> None:
    rows = {r[0]: r[1:] for r in targets.headline([targets.load(str(p)) for p in runs])}
    assert rows["copy bandwidth (measured)"] == [
        "3000 GB/s (0.90 of the datasheet's 3350)", "all 2 runs that measured it"]
    assert rows["cuBLAS bf16 (torch.matmul) 8192^3"] == ["790 TFLOP/s", "matmul-8192"]
    fp8 = "cuBLAS fp8 (torch._scaled_mm) 8192^3"
    assert rows[f"{fp8}, fast accumulation"] == ["1300 TFLOP/s", "matmul-8192"]
    assert rows[f"{fp8}, precise accumulation"] == ["1100 TFLOP/s", "fp8-precise"]


def _steps(path: Path) -> Path:
    # As .ci/gpu's record() writes it: header, then step, status, seconds, log, note.
    path.write_text("step\tstatus\tseconds\tlog\tnote\n"
                    "sweep\tpass\t61\tlogs/sweep.log\t\n"
                    "compare\tskipped\t0\t-\tno baseline results/baselines/h100.json\n"
                    "pytest\tfail\t200\tlogs/pytest.log\texit 1: 2 failed, 700 passed\n")
    return path


def test_cli_writes_the_summary(runs: list[Path], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "summary.md"
    code = roofline_main(["targets", *map(str, runs), "--steps", str(_steps(tmp_path / "s")),
                          "--md", str(md)])
    out = capsys.readouterr().out
    assert code == 0  # missed targets are findings, not errors
    assert md.read_text() == out
    assert "## Targets: 3 met, 2 missed, 38 not measured" in out
    assert "## Steps: 2 of 3 passed or skipped" in out
    assert "| pytest | fail | 200 | logs/pytest.log | exit 1: 2 failed, 700 passed |" in out
    assert "these runs are on" not in out  # an H100: no device caveat


def test_cli_fleet_rows(runs: list[Path], tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    quick = runs[0]
    rows = json.loads((quick / "results.json").read_text())["rows"]
    same = write_ci_run(tmp_path / "fleet-same", rows)
    assert roofline_main(["targets", str(quick), "--same-rows", str(quick), str(same)]) == 0
    assert "same rows: same 12 rows, same statuses" in capsys.readouterr().out
    fewer = write_ci_run(tmp_path / "fleet-fewer", rows[1:])
    assert roofline_main(["targets", str(quick), "--same-rows", str(quick), str(fewer)]) == 1
    assert "ROWS DIFFER: 1 only in the plain run (first: add triton bf16 n=67108864)" \
        in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    ([], "give at least one RUN"),
    (["{run}", "--md", "{run}/summary.md"], "would write into a run folder"),
    (["{run}", "--md", "{run}/results.json"], "would overwrite measured results"),
    (["{run}", "--steps", "{tmp}/bad.tsv"], "not a steps file"),
    (["{tmp}/none"], "no results found"),
])
def test_cli_errors_are_one_line(runs: list[Path], tmp_path: Path, args: list[str], says: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.tsv").write_text("sweep pass\n")
    code = roofline_main(["targets", *(a.format(run=runs[0], tmp=tmp_path) for a in args)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and says in err
    assert not (runs[0] / "summary.md").exists()


def _attn(provider: str, s: int, causal: int, tflops: float, **kw: Any) -> dict[str, Any]:
    b, h, d = 16384 // s, 16, 128
    flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
    return ci_row("attention", provider, "bf16", f"B={b},H={h},S={s},D={d},causal={causal}",
                4 * b * h * s * d * 2, tflops=tflops, flops=flops, **kw)


def test_the_step_kernels_targets(tmp_path: Path) -> None:
    """Issue 28's targets: row ops against the copy at >= 64 MiB, Triton attention bf16
    D=128 against SDPA (flash) and against 50% of the bf16 peak."""
    peak = {"peak_tflops": 989.4}
    rows = [
        # rmsnorm bf16, 64 MiB each way (128 MiB): 0.93 of copy: met; 32 MiB ignored
        ci_row("rmsnorm", "triton", "bf16", "M=8192,N=4096", 2 * 2 * 8192 * 4096 + 8192,
             gbps=0.93 * COPY_GBPS),
        ci_row("rmsnorm", "triton", "fp16", "M=2048,N=4096", 2 * 2 * 2048 * 4096 + 8192,
             gbps=0.99 * COPY_GBPS),
        # softmax fp32 at 256 MiB: 0.85 of copy: missed
        ci_row("softmax", "triton", "fp32", "M=8192,N=4096", 2 * 4 * 8192 * 4096,
             gbps=0.85 * COPY_GBPS),
        # S=8192: 520 / 560 TFLOP/s = 0.929x SDPA, 52.6% of 989.4: met
        {**_attn("triton", 8192, 0, 520), **peak},
        {**_attn("torch", 8192, 0, 560), "reason": "SDPA backend: flash"},
        # S=16384 causal: 0.8x SDPA and 40% of peak: both missed
        {**_attn("triton", 16384, 1, 0.4 * 989.4), **peak},
        {**_attn("torch", 16384, 1, 0.5 * 989.4)},
    ]
    c = _checks([write_ci_run(tmp_path / "step", rows)])
    assert c["rmsnorm bf16"].verdict == MET
    assert c["rmsnorm bf16"].parts[0].value == pytest.approx(0.93)
    assert "no row at >= 64 MiB" in c["rmsnorm fp16"].cells()[-1]  # 32 MiB: too small
    assert c["softmax fp32"].verdict == MISSED
    a = c["attention bf16 D=128 S=8192"]
    assert a.verdict == MET
    assert [p.value for p in a.parts] == pytest.approx([520 / 560, 520 / 989.4])
    assert "SDPA backend: flash" in a.case
    slow = c["attention bf16 D=128 S=16384 causal"]
    assert slow.verdict == MISSED
    assert [p.value for p in slow.parts] == pytest.approx([0.8, 0.4])
    assert c["attention bf16 D=128 S=4096"].verdict == NOT_MEASURED
    assert "no Triton row" in c["attention bf16 D=128 S=4096"].cells()[-1]


# ---- the job rehearsed on a CPU -----------------------------------------------------------

@pytest.mark.slow
def test_the_job_rehearsed_on_a_cpu_passes_with_every_step_run_or_skipped_with_why(
        tmp_path: Path) -> None:
    """`.ci/gpu --rehearse`: every step's command, its outputs, the finalize of a killed
    run and the summary, on this CPU (3 to 4 minutes on the 2-core VM)."""
    out = tmp_path / "job"
    p = _rehearse(out, timeout=1800,
                  env_extra={"GPU_CI_REHEARSE_SELECT": "--kernels add --dtypes fp32"})
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    rows = [ln.split("\t") for ln in (out / "steps.tsv").read_text().splitlines()[1:]]
    status = {r[0]: (r[1], r[4]) for r in rows}
    steps = [name for name, _, _ in _step_table()] + ["rehearse"]
    assert sorted(status) == sorted(steps) and len(rows) == len(steps)  # each once
    for name, (st, note) in status.items():
        assert st == "pass" or (st == "skipped" and note), (name, st, note)
    assert status["pytest"] == ("skipped", "the whole suite on a CPU is .ci/run's job")
    assert status["rehearse"][0] == "pass"  # the launch rehearsal ran (add fp32, sm_90)
    # the physics check read every run the job wrote, its count the note
    assert status["check"][0] == "pass" and " values withheld: " in status["check"][1]
    # the sweep's run against itself: no row slower, nothing re-timed, no FAIL
    assert status["compare"] == ("pass", status["compare"][1])
    assert status["compare"][1].startswith("verdict: OK (")
    # the sweep ran past its rehearsal cap and was killed; its journal was written whole
    assert status["sweep"][1].startswith("killed at its 40 s rehearsal cap, as designed")
    quick = out / "runs" / "cpu" / "quick"
    doc = json.loads((quick / "results.json").read_text())
    assert not (quick / "rows.jsonl").exists()
    assert doc["rows"] and doc["metadata"]["complete"] is False
    assert "finalized from its row journal" in json.dumps(doc["metadata"])
    summary = (out / "summary.md").read_text()
    assert "## Steps: " in summary and "One-rank fleet run against the plain run" in summary
    assert p.stdout.rstrip().splitlines()[-1].startswith("gpu job (rehearsed): passed in ")
