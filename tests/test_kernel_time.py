"""A cold row's kernel-only time is taken cold: each profiled call after an L2 flush,
the flush's own device work left out by name and count (benches/sweep/kernel_time.py)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from torch.autograd import DeviceType

from benches.sweep import kernel_time
from benches.sweep.kernel_time import DeviceEvent, without_flushes

FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>(...)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"


def _timeline(*names_us: tuple[str, float], times: int) -> list[DeviceEvent]:
    """The device work of `times` flush-then-call pairs, in order on one stream."""
    out, t = [], 0.0
    for _ in range(times):
        for name, us in names_us:
            out.append(DeviceEvent(name, us, t))
            t += us + 1.0
    return out


def test_the_flushes_work_is_left_out_by_name_and_count():
    events = _timeline((FILL, 55.0), (ADD, 3.0), times=5)
    got = without_flushes(events[::-1], Counter({FILL: 1}), 5)  # in any order given
    assert [(e.name, e.dur_us) for e in got] == [(ADD, 3.0)] * 5
    # A provider whose own kernel is the flush's kind keeps its launches: each flush's
    # own is the first of its pair.
    own_fill = _timeline((FILL, 55.0), (FILL, 2.0), (ADD, 3.0), times=3)
    got = without_flushes(own_fill, Counter({FILL: 1}), 3)
    assert [(e.name, e.dur_us) for e in got] == [(FILL, 2.0), (ADD, 3.0)] * 3
    # Uneven groups (a call that launched once more): by name, the earliest first.
    uneven = own_fill + [DeviceEvent(ADD, 3.0, 1e6)]
    assert len(without_flushes(uneven, Counter({FILL: 1}), 3)) == len(uneven) - 3


def test_a_cold_row_is_profiled_with_a_flush_before_each_call(monkeypatch):
    order: list[str] = []

    def events(run, on_gpu):
        run()
        return []

    monkeypatch.setattr(kernel_time, "profile_events", events)
    monkeypatch.setattr(kernel_time, "_FLUSH_KERNELS", Counter())
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    kernel_time.profile_calls(lambda: order.append("call"), 3, lambda: order.append("flush"))
    assert order == ["flush", "call"] * 3
    order.clear()
    kernel_time.profile_calls(lambda: order.append("call"), 3)  # warm: back to back
    assert order == ["call"] * 3


def test_one_flushs_kernels_survive_a_dropped_first_launch(monkeypatch):
    """CUPTI may drop a session's first kernels: three flushes are profiled, and one
    dropped launch still reads as the flush's one kernel; nothing seen is not kept."""
    sessions = [[FILL, FILL], []]  # the first flush's kernel lost; then a blind session

    def events(run, on_gpu):
        run()
        got = sessions.pop(0)
        return [SimpleNamespace(name=n, device_type=DeviceType.CUDA,
                                time_range=SimpleNamespace(elapsed_us=lambda: 55.0),
                                is_user_annotation=False) for n in got]

    monkeypatch.setattr(kernel_time, "profile_events", events)
    monkeypatch.setattr(kernel_time, "_FLUSH_KERNELS", None)
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    assert kernel_time.flush_kernels(lambda: None) == Counter({FILL: 1})
    monkeypatch.setattr(kernel_time, "_FLUSH_KERNELS", None)
    assert kernel_time.flush_kernels(lambda: None) == Counter()
    assert kernel_time._FLUSH_KERNELS is None  # asked again next time
