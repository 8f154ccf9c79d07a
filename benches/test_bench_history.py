"""Replay benchmark of the history's change-point detection: false alarms and detection
delays on the noise of real CPU and GPU runs, in long histories and young ones.

    pytest benches/test_bench_history.py -s     # prints the figures

The noise is real: the samples of identical runs (benches/fixtures/:
`history_noise_cpu_2threads.json`, run_bench.py as it runs by default on the 2-core CI
VM, `history_noise_cpu_1thread.json`, the same with OMP_NUM_THREADS=1, and
`history_noise_h200.json`, 5 runs on an H200 that share bf16 add rows), each synthetic
run one recorded run with its samples bootstrapped (roofline/history/replay.py), replayed
as CI runs `history report --since 1 --fail-on-new` after each run.  `gaussian` noise
replaces the recorded runs by log-normal run-to-run noise of a given spread (the
`gpu-like` ones with a spread of samples within each run as well).

- test_replay: histories of 200 runs: unchanged code (false alarms per 100 runs), steps
  of 3, 5, 10 and 30% at run 100 (the share caught within 3 runs, within 20, and the
  median delay), and a drift of 0.2% per run from run 100, with the detection before
  (`detect(previous=True)`) and after.
- test_replay_young: histories of 6, 8, 12 and 20 runs: the alarms the last run of
  unchanged code raises (per 100 runs), and steps of 5, 10 and 30% with 3 runs after
  them at that length (the share seen by then, within 20 runs, the median delay), with
  the detection before (`detect(previous=True)`: one value per run, ranks alone) and
  after.

A benchmark, not a timed test: the figures are reported (printed and in
benchmark.extra_info), never asserted.  HISTORY_REPLAY_TRIALS sets the trials per step
and drift scenario of the long histories (default 25; the null scenario replays a
quarter as many series, each 181 detections long), HISTORY_REPLAY_YOUNG_TRIALS those of
the young ones (default 40, and 10x as many histories of unchanged code).  The
detection settings are the defaults of roofline/history/changepoints.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ruptures", reason="the history extra is not installed "
                    "(pip install -e '.[history]')")

from roofline.history.replay import (  # noqa: E402
    SHORT_LENGTHS,
    Figures,
    load_noise,
    measure,
    measure_short,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRIALS = int(os.environ.get("HISTORY_REPLAY_TRIALS", "25"))
YOUNG_TRIALS = int(os.environ.get("HISTORY_REPLAY_YOUNG_TRIALS", "40"))
ROWS = ("matmul/torch/fp32/M=256,N=256,K=256", "add/torch/fp32/n=65536",
        "add/torch/fp32/n=16777216")
GPU_ROWS = ("add/torch/bf16/n=16777216", "add/triton/bf16/n=67108864")


def _gaussian(spread: float, within: float = 0.0, runs: int = 20, samples: int = 25
              ) -> list[np.ndarray]:
    """Noise runs whose medians spread log-normally by `spread` (sd of log time), their
    samples by `within` about it."""
    rng = np.random.default_rng(1)
    return [np.exp(rng.normal(0.0, spread) + rng.normal(0.0, within, samples))
            if within else np.full(samples, np.exp(rng.normal(0.0, spread)))
            for _ in range(runs)]


def _noise(source: str, row: object) -> tuple[list[np.ndarray], str]:
    """(noise runs, name) of a case."""
    if source == "gaussian":
        return _gaussian(row), f"gaussian run-to-run noise {row * 100:g}%"
    if source == "gpu-like":
        spread, within = row
        return (_gaussian(spread, within, samples=100),
                f"gpu-like: {spread * 100:g}% run to run, {within * 100:g}% within")
    return load_noise(FIXTURES / f"{source}.json")[row], f"{source[14:]} {row}"


def _line(name: str, spread: float, f: Figures) -> str:
    steps = "  ".join(f"{s * 100:g}%: {f.detected[s] * 100:.0f}/{f.detected_ever[s] * 100:.0f}%"
                      f" d={f.delay[s]:g}" for s in f.detected)
    return (f"{name:<52} sd {spread * 100:5.1f}%  false/100 {f.false_per_100:5.2f}  {steps}  "
            f"drift 0.2%/run: {f.drift_detected * 100:.0f}% d={f.drift_delay:g}")


def _spread(noise: list[np.ndarray]) -> float:
    return float(np.std(np.log([np.median(s) for s in noise])))


# The rows of the young replay below, and 1% gaussian run-to-run noise: each case
# replays its histories twice (before and after), minutes a case (docs/measurement.md).
CASES = [(f, r) for f in ("history_noise_cpu_1thread", "history_noise_cpu_2threads")
         for r in (ROWS[0], ROWS[2])] + [("history_noise_h200", r) for r in GPU_ROWS] + \
    [("gaussian", 0.01)]


@pytest.mark.parametrize("source,row", CASES, ids=[f"{f}:{r}" for f, r in CASES])
def test_replay(benchmark, source, row):
    noise, name = _noise(source, row)
    got: dict[str, Figures] = {}

    def run() -> None:
        for key, previous in (("before", True), ("after", False)):
            got[key] = measure(noise, trials=TRIALS, null_trials=max(1, TRIALS // 4),
                               previous=previous)

    benchmark.pedantic(run, rounds=1, iterations=1)
    for key in ("before", "after"):
        f = got[key]
        print(f"\n{key:<6} " + _line(name, _spread(noise), f), end="")
        benchmark.extra_info[key] = {
            "false_per_100": f.false_per_100,
            "within_3": {str(k): v for k, v in f.detected.items()},
            "within_20": {str(k): v for k, v in f.detected_ever.items()},
            "median_delay": {str(k): v for k, v in f.delay.items()},
            "drift_detected": f.drift_detected, "drift_delay": f.drift_delay}
    benchmark.extra_info.update(noise=name, spread=_spread(noise), trials=TRIALS)


YOUNG = [("history_noise_cpu_1thread", r) for r in (ROWS[0], ROWS[2])] + \
    [("history_noise_cpu_2threads", r) for r in (ROWS[0], ROWS[2])] + \
    [("history_noise_h200", r) for r in GPU_ROWS] + \
    [("gpu-like", (0.003, 0.01)), ("gpu-like", (0.01, 0.01))]
YOUNG_CASES = [(f, r, n) for f, r in YOUNG for n in SHORT_LENGTHS]


def _young_cells(f: Figures) -> str:
    return "  ".join(f"{s * 100:g}%: {f.detected[s] * 100:3.0f}/{f.detected_ever[s] * 100:3.0f}%"
                     f" d={f.delay[s]:g}" for s in f.detected)


@pytest.mark.parametrize("source,row,length", YOUNG_CASES,
                         ids=[f"{f}:{r}:{n}" for f, r, n in YOUNG_CASES])
def test_replay_young(benchmark, source, row, length):
    noise, name = _noise(source, row)
    got: dict[str, Figures] = {}

    def run() -> None:
        for key, previous in (("before", True), ("after", False)):
            got[key] = measure_short(noise, length, trials=YOUNG_TRIALS,
                                     null_trials=10 * YOUNG_TRIALS, previous=previous)

    benchmark.pedantic(run, rounds=1, iterations=1)
    for key in ("before", "after"):
        f = got[key]
        print(f"\n{name:<44} {length:>2} runs {key:<6} false/100 {f.false_per_100:5.2f}  "
              f"{_young_cells(f)}", end="")
        benchmark.extra_info[key] = {
            "false_per_100": f.false_per_100,
            "by_3rd_run": {str(k): v for k, v in f.detected.items()},
            "within_20": {str(k): v for k, v in f.detected_ever.items()},
            "median_delay": {str(k): v for k, v in f.delay.items()}}
    benchmark.extra_info.update(noise=name, spread=_spread(noise), runs=length,
                                trials=YOUNG_TRIALS)
