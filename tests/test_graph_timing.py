"""CUDA-graph rows sample by time, not by a fixed count of whole-rotation replays
(benches/timing/graphs.py, timing_plan.graph_split and graph_sample_count): a rotation
too long for one replay is captured in several graphs replayed in turn, in the order
its calls meet the copies.  torch.cuda is faked: graphs record what they captured and
when they were replayed, and every replay lasts the time of the calls it holds."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from benches.timing import graphs as graph_timing
from benches.timing import plan as timing_plan
from benches.timing.plan import TimingConfig


class FakeGraphs:
    """Graphs that remember their calls; events whose elapsed time is that of the
    replay recorded between them (`call_ms` per captured call)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, call_ms: float) -> None:
        self.graphs: list[FakeGraphs.Graph] = []
        self.replays: list[int] = []  # graph index per replay, in order
        self.pools: list[object] = []
        self.capturing: FakeGraphs.Graph | None = None
        outer = self

        class Graph:
            def __init__(self, keep_graph: bool = False) -> None:
                self.calls: list[int] = []
                self.index = len(outer.graphs)
                outer.graphs.append(self)

            def replay(self) -> None:
                outer.replays.append(self.index)
                outer.clock += len(self.calls) * call_ms

            def pool(self) -> tuple[int, int]:
                return (7, 7)

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = outer.clock

            def elapsed_time(self, end: Event) -> float:
                return end.at - self.at

            def synchronize(self) -> None:
                pass

        @contextlib.contextmanager
        def graph(g: Graph, pool: object = None):
            self.pools.append(pool)
            self.capturing = g
            yield
            self.capturing = None

        self.Graph = Graph
        self.clock = 0.0
        stream = SimpleNamespace(wait_stream=lambda s: None)
        monkeypatch.setattr(torch.cuda, "Stream", lambda: stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "Event", Event)

    def calls(self, n: int) -> list:
        def make(j: int):
            def call() -> None:
                if self.capturing is not None:
                    self.capturing.calls.append(j)
            return call
        return [make(j) for j in range(n)]


def test_a_short_rotation_is_one_graph():
    cfg = TimingConfig()
    assert timing_plan.graph_split(209, 0.005, cfg) == [209]  # 1 ms a replay
    assert timing_plan.graph_split(10_241, None, cfg) == [10_241]  # nothing known


@pytest.mark.parametrize("total, call_ms", [(10_241, 0.0185), (200, 0.53), (2561, 0.0067)])
def test_a_long_rotation_is_split_in_equal_graphs_under_the_replay_time(total, call_ms):
    cfg = TimingConfig()
    sizes = timing_plan.graph_split(total, call_ms, cfg)
    assert sum(sizes) == total and len(sizes) > 1
    assert max(sizes) - min(sizes) <= 1
    assert max(sizes) * call_ms <= cfg.graph_replay_ms
    # as few graphs as that allows
    assert (max(sizes) + 1) * call_ms > cfg.graph_replay_ms or min(sizes) < max(sizes)


def test_graph_samples_are_as_many_as_their_time_allows():
    cfg = TimingConfig()
    assert timing_plan.graph_sample_count(2.0, cfg) == cfg.gate_min_samples == 10
    assert timing_plan.graph_sample_count(0.5, cfg) == 40  # graph_rep_ms / replay
    assert timing_plan.graph_sample_count(1e-4, cfg) == cfg.max_samples
    # never fewer than the gate needs, whatever a replay lasts (but within the budget)
    assert timing_plan.graph_sample_count(159.0, cfg) == 10
    assert timing_plan.graph_sample_count(159.0, cfg) * 159.0 < 25 * 159.0


def test_split_graphs_replay_in_rotation_order(monkeypatch):
    n, call_ms = 12, 0.5  # 6 ms a rotation: 4 calls (2 ms) a graph
    fake = FakeGraphs(monkeypatch, call_ms)
    cfg = TimingConfig(graph_min_calls=12)
    t = graph_timing.time_cudagraph(fake.calls(n), cfg, total=n, call_ms=call_ms)
    graphs = [g for g in fake.graphs]
    assert [g.calls for g in graphs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # one memory pool: the first graph's, passed to the others' captures
    assert fake.pools == [None, (7, 7), (7, 7)]
    # every graph once (the uploading round), graph 0 to size the samples, then the
    # round goes on from graph 1, each batch of samples after one untimed replay
    reps = timing_plan.graph_sample_count(4 * call_ms, cfg)
    assert fake.replays[:4] == [0, 1, 2, 0]
    later = fake.replays[4:]
    assert later == [(i + 1) % 3 for i in range(len(later))]
    assert 1 <= len(later) - reps <= 3  # one untimed replay a batch
    assert t.n_samples == reps and t.ms_median == pytest.approx(call_ms)
    assert t.setup_s >= 0 and t.note == ""


def test_the_issues_slowest_graph_row_costs_a_rotation_not_25(monkeypatch):
    """torch's fp8 add at 2^12 on an H200: 10,241 copies, 15.5 us a call (18.5 us as a
    one-call graph).  Before: 27 replays of the whole rotation (159 ms each, 4.3 s);
    now one round over it, then samples of about 2 ms."""
    n, call_ms = 10_241, 0.0155
    fake = FakeGraphs(monkeypatch, call_ms)
    t = graph_timing.time_cudagraph(fake.calls(n), TimingConfig(), call_ms=0.0185)
    replayed_ms = sum(len(fake.graphs[i].calls) * call_ms for i in fake.replays)
    assert replayed_ms < 200  # ms: one round (159) and the samples, not 4,300
    assert t.n_samples >= 10 and t.ms_median == pytest.approx(call_ms)


def test_do_bench_rows_take_their_100_ms_of_samples_at_least_the_gates_10():
    cfg = TimingConfig()
    assert timing_plan.sample_count(0.5, cfg) == 200  # rep_ms / per sample
    assert timing_plan.sample_count(8.0, cfg) == 12  # was 25: 200 ms, not 100
    assert timing_plan.sample_count(50.0, cfg) == cfg.gate_min_samples == 10
    # a CPU row keeps its own floor (plan_cpu): min_samples
    assert cfg.min_samples == 25


def test_a_slow_calls_dispatch_costs_the_budget_not_100_calls():
    import time

    from benches.timing import clock as timing

    calls: list[int] = []

    def call() -> None:  # 1 ms a call, host and device together
        calls.append(1)
        time.sleep(0.001)

    timing.host_dispatch_us(call, lambda: None)
    assert timing.DISPATCH_BUDGET_S == 0.02
    # a warm and a timed call, then 3 bursts within 20 ms (the old 0.25 s: 100 calls)
    assert len(calls) <= 2 + 20
