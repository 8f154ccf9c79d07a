"""Communication in the plan: nccl-tests' busbw conventions and the step's collectives,
on hand-computed examples."""

from __future__ import annotations

import json

import pytest

from roofline.plan import main as plan_main
from roofline.plan.comm import BUSBW_FACTOR, collective_seconds, step_communication


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
    assert c["data_parallel"]["comm_s"] == pytest.approx(0.0775)
    # FSDP: weights gathered twice (2 x 31/32 x 16 GB) + gradients reduce-scattered
    # (31/32 x 16 GB), at 400 GB/s: 77.5 + 38.75 ms
    assert c["fsdp"]["comm_s"] == pytest.approx(0.0775 + 0.03875)
    assert c["data_parallel"]["hides"]  # 77.5 ms under a 333 ms backward
    assert c["data_parallel"]["step_s_overlap"] == 0.5
    assert c["data_parallel"]["step_s_serial"] == pytest.approx(0.5775)
    assert c["data_parallel"]["days_serial"] == pytest.approx(1000 * 0.5775 / 86400)


def test_communication_that_does_not_hide():
    c = step_communication(8e9, 32, 10, 2, 2, compute_s=0.5, steps=None, busbw_source="x")
    dp = c["data_parallel"]
    assert not dp["hides"] and dp["comm_s"] == pytest.approx(3.1)
    # Only what sticks out past the backward (2/3 of the compute) adds to the step.
    assert dp["step_s_overlap"] == pytest.approx(0.5 + 3.1 - 0.5 * 4 / 6)


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
