"""The L2 ceiling's probe (benches/l2_probe.py): one long Triton kernel copying a buffer
held in the L2 pass after pass, in place of back-to-back copy kernels whose launches the
figure measured as much as the cache.  Here: what it computes (the interpreter), how it
is sized for an H200 (so that its launch is a rounding error), that on the stand-in GPU
(Triton's compile for sm_90) it is one kernel whose passes loop inside it with L2-only
loads, and that the ceiling uses it on a GPU.  Its figure only a GPU gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benches import l2_probe
from benches import measured_ceilings as ceil_mod
from contract.devices import Present

ROOT = Path(__file__).resolve().parents[1]
H200 = Present("h200", "NVIDIA H200", "cuda", capability=(9, 0), sms=132, l2_mb=60.0)


@pytest.mark.interpreter
def test_one_call_copies_the_buffer_in_every_pass() -> None:
    probe = l2_probe.l2_copy(1 << 18, 2, "cpu", bytes_per_call=1 << 21)
    assert probe.programs == 2 * l2_probe.PROGRAMS_PER_SM
    n = probe.buffer_bytes // 4
    assert n % (probe.programs * l2_probe.BLOCK) == 0 and probe.buffer_bytes <= 1 << 18
    assert probe.passes == (1 << 21) // (8 * n) and probe.passes > 1
    assert probe.bytes_moved == 8 * n * probe.passes  # read + written, every pass
    probe.fn()
    assert torch.equal(probe.src, probe.dst)


def test_an_h200_probe_is_a_quarter_of_its_l2_and_milliseconds_long() -> None:
    """Source and destination fill at most a quarter of the L2 (60 MiB), over 4 programs
    an SM; one call moves 16 GiB: 1.6 ms even at 10 TB/s, so a launch's ramp and tail (a
    few us) are under 1% of a sample, and so is its first pass, read from DRAM after the
    timer's flush (at the DRAM copy's 4.26 TB/s)."""
    probe = l2_probe.l2_copy(int(H200.l2_mb * 2**20) // 8, H200.sms, "meta")
    assert probe.programs == 528 and 2 * probe.buffer_bytes <= 60 * 2**20 // 4
    assert probe.buffer_bytes >= 0.75 * 60 * 2**20 // 8  # most of what it was given
    assert l2_probe.BYTES_PER_CALL - 8 * probe.buffer_bytes < probe.bytes_moved \
        <= l2_probe.BYTES_PER_CALL
    call_s = probe.bytes_moved / 10e12
    assert 5e-6 / call_s < 0.01
    assert (2 * probe.buffer_bytes / 4.26e12) / call_s < 0.01
    with pytest.raises(ValueError, match="less than 1024 fp32 values"):
        l2_probe.l2_copy(1 << 20, 132, "meta")


_COMPILE = """
import contextlib, io, re
import torch, triton
from benches.inspect.compile import bind, gpu_target
from benches.l2_probe import BLOCK, l2_copy_kernel
from kernels.spec import TritonLaunch
src = torch.empty(1 << 20, dtype=torch.float32, device="meta")
launch = TritonLaunch(l2_copy_kernel, (src, torch.empty_like(src), 3072, 1323, 528),
                      {"BLOCK": BLOCK}, (triton.Config({}, num_warps=4),), lambda kw: (528,))
s, options = bind(launch, launch.configs[0], 90)
with contextlib.redirect_stdout(io.StringIO()):
    k = triton.compile(s, target=gpu_target(90), options=options.__dict__)
print(k.asm["ptx"])
"""


def test_on_the_stand_in_gpu_the_passes_loop_inside_one_kernel() -> None:
    """Compiled for sm_90 as a launch on an H200 is (Triton's own binder; a child
    process without the interpreter): one entry, its loads cached in the L2 only
    (ld.global.cg), one load and one store of each kind in the copy's loop, and two
    loops (the copy's steps within a pass, the passes): no pass hoisted or dropped."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    ptx = p.stdout
    assert ptx.count(".entry ") == 1
    loads = [ln.split()[0] for ln in ptx.splitlines() if "ld.global" in ln]
    stores = [ln.split()[0] for ln in ptx.splitlines() if "st.global" in ln]
    assert loads and all(op.startswith("ld.global.cg") for op in loads), loads
    assert stores and len(loads) == len(stores)
    back_edges = [ln for ln in ptx.splitlines() if " bra" in ln and "$L__BB0_" in ln]
    loop_heads = {ln.split("$")[-1].strip(" ;") for ln in back_edges}
    assert len(loop_heads) >= 2, back_edges


def test_the_gpu_cache_ceiling_is_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the cache ceiling times the probe (flushed CUDA events, as the DRAM
    copy: its first pass from DRAM is ~0.2% of it) and records its bytes over its
    fastest sample and its method; no graph of copy kernels."""
    asked: list[tuple[int, int]] = []
    timed: list[bool] = []
    probe = l2_probe.L2Copy(lambda: None, torch.empty(0), torch.empty(0),
                            bytes_moved=16 << 30, buffer_bytes=6 << 20, passes=1365,
                            programs=528)

    def l2_copy(cache_bytes: int, sms: int, device: str = "cuda") -> l2_probe.L2Copy:
        asked.append((cache_bytes, sms))
        return probe

    def time_ms(fn, device, l2_flush=True):
        assert fn is probe.fn and device == "cuda"
        timed.append(l2_flush)
        return 2.0

    monkeypatch.setattr(l2_probe, "l2_copy", l2_copy)
    monkeypatch.setattr(ceil_mod, "_time_ms", time_ms)
    out = {"hbm_gbps": 4260.0, "method": {}, "left_out": {}, "l2_gbps": None}
    ceil_mod._measure_cache_copy(out, H200, "cuda", lambda m: None,
                                 lambda name, why: out["left_out"].update({name: why}))
    assert asked == [(60 * 2**20 // 8, 132)] and timed == [True]
    assert out["l2_gbps"] == pytest.approx((16 << 30) / 2e-3 / 1e9)
    assert out["method"]["l2"].startswith("one Triton kernel copying 6.0 MiB held in the "
                                          "L2 1365 times (528 programs")
    assert not out["left_out"]


def test_a_cached_cache_roof_of_the_graph_copies_is_measured_again() -> None:
    old = {"tflops": {"bf16": 750.0}, "hbm_gbps": 4258.0, "l2_gbps": 4955.0,
           "method": {"l2": "50 back-to-back copies of 7.5 MiB, replayed in a CUDA graph"}}
    assert "replayed in CUDA graphs" in ceil_mod.cache_problem(old)
    probe = l2_probe.l2_copy(int(H200.l2_mb * 2**20) // 8, H200.sms, "meta")
    assert ceil_mod.cache_problem({**old, "method": {"l2": probe.method}}) is None
    cpu = {**old, "method": {"l2": "50 back-to-back copies of 2.0 MiB"}}
    assert ceil_mod.cache_problem(cpu) is None  # a CPU's copies: its method
