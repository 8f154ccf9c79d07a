"""`run_bench.py --estimate` (benches/estimate/): a sweep priced from what a run of the
device measured.  Held against the committed H200 runs (each priced from another), and
against small runs made here whose every number is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import run_bench
from benches.estimate.price import (
    COLD,
    FALLBACK_COMPILE,
    WARM,
    Cache,
    CompileTimes,
    compile_times,
    device_runs,
    item_of,
    load_run,
    nearest,
    price,
    price_run,
    source_run,
)
from benches.sweep.cases import Case
from contract.devices import DEVICES, Present, resolve_device
from contract.schema import COLUMNS
from kernels import REGISTRY
from kernels.spec import Target

ROOT = Path(__file__).resolve().parent.parent
DAY = ROOT / "results" / "h200" / "2026-11-27"
H200 = DEVICES["h200"]
ZERO = CompileTimes(0.0, 0.0, 0.0, 0.0)


def _h200_runs():
    return device_runs(ROOT / "results", H200, Present("h200", "NVIDIA H200", "cuda"))


@pytest.mark.parametrize("source, target, estimate", [
    # a warm run from a partly warm one and the reverse (quick-warm tuned 30 launches the
    # cut quick run had not reached), and the cut quick run, its cache cold, up to the
    # 362nd row it reached, from each of them
    ("quick-warm2", "quick-warm", 108.8), ("quick-warm", "quick-warm2", 93.3),
    ("quick-warm2", "quick", 163.3), ("quick-warm", "quick", 179.1)])
def test_the_h200_runs_price_one_another_within_15_percent(source, target, estimate):
    """The figures docs/measurement.md lists: never a run from itself (its compile
    times neither: the runs' record without it)."""
    src, tgt = load_run(DAY / source / "results.json"), load_run(DAY / target / "results.json")
    others = [r for r in _h200_runs() if r.path != tgt.path]
    assert len(others) >= 10 and all(r.meta.device.device_key == "h200" for r in others)
    walk = price_run(tgt, src, compile_times(others, FALLBACK_COMPILE))
    wall = tgt.meta.time.wall_s
    assert walk.total == pytest.approx(estimate, abs=0.5)
    assert 0.85 <= walk.total / wall <= 1.15, walk.total / wall
    assert walk.counts["priced from its own row"] == len(tgt.rows)  # the same cases


def test_what_the_h200_runs_measured_per_compile_and_tuning():
    """Loads: the line through the runs that built nothing (a first compile's set-up,
    then about a millisecond each); builds: the cut quick run's 178 in 60.8 s, the
    others' few; tunings: the tune phase over the launches tuned."""
    t = compile_times(_h200_runs(), FALLBACK_COMPILE)
    assert t.first_s == pytest.approx(0.36, abs=0.01)
    assert t.load_s == pytest.approx(0.001, abs=0.0002)
    # quick 178 builds, quick-warm 11, fp8-precise 6: (60.8 + 11.3 + 1.9 s less the
    # loads and set-ups) / 195
    assert t.build_s == pytest.approx(0.37, abs=0.01)
    assert t.tune_s == pytest.approx((25.652 + 9.676 + 1.266) / (35 + 30 + 1))
    quick = load_run(DAY / "quick" / "results.json")
    assert quick.cache == Cache(1.0, 1.0)
    partly = load_run(DAY / "quick-warm" / "results.json").cache
    assert partly.built == pytest.approx(11 / 118) and partly.tuned == pytest.approx(30 / 71)


def test_the_source_is_the_newest_whole_run_else_the_committed_baseline(tmp_path):
    runs = _h200_runs()
    src = source_run(runs, H200)
    assert src is not None and src.name == "quick-warm2"  # quick-warm2 is newer, whole
    assert not any("ranks" in r.path.parts for r in runs)  # a fleet rank's own run
    # a fresh runner: the run the committed baseline names
    base = source_run([], H200)
    assert base is not None and base.path.resolve() == DAY / "quick-warm2" / "results.json"
    # a CPU's baseline would be another machine's: none
    assert source_run([], DEVICES["cpu"]) is None


def _run(tmp: Path, name: str, split: dict[str, float], rows: list[dict], **meta) -> Path:
    """A run's results.json under tmp/<device>/<name>."""
    doc = {"metadata": {"run_id": name, "device_key": "h200", "created": "2026-12-01T00:00:00",
                        "complete": True, "time_split_s": split,
                        "wall_s": sum(split.values()), **meta}, "rows": rows}
    path = tmp / str(doc["metadata"]["device_key"]) / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    return path


def _row(n: int, provider: str = "torch", status: str = "ok", **extra) -> dict:
    """A row as a run writes it: every required column (contract.schema.COLUMNS, load_doc
    refuses a run without them), those given set."""
    return {**dict.fromkeys(COLUMNS), "kernel": "add", "provider": provider, "dtype": "fp32",
            "shape": f"n={n}",
            "cache": "cold", "flops": n, "bytes": 12 * n, "roof_class": "fp32",
            "status": status, **extra}


def test_each_row_priced_at_its_own_split_and_what_the_run_spent_once(tmp_path):
    """A run that recorded its rows' own split: a case costs its row's seconds, the rest
    of each phase (start-up, end) is paid once; a phase this code does not know (a newer
    run's) is priced as recorded; compile and tune come from the counts."""
    split = {"ceilings": 4.0, "compile": 2.0, "tune": 0.0, "timing": 3.0, "upload": 0.6,
             "write": 2.0, "other": 5.0}
    own = [{"row": ["add", "torch", "fp32", "n=4096", "cold"],
            "s": {"timing": 1.0, "upload": 0.2, "write": 0.1, "other": 0.1}},
           {"row": ["add", "torch", "fp32", "n=1048576", "cold"],
            "s": {"timing": 2.0, "upload": 0.4, "write": 0.1, "other": 0.1, "compile": 9}}]
    run = load_run(_run(tmp_path, "r", split, [_row(4096), _row(1 << 20)], row_split_s=own))
    assert run.once == pytest.approx({"timing": 0.0, "upload": 0.0, "write": 1.8,
                                      "other": 4.8})
    first = [nearest(item, run)[0] for item in list(run.rows.values())[:1]]
    walk = price(first, run, ZERO, WARM, ceilings=True)
    assert walk.phases["timing"] == 1.0 and walk.phases["upload"] == pytest.approx(0.2)
    assert walk.phases["write"] == pytest.approx(1.9)
    assert walk.phases["other"] == pytest.approx(4.9)
    assert walk.phases["ceilings"] == 4.0 and walk.phases["compile"] == 0.0
    assert list(walk.phases)[-1] == "upload"  # after contract.phases' own
    both = price(list(run.rows.values()), run, ZERO, WARM, ceilings=False)
    assert both.total == pytest.approx(sum(split.values()) - 4.0 - 2.0)


def test_a_run_without_its_rows_split_spreads_its_phases_over_the_rows_that_ran(tmp_path):
    split = {"ceilings": 0.0, "compile": 0.0, "tune": 0.0, "timing": 4.0, "other": 2.0}
    rows = [_row(4096), _row(1 << 20), _row(1 << 30, status="skipped")]
    run = load_run(_run(tmp_path, "r", split, rows))
    costs = [r.cost for r in run.rows.values()]
    assert costs == [{"timing": 2.0, "other": 1.0}] * 2 + [{"timing": 0.0, "other": 0.0}]
    assert run.once == {}


def test_a_case_the_run_lacks_is_priced_from_its_nearest_scaled_by_the_roofline(tmp_path):
    """Its nearest row of the kernel (provider, cache mode and dtype first, then the
    roofline bound under the run's ceilings): that row's seconds, its samples' time
    scaled by the ratio of the bounds, never under 1; a row skipped by design (no such
    dtype) prices the case skipped."""
    split = {"timing": 4.0, "other": 2.0}
    meta = {"ceilings": {"measured": {"tflops": {"fp32": 50.0}, "hbm_gbps": 4000.0}},
            "ceilings_ready": True}
    rows = [_row(1 << 20, ms_median=0.004, n_samples=100),
            _row(1 << 24, ms_median=0.05, n_samples=200),
            _row(1 << 24, "triton", status="skipped") | {"dtype": "fp16"}]
    run = load_run(_run(tmp_path, "r", split, rows, **meta))
    spec, target = REGISTRY["add"], Target("cuda", (9, 0))

    def priced(n: int, provider: str = "torch", dtype: str = "fp32") -> tuple[float, str]:
        item = item_of(Case(spec, provider, dtype, {"n": n}), target)
        row, scale = nearest(item, run)
        walk = price([item], run, ZERO, WARM, ceilings=False)
        assert walk.phases["timing"] == pytest.approx(row.cost["timing"] + row.timed * (scale - 1))
        return scale, row.key[3]

    assert priced(1 << 24) == (1.0, "n=16777216")  # its own
    # 4x the bytes of the largest: its 10 ms of samples x4 (bandwidth-bound)
    assert priced(1 << 26) == (pytest.approx(4.0), "n=16777216")
    assert priced(1 << 21) == (pytest.approx(2.0), "n=1048576")
    assert priced(1 << 10) == (1.0, "n=1048576")  # never cheaper than the smallest
    assert priced(1 << 26, "triton", "fp16")[1] == "n=16777216"
    skipped = price([item_of(Case(spec, "triton", "fp16", {"n": 1 << 26}), target)], run,
                    ZERO, WARM, ceilings=False)
    assert skipped.counts["skipped"] == 1 and skipped.total == 0.0


def test_the_cache_prices_compiles_and_tunings_by_the_counts(tmp_path):
    """Cold: every compile the source counted, built, and every launch that tuned or
    found its tuning on disk, tuned; warm: loads, no tuning."""
    split = {"compile": 1.0, "tune": 0.5, "timing": 1.0}
    rows = [_row(4096, "triton", config="BLOCK=1024", config_source="cached; tuned"),
            _row(1 << 20, "triton", config="BLOCK=1024", config_source="shipped"),
            _row(4096)]
    run = load_run(_run(tmp_path, "r", split, rows,
                        triton_compiles={"compiled": 1, "from_cache": 3}))
    assert [r.compiles for r in run.rows.values()] == [2.0, 2.0, 0.0]
    assert run.tuned == 1  # and one found on disk: half the tuning launches tuned
    times = CompileTimes(first_s=0.3, load_s=0.01, build_s=0.5, tune_s=0.7)
    items = list(run.rows.values())
    cold, warm = (price(items, run, times, c, ceilings=False) for c in (COLD, WARM))
    assert cold.phases["compile"] == pytest.approx(0.3 + 4 * 0.5)
    assert cold.phases["tune"] == pytest.approx(2 * 0.7) and cold.counts["tunings"] == 2
    assert warm.phases["compile"] == pytest.approx(0.3 + 4 * 0.01)
    assert warm.phases["tune"] == 0.0
    assert run.cache == Cache(0.25, 0.5)


def test_compile_times_from_the_runs(tmp_path):
    def run(name: str, compile_s: float, built: int, loaded: int, **meta):
        return load_run(_run(tmp_path, name, {"compile": compile_s, "tune": 0.0}, [],
                             triton_compiles={"compiled": built, "from_cache": loaded},
                             **meta))

    warm = [run("a", 0.4, 0, 10), run("b", 0.5, 0, 110)]
    cold = run("c", 0.4 + 0.1 * 2 + 10.0, 2, 100, compiled_ahead={"kernels_built": 98})
    t = compile_times([*warm, cold], FALLBACK_COMPILE)
    assert (t.first_s, t.load_s) == (pytest.approx(0.39), pytest.approx(0.001))
    # the compile-ahead workers' 98 builds count, the wait for them in the phase
    assert t.build_s == pytest.approx((10.6 - 0.39 - 100 * 0.001) / 100)
    assert t.tune_s == FALLBACK_COMPILE.tune_s and t.runs == 3
    assert compile_times([], FALLBACK_COMPILE) == FALLBACK_COMPILE


def test_the_command_prints_every_phase_and_writes_nothing(capsys, tmp_path):
    code = run_bench.main(["--estimate", "--device", "h200", "--sizes", "quick",
                           "--kernels", "add,matvec"])
    out = capsys.readouterr().out
    assert code == 0 and "priced from run quick-warm2" in out
    for phase in ("ceilings", "compile", "tune", "inputs", "check", "capture", "timing",
                  "profile", "write", "other", "total"):
        assert f"│ {phase}" in out, phase
    for label in ("Triton cache cold", "Triton cache warm"):
        assert f"{label}: timing " in out
    assert run_bench.main(["--estimate", "--out", str(tmp_path), "--kernels", "add",
                           "--sizes", "n=4096"]) == 0
    assert "priced by the fallback" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # nothing made, not even a ceiling cache


def test_a_cpu_estimate_uses_this_machines_newest_run(capsys, tmp_path):
    """A CPU run of this machine under --out prices the sweep; one of another CPU is no
    source (its speed is another's)."""
    here = resolve_device("cpu").present
    split = {"ceilings": 0.0, "timing": 3.0, "write": 1.0, "other": 2.0}
    rows = [_row(4096, cache="warm"), _row(1 << 20, cache="warm")]
    cpu = {"device_key": "cpu", "device_name": here.name, "cpu_cores": here.cores,
           "ceilings": {"measured": {"seconds": 10.0}}}
    _run(tmp_path, "other-cpu", split, rows, **cpu | {"device_name": "another CPU"})
    _run(tmp_path, "mine", split, rows, **cpu, created="2026-11-30T00:00:00")
    args = ["--estimate", "--device", "cpu", "--out", str(tmp_path), "--kernels", "add",
            "--dtypes", "fp32", "--providers", "torch", "--sizes", "n=4096;n=1048576"]
    assert run_bench.main(args) == 0
    out = capsys.readouterr().out
    assert "priced from run mine" in out and "Triton cache cold" not in out
    total = float(out.split("│ total")[1].split("│")[1])
    # its rows, and the 10 s its ceilings took where none are cached here
    assert total == pytest.approx(6.0 if "ceilings cached" in out else 16.0, abs=0.05)
