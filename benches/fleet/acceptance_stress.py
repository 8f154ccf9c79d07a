"""The active checks of fleet acceptance, run by every rank at once: a sustained matmul
stress with equality checks, a copy bandwidth, and the node's all_reduce busbw.

Stress.  The registry's matmul (kernels/matmul.py: torch.matmul, torch._scaled_mm for
fp8) multiplies the same inputs (same seed on every rank) over and over for the
stress's seconds, in batches timed together (CUDA is asynchronous: one synchronize per
batch; a batch lasts about BATCH_S).  The first product is checked against the float64
reference (the dtype's tolerance, kernels/spec.py) and hashed (its bytes' SHA-256, the
digest every rank of the same model should share: silent data corruption shows as a
rank that disagrees); every later product is compared with the first bit for bit, on
the device, without a sync (a count of products that differ).  Throughput is the
median over batches of 2 n^3 per call; it includes the comparison (2 n^2 element reads,
under 1% of a call at n = 8192 on a GPU), the same on every rank.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable

import torch

from benches.fleet.acceptance_records import NodeBusbw, Stress
from benches.timing.clock import time_call_ms

# Square products: gpu-fryer's 8192 on GPUs; on CPUs a size a core multiplies in tens of
# milliseconds.  A rank's stress dtypes: bf16 (+ fp8 on sm_89+) on GPUs, fp32 on CPUs.
N = {"cuda": 8192, "cpu": 512}
SEED = 1234
BATCH_S = 0.25
# Batches a stress takes however short its time: products to compare with the first,
# and batches past the warm-up one to take the median of.
MIN_BATCHES = 3
# Copy: 1 GiB on GPUs (far past L2), 64 MiB on CPUs (past a core's share of LLC).
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}
COPY_SAMPLES = 10
# all_reduce busbw: 1 GiB bf16 (NCCL reaches its bus bandwidth there), 4 MiB fp32 through
# gloo on CPUs (its largest size in the collectives sweep).
BUSBW = {"cuda": ("bf16", 1 << 30, 20), "cpu": ("fp32", 1 << 22, 10)}


def stress_dtypes(device: str) -> tuple[str, ...]:
    if device != "cuda":
        return ("fp32",)
    from kernels.spec import current_target, fp8_ok_on

    return ("bf16", "fp8") if fp8_ok_on(current_target()) else ("bf16",)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
                          ).hexdigest()[:16]


def matmul_stress(dtype: str, seconds: float, device: str, *, n: int | None = None,
                  slow: float = 1.0, wrong: bool = False,
                  midway: Callable[[], None] | None = None) -> Stress:
    """Multiply the same n x n inputs for `seconds` (see the module docstring).
    `midway` is called once, half way, with products still queued (the GPU busy).
    Test-only: `slow` multiplies the measured times; `wrong` alters the second product
    (one element), as a corrupting GPU would."""
    from kernels import REGISTRY
    from kernels.spec import DTYPES

    spec = REGISTRY["matmul"]
    n = n or N[device]
    on_gpu = device == "cuda"
    inputs = spec.make_inputs({"M": n, "N": n, "K": n}, dtype, SEED, device)
    call = spec.providers["torch"].fn
    out = spec.alloc_out(inputs, dtype)
    first = call(inputs, out).clone()
    rel_err = spec.check(first, inputs, dtype)
    tol = DTYPES[dtype].tol
    differ = torch.zeros((), dtype=torch.int64, device=device)
    per_call: list[float] = []
    done, batch = 0, 1
    t_start = time.monotonic()
    t_mid, t_end = t_start + seconds / 2, t_start + seconds
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            got = call(inputs, out)
            if wrong and done == 1:
                got.view(-1)[0] += 1.0
            differ += (got != first).any()
            done += 1
        if midway is not None and time.monotonic() >= t_mid:
            midway()  # products are still queued on a GPU
            midway = None
        if on_gpu:
            torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) * slow
        per_call.append(dt / batch)
        if time.monotonic() >= t_end and len(per_call) >= MIN_BATCHES:
            break
        batch = max(1, min(10_000, round(BATCH_S / max(dt / batch, 1e-9))))
    # The first batch (one call) pays warm-up; it counts only when it is all there is.
    ms = statistics.median(per_call[1:] or per_call) * 1e3
    return Stress(n=n, iterations=done, mismatches=int(differ.item()),
                  digest=_digest(first), rel_err=rel_err, tol=tol,
                  reference_ok=rel_err <= tol, tflops=2 * n**3 / (ms * 1e-3) / 1e12,
                  ms_per_call=ms, seconds=time.monotonic() - t_start)


def copy_bandwidth(device: str, slow: float = 1.0, nbytes: int | None = None) -> float:
    """Median GB/s of a device-to-device copy, each byte read and written (2 x bytes)."""
    nbytes = nbytes or COPY_BYTES[device]
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        nbytes = min(nbytes, free // 4)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: pages touched, kernels loaded
    ms = statistics.median(time_call_ms(lambda: dst.copy_(src), device == "cuda")
                           for _ in range(COPY_SAMPLES)) * slow
    return 2 * nbytes / (ms * 1e-3) / 1e9


def node_busbw(hosts: list[str], rank: int, device: str, slow: float = 1.0
               ) -> NodeBusbw | None:
    """The all_reduce busbw among the ranks of this rank's node (every rank calls this:
    each node's group is made by all, as torch.distributed requires); None on a node of
    one rank.  The times are the slowest rank's (benches/fleet/collectives.py)."""
    import torch.distributed as dist

    from benches.fleet import collectives

    groups = {}
    for host in sorted(set(hosts), key=hosts.index):
        members = [r for r, h in enumerate(hosts) if h == host]
        groups[host] = (members, dist.new_group(ranks=members) if len(members) > 1
                        else None)
    members, group = groups[hosts[rank]]
    if group is None:
        return None
    dtype, size, iters = BUSBW[device]
    row = collectives.measure("all_reduce", dtype, size, device, iters=iters, group=group)
    if not row.ok:
        return NodeBusbw(None, why=row.reason)
    return NodeBusbw(row.fleet.busbw_gbps / slow, bytes=row.accounting.bytes, dtype=dtype,
                     ms_median=row.timing.ms_median * slow, ranks=tuple(members))
