"""benches/ncu_bytes.py without a GPU: ncu's CSV read per family, the whole command
against a stand-in ncu (its CSV and the child's family list), and the skip where ncu
may not read the counters."""

from __future__ import annotations

import dataclasses
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
FAMILIES = [ncu_bytes.Family("add", "bf16", "n=67108864", 3 * 2 * 2**26),
            ncu_bytes.Family("dot", "bf16", "n=67108864", 2 * 2 * 2**26 + 4)]
FAMILIES_JSON = json.dumps([dataclasses.asdict(f) for f in FAMILIES])  # the child's file


def test_each_family_sums_the_kernels_after_its_marker() -> None:
    got = ncu_bytes.by_family(ncu_bytes.parse_ncu_csv(CSV), FAMILIES)
    assert [g.family.kernel for g in got] == ["add", "dot"]
    assert got[0].ncu_bytes == 402_653_184 and got[0].ratio == pytest.approx(1.0)
    assert got[1].dram_read == 268_435_456 + 4_096
    assert got[1].dram_write == 4_096 + 32
    assert got[1].kernels == ("dot_final_kernel", "dot_partial_kernel")
    assert got[1].ratio == pytest.approx((268_435_456 + 8_224) / (4 * 2**26 + 4))


def test_other_units_are_scaled_and_a_missing_range_is_an_error() -> None:
    text = CSV.replace('"byte","268,435,456"', '"Mbyte","268.435456"')
    got = ncu_bytes.by_family(ncu_bytes.parse_ncu_csv(text), FAMILIES)
    assert got[0].dram_read == pytest.approx(268_435_456)
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


VERSION = "2099.1.0.0"


def _write_fake_ncu(script: Path, log_body: str, done: bool = True, code: int = 0,
                    child_stderr: str = "") -> None:
    """A stand-in `ncu` at `script`: `--version` prints Nsight Compute's banner; a
    profiling run writes `log_body` to its --log-file (ncu's messages and CSV), writes
    the child's done file (its last argument) with FAMILIES when `done` (a child that
    ran to its end), prints `child_stderr` on stderr (the child's own output) and exits
    `code`."""
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        "#!/usr/bin/env bash\n"
        "if [ \"$1\" = --version ]; then\n"
        "  echo 'NVIDIA (R) Nsight Compute Command Line Profiler'\n"
        f"  echo 'Version {VERSION} (build 34567890) (public-release)'; exit 0\n"
        "fi\n"
        "for a in \"$@\"; do last=$a; done\n"
        "while [ $# -gt 0 ]; do case $1 in --log-file) log=$2; shift 2 ;; *) shift ;; "
        "esac; done\n"
        f"cat > \"$log\" <<'EOF'\n{log_body}EOF\n"
        + (f"cat > \"$last\" <<'EOF'\n{FAMILIES_JSON}\nEOF\n" if done else "")
        + (f"cat >&2 <<'EOF'\n{child_stderr}EOF\n" if child_stderr else "")
        + f"exit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def _fake_ncu(tmp_path: Path, body: str, **how) -> dict[str, str]:
    """The environment of a command with a stand-in `ncu` first on PATH."""
    bindir = tmp_path / "bin"
    _write_fake_ncu(bindir / "ncu", body, **how)
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


def _run(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benches.ncu_bytes", str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_the_command_writes_the_table(tmp_path: Path) -> None:
    p = _run(tmp_path, _fake_ncu(tmp_path, CSV))
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "o" / "ncu-bytes.json").read_text())
    assert doc["status"] == "ok" and doc["reason"] == ""
    assert doc["ncu"] == {"path": str(tmp_path / "bin" / "ncu"), "version": VERSION,
                          "found_in": "PATH"}
    assert [round(d["ratio"], 3) for d in doc["families"]] == [1.0, 1.0]
    md = (tmp_path / "o" / "ncu-bytes.md").read_text()
    assert "| add | bf16 | n=67108864 | 402.7 | 268.4 | 134.2 | 1.000 | add_kernel |" in md
    assert f"ncu {VERSION}: `{tmp_path / 'bin' / 'ncu'}`" in md
    assert p.stdout.startswith(f"ncu: {tmp_path / 'bin' / 'ncu'} (version {VERSION}, ")


def test_no_counter_access_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    # ncu shuts the child down when it cannot profile: no done file, code 9.
    env = _fake_ncu(tmp_path, "==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                              "permission to access NVIDIA GPU Performance Counters\n"
                              "==PROF== Trying to shutdown target application\n"
                              "==ERROR== The application returned an error code (9).\n",
                    done=False, code=9)
    p = _run(tmp_path, env)
    assert p.returncode == ncu_bytes.SKIPPED
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("skipped: ncu cannot read the DRAM counters here: ")
    assert "ERR_NVGPUCTRPERM" in last
    assert json.loads((tmp_path / "o" / "ncu-bytes.json").read_text())["status"] == "skipped"


# What ncu says when the child dies before its first profiled range.
CRASHED = ("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
           "==PROF== Disconnected from process 4242\n"
           "==ERROR== The application returned an error code (1).\n"
           "==WARNING== No kernels were profiled.\n")


