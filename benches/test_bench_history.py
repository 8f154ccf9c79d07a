"""Replay benchmark of the history's change-point detection: false alarms and detection
delays on the noise of real CPU runs, and what a GPU's 5% needs.

    pytest benches/test_bench_history.py -s     # prints the figures (a few minutes)

Each scenario is a synthetic history of 200 runs (roofline/history/replay.py) drawn
from the samples of identical runs recorded on the 2-core CI VM (benches/fixtures/:
`history_noise_cpu_2threads.json`, run_bench.py as it runs by default there, and
`history_noise_cpu_1thread.json`, the same with OMP_NUM_THREADS=1), replayed as CI
runs `history report --since 1 --fail-on-new` after each run: unchanged code (false
alarms per 100 runs), steps of 3, 5, 10 and 30% at run 100 (the share caught within 3
runs, within 20, and the median delay), and a drift of 0.2% per run from run 100.  The
targets on the CPU's noise are <= 1 false alarm per 100 runs and >= 95% of 10% steps
within 3 runs.  `gaussian` scenarios replace the recorded noise by log-normal run-to-run
noise of a given spread, to say how steady a GPU runner must be for its 5% threshold.

A benchmark, not a timed test: the figures are reported (printed and in
benchmark.extra_info), never asserted.  HISTORY_REPLAY_TRIALS sets the trials per step
and drift scenario (default 25, the README's figures; the null scenario replays a
quarter as many series, each 181 detections long); about 13 minutes on the 2-core VM.
The detection settings are the defaults of roofline/history/changepoints.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ruptures", reason="the history extra is not installed "
                    "(pip install -e '.[history]')")

from roofline.history.replay import Figures, load_noise, measure  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRIALS = int(os.environ.get("HISTORY_REPLAY_TRIALS", "25"))
ROWS = ("matmul/torch/fp32/M=256,N=256,K=256", "add/torch/fp32/n=65536",
        "add/torch/fp32/n=16777216")


def _gaussian(spread: float, runs: int = 20, samples: int = 25) -> list[np.ndarray]:
    """Noise runs whose medians spread log-normally by `spread` (sd of log time)."""
    rng = np.random.default_rng(1)
    return [np.full(samples, np.exp(rng.normal(0.0, spread))) for _ in range(runs)]


def _line(name: str, spread: float, f: Figures) -> str:
    steps = "  ".join(f"{s * 100:g}%: {f.detected[s] * 100:.0f}/{f.detected_ever[s] * 100:.0f}%"
                      f" d={f.delay[s]:g}" for s in f.detected)
    return (f"{name:<52} sd {spread * 100:5.1f}%  false/100 {f.false_per_100:5.2f}  {steps}  "
            f"drift 0.2%/run: {f.drift_detected * 100:.0f}% d={f.drift_delay:g}")


def _spread(noise: list[np.ndarray]) -> float:
    return float(np.std(np.log([np.median(s) for s in noise])))


CASES = [(f, r) for f in ("history_noise_cpu_1thread", "history_noise_cpu_2threads")
         for r in ROWS] + [("gaussian", s) for s in (0.005, 0.01, 0.02)]


@pytest.mark.parametrize("source,row", CASES, ids=[f"{f}:{r}" for f, r in CASES])
def test_replay(benchmark, source, row):
    if source == "gaussian":
        noise, name = _gaussian(row), f"gaussian run-to-run noise {row * 100:g}%"
    else:
        noise, name = load_noise(FIXTURES / f"{source}.json")[row], f"{source[14:]} {row}"
    got: dict[str, Figures] = {}

    def run() -> None:
        got["f"] = measure(noise, trials=TRIALS, null_trials=max(1, TRIALS // 4))

    benchmark.pedantic(run, rounds=1, iterations=1)
    f = got["f"]
    print("\n" + _line(name, _spread(noise), f))
    benchmark.extra_info.update(
        noise=name, spread=_spread(noise), false_per_100=f.false_per_100,
        within_3={str(k): v for k, v in f.detected.items()},
        within_20={str(k): v for k, v in f.detected_ever.items()},
        median_delay={str(k): v for k, v in f.delay.items()},
        drift_detected=f.drift_detected, drift_delay=f.drift_delay, trials=TRIALS)
