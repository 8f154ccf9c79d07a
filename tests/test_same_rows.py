"""`targets --same-rows PLAIN FLEET`: the GPU job's fleet step runs a few of the plain
sweep's kernels and its own collectives; only the cases both runs asked for are
compared, and the answer says how many rows were left aside."""

from __future__ import annotations

import json
from pathlib import Path

from contract.schema import COLUMNS
from roofline.report import targets, targets_cli


def _row(kernel: str, provider: str = "triton", dtype: str = "bf16", status: str = "ok"):
    return {**dict.fromkeys(COLUMNS), "kernel": kernel, "provider": provider, "dtype": dtype,
            "shape": "n=4096",
            "flops": 4096, "bytes": 24576, "intensity": 1 / 6, "status": status,
            "ms_median": 0.01 if status == "ok" else None, "n_samples": 10}


def _run(folder: Path, kernels: list[str], rows: list[dict]) -> targets.Run:
    meta = {"run_id": folder.name, "device_key": "h200", "kernels": kernels,
            "dtypes": ["bf16"], "providers": ["torch", "triton"], "complete": True}
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"metadata": meta, "rows": rows}))
    return targets.load(str(folder))


def test_only_the_cases_both_runs_asked_for_are_compared(tmp_path):
    plain = _run(tmp_path / "plain", ["add", "gelu", "matmul"],
                 [_row("add"), _row("gelu"), _row("matmul")])
    fleet = _run(tmp_path / "fleet", ["add", "matmul"],
                 [_row("add"), _row("matmul"), _row("all_reduce", "nccl")])
    same, why = targets_cli.same_rows(plain, fleet)
    assert same, why
    assert why.startswith("same 2 rows, same statuses; 2 rows of cases only one run")


def test_a_difference_among_the_shared_cases_still_shows(tmp_path):
    plain = _run(tmp_path / "plain", ["add", "gelu"], [_row("add"), _row("gelu")])
    fleet = _run(tmp_path / "fleet", ["add"], [_row("add", status="failed")])
    same, why = targets_cli.same_rows(plain, fleet)
    assert not same and why.startswith("1 with another status (first: add triton bf16")
    # A shared case the fleet lacks is still missing, not left aside.
    fleet = _run(tmp_path / "fleet2", ["add", "gelu"], [_row("add")])
    same, why = targets_cli.same_rows(plain, fleet)
    assert not same and why.startswith("1 only in the plain run")
