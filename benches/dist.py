"""torch.distributed for fleet runs: launched by torchrun (or Slurm through torchrun),
one process per device; no process management, rendezvous or sockets of our own.

    torchrun --nproc-per-node=8 run_bench.py --dtypes bf16,fp8
    srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8 \\
         --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 run_bench.py ...

The process group uses NCCL on GPUs (each rank on cuda:LOCAL_RANK) and gloo on CPUs
(each rank a process with its share of the cores), with a timeout: a rank that dies or
hangs makes the others' next collective fail within it, with a message that says so,
never a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 120.0


class FleetError(RuntimeError):
    """A peer that died or hung (one-line message, exit 1)."""


class FleetRefused(FleetError):
    """A fleet that cannot run as asked, found before measuring (one-line message,
    exit 2): more ranks per node than GPUs, ranks that disagree."""


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local_rank: int
    local_world: int
    host: str
    backend: str


def launched() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def start(timeout_s: float = DEFAULT_TIMEOUT_S) -> Rank:
    """Join the process group torchrun set up; refuse more ranks per node than GPUs
    before anything is initialized."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    gpu = torch.cuda.is_available()
    if gpu:
        n = torch.cuda.device_count()
        if local_world > n:
            raise FleetRefused(f"{local_world} processes per node but {n} GPU(s) on "
                             f"{socket.gethostname()}: use --nproc-per-node={n}")
        torch.cuda.set_device(local_rank)
    else:
        # Each rank a process with its own share of the cores.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    backend = "nccl" if gpu else "gloo"
    kw: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if gpu:
        kw["device_id"] = torch.device("cuda", local_rank)
    try:
        dist.init_process_group(**kw)
    except TypeError:  # a torch without device_id
        kw.pop("device_id", None)
        dist.init_process_group(**kw)
    return Rank(rank, world, local_rank, local_world, socket.gethostname(), backend)


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def agree(what: str, parts: dict[str, Any]) -> None:
    """FleetError unless every rank has the same `parts` (versions, case list...),
    naming the ranks that differ and how."""
    mine = {"fp": fingerprint(parts), "parts": parts}
    every: list[Any] = [None] * dist.get_world_size()
    collective("agreeing on the " + what, dist.all_gather_object, every, mine)
    odd = [r for r, x in enumerate(every) if x["fp"] != every[0]["fp"]]
    if odd:
        diff = sorted(k for k in parts if every[odd[0]]["parts"].get(k)
                      != every[0]["parts"].get(k))
        raise FleetRefused(f"ranks disagree on the {what}: rank(s) {odd} differ from rank 0 "
                         f"in {', '.join(diff)}; every rank must run the same suite, torch, "
                         "triton and cases")


def collective(doing: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """A torch.distributed call whose failure (a peer that died, or the timeout) becomes
    a one-line FleetError saying what the fleet was doing."""
    try:
        return fn(*args, **kw)
    except RuntimeError as e:  # torch.distributed's errors (DistBackendError...) are these
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise FleetError(f"{doing}: a peer died or did not answer within the timeout "
                         f"({first})") from None
