"""Fleet runs on torch.distributed, with real processes: two ranks launched through
torchrun (torch.distributed.run) with `--device cpu`, so gloo on the CPU, also on a
machine with GPUs (CUDA is not hidden: the request decides the backend).  The slow-rank,
early-exit, kill, hang and other-case-list paths use the test-only hooks documented in
benches/fleet/run.py; a test that signals waits for the state it needs (a file), never for
a clock, and its timeouts only stop a hang."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benches.fleet.collectives import busbw, elements, fill_value
from benches.fleet.dist import FleetRefused, cpu_threads
from roofline.plan.comm import busbw_from_run
from roofline.plan.model import PlanError
from roofline.report.fleet import DeviceFigures, find_outliers

ROOT = Path(__file__).resolve().parent.parent
OPS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
# Two ranks share two busy cores: their rows and ceilings can differ by up to 2x by
# contention alone, so the tests hold the fleet to 50% (the slow-rank hook is 10x).
SWEEP = ["--device", "cpu", "--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
         "--sizes", "n=4096;n=65536", "--fleet-tolerance", "50"]


def _command(out: Path, extra: tuple[str, ...], sweep: list[str] = SWEEP,
             nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
            "run_bench.py", *sweep, "--out", str(out), *extra]


def _env(env: dict[str, str] | None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and
         not k.startswith("GPUBENCH_TEST_")}
    e.update(env or {})
    return e


def _end(proc: subprocess.Popen) -> None:
    """Stop a torchrun still running (a hang guard fired): SIGTERM, which torchrun
    forwards to its workers (in sessions of their own, a SIGKILL to torchrun would
    orphan them) and follows with SIGKILL after its grace."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def torchrun(out: Path, *extra: str, env: dict[str, str] | None = None,
             timeout: float = 300, nproc: int = 2) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(_command(out, extra, nproc=nproc), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(env))
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        _end(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def ours_traceback(stderr: str) -> bool:
    """A traceback through the suite's own files.  torchrun itself prints one
    (ChildFailedError) whenever a worker exits non-zero: that one is the launcher's."""
    # A virtual environment inside the checkout (the README's `.venv`) puts torch's own
    # frames under ROOT too: those are not ours.
    return any(f == "run_bench.py" or (f.startswith(str(ROOT)) and "site-packages" not in f)
               for f in re.findall(r'File "([^"]+)"', stderr))


def rows_of(folder: Path) -> list[dict]:
    return json.loads((folder / "results.json").read_text())["rows"]


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """The fleets' results root.  Their ceilings come from the session's cache
    (tests/conftest.py: $GPUBENCH_CEILINGS_DIR, which every rank honours over its own
    cache), so only the first fleet of a session without cached CPU ceilings measures."""
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="module")
def fleet(out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    return torchrun(out, "--run-id", "f1"), out / "fleet" / "f1"


def test_a_two_rank_fleet_gathers_every_row(fleet):
    p, folder = fleet
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = rows_of(folder)
    kernels = [r for r in rows if r["kernel"] == "add"]
    assert sorted((r["rank"], r["shape"]) for r in kernels) == [
        (0, "n=4096"), (0, "n=65536"), (1, "n=4096"), (1, "n=65536")]
    assert all(r["host"] and r["gpu_uuid"] is None for r in kernels)  # a CPU has no UUID
    meta = json.loads((folder / "results.json").read_text())["metadata"]
    assert meta["complete"] and meta["fleet"]["world"] == 2
    assert [i["rank"] for i in meta["fleet"]["ranks"]] == [0, 1]
    for f in ("fleet.md", "fleet.png", "summary.md", "roofline.png"):
        assert (folder / f).exists(), f
    md = (folder / "fleet.md").read_text()
    assert "| 0 | " in md and "| 1 | " in md and "## Outliers (0)" in md
    for r in (0, 1):  # each rank's own run folder is kept too
        assert (folder / "ranks" / f"rank-{r}" / "cpu" / "f1" / "results.json").exists()
    assert f"fleet of 2: {len(rows)} rows in" in p.stdout
    # every rank's time split, from its own run folder, and said by rank 0
    for info in meta["fleet"]["ranks"]:
        split = info["time_split_s"]
        assert split["timing"] > 0 and sum(split.values()) == pytest.approx(info["wall_s"],
                                                                           abs=0.01)
        assert re.search(rf"rank {info['rank']} on \S+: timing \d+ s of \d+ s", p.stdout)


def test_rank_0_speaks_and_the_others_write_to_their_folders(fleet):
    p, folder = fleet
    # Rank 0's table and lines only; rank 1's console is in its own folder.
    assert p.stdout.count("results: ") == 1 and "/ranks/rank-0/cpu/f1" in p.stdout
    assert "rank-1" not in p.stdout and "error" not in p.stderr
    log = (folder / "ranks" / "rank-1" / "console.log").read_text()
    assert "results: " in log and "/ranks/rank-1/cpu/f1" in log
    assert "2 ok, 0 failed" in log
    assert not (folder / "ranks" / "rank-0" / "console.log").exists()


def test_collectives_are_correct_and_in_nccl_tests_terms(fleet):
    _, folder = fleet
    coll = [r for r in rows_of(folder) if r["kernel"] in OPS]
    # 5 ops x 2 dtypes x 6 sizes (4 KB .. 4 MB, x4 apart)
    assert len(coll) == 60 and {r["kernel"] for r in coll} == OPS
    assert all(r["status"] == "ok" and r["correct"] for r in coll)
    assert {r["bytes"] for r in coll} == {2**k for k in range(12, 23, 2)}
    for r in coll:
        assert r["provider"] == "gloo" and r["shape"] == f"bytes={r['bytes']},ranks=2"
        assert r["rank"] is None and r["host"] == "fleet"
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["ms_median"] / 1e3) / 1e9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r["kernel"], 0.5)  # n = 2
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
        assert r["n_samples"] == 10 and r["ms_p20"] <= r["ms_median"] <= r["ms_p80"]
        assert r["config"].endswith(" calls per sample")  # a sample is a batch of calls
    assert "## Collectives (slowest rank)" in (folder / "fleet.md").read_text()


