"""A fleet's control in one process: the device and backend from the request (CUDA
reported present by torch.cuda, faked), torchrun's environment, heartbeats and stops
through a real c10d store (HashStore) on a fake clock, the collectives' batched samples
(a fake clock and a barrier that leaves a skew), and --list."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from benches.fleet import dist as fdist
from benches.fleet.dist import FleetRefused, Rank
from benches.fleet.liveness import STOP_SIGNAL, Liveness
from benches.sweep.interrupt import PeerStopped
from contract.record import RunRow

TORCHRUN_ENV = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.fixture
def one_gpu(monkeypatch):
    """CUDA reported present with one GPU, every other touch of CUDA a failure, and
    torchrun's environment for rank 1 of 2 on this node."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def touched(*a, **k):
        raise AssertionError("CUDA touched")

    monkeypatch.setattr(torch.cuda, "set_device", touched)
    monkeypatch.setattr(torch.cuda, "get_device_properties", touched)
    for k, v in TORCHRUN_ENV.items():
        monkeypatch.setenv(k, v)
    joined: list[dict] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: joined.append(kw))
    monkeypatch.setattr(dist, "new_group", lambda **kw: pytest.fail("a second group"))
    monkeypatch.setattr(fdist, "_store", lambda: None)
    threads = torch.get_num_threads()
    yield joined
    torch.set_num_threads(threads)
    fdist.stop()


def test_a_cpu_fleet_on_a_gpu_machine_joins_gloo_without_touching_cuda(one_gpu):
    me = fdist.start(5, "cpu")
    assert one_gpu == [{"backend": "gloo", "timeout": timedelta(seconds=5)}]
    assert (me.backend, me.device, me.rank, me.local_world) == ("gloo", "cpu", 1, 2)


def test_a_gpu_fleet_is_still_held_to_the_gpus_present(one_gpu):
    for device in ("auto", "h100"):
        with pytest.raises(FleetRefused, match="2 processes per node but 1 GPU"):
            fdist.start(5, device)
    assert one_gpu == []  # refused before joining


def test_a_gpu_model_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(FleetRefused, match="--device h100 needs a CUDA GPU"):
        fdist.wants_gpu("h100")
    assert not fdist.wants_gpu("auto") and not fdist.wants_gpu("cpu")


def test_a_cpu_rank_has_no_gpu_uuid_on_a_gpu_machine(one_gpu):
    from benches.fleet.folder import gpu_uuid as _gpu_uuid

    cpu = Rank(0, 2, 0, 2, "h", "gloo", 5.0, "cpu")
    assert _gpu_uuid({"nvml_start": {"nvml_uuid": "GPU-1234"}}, cpu) is None


