"""What the measured training step files where: each GPU kernel counted once and put in
the category of the op that launched it (on a profiler event list as torch builds it),
autocast's weight copies apart from the activations, and SDPA's math backend counted
once, as attention."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benches.step.measure import measure_model
from benches.step.profile import CATEGORIES, split_cpu_time, split_device_time
from benches.step.transformer import Transformer
from contract.models import ModelShape

TINY = ModelShape("tiny", d_model=64, n_layers=2, d_ff=256, vocab=1000, seq_len=32,
                  heads=4, kv_heads=4, tied=False)


class Events:
    """A profiler event list built the way torch's _parse_kineto_results builds one on
    a GPU: CPU ops nested by cpu_parent, each kernel a device event of its own and also
    an entry in the `kernels` of the op that launched it (linked by correlation id),
    the cudaLaunchKernel runtime call a CPU child of that op."""

    def __init__(self) -> None:
        self.events: list[FunctionEvent] = []
        self.t = 0.0
        self.device_us = 0.0  # the kernels' time, each once

    def op(self, name: str, parent: FunctionEvent | None = None, cpu_us: float = 10.0
           ) -> FunctionEvent:
        self.t += 1
        ev = FunctionEvent(len(self.events) + 1, name, thread=1, start_us=self.t,
                           end_us=self.t + cpu_us, use_device="cuda")
        if parent is not None:
            ev.set_cpu_parent(parent)
            parent.append_cpu_child(ev)
        self.events.append(ev)
        return ev

    def kernel(self, name: str, us: float, launcher: FunctionEvent | None) -> None:
        if launcher is not None:
            self.op("cudaLaunchKernel", launcher, cpu_us=0.5)
            launcher.append_kernel(name, 0, us)
        self.events.append(FunctionEvent(len(self.events) + 1, name, thread=7,
                                         start_us=1000 + self.t, end_us=1000 + self.t + us,
                                         device_type=DeviceType.CUDA, use_device="cuda"))
        self.device_us += us


def test_each_kernel_counts_once_in_its_launching_ops_category():
    ev = Events()
    linear = ev.op("aten::linear")
    ev.op("aten::t", linear)
    addmm = ev.op("aten::addmm", linear)
    ev.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", 50.0, addmm)
    # The same kernel again, same duration, from another op: both count.
    ev.kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", 50.0, ev.op("aten::mm"))
    to = ev.op("aten::to")
    copy = ev.op("aten::copy_", ev.op("aten::_to_copy", to))
    ev.kernel("Memcpy HtoD (Pageable -> Device)", 5.0, copy)
    ev.kernel("Memset (Device)", 2.0, ev.op("aten::fill_", ev.op("aten::zero_")))
    # SDPA's math backend: its bmm and softmax are attention's.
    sdpa = ev.op("aten::scaled_dot_product_attention")
    math = ev.op("aten::_scaled_dot_product_attention_math", sdpa)
    ev.kernel("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", 7.0,
              ev.op("aten::bmm", ev.op("aten::matmul", math)))
    ev.kernel("void at::native::softmax_warp_forward<...>", 1.5, ev.op("aten::_softmax", math))
    # Backward of a linear with a bias: the weight gradient is a GEMM, the bias gradient
    # (a sum under AddmmBackward0) elementwise.
    node = ev.op("AddmmBackward0", ev.op("autograd::engine::evaluate_function: "
                                         "AddmmBackward0"))
    ev.kernel("nvjet_hsh_64x8_64x16_4x1_v_bz_TNT", 30.0, ev.op("aten::mm", node))
    ev.kernel("void at::native::reduce_kernel<512, 1, ...>", 3.0, ev.op("aten::sum", node))
    ce = ev.op("aten::cross_entropy_loss")
    ev.kernel("void at::native::cunn_SoftMaxForward<...LogSoftMaxForwardEpilogue>", 4.0,
              ev.op("aten::_log_softmax", ev.op("aten::log_softmax", ce)))
    ev.kernel("void at::native::nll_loss_forward_reduce_cuda_kernel_2d<...>", 1.0,
              ev.op("aten::nll_loss_forward", ev.op("aten::nll_loss_nd", ce)))
    # A kernel no op claims: by its own name.
    ev.kernel("nvjet_hsh_256x128_64x4_1x2_h_bz_coopB_NNT", 11.0, None)
    # A GPU user annotation (a record_function range mirrored on the GPU): no work.
    ev.events.append(FunctionEvent(999, "Optimizer.step#AdamW.step", thread=7,
                                   start_us=0, end_us=5000, device_type=DeviceType.CUDA,
                                   use_device="cuda", is_user_annotation=True))

    ms = split_device_time(ev.events)
    assert sum(ms.values()) == pytest.approx(ev.device_us / 1e3)  # each kernel once
    assert ms == pytest.approx({"gemm": 0.141, "attention": 0.0085,
                                "norms and elementwise": 0.010, "loss": 0.005,
                                "optimizer": 0.0, "other": 0.0})
    opt = split_device_time(ev.events, only="optimizer")
    assert opt["optimizer"] == pytest.approx(ev.device_us / 1e3)
    assert set(ms) == set(CATEGORIES)


def test_cpu_self_times_count_once_by_their_op_and_its_parents():
    ev = Events()
    linear = ev.op("aten::linear", cpu_us=100)  # self 100 - 60 = 40: other
    ev.op("aten::addmm", linear, cpu_us=60)
    sdpa = ev.op("aten::scaled_dot_product_attention", cpu_us=50)  # self 10
    ev.op("aten::bmm", sdpa, cpu_us=25)
    ev.op("aten::_softmax", sdpa, cpu_us=15)
    ce = ev.op("aten::cross_entropy_loss", cpu_us=30)  # self 10
    ev.op("aten::_log_softmax", ce, cpu_us=20)
    node = ev.op("AddmmBackward0", cpu_us=70)  # self 10: gemm
    ev.op("aten::mm", node, cpu_us=40)
    ev.op("aten::sum", node, cpu_us=20)
    ms = split_cpu_time(ev.events)
    assert sum(ms.values()) == pytest.approx((100 + 50 + 30 + 70) / 1e3)
    assert ms["gemm"] == pytest.approx((60 + 40 + 10) / 1e3)
    assert ms["attention"] == pytest.approx(50 / 1e3)
    assert ms["loss"] == pytest.approx(30 / 1e3)
    assert ms["norms and elementwise"] == pytest.approx(20 / 1e3)
    assert ms["other"] == pytest.approx(40 / 1e3)


def _saved_storage_bytes(shape: ModelShape, micro_batch: int, dtype: torch.dtype) -> int:
    """Every distinct storage autograd saves in a forward of the model under autocast,
    parameters left out: what the step's memory split must add up to."""
    torch.manual_seed(0)
    model = Transformer(shape)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    idx = torch.randint(shape.vocab, (micro_batch, shape.seq_len))
    tgt = torch.randint(shape.vocab, (micro_batch, shape.seq_len))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=dtype):
        model(idx, tgt)
    return sum(seen.values())