def test_a_child_that_crashed_is_a_failure_not_a_skip(tmp_path: Path) -> None:
    env = _fake_ncu(tmp_path, CRASHED, done=False, code=1,
                    child_stderr="Traceback (most recent call last):\n"
                                 "ModuleNotFoundError: No module named 'triton'\n")
    p = _run(tmp_path, env)
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert "the profiled child died before it finished (exit 1; ncu exit 1)" in line
    assert "ModuleNotFoundError: No module named 'triton'" in line
    doc = json.loads((tmp_path / "o" / "ncu-bytes.json").read_text())
    assert doc["status"] == "failed" and doc["ncu"]["version"] == VERSION
    assert not (tmp_path / "o" / "ncu-bytes.md").exists()


def test_a_child_that_ran_but_profiled_nothing_is_a_skip(tmp_path: Path) -> None:
    env = _fake_ncu(tmp_path, "==WARNING== No kernels were profiled.\n", done=True, code=0)
    p = _run(tmp_path, env)
    assert p.returncode == ncu_bytes.SKIPPED, p.stdout + p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last == ("skipped: ncu profiled no kernel though the child ran to its end "
                    "(exit 0): ==WARNING== No kernels were profiled.")


@pytest.mark.parametrize("said, code, done, want", [
    # An OOM killed mid-way: ncu names no exit code, the child's last line says why.
    ("==PROF== Connected to process 7\n", 137, False, 1),
    # ncu failing after a child that finished: a failure too.
    ("==ERROR== An error occurred while trying to profile.\n", 1, True, 1),
    # A child's traceback that happens to say "does not have permission" is not ncu's.
    ("==PROF== Connected to process 7\n", 0, True, 0),
])
def test_judging_ncus_run(said: str, code: int, done: bool, want: int) -> None:
    child = "PermissionError: user does not have permission\n" if code == 0 else \
        "torch.OutOfMemoryError: CUDA out of memory.\n"
    got = ncu_bytes.judge_run(said, code, done, child)
    assert got.code == want, got
    if not done:
        assert "exit status unknown; ncu exit 137" in got.line
        assert "torch.OutOfMemoryError" in got.line


def _install(root: Path, rel: str) -> Path:
    exe = root / rel
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def test_ncu_is_found_off_path_newest_version_first(tmp_path: Path) -> None:
    opt, local, empty = tmp_path / "opt-nsight", tmp_path / "usr-local", tmp_path / "empty"
    empty.mkdir()
    assert ncu_bytes.find_ncu(str(empty), opt, local) is None  # nothing anywhere
    for v in ("2023.3.0", "2024.1.1", "2024.10.0"):
        _install(opt, f"{v}/ncu")
    (opt / "2025.1.0").mkdir()  # a version folder without ncu in it
    for c in ("cuda", "cuda-12.4", "cuda-12.10"):
        _install(local, f"{c}/bin/ncu")
    assert ncu_bytes.find_ncu(str(empty), opt, local) == (opt / "2024.10.0" / "ncu",
                                                           f"{opt}/<version>")
    assert ncu_bytes.find_ncu(str(empty), tmp_path / "none", local) == (
        local / "cuda-12.10" / "bin" / "ncu", f"{local}/cuda*/bin")
    on_path = _install(tmp_path / "bin", "ncu")
    assert ncu_bytes.find_ncu(str(on_path.parent), opt, local) == (on_path, "PATH")


def test_the_command_runs_the_ncu_it_found_off_path_and_says_which(
        tmp_path: Path, monkeypatch, capsys) -> None:
    opt = tmp_path / "opt-nsight"
    _write_fake_ncu(opt / "2024.1.1" / "ncu", CSV)
    _write_fake_ncu(opt / "2023.3.0" / "ncu", "==ERROR== the older one ran\n", code=1)
    # PATH without any ncu of this machine's own
    keep = [d for d in os.environ["PATH"].split(os.pathsep) if not Path(d, "ncu").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))
    monkeypatch.setattr(ncu_bytes, "NSIGHT_ROOT", opt)
    monkeypatch.setattr(ncu_bytes, "CUDA_ROOT", tmp_path / "no-cuda")
    assert ncu_bytes.main([str(tmp_path / "o")]) == 0, capsys.readouterr().err
    doc = json.loads((tmp_path / "o" / "ncu-bytes.json").read_text())
    assert doc["ncu"]["path"] == str(opt / "2024.1.1" / "ncu")
    assert doc["ncu"]["found_in"] == f"{opt}/<version>" and doc["ncu"]["version"] == VERSION
    assert capsys.readouterr().out.startswith(f"ncu: {opt / '2024.1.1' / 'ncu'} (version ")


def test_no_ncu_anywhere_is_a_skip(tmp_path: Path, monkeypatch, capsys) -> None:
    keep = [d for d in os.environ["PATH"].split(os.pathsep) if not Path(d, "ncu").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))
    monkeypatch.setattr(ncu_bytes, "NSIGHT_ROOT", tmp_path / "none")
    monkeypatch.setattr(ncu_bytes, "CUDA_ROOT", tmp_path / "none")
    assert ncu_bytes.main([str(tmp_path / "o")]) == ncu_bytes.SKIPPED
    out = capsys.readouterr().out
    assert out.startswith("skipped: ncu (Nsight Compute) not found: not on PATH, nor under ")
