"""What each of a run's timing settings (metadata.timing: benches/timing/plan.py's
TimingConfig, and the methods benches/sweep/results.py describes from it) means, for
summary.md's table of them.  Kept here, not read from TimingConfig, because roofline/
reads saved runs and never imports the harness; tests/test_summary_settings.py fails when
a setting has no line here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.run_meta import JsonDoc

TIMING_MEANINGS: dict[str, str] = {
    "warmup_ms": "warm-up before a GPU row's samples (do_bench's warmup), ms",
    "rep_ms": "how long a GPU row samples (do_bench's rep), ms",
    "max_rep_ms": "the longest a GPU row samples, stretched from rep_ms to fit min_samples "
                  "(runs before graph_rep_ms), ms",
    "min_samples": "samples of a CPU row at least",
    "cudagraph_below_ms": "a case whose roofline bound is under this is replayed in CUDA "
                          "graphs; the rest are timed with the L2 flushed before each "
                          "call, ms",
    "graph_min_calls": "calls per captured graph at least, so the graph's own launch is "
                       "under 1% of a replay",
    "graph_rep_ms": "how long a CUDA-graph row samples replays (at least gate_min_samples), "
                    "ms",
    "graph_replay_ms": "a rotation longer than this is split over several graphs replayed "
                       "in turn, so a sample lasts about this long, ms",
    "max_samples": "samples of one GPU timing at most",
    "max_graph_nodes": "nodes of one capture at most: past them a graph holds one round "
                       "over the copies, and past that the row is timed with L2 flushes",
    "max_capture_s": "seconds of one capture at most, as max_graph_nodes",
    "assumed_launches": "graph nodes per call assumed where they cannot be counted",
    "cpu_block_s": "a CPU sample is a block of calls lasting at least this, s",
    "cpu_min_run_time_s": "a CPU row's samples last at least this, s",
    "row_budget_s": "each row's timing budget: it samples until min_samples or this, s",
    "gate_min_samples": "samples a row never goes under (the fewest with which the gate "
                        "can call a change); a row that cannot fit them is skipped",
    "cpu_rounds": "rounds of a CPU row's samples, each on fresh buffers",
    "cpu_chunk_s": "CPU rounds are interleaved over chunks of about this many seconds of "
                   "cases, s",
    "cpu_rounds_of_row": "rounds of the row a one-round setting belongs to (1: the run's "
                         "own settings)",
    "ci_rel_width": "the stopping rule: a row stops sampling once the ci_level interval "
                    "of its median is narrower than this fraction of it (0: off)",
    "ci_level": "confidence of the stopping rule's interval (distribution-free, from "
                "order statistics)",
    "cpu_min_rounds": "rounds a CPU row takes before the stopping rule may skip the rest",
    "interleave_ms": "the providers of a GPU case sample in turns, a batch of about this "
                     "much device time each, so that they share the GPU's clocks, ms",
    "sustain_min_ms": "a compute-bound case warms up until its SM clock has come down or "
                      "held this long, ms",
    "sustain_cap_ms": "the longest a compute-bound case warms up for a sustained clock "
                      "(0: no warm-up), ms",
    "sustain_drop": "the warm-up ends once the SM clock changed by less than this "
                    "fraction over each of the last sustain_still rounds",
    "sustain_still": "rounds the SM clock must hold before the warm-up ends",
    "gpu_method": "how a GPU row is timed (cold: L2 flushed or rotated copies)",
    "cpu_method": "how a CPU row is timed",
    "warm_gpu_method": "how a warm GPU row (--cache warm) is timed",
    "gpu_sampling": "how the providers of a GPU case share its samples and the GPU's "
                    "clocks",
    "stopping": "when a row stops sampling (the stopping rule)",
    "budget": "the timing budgets of a row and of the sweep",
}


@dataclass(frozen=True)
class TimingSetting:
    """One row of summary.md's timing settings: the name, its value as recorded, and
    what it means (None for a setting this reader does not know)."""

    name: str
    value: Any
    meaning: str | None


def timing_settings(timing: JsonDoc) -> list[TimingSetting]:
    """A run's metadata.timing (the settings object the sweep records) as rows, in the
    order the run recorded them."""
    return [TimingSetting(k, v, TIMING_MEANINGS.get(k)) for k, v in timing.items()]