def test_autocast_weight_casts_are_not_activations():
    # CPU autocast casts (and caches) the fp32 weights to bf16 for the matmuls, as a
    # GPU's does; the matmuls' backward saves those copies.
    m = measure_model(TINY, TINY.n_layers, 2, "cpu", "bf16", steps=1, warmup=1)
    mem = m.memory
    linear = sum(mod.weight.numel() for mod in Transformer(TINY).modules()
                 if isinstance(mod, torch.nn.Linear))
    assert mem["weight_casts"] == 2 * linear  # one bf16 copy of each matmul weight
    total = _saved_storage_bytes(TINY, 2, torch.bfloat16)
    assert mem["activations"] == total - mem["weight_casts"]
    assert 0 < mem["activations_in_blocks"] <= mem["activations"]
    fp32 = measure_model(TINY, TINY.n_layers, 2, "cpu", "fp32", steps=1, warmup=1)
    assert fp32.memory["weight_casts"] == 0


@pytest.mark.parametrize("shape", [
    TINY,
    ModelShape("gqa", 96, 2, 200, 500, 16, 6, 2, tied=True, gated=True),
    ModelShape("gpt", 64, 2, 256, 300, 16, 4, 4, tied=True, bias=True, learned_pos=True,
               norm_params=2),
])
def test_the_linears_run_no_batched_matmul(shape):
    """Why a bmm is attention's in this model: the linear layers fold their tokens into
    one mm/addmm, forward and backward, whatever the shape."""
    model = Transformer(shape)
    idx = torch.randint(shape.vocab, (2, shape.seq_len))
    with FlopCounterMode(display=False) as count:
        model(idx, idx).backward()
    ops = {str(op) for op in count.get_flop_counts()["Global"]}
    assert ops <= {"aten.mm", "aten.addmm"}, ops


def test_sdpa_on_its_math_backend_is_counted_once_as_attention():
    with sdpa_kernel([SDPBackend.MATH]):
        m = measure_model(TINY, TINY.n_layers, 2, "cpu", "fp32", steps=1, warmup=1)
    tokens = 2 * TINY.seq_len
    hd, T = TINY.head_dim, TINY.seq_len
    qk_and_pv = 2 * (2 * 2 * TINY.heads * T * T * hd)  # batch 2, per layer
    assert m.flops_forward["gemm"] == 2 * TINY.matmul_params * tokens
    assert m.flops_forward["attention"] == TINY.n_layers * qk_and_pv
    # The math backward keeps the scores: 4 batched matmuls, 2x the forward.
    assert m.flops_backward["attention"] == 2 * m.flops_forward["attention"]
    assert m.flops_backward["gemm"] == 2 * m.flops_forward["gemm"]
    assert any("math backend" in n for n in m.notes)
    assert not any("counted by its formula" in n for n in m.notes)
    assert m.profile_ms["attention"] > 0
