"""Configs per architecture: each kernel module builds its launches for a Target
(KernelSpec.launches), so `--inspect --arch sm_100` compiles what a run on a B200 tunes
over, and sm_90 keeps the Hopper configs inspect validated.  Nothing is compiled here:
the launches are built from meta tensors."""

from __future__ import annotations

import pytest
import torch

from benches.inspect import compile as ins
from kernels import REGISTRY

# ---- configs per architecture: one choice for --inspect and for a run on that GPU --------

# (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps) of matmul, (BLOCK_M, BLOCK_K, warps, stages,
# STAGES) of matvec.  sm_90's are what inspect validated for Hopper (README): they must
# not move.  matvec's first seven are the plain loop the H200 run tuned over (STAGES = 1),
# the last three pipelined (docs/hopper.md).
HOPPER_MATMUL = {
    "fp32": [(128, 128, 32, 3, 8), (128, 64, 32, 3, 4), (64, 128, 32, 3, 4),
             (64, 64, 32, 3, 4), (32, 64, 32, 4, 4)],
    "tf32": [(128, 256, 32, 3, 8), (64, 256, 32, 3, 8), (128, 128, 32, 3, 4),
             (128, 64, 32, 4, 4), (64, 64, 32, 4, 4)],
    "bf16": [(128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8),
             (128, 128, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
             (64, 64, 64, 4, 4)],
    "fp8": [(256, 128, 128, 3, 8), (256, 128, 64, 4, 8), (128, 128, 128, 4, 8),
            (128, 128, 128, 4, 4), (128, 64, 128, 4, 4), (64, 128, 128, 4, 4),
            (64, 64, 128, 4, 4)],
}
HOPPER_MATMUL["fp16"] = HOPPER_MATMUL["bf16"]
HOPPER_MATMUL["fp8e5"] = HOPPER_MATMUL["fp8"]
HOPPER_PRECISE_FP8 = [(128, 128, 128, 4, 8), (64, 256, 128, 3, 8), (128, 128, 128, 3, 8),
                      (128, 64, 128, 4, 8), (64, 128, 128, 4, 4), (64, 64, 128, 4, 4)]
PIPELINED_MATVEC = [(8, 512, 4, 4, 4), (16, 256, 4, 4, 4), (8, 256, 4, 5, 5)]
HOPPER_MATVEC = [(8, 512, 4, 3, 1), (16, 256, 4, 3, 1), (16, 512, 8, 3, 1),
                 (32, 256, 8, 3, 1), (4, 1024, 4, 3, 1), (8, 1024, 8, 2, 1),
                 (16, 128, 4, 4, 1), *PIPELINED_MATVEC]
# sm_100: the four configs that spill there replaced (kernels/matmul.py, matvec.py).
SM100_MATMUL = {
    **HOPPER_MATMUL,
    "fp32": [(128, 128, 32, 3, 8), (128, 64, 32, 3, 4), (64, 128, 32, 3, 8),
             (64, 64, 32, 3, 8), (32, 64, 32, 4, 4)],
    "tf32": [(128, 128, 64, 3, 8), (64, 256, 32, 3, 8), (128, 128, 32, 4, 8),
             (128, 64, 32, 4, 4), (64, 64, 32, 4, 4)],
}
SM100_MATVEC = [(8, 512, 4, 3, 1), (16, 256, 4, 3, 1), (16, 512, 8, 3, 1),
                (32, 256, 8, 3, 1), (4, 1024, 8, 3, 1), (8, 1024, 8, 2, 1),
                (16, 128, 4, 4, 1), *PIPELINED_MATVEC]
# The persistent TMA candidates, offered from sm_90 on where the layout allows them (all
# of MATMUL_SHAPE's), after the lists above.
TMA_MATMUL = {"16bit": [(128, 256, 64, 3, 8, "tma"), (256, 128, 64, 3, 8, "tma"),
                        (128, 128, 64, 4, 8, "tma")],
              "fp8": [(256, 128, 128, 3, 8, "tma"), (128, 256, 128, 3, 8, "tma"),
                      (128, 128, 128, 4, 8, "tma")]}
TMA_FAMILY = {"fp16": "16bit", "bf16": "16bit", "fp8": "fp8", "fp8e5": "fp8"}
MATMUL_SHAPE = {"M": 4096, "N": 4096, "K": 4096}
MATVEC_SHAPE = {"M": 4096, "K": 4096}


def _tiles(launch) -> list[tuple[int, ...]]:
    out = []
    for c in launch.configs:
        kw = c.kwargs
        if "BLOCK_N" in kw:
            out.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], c.num_stages,
                        c.num_warps) + (("tma",) if kw.get("TMA") else ()))
        else:
            out.append((kw["BLOCK_M"], kw["BLOCK_K"], c.num_warps, c.num_stages,
                        kw["STAGES"]))
    return out


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90", "sm_100"])
def test_each_arch_tunes_over_its_own_configs_and_sm90_keeps_hoppers(arch):
    from kernels.spec import fp8_accum, set_fp8_accum

    matmul = SM100_MATMUL if arch == "sm_100" else HOPPER_MATMUL
    for dtype, want in matmul.items():
        (launch,) = ins.launches_for("matmul", dtype, MATMUL_SHAPE, arch)
        tma = TMA_MATMUL.get(TMA_FAMILY.get(dtype, ""), []) if arch in ("sm_90", "sm_100") \
            else []
        assert _tiles(launch) == want + tma, (arch, dtype)
    (launch,) = ins.launches_for("matvec", "bf16", MATVEC_SHAPE, arch)
    assert _tiles(launch) == (SM100_MATVEC if arch == "sm_100" else HOPPER_MATVEC)
    mode = fp8_accum()
    set_fp8_accum("precise")
    try:
        (launch,) = ins.launches_for("matmul", "fp8", MATMUL_SHAPE, arch)
    finally:
        set_fp8_accum(mode)
    assert _tiles(launch) == HOPPER_PRECISE_FP8


