"""torch.distributed for fleet runs: launched by torchrun (or Slurm through torchrun),
one process per device; no process management, rendezvous or sockets of our own.

    torchrun --nproc-per-node=8 run_bench.py --dtypes bf16,fp8
    srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8 \\
         --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 run_bench.py ...

The process group uses NCCL on GPUs (each rank on cuda:LOCAL_RANK) and gloo on CPUs
(each rank a process with its share of the cores).  The fleet's own exchanges (versions,
case lists, rows) go through a gloo group, the default one on CPUs and a second one
beside NCCL on GPUs: gloo honours the timeout by raising an error this module turns into
one line, and its monitored barrier names the ranks that did not arrive, where NCCL's
watchdog would abort the process.  A rank that dies or hangs thus makes the others stop
within the timeout, with a message that says which, never a hang.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable
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
    timeout_s: float


# The gloo group of the fleet's own exchanges (None: the default group, itself gloo).
_control: Any = None


def launched() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def cpu_threads(cores: int, local_world: int) -> int:
    """Threads of one rank on a CPU: the node's cores shared evenly by its ranks."""
    return max(1, cores // max(1, local_world))


def start(timeout_s: float = DEFAULT_TIMEOUT_S) -> Rank:
    """Join the process group torchrun set up; refuse more ranks per node than GPUs
    before anything is initialized."""
    global _control
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
        torch.set_num_threads(cpu_threads(os.cpu_count() or 1, local_world))
    backend = "nccl" if gpu else "gloo"
    timeout = timedelta(seconds=timeout_s)
    kw: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if gpu:
        kw["device_id"] = torch.device("cuda", local_rank)
    try:
        collective("joining the process group", dist.init_process_group, **kw)
    except TypeError:  # a torch without device_id
        kw.pop("device_id", None)
        collective("joining the process group", dist.init_process_group, **kw)
    _control = (collective("making the gloo group", dist.new_group, backend="gloo",
                           timeout=timeout) if gpu else None)
    return Rank(rank, world, local_rank, local_world, socket.gethostname(), backend,
                timeout_s)


def stop() -> None:
    global _control
    if dist.is_initialized():
        dist.destroy_process_group()
    _control = None


def fingerprint(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def all_gather_object(doing: str, obj: Any) -> list[Any]:
    every: list[Any] = [None] * dist.get_world_size()
    collective(doing, dist.all_gather_object, every, obj, group=_control)
    return every


def broadcast_object(doing: str, obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    box = [obj]
    collective(doing, dist.broadcast_object_list, box, src=0, group=_control)
    return box[0]


def gather_object(doing: str, obj: Any) -> list[Any] | None:
    """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
    out: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    collective(doing, dist.gather_object, obj, out, dst=0, group=_control)
    return out


def agree(what: str, parts: dict[str, Any]) -> None:
    """FleetRefused unless every rank has the same `parts` (versions, case list...),
    naming the ranks that differ and how."""
    every = all_gather_object("agreeing on the " + what,
                              {"fp": fingerprint(parts), "parts": parts})
    odd = [r for r, x in enumerate(every) if x["fp"] != every[0]["fp"]]
    if odd:
        ours, theirs = every[0]["parts"], every[odd[0]]["parts"]
        diff = []
        for k in sorted(ours.keys() | theirs.keys()):
            a, b = ours.get(k), theirs.get(k)
            if a != b:  # short values are shown: "torch (2.11.0 vs 2.13.0)"
                short = len(str(a)) <= 40 and len(str(b)) <= 40
                diff.append(f"{k} ({a} vs {b})" if short else k)
        raise FleetRefused(f"ranks disagree on the {what}: rank(s) {odd} differ from rank 0 "
                           f"in {', '.join(diff)}; every rank must run the same suite, torch, "
                           "triton and cases")


def _store() -> Any | None:
    """The store torchrun's rendezvous gave the process group (where ranks can leave a
    mark that outlives them), or None where torch does not expose it."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def wait_for_peers(doing: str, timeout_s: float, tag: str) -> None:
    """Wait up to timeout_s for every rank to reach this point (gloo's monitored barrier:
    rank 0 waits for each other rank, and names every one that did not come).  Each rank
    also marks its arrival in the rendezvous store under `tag`, so that rank 0 can name
    the ranks that never came when the barrier fails on a closed connection instead."""
    store, rank = _store(), dist.get_rank()

    def mark(r: int) -> str:
        return f"gpubench/{tag}/{r}"

    if store is not None:
        collective(doing, store.set, mark(rank), "1")
    try:
        dist.monitored_barrier(group=_control, timeout=timedelta(seconds=timeout_s),
                               wait_all_ranks=True)
        return
    except RuntimeError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "failed to pass monitoredBarrier" in msg:
        # "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 4000 ms"
        ranks = msg.split("Ranks", 1)[1].split("failed", 1)[0].strip()
        raise FleetError(f"{doing}: rank(s) {ranks} did not arrive within {timeout_s:.0f} s "
                         "(died or hung)")
    absent: list[int] = []
    if store is not None and rank == 0:
        try:
            absent = [r for r in range(dist.get_world_size()) if not store.check([mark(r)])]
        except RuntimeError:
            absent = []
    if absent:
        raise FleetError(f"{doing}: rank(s) {', '.join(map(str, absent))} did not arrive "
                         "(died: its connection closed)")
    raise FleetError(f"{doing}: a peer died or hung (waited up to {timeout_s:.0f} s; "
                     f"{msg[:160]})")


def collective(doing: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A torch.distributed call whose failure (a peer that died, or the timeout) becomes
    a one-line FleetError saying what the fleet was doing."""
    try:
        return fn(*args, **kw)
    except RuntimeError as e:  # torch.distributed's errors (DistBackendError...) are these
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise FleetError(f"{doing}: a peer died or did not answer within the timeout "
                         f"({first})") from None
