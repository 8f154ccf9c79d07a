"""The pytest-benchmark suite in benches/ runs and records what CI comparisons need."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A hang guard only: the test waits for the child to finish, however long that takes on
# a busy machine.  The child reads the CPU ceilings of this session's cache
# (GPUBENCH_CEILINGS_DIR, inherited: tests/conftest.py), never measures them.
HANG_GUARD_S = 1800


def _not_a_worker() -> dict[str, str]:
    """This environment without xdist's worker variables: the suite may run under xdist,
    and pytest-benchmark disables itself in a child that inherits them (a parallel run's
    timings are not benchmarks)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}


def test_bench_suite_records_metrics_and_machine(tmp_path):
    out = tmp_path / "bench.json"
    # fp32 rows: fp32 is a roof on every device, while a CPU may have no bf16 unit (a
    # measured bf16 ceiling below fp32's is no roof, so no MFU: contract.ceilings.no_roofs).
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "benches/", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-k", "add-torch-fp32 or matmul-torch-fp32",
         f"--benchmark-json={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S, env=_not_a_worker())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["machine_info"]["gpu_name"]
    assert doc["machine_info"]["device_key"]
    benches = doc["benchmarks"]
    assert len(benches) >= 2
    for b in benches:
        extra = b["extra_info"]
        for key in ("flops", "bytes", "tflops", "gbps", "mfu", "pct_roof", "rel_err"):
            assert extra[key] is not None, key
        assert abs(extra["tflops"] - extra["flops"] / b["stats"]["median"] / 1e12) \
            <= 1e-9 * extra["tflops"]