def test_a_one_rank_fleet_runs_every_collective_with_no_busbw(out):
    """A fleet of one (the GPU job's fleet step) runs each op on its backend (NCCL on a
    GPU, gloo here), checked and timed: algbw measured, busbw n/a."""
    p = torchrun(out, "--run-id", "w1", "--no-plots", nproc=1)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    folder = out / "fleet" / "w1"
    coll = [r for r in rows_of(folder) if r["kernel"] in OPS]
    assert len(coll) == 60 and {r["kernel"] for r in coll} == OPS  # 5 ops x 2 x 6 sizes
    for r in coll:
        assert r["status"] == "ok" and r["correct"] and r["provider"] == "gloo"
        assert r["shape"] == f"bytes={r['bytes']},ranks=1"
        assert r["busbw_gbps"] is None and r["algbw_gbps"] > 0
    assert "(60 collective rows)" in p.stdout
    md = (folder / "fleet.md").read_text()
    assert "| all_reduce | gloo | bf16 | 4,096 |" in md and " | n/a |" in md
    with pytest.raises(PlanError, match="no ok all_reduce rows with a busbw"):
        busbw_from_run(str(folder))  # a plan never takes one rank's copy for a link


def test_busbw_from_a_saved_run(fleet):
    _, folder = fleet
    at = [r["busbw_gbps"] for r in rows_of(folder) if r["kernel"] == "all_reduce"
          and r["bytes"] == 2**16]
    bw, source = busbw_from_run(str(folder), "all_reduce", 2**16)
    assert len(at) == 2 and bw == max(at) and "65,536 bytes" in source  # bf16 and fp32
    largest, _ = busbw_from_run(str(folder), "reduce_scatter")
    assert largest == max(r["busbw_gbps"] for r in rows_of(folder)
                          if r["kernel"] == "reduce_scatter" and r["bytes"] == 2**22)
    with pytest.raises(PlanError, match="no ok all_reduce row of 1,000 bytes"):
        busbw_from_run(str(folder), "all_reduce", 1000)


@pytest.mark.parametrize("n, op, factor", [
    (2, "all_reduce", 1.0), (4, "all_reduce", 1.5), (8, "all_reduce", 1.75),
    (2, "all_gather", 0.5), (4, "all_gather", 0.75), (8, "all_gather", 0.875),
    (2, "reduce_scatter", 0.5), (4, "reduce_scatter", 0.75), (8, "reduce_scatter", 0.875),
    (2, "all_to_all", 0.5), (4, "all_to_all", 0.75), (8, "all_to_all", 0.875),
    (2, "broadcast", 1.0), (4, "broadcast", 1.0), (8, "broadcast", 1.0)])
