"""Fleet acceptance end to end: one 2-rank torchrun on this CPU (gloo), with the
test-only hooks of benches/fleet/acceptance.py: rank 0 fed a planted wrong product,
rank 1 slowed 10x (the fleet run's slow-rank hook).  The GPU-only checks are UNKNOWN;
the CPU stress, its equality checks, the copy and the busbw are measured for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benches.fleet.acceptance_records import Node, RankRecord
from benches.fleet.acceptance_rules import (
    CRITICAL,
    OK,
    PASSIVE,
    UNKNOWN,
    WARN,
    Thresholds,
    judge_fleet,
)

ROOT = Path(__file__).resolve().parent.parent


def verdicts(doc: dict, rank: int) -> dict[str, str]:
    gpu = next(g for g in doc["gpus"] if g["rank"] == rank)
    return {c["check"]: c["verdict"] for c in gpu["checks"]}


def torchrun(out: Path, minutes: str, hooks: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBENCH_TEST_")}
    env.update(hooks)
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "run_bench.py", "--device", "cpu", "--acceptance", "--minutes", minutes,
         "--out", str(out), "--run-id", "t"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("acceptance")
    proc = torchrun(out, "0.05", {"GPUBENCH_TEST_WRONG_RANK": "0",
                                  "GPUBENCH_TEST_SLOW_RANK": "1"})
    return proc, out / "acceptance" / "t"


def test_a_cpu_fleet_is_judged_end_to_end(run):
    proc, folder = run
    # torchrun turns rank 0's exit 2 into its own 1: the verdict line tells.
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"verdict: CRITICAL (exit 2) {folder / 'acceptance.json'}"
    assert "exitcode  : 2" in proc.stderr  # torchrun's report of rank 0
    doc = json.loads((folder / "acceptance.json").read_text())
    assert (doc["verdict"], doc["exit_code"], doc["world"]) == (CRITICAL, 2, 2)
    assert (folder / "acceptance.md").read_text().startswith("# Fleet acceptance: CRITICAL")
    assert (folder / "acceptance.png").stat().st_size > 0
    for rank in (0, 1):
        v = verdicts(doc, rank)
        assert {k: v[k] for k in PASSIVE} == dict.fromkeys(PASSIVE, UNKNOWN)  # no NVML
        s = doc["ranks"][rank]["stress"]["fp32"]
        assert s["reference_ok"] and s["iterations"] >= 3
    # The planted product: rank 0 CRITICAL by the equality check alone.
    assert doc["ranks"][0]["stress"]["fp32"]["mismatches"] == 1
    assert verdicts(doc, 0)["sdc_fp32"] == CRITICAL and verdicts(doc, 1)["sdc_fp32"] == OK
    # Both ranks multiplied the same inputs to the same bits.
    assert doc["ranks"][0]["stress"]["fp32"]["digest"] == \
        doc["ranks"][1]["stress"]["fp32"]["digest"]
    # The slow rank: 10x slower, ~82% under the median of two (their mean).
    assert verdicts(doc, 1)["matmul_fp32"] == CRITICAL == verdicts(doc, 1)["copy_bw"]
    assert verdicts(doc, 0)["matmul_fp32"] == OK
    node = doc["nodes"][0]
    assert node["checks"][0]["check"] == "busbw" and node["busbw"]["busbw_gbps"] > 0
    assert node["checks"][0]["verdict"] == UNKNOWN  # a CPU has no expected link figure


def test_the_slow_rank_is_warn_or_critical_by_its_margin(run):
    """The run's own figures judged again with a CRITICAL limit past the slow rank's
    margin: WARN; its margin decides, not the hook."""
    _, folder = run
    doc = json.loads((folder / "acceptance.json").read_text())
    nodes = [Node(n["host"], tuple(n["ranks"])) for n in doc["nodes"]]
    shortfall = 1 - doc["ranks"][1]["stress"]["fp32"]["tflops"] / (
        (doc["ranks"][0]["stress"]["fp32"]["tflops"]
         + doc["ranks"][1]["stress"]["fp32"]["tflops"]) / 2)
    assert 0.6 < shortfall < 0.95
    ranks = [RankRecord.from_json(r) for r in doc["ranks"]]
    again = judge_fleet(ranks, nodes, Thresholds(median_critical_pct=96))
    assert verdicts(again.to_json(), 1)["matmul_fp32"] == WARN


def test_an_existing_run_is_refused_without_a_verdict(run):
    """Nothing measured is overwritten; the refusal is a usage-class error (exit 2 on
    every rank, one line each), told apart from CRITICAL by the missing verdict line."""
    _, folder = run
    before = (folder / "acceptance.json").read_bytes()
    proc = torchrun(folder.parent.parent, "0.01", {})
    assert proc.returncode == 1 and "verdict:" not in proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 2 and all("exists already" in ln for ln in errors)
    assert (folder / "acceptance.json").read_bytes() == before


def test_error_lines_of_two_ranks_never_interleave():
    """Two processes sharing one stderr pipe, Python's stderr unbuffered (as under
    torchrun here): each line is one write, text and newline together.  print() writes
    them apart, and the other process's line lands between them (hundreds of 4000
    lines with print)."""
    code = ("import sys\nfrom benches.fleet.rank_io import say_line\n"
            "for i in range(2000): say_line(f'error: rank {sys.argv[1]} line {i} ' + 'x' * 60)")
    r, w = os.pipe()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(k)], cwd=ROOT, env=env,
                              stderr=w) for k in (0, 1)]
    os.close(w)
    with open(r, "rb") as f:
        lines = f.read().decode().splitlines()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    whole = [ln for ln in lines if ln.startswith("error: rank ") and ln.count("error:") == 1
             and ln.endswith("x" * 60)]
    assert len(lines) == len(whole) == 4000


def test_every_error_line_of_a_rank_goes_through_say_line():
    """No print(..., file=sys.stderr) left in the fleet's modules or the entry point."""
    import ast

    files = [*sorted((ROOT / "benches" / "fleet").glob("*.py")), ROOT / "run_bench.py"]
    bare = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
                    and any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr"
                            and isinstance(node.args[0], ast.JoinedStr)
                            and ast.unparse(node.args[0]).startswith("f'error:")
                            for k in node.keywords if node.args)):
                bare.append(f"{path.name}:{node.lineno}")
    assert not bare
