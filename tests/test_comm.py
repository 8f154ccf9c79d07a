"""Communication in the plan: nccl-tests' busbw conventions and the step's collectives,
on hand-computed examples."""

from __future__ import annotations

import json

import pytest

from contract.metrics import BUSBW_FACTOR
from contract.schema import ALL_COLUMNS
from roofline.plan.cli import main as plan_main
from roofline.plan.comm import collective_seconds, step_communication


@pytest.mark.parametrize("n, all_reduce, gather", [(2, 1.0, 0.5), (4, 1.5, 0.75),
                                                   (8, 1.75, 0.875)])
def test_busbw_factors(n, all_reduce, gather):
    assert BUSBW_FACTOR["all_reduce"](n) == all_reduce
    assert BUSBW_FACTOR["all_gather"](n) == BUSBW_FACTOR["reduce_scatter"](n) == gather
    assert BUSBW_FACTOR["all_to_all"](n) == gather
    assert BUSBW_FACTOR["broadcast"](n) == 1.0


def test_the_issues_example_8b_bf16_32_gpus_400_gbps():
    # all-reduce time = 2 x 31/32 x 16 GB / 400 GB/s = 77.5 ms
    assert collective_seconds("all_reduce", 8e9 * 2, 32, 400) == pytest.approx(0.0775)
    c = step_communication(8e9, 32, 400, 2, 2, compute_s=0.5, steps=1000, busbw_source="x")
    assert c.data_parallel.comm_s == pytest.approx(0.0775)
    # FSDP: weights gathered twice (2 x 31/32 x 16 GB) + gradients reduce-scattered
    # (31/32 x 16 GB), at 400 GB/s: 77.5 + 38.75 ms
    assert c.fsdp.comm_s == pytest.approx(0.0775 + 0.03875)
    assert c.data_parallel.hides  # 77.5 ms under a 333 ms backward
    assert c.data_parallel.step_s_overlap == 0.5
    assert c.data_parallel.step_s_serial == pytest.approx(0.5775)
    assert c.data_parallel.days_serial == pytest.approx(1000 * 0.5775 / 86400)


def test_communication_that_does_not_hide():
    c = step_communication(8e9, 32, 10, 2, 2, compute_s=0.5, steps=None, busbw_source="x")
    dp = c.data_parallel
    assert not dp.hides and dp.comm_s == pytest.approx(3.1)
    assert dp.days_overlap is None and "days_overlap" not in dp.to_json()
    # Only what sticks out past the backward (2/3 of the compute) adds to the step.
    assert dp.step_s_overlap == pytest.approx(0.5 + 3.1 - 0.5 * 4 / 6)


def test_the_plan_shows_it(capsys):
    assert plan_main(["--params", "8e9", "--gpus", "32", "--busbw", "400", "--tokens",
                      "1e12", "--json", "--no-save"]) == 0
    plan = json.loads(capsys.readouterr().out)
    c = plan["communication"]
    assert c["data_parallel"]["comm_s"] == pytest.approx(0.0775)
    assert c["grad_bytes_per_param"] == 2  # bf16-master: bf16 gradients
    assert c["steps"] == pytest.approx(1e12 / (32 * 2048))


def test_busbw_run_without_collective_rows_is_one_line(tmp_path, capsys):
    p = tmp_path / "results.json"
    p.write_text(json.dumps({"metadata": {}, "rows": []}))
    assert plan_main(["--params", "8e9", "--gpus", "8", "--busbw-run", str(p),
                      "--no-save"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no collective rows" in err[0]
    # What produces them: a fleet run under torchrun (run_bench.py rejects --kernels
    # all_reduce, the collectives being no kernel family of a single run).
    assert "torchrun" in err[0] and "--kernels" not in err[0]


def fleet_run(tmp_path, device: str, backend: str, ranks: int = 2,
              busbw: float = 1.6) -> str:
    """A fleet run's results.json with all_reduce rows as benches/fleet/run.py writes them."""
    rows = []
    for size in (2**20, 2**22):
        r = dict.fromkeys(ALL_COLUMNS)
        r.update(kernel="all_reduce", provider=backend, dtype="fp32", status="ok",
                 shape=f"bytes={size},ranks={ranks}", bytes=size, flops=0, device=device,
                 busbw_gbps=busbw * size / 2**22, algbw_gbps=busbw, ms_median=1.0,
                 rank=None, host="fleet")
        rows.append(r)
    d = tmp_path / f"fleet-{device}-{backend}"
    d.mkdir()
    (d / "results.json").write_text(json.dumps(
        {"metadata": {"device_key": device, "fleet": {"world": ranks, "backend": backend}},
         "rows": rows}))
    return str(d)


PLAN_32_H100 = ["--params", "8e9", "--gpus", "32", "--device", "h100", "--tokens", "1e12",
                "--no-save"]


def test_a_busbw_from_another_kind_of_device_is_refused(tmp_path, capsys):
    run = fleet_run(tmp_path, "cpu", "gloo")
    assert plan_main([*PLAN_32_H100, "--busbw-run", run]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "cpu, gloo, 2 ranks" in err[0] and "--force-busbw-run" in err[0]


def test_forced_it_is_used_with_warnings(tmp_path, capsys):
    run = fleet_run(tmp_path, "cpu", "gloo")
    assert plan_main([*PLAN_32_H100, "--busbw-run", run, "--force-busbw-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["communication"]["busbw_gbps"] == pytest.approx(1.6)
    w = " | ".join(plan["warnings"])
    assert "--force-busbw-run" in w and "over gloo" in w and "over nccl" in w
    assert "on 2 ranks" in w


def test_the_plans_device_but_another_backend_is_a_warning(tmp_path, capsys):
    run = fleet_run(tmp_path, "h100", "gloo", ranks=32)
    assert plan_main([*PLAN_32_H100, "--busbw-run", run, "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["warnings"]
    assert any("over gloo" in x for x in w) and not any("ranks" in x for x in w)
    run = fleet_run(tmp_path, "h100", "nccl", ranks=32)
    assert plan_main([*PLAN_32_H100, "--busbw-run", run, "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["warnings"]
    assert not any("busbw" in x for x in w)


def test_communication_days_are_the_compute_tables_with_attention(capsys):
    argv = ["--preset", "llama3-8b", "--gpus", "32", "--days", "14", "--busbw", "400"]
    assert plan_main([*argv, "--json", "--no-save"]) == 0
    plan = json.loads(capsys.readouterr().out)
    c = plan["communication"]
    assert c["data_parallel"]["hides"] and c["compute_basis"] == "6 N + attention"
    # Hidden communication adds nothing: the days are the compute table's, on its basis.
    assert c["data_parallel"]["days_overlap"] == pytest.approx(plan["days_with_attention"])
    assert plan["days_with_attention"] > 1.2 * plan["days"]  # 17.7 vs 14.0
    assert plan_main([*argv, "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "6 N + attention FLOPs per token; days on the same basis" in out
    # With --params alone there is no attention term: 6 N, said so.
    assert plan_main(["--params", "8e9", "--gpus", "32", "--days", "14", "--busbw", "400",
                      "--json", "--no-save"]) == 0
    plan = json.loads(capsys.readouterr().out)
    c = plan["communication"]
    assert c["compute_basis"] == "6 N"
    assert c["data_parallel"]["days_overlap"] == pytest.approx(plan["days"])