def test_busbw_factors(n, op, factor):
    assert busbw(op, 100.0, n) == pytest.approx(100.0 * factor)


def test_sizes_are_whole_elements_per_rank():
    assert elements(2**20, 2, 8) == 2**19  # 1 MiB of bf16 on 8 ranks
    assert elements(1000, 4, 3) == 249  # 250 fp32 rounded down to 83 per rank
    assert elements(4, 4, 8) == 8  # at least one element per rank


@pytest.mark.parametrize("world, fills", [(8, [1, 2, 3, 4, 5, 6, 7, 8]),
                                          (23, [1, 2] * 11 + [1]), (200, [1] * 200)])
def test_reduction_fills_stay_exact_in_bf16(world, fills):
    got = [fill_value(r, world, torch.bfloat16) for r in range(world)]
    assert got == fills
    # Every partial sum, in bf16, in either order, is the exact integer.
    for order in (got, got[::-1]):
        acc = torch.zeros((), dtype=torch.bfloat16)
        for v in order:
            acc = acc + torch.tensor(v, dtype=torch.bfloat16)
        assert float(acc) == sum(got)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_collective_check_catches_a_wrong_value(op, dtype, tmp_path):
    """One process (a world of 1): the check passes on the collective's result and fails
    once one element of the output is wrong."""
    import torch.distributed as dist

    from benches.fleet.collectives import collective_buffers

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        reset, call, check = collective_buffers(op, 64, dtype, "cpu", 0, 1)
        reset()
        call()
        assert check()
        # The buffer the check reads: `out`, or `buf` for the in-place collectives.
        held = dict(zip(check.__code__.co_freevars,
                        (c.cell_contents for c in check.__closure__), strict=True))
        (held.get("out") if "out" in held else held["buf"])[-1] += 1
        assert not check()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_timed_call_is_the_collective_alone(op, tmp_path, monkeypatch):
    """The buffers are reset outside the timed callable: no fill_/copy_ (an extra write of
    the whole buffer, and a launch) runs inside what is timed."""
    import torch.distributed as dist

    from benches.fleet.collectives import GPU_SIZES, collective_buffers

    assert GPU_SIZES[0] == 4 * 2**10 and GPU_SIZES[-1] == 2**30  # 4 KB .. 1 GB
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        reset, call, check = collective_buffers(op, 64, torch.float32, "cpu", 0, 1)
        reset()
        writes: list[str] = []
        for name in ("fill_", "copy_", "zero_"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name,
                                lambda self, *a, _n=name, _r=real, **k:
                                writes.append(_n) or _r(self, *a, **k))
        call()
        monkeypatch.undo()
        assert writes == [] and check()
    finally:
        dist.destroy_process_group()


def test_ranks_with_other_versions_are_refused_naming_what_differs(monkeypatch):
    from benches.fleet import dist as fdist
    from benches.fleet.folder import versions as _versions
    from contract.request import DeviceChoice, RunRequest, Selection

    mine = _versions(RunRequest(Selection(kernels=("add",), dtypes=("fp32",),
                                          providers=("torch",), sizes="explicit",
                                          shapes=({"n": 4096},)), DeviceChoice("cpu")))
    assert {"suite commit", "suite package", "torch", "triton", "kernels"} <= mine.keys()
    other = {**mine, "torch": "2.11.0+cu128"}
    monkeypatch.setattr(fdist, "all_gather_object", lambda doing, obj: [
        obj, {"fp": fdist.fingerprint(other), "parts": other}, obj])
    with pytest.raises(FleetRefused) as e:
        fdist.agree("versions and request", mine)
    assert (f"rank(s) [1] differ from rank 0 in torch ({torch.__version__} vs 2.11.0+cu128);"
            in str(e.value))
    monkeypatch.setattr(fdist, "all_gather_object", lambda doing, obj: [obj, obj])
    fdist.agree("versions and request", mine)  # the same everywhere: no error


def test_each_rank_gets_its_share_of_the_cores():
    assert [cpu_threads(2, 2), cpu_threads(16, 4), cpu_threads(2, 4)] == [1, 4, 1]


def test_more_processes_than_gpus_is_refused(monkeypatch):
    from benches.fleet import dist as fdist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3",
                 "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(FleetRefused, match="4 processes per node but 2 GPU"):
        fdist.start(5)


