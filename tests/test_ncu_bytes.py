"""benches/ncu_bytes.py without a GPU: ncu's CSV read per family, the whole command
against a stand-in ncu (its CSV and the child's family list), and the skip where ncu
may not read the counters."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from benches import ncu_bytes
from benches.sweep.shapes import preset_shapes
from kernels import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
          '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
          '"Metric Unit","Metric Value"')


def _rows(launch: int, kernel: str, read: str, write: str) -> str:
    common = f'"{launch}","1","python","h","{kernel}","1","7","(128, 1, 1)","(1, 1, 1)","0",' \
             '"9.0","Command line profiler metrics"'
    return (f'{common},"dram__bytes_read.sum","byte","{read}"\n'
            f'{common},"dram__bytes_write.sum","byte","{write}"\n')


# Two families: add (one kernel), dot (two: partial sums, then the final sum), each after
# its marker; ncu's own messages come first; values carry thousands separators.
CSV = ("==PROF== Connected to process 1\n" + HEADER + "\n"
       + _rows(0, ncu_bytes.MARKER, "32", "4")
       + _rows(1, "add_kernel", "268,435,456", "134,217,728")
       + _rows(2, ncu_bytes.MARKER, "32", "4")
       + _rows(3, "dot_partial_kernel", "268,435,456", "4,096")
       + _rows(4, "dot_final_kernel", "4,096", "32"))
FAMILIES = [{"kernel": "add", "dtype": "bf16", "shape": "n=67108864",
             "counted_bytes": 3 * 2 * 2**26},
            {"kernel": "dot", "dtype": "bf16", "shape": "n=67108864",
             "counted_bytes": 2 * 2 * 2**26 + 4}]


def test_each_family_sums_the_kernels_after_its_marker() -> None:
    got = ncu_bytes.by_family(ncu_bytes.parse_ncu_csv(CSV), FAMILIES)
    assert [g["kernel"] for g in got] == ["add", "dot"]
    assert got[0]["ncu_bytes"] == 402_653_184 and got[0]["ratio"] == pytest.approx(1.0)
    assert got[1]["dram_read"] == 268_435_456 + 4_096
    assert got[1]["dram_write"] == 4_096 + 32
    assert got[1]["kernels"] == ["dot_final_kernel", "dot_partial_kernel"]
    assert got[1]["ratio"] == pytest.approx((268_435_456 + 8_224) / (4 * 2**26 + 4))


def test_other_units_are_scaled_and_a_missing_range_is_an_error() -> None:
    text = CSV.replace('"byte","268,435,456"', '"Mbyte","268.435456"')
    got = ncu_bytes.by_family(ncu_bytes.parse_ncu_csv(text), FAMILIES)
    assert got[0]["dram_read"] == pytest.approx(268_435_456)
    with pytest.raises(ValueError, match="2 marked ranges for 3 families"):
        ncu_bytes.by_family(ncu_bytes.parse_ncu_csv(CSV), FAMILIES + FAMILIES[:1])


def test_one_case_per_family_at_its_largest_quick_shape() -> None:
    cases = dict(ncu_bytes.cases(None))
    with_triton = [n for n, s in REGISTRY.items()
                   if "triton" in s.providers and "bf16" in s.providers["triton"].dtypes]
    assert sorted(cases) == sorted(with_triton)
    for name, shape in cases.items():
        spec = REGISTRY[name]
        assert spec.nbytes(shape, "bf16") == max(
            spec.nbytes(s, "bf16") for s in preset_shapes(spec, "quick", on_gpu=True))


def _fake_ncu(tmp_path: Path, body: str) -> dict[str, str]:
    """An `ncu` on PATH that writes `body`'s CSV to its --log-file and prints the
    child's family list."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "ncu"
    script.write_text(
        "#!/usr/bin/env bash\n"
        "while [ $# -gt 0 ]; do case $1 in --log-file) log=$2; shift 2 ;; *) shift ;; "
        "esac; done\n"
        f"cat > \"$log\" <<'EOF'\n{body}EOF\n"
        f"echo 'NCU_FAMILIES {json.dumps(FAMILIES)}'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def test_the_command_writes_the_table(tmp_path: Path) -> None:
    env = _fake_ncu(tmp_path, CSV)
    p = subprocess.run([sys.executable, "-m", "benches.ncu_bytes", str(tmp_path / "o")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "o" / "ncu-bytes.json").read_text())
    assert [round(d["ratio"], 3) for d in doc] == [1.0, 1.0]
    assert "| add | bf16 | n=67108864 | 402.7 | 268.4 | 134.2 | 1.000 | add_kernel |" \
        in (tmp_path / "o" / "ncu-bytes.md").read_text()


def test_no_counter_access_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    env = _fake_ncu(tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                              "permission to access NVIDIA GPU Performance Counters\n")
    p = subprocess.run([sys.executable, "-m", "benches.ncu_bytes", str(tmp_path / "o")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == ncu_bytes.SKIPPED
    assert p.stdout.startswith("skipped: ncu cannot read the DRAM counters here: ")
    assert "ERR_NVGPUCTRPERM" in p.stdout