@pytest.mark.parametrize("unset", [("MASTER_ADDR",), ("MASTER_ADDR", "MASTER_PORT")])
def test_half_a_torchrun_environment_is_one_error_line(monkeypatch, capsys, unset):
    import run_bench

    for k, v in TORCHRUN_ENV.items():
        monkeypatch.setenv(k, v)
    for k in unset:
        monkeypatch.delenv(k)
    assert run_bench.main(["--device", "cpu", "--kernels", "add"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: RANK and WORLD_SIZE are set but "
                                               + " and ".join(unset)), cap.err
    assert "torchrun" in err[0] and not cap.out


def test_a_rank_id_outside_the_world_is_refused(monkeypatch):
    for k, v in {**TORCHRUN_ENV, "RANK": "2"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(FleetRefused, match="RANK=2 of WORLD_SIZE=2"):
        fdist.start(5, "cpu")


# ---- heartbeats and stops --------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_rank_whose_heartbeat_stops_is_lost_and_every_rank_is_told():
    store, clock = dist.HashStore(), Clock()
    r0, r1, r2 = (Liveness(store, r, 3, 10.0, clock) for r in range(3))
    for live in (r0, r1, r2):
        live.poll()
    clock.t = 5.0
    r0.poll()  # rank 0 sees rank 2's first beat now; rank 2 beats no more
    clock.t = 14.9
    r1.poll()
    assert r0.poll() is None and not r0.lost
    clock.t = 15.0
    r1.poll()
    assert r0.poll() == "rank 2 sent no heartbeat for 10 s (died or hung)"
    assert list(r0.lost) == [2] and r0.problem_code == 1
    # Rank 1 watches rank 0 only: it learns of rank 2 from the stop rank 0 posted.
    assert r1.poll() == r0.problem and not r1.lost


def test_a_rank_that_leaves_is_not_lost_and_its_error_is_known_at_once():
    store, clock = dist.HashStore(), Clock()
    r0, r1, r2 = (Liveness(store, r, 3, 10.0, clock) for r in range(3))
    for live in (r0, r1, r2):
        live.poll()
    r1.retire("done")
    r2.retire("rank 2 on h failed: RuntimeError: boom")
    assert r0.poll() == "rank 2 on h failed: RuntimeError: boom"
    clock.t = 100.0
    r0.poll()
    assert list(r0.lost) == [2]  # rank 1 left after its work: never lost


def test_an_interrupted_rank_stops_the_others_with_its_exit_code():
    store = dist.HashStore()
    r0, r1, r2 = (Liveness(store, r, 3, 10.0, Clock()) for r in range(3))
    r1.post_stop("rank 1 on h was interrupted (SIGINT)", 130)
    r2.post_stop("rank 2 on h was interrupted (SIGTERM)", 143)  # the first one stands
    for live in (r0, r1, r2):
        live.poll()
        assert (live.problem, live.problem_code) == ("rank 1 on h was interrupted (SIGINT)",
                                                     130)


def _wait(pred, guard_s: float = 120.0) -> None:
    """Until pred() holds (the guard only stops a hang)."""
    end = time.monotonic() + guard_s
    while not pred():
        assert time.monotonic() < end, "hang guard"
        time.sleep(0.01)


def test_a_stop_interrupts_the_armed_main_thread_in_a_blocking_call():
    store = dist.HashStore()
    live = Liveness(store, 1, 2, 1000.0)  # rank 0 is never lost within the test
    live.start()
    try:
        inside = threading.Event()

        def rank0_interrupted() -> None:
            inside.wait(120)
            Liveness(store, 0, 2, 1000.0).post_stop("rank 0 on h was interrupted (SIGINT)",
                                                    130)

        threading.Thread(target=rank0_interrupted, daemon=True).start()
        with pytest.raises(PeerStopped, match="rank 0 on h was interrupted"), live.armed():
            inside.set()
            time.sleep(120)  # a sweep's call: the stop's signal cuts it short
        assert live.problem_code == 130
        # Outside the armed block a stop raises nothing: the fleet's code polls it.
        signal.pthread_kill(threading.main_thread().ident, STOP_SIGNAL)
        time.sleep(0.01)
    finally:
        live.close()


def test_after_its_own_interrupt_a_rank_is_not_interrupted_again_by_the_fleet():
    """Ctrl-C reaches every rank of a node; the first to post its interrupt stops the
    others, whose own sweep is unwinding already (saving its rows): that must not be cut
    short by a second interruption."""
    store = dist.HashStore()
    live = Liveness(store, 1, 2, 1000.0)
    live.start()
    # Python's own Ctrl-C handler, also where this process was started with SIGINT
    # ignored (a background job of a shell without job control: its sleep ran out)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), live.armed():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(120)
            except KeyboardInterrupt:  # the sweep unwinds, keeping its rows...
                Liveness(store, 0, 2, 1000.0).post_stop("rank 0 was interrupted", 130)
                _wait(lambda: live.problem is not None)  # ...and hears the stop
                for _ in range(20):
                    time.sleep(0.01)  # where a second interruption would land
                raise
    finally:
        signal.signal(signal.SIGINT, before)
        live.close()


# ---- the collectives' samples ------------------------------------------------------------

def test_a_sample_is_a_batch_of_calls_so_the_barriers_skew_is_diluted(monkeypatch, tmp_path):
    """Ranks leave a barrier apart; the first call after it waits for the last rank.  A
    fake clock and a barrier after which the next call costs SKEW more: one call per
    sample would read CALL + SKEW (26x the call), a batch reads the call's own time."""
    from benches.fleet import collectives
    from benches.timing import clock as timing

    call_ms, skew_ms = 0.02, 0.5
    clock = SimpleNamespace(t=0.0)
    after_barrier = [False]
    real_barrier = dist.barrier

    def barrier(*a, **k):
        real_barrier(*a, **k)
        after_barrier[0] = True

    def call() -> None:
        clock.t += (call_ms + (skew_ms if after_barrier[0] else 0.0)) / 1e3
        after_barrier[0] = False

    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.t))
    monkeypatch.setattr(dist, "barrier", barrier)
    monkeypatch.setattr(collectives, "collective_buffers",
                        lambda *a: (lambda: None, call, lambda: True))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        row = collectives.measure("all_reduce", "fp32", 4096, "cpu", iters=10)
    finally:
        dist.destroy_process_group()
    assert row.status == "ok" and row.timing.n_samples == 10
    assert row.timing.ms_median == pytest.approx(call_ms, rel=0.1)
    config = str(row.build.config)
    calls = int(config.split()[0])
    assert config == f"{calls} calls per sample"
    assert calls * call_ms + skew_ms >= collectives.MIN_SAMPLE_MS["cpu"]  # a sample's length


def test_an_interrupt_during_the_collectives_ends_them_at_the_next_row(tmp_path):
    """The ranks agree before each row: one rank's stop (its interrupt's exit code) ends
    the sweep on every rank there, with the rows measured so far."""
    from benches.fleet import collectives

    asked = []

    def stop() -> int:  # SIGINT noted once the first row is measured
        asked.append(len(rows))
        return 130 if rows else 0

    rows: list[RunRow] = []
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        code = collectives.sweep("cpu", sizes=(4096,), dtypes=("fp32",),
                                 ops=("all_reduce", "broadcast"), stop=stop, rows=rows)
    finally:
        dist.destroy_process_group()
    assert code == 130 and [r.case.kernel for r in rows] == ["all_reduce"] and asked == [0, 1]


def test_after_the_sweep_signals_are_noted_not_raised():
    from benches.fleet.rank_io import deferred_signals

    with deferred_signals() as noted:
        assert noted() is None
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        _wait(lambda: noted() is not None)
        for _ in range(10):
            time.sleep(0.01)  # where an exception would land
    assert noted() == "SIGTERM"  # the first one


def test_batch_sizes():
    from benches.fleet.collectives import MAX_BATCH, batch_size

    assert batch_size(0.02, 10.0) == 500
    assert batch_size(20.0, 10.0) == 1  # a call longer than a sample: one per sample
    assert batch_size(0.0, 10.0) == MAX_BATCH == batch_size(1e-6, 10.0)


def test_list_shows_the_collectives_and_what_runs_them(capsys):
    import run_bench

    assert run_bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        assert f"│ {op}" in out
    assert "torchrun --nproc-per-node=G run_bench.py" in out and "--kernels" in out