def test_outliers_are_below_the_median_by_more_than_the_tolerance():
    devices = [DeviceFigures(r, "h", figures={"copy_gbps": bw, "bf16_matmul_tflops": tf})
               for r, bw, tf in [(0, 100.0, 500.0), (1, 100.0, 470.0), (2, 94.0, 500.0),
                                 (3, 96.0, 500.0)]]
    out, medians = find_outliers(devices, 5.0)
    assert medians == {"copy_gbps": 98.0, "bf16_matmul_tflops": 500.0}
    # 94 / 98 = 0.959 (4.1% below: inside), 470 / 500 = 0.94 (6% below: outside)
    assert [o.device.rank for o in out] == [1]
    assert "bf16_matmul_tflops 470 = 0.94x the median 500" in out[0].why
    assert devices[2].ratios["copy_gbps"] == pytest.approx(94 / 98)


def test_resume_and_compare_are_refused_under_torchrun(monkeypatch, capsys, tmp_path):
    import run_bench

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_bench.main(["--device", "cpu", "--resume", str(tmp_path)]) == 2
    assert run_bench.main(["--device", "cpu", "--compare", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--resume continues a single-process run" in err[0]
    assert "--compare gates a single-process run" in err[1]


def test_a_slow_rank_is_an_outlier(out, fleet):
    p = torchrun(out, "--run-id", "f2", "--no-collectives", "--no-plots",
                 env={"GPUBENCH_TEST_SLOW_RANK": "1"})
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert "OUTLIER rank 1" in p.stdout and "OUTLIER rank 0" not in p.stdout
    md = (out / "fleet" / "f2" / "fleet.md").read_text()
    assert "## Outliers (1)" in md and "- rank 0 " not in md
    line = next(x for x in md.splitlines() if x.startswith("- rank 1 "))
    assert "copy_gbps" in line and "rows_gbps" in line  # both its times 10x longer
    assert not (out / "fleet" / "f2" / "fleet.png").exists()  # --no-plots


def test_different_case_lists_are_refused_before_measuring(out):
    p = torchrun(out, "--run-id", "f3", "--no-plots", env={"GPUBENCH_TEST_CASES_RANK": "1"})
    # Each rank exits 2; torchrun itself exits 1 whenever a worker fails.
    assert p.returncode == 1, p.stderr[-3000:]
    assert "exitcode  : 2" in p.stderr
    assert ("ranks disagree on the case list: rank(s) [1] differ from rank 0 in cases, "
            "number of cases (2 vs 1)") in p.stderr
    assert not ours_traceback(p.stderr)
    assert not (out / "fleet" / "f3").exists()  # no folder, nothing measured


def _incomplete(folder: Path, missing: list[int]) -> dict:
    doc = json.loads((folder / "results.json").read_text())
    meta = doc["metadata"]
    assert not meta["complete"] and meta["fleet"]["missing_ranks"] == missing
    assert "**Incomplete:" in (folder / "fleet.md").read_text()
    return doc


def test_a_rank_that_leaves_stops_the_other_keeping_its_rows(out, fleet):
    p = torchrun(out, "--run-id", "f4", "--dist-timeout", "6", "--no-plots",
                 env={"GPUBENCH_TEST_EXIT_RANK": "1"})
    assert p.returncode == 1
    # Rank 1 left after its sweep without posting its rows: its heartbeat stopped.
    assert ("error: rank 0 on" in p.stderr and "the fleet stopped: rank 1 sent no "
            "heartbeat for 6 s (died or hung)" in p.stderr), p.stderr[-3000:]
    assert not ours_traceback(p.stderr)
    doc = _incomplete(out / "fleet" / "f4", [1])
    assert sorted((r["rank"], r["shape"]) for r in doc["rows"]) == [(0, "n=4096"),
                                                                    (0, "n=65536")]


def test_a_rank_that_hangs_stops_the_other_by_its_heartbeat(out, fleet):
    p = torchrun(out, "--run-id", "f5", "--dist-timeout", "6", "--no-plots",
                 env={"GPUBENCH_TEST_HANG_RANK": "1"})
    assert p.returncode == 1
    assert ("error: rank 0 on" in p.stderr and "rank 1 sent no heartbeat for 6 s (died or "
            "hung)" in p.stderr), p.stderr[-3000:]
    assert not ours_traceback(p.stderr)
    doc = _incomplete(out / "fleet" / "f5", [1])
    assert {r["rank"] for r in doc["rows"]} <= {0}  # what rank 0 measured, kept
    assert not [r for r in doc["rows"] if r["kernel"] in OPS]


def test_a_rank_killed_mid_sweep_is_named_and_the_survivor_keeps_its_rows(out, fleet):
    """torchrun sees the dead worker and sends the survivor SIGTERM: it stops, waits
    for the rows of ranks still alive, and names the one whose heartbeat stopped."""
    p = torchrun(out, "--run-id", "f6", "--dist-timeout", "6", "--no-plots",
                 env={"GPUBENCH_TEST_KILL_RANK": "1"})
    assert p.returncode == 1 and "exitcode  : -9" in p.stderr  # torchrun's report
    line = next(x for x in p.stderr.splitlines() if x.startswith("error: rank 0 on"))
    assert "rank 1 sent no heartbeat" in line and "kept in" in line, p.stderr[-3000:]
    doc = _incomplete(out / "fleet" / "f6", [1])
    assert {r["rank"] for r in doc["rows"]} <= {0}
    assert doc["metadata"]["fleet"]["ranks"][0]["exit_code"] == 143  # SIGTERM, rows kept
    # A rank killed within its sweep leaves its journal under ranks/rank-1/ (where a glob
    # for fleet/*/rows.jsonl never looks; one killed just after its sweep leaves none);
    # finalizing the tree writes it whole and leaves the fleet folder rank 0 wrote.
    from benches.fleet.finalize import finalize_tree

    ranks = out / "fleet" / "f6" / "ranks"
    journals = list(ranks.rglob("rows.jsonl"))
    assert [j.parent.parent.parent.name for j in journals] in ([], ["rank-1"])
    assert json.loads((ranks / "rank-1" / "rank.json").read_text())["rank"] == 1
    got = finalize_tree(out / "fleet" / "f6", plots=False)
    assert [(d.what, d.folder.parent.parent.name) for d in got.done] == \
        [("run", "rank-1")] * len(journals)
    assert not got.refused and not list(ranks.rglob("rows.jsonl"))


def _wait_for(paths, proc: subprocess.Popen, guard_s: float = 300.0) -> None:
    """Until every path pattern (a folder, a glob) has a match; the guard stops a hang."""
    end = time.monotonic() + guard_s
    while not all(any(folder.glob(pattern)) for folder, pattern in paths):
        assert proc.poll() is None, "the fleet ended before the state was reached"
        assert time.monotonic() < end, "hang guard"
        time.sleep(0.05)


def test_ctrl_c_to_torchrun_stops_the_fleet_at_once_keeping_every_rows(out, fleet):
    """torchrun forwards SIGINT to every rank.  Both stop their sweep, rank 0 gathers
    the rows measured, skips the collectives, says so and exits 130; torchrun itself
    raises its SignalException and exits 1."""
    sizes = ";".join(f"n={2**k}" for k in range(12, 21))  # 18 cases: ~20 s of sweep
    sweep = ["--device", "cpu", "--kernels", "add,mul", "--dtypes", "fp32", "--providers",
             "torch", "--sizes", sizes]
    run = out / "fleet" / "f7"
    proc = subprocess.Popen(_command(out, ("--run-id", "f7", "--no-plots"), sweep),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(None))
    try:
        # Both ranks inside their sweep: their run folders hold a results.json.
        _wait_for([(run / "ranks" / f"rank-{r}", "*/f7/results.json") for r in (0, 1)], proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        _end(proc)
    assert proc.returncode == 1 and "SignalException" in stderr  # torchrun's own
    line = next(x for x in stderr.splitlines() if x.startswith("interrupted: "))
    assert "the fleet stopped: rank " in line and "(SIGINT)" in line
    assert "kept in" in line and "no collectives" in line
    assert not ours_traceback(stderr)
    doc = json.loads((run / "results.json").read_text())
    meta = doc["metadata"]
    assert meta["interrupted"] and meta["signal"] == "SIGINT" and not meta["complete"]
    assert [(i["rank"], i["exit_code"]) for i in meta["fleet"]["ranks"]] == [(0, 130),
                                                                             (1, 130)]
    assert not [r for r in doc["rows"] if r["kernel"] in OPS]  # no collectives
    for r in (0, 1):  # each stopped within its sweep, its rows gathered
        assert len([x for x in doc["rows"] if x["rank"] == r]) < 18
    assert "fleet of 2:" in stdout and stdout.count("results: ") == 1
