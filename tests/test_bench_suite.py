"""The pytest-benchmark suite in benches/ runs and records what CI comparisons need."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_suite_records_metrics_and_machine(tmp_path):
    out = tmp_path / "bench.json"
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "benches/", "-q", "-p", "no:cacheprovider",
         "-k", "add-torch-fp32 or matmul-torch-bf16", f"--benchmark-json={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
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