class _OnCuda(torch.Tensor):
    """A meta tensor that says it lives on GPU 0: what a GPU run's inputs look like to
    code that builds launches from shapes, strides and the device alone."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def _gpu_inputs(kernel: str, dtype: str, shape: dict[str, int]):
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    out = spec.alloc_out(inputs, dtype).as_subclass(_OnCuda)
    return spec, {k: v.as_subclass(_OnCuda) if isinstance(v, torch.Tensor) else v
                  for k, v in inputs.items()}, out


@pytest.mark.parametrize("cc,arch", [((10, 0), "sm_100"), ((9, 0), "sm_90")])
def test_a_gpu_run_picks_the_configs_inspect_compiled_for_its_arch(monkeypatch, cc, arch):
    # The runner and the providers build launches without a target: the device's
    # capability (faked at torch's boundary) picks the table, as --arch does for inspect.
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: asked.append(device) or cc)
    for kernel, dtype, shape in [("matmul", "tf32", MATMUL_SHAPE),
                                 ("matmul", "fp32", MATMUL_SHAPE),
                                 ("matvec", "bf16", MATVEC_SHAPE)]:
        spec, inputs, out = _gpu_inputs(kernel, dtype, shape)
        (run,) = spec.triton_launches(inputs, out, 148)
        (inspected,) = ins.launches_for(kernel, dtype, shape, arch)
        assert _tiles(run) == _tiles(inspected), (kernel, dtype)
    assert asked and all(str(d) == "cuda:0" for d in asked)
    want = SM100_MATMUL["tf32"] if arch == "sm_100" else HOPPER_MATMUL["tf32"]
    spec, inputs, out = _gpu_inputs("matmul", "tf32", MATMUL_SHAPE)
    assert _tiles(spec.triton_launches(inputs, out, 148)[0]) == want


def test_launches_passes_the_target_only_to_families_that_take_it():
    import dataclasses

    from kernels.spec import Target

    spec = REGISTRY["add"]
    seen = []
    old_style = dataclasses.replace(spec, triton_launches=lambda i, o, sms: seen.append(sms)
                                    or [])
    new_style = dataclasses.replace(
        spec, triton_launches=lambda i, o, sms, target=None: seen.append(target) or [])
    b200 = Target("cuda", (10, 0))
    assert old_style.launches({}, None, 148, b200) == []  # a 3-argument family still works
    assert new_style.launches({}, None, 148, b200) == []
    assert new_style.launches({}, None, 132) == []
    assert seen == [148, b200, None]
    no_triton = dataclasses.replace(spec, triton_launches=None)
    assert no_triton.launches({}, None, 148, b200) == []


def test_autotuners_are_kept_apart_per_arch(monkeypatch):
    # One process must never serve sm_100's launch from a tuner built over sm_90's
    # candidates: run_launch keys its tuners by the candidates (triton.autotune faked).
    import triton

    from kernels import triton_utils
    from kernels.spec import Target

    class FakeTuner:  # what run_launch uses of Triton's Autotuner
        def __init__(self, configs):
            self.best_config = configs[0]
            self.cache: dict = {}

        def check_disk_cache(self, key, configs, bench_fn):
            return False

        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(triton, "autotune",
                        lambda configs, key: lambda fn: FakeTuner(configs))
    monkeypatch.setattr(triton_utils, "_TUNERS", {})
    spec, inputs, out = _gpu_inputs("matmul", "tf32", MATMUL_SHAPE)
    for cc, want in [((9, 0), HOPPER_MATMUL["tf32"][0]), ((10, 0), SM100_MATMUL["tf32"][0]),
                     ((9, 0), HOPPER_MATMUL["tf32"][0])]:
        (launch,) = spec.launches(inputs, out, 148, Target("cuda", cc))
        cfg = triton_utils.run_launch(launch)
        kw = cfg.kwargs
        assert (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], cfg.num_stages,
                cfg.num_warps) == want, cc
    assert len(triton_utils._TUNERS) == 2


# ---- attention: forward, delta, dK/dV, dQ per architecture -------------------------------

# (BLOCK_M, BLOCK_N, stages, warps) per kernel of kernels/attention_triton.py; delta is
# one fixed launch: (warps,).  sm_90's are what inspect validated for Hopper (README).
HOPPER_ATTENTION = {
    "attn_fwd_kernel": [(128, 128, 2, 8), (128, 64, 3, 8), (64, 64, 3, 4)],
    "attn_bwd_delta_kernel": [(4,)],
    "attn_bwd_dkdv_kernel": [(32, 128, 2, 8), (32, 64, 2, 8)],
    "attn_bwd_dq_kernel": [(128, 64, 2, 8), (64, 64, 2, 4)],
}
# sm_100: the forward's 128x64 at 2 stages (fp8 D=128 spilled at 3) and delta on 8 warps
# (spilled at D=128 on 4); dK/dV and dQ as Hopper.
SM100_ATTENTION = {
    **HOPPER_ATTENTION,
    "attn_fwd_kernel": [(128, 128, 2, 8), (128, 64, 2, 8), (64, 64, 3, 4)],
    "attn_bwd_delta_kernel": [(8,)],
}
ATTENTION_SHAPE = {"B": 8, "H": 16, "S": 2048, "D": 128, "causal": 1}


def _attention_tiles(launches) -> dict[str, list[tuple[int, ...]]]:
    out = {}
    for ln in launches:
        out[ln.name] = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps)
                        if c.kwargs else (c.num_warps,) for c in ln.configs]
    return out


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90", "sm_100"])
def test_attention_tunes_over_its_archs_configs_and_sm90_keeps_hoppers(arch):
    want = SM100_ATTENTION if arch == "sm_100" else HOPPER_ATTENTION
    got = _attention_tiles(ins.launches_for("attention_bwd", "bf16", ATTENTION_SHAPE, arch))
    assert got == want, arch
    # fp8's forward (its own family) tunes over the same forward list
    (fwd,) = ins.launches_for("attention", "fp8", ATTENTION_SHAPE, arch)
    assert _attention_tiles([fwd])["attn_fwd_kernel"] == want["attn_fwd_kernel"]


@pytest.mark.parametrize("cc,arch", [((10, 0), "sm_100"), ((9, 0), "sm_90")])
def test_an_attention_run_picks_the_configs_inspect_compiled(monkeypatch, cc, arch):
    from kernels import attention_triton as at

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    # The log-sum-exp buffer the launches allocate beside q: on meta, as q really is
    # (this CPU build of torch cannot allocate on the GPU the fake tensors name).
    monkeypatch.setattr(at, "_lse", lambda q: torch.empty(q.shape[:3], device="meta"))
    for kernel, dtype in [("attention_bwd", "fp16"), ("attention", "fp8")]:
        spec, inputs, out = _gpu_inputs(kernel, dtype, ATTENTION_SHAPE)
        run = spec.triton_launches(inputs, out, 148)
        inspected = ins.launches_for(kernel, dtype, ATTENTION_SHAPE, arch)
        assert _attention_tiles(run) == _attention_tiles(inspected), (kernel, dtype)
    want = SM100_ATTENTION if arch == "sm_100" else HOPPER_ATTENTION
    spec, inputs, out = _gpu_inputs("attention_bwd", "bf16", ATTENTION_SHAPE)
    assert _attention_tiles(spec.triton_launches(inputs, out, 148)) == want
