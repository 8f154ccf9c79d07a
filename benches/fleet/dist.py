"""torch.distributed for fleet runs: launched by torchrun (or Slurm through torchrun),
one process per device; no process management, rendezvous or sockets of our own.

    torchrun --nproc-per-node=8 run_bench.py --dtypes bf16,fp8
    srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node=8 \\
         --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 run_bench.py ...

The request decides the device and so the backend: `--device cpu` is gloo with each rank a
CPU process with its share of the cores, on any machine; a GPU model is NCCL with each
rank on cuda:LOCAL_RANK; `auto` is a GPU where CUDA is present, else the CPU.  The
fleet's agreement at the start (versions, case list, run id) goes through a gloo group,
the default one on CPUs and a second one beside NCCL on GPUs: gloo honours the timeout by
raising an error this module turns into one line, where NCCL's watchdog would abort the
process.

Everything after the start goes through the rendezvous store that torchrun set up,
polled from Python, so a signal or a lost peer is acted on within a poll, never after a
blocking call's timeout: every rank beats a heartbeat there from a background thread
(Liveness), rank 0 watches every rank's and the others watch rank 0's; a rank that stops
beating for --dist-timeout seconds (killed, frozen, its host gone) is lost, and the
first rank that learns of a loss or is interrupted posts why under one key, which every
rank watches.  A rank that leaves on an error posts it as it goes, so the others learn
at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import socket
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from benches.fleet.liveness import PREFIX, FleetError, Liveness, first_line

DEFAULT_TIMEOUT_S = 120.0
# torchrun's environment: RANK and WORLD_SIZE mark a launched process (launched()); the
# rendezvous needs the master's address and port too.
LAUNCH_ENV = ("RANK", "WORLD_SIZE")
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT")


class FleetRefused(FleetError):
    """A fleet that cannot run as asked, found before measuring (one-line message,
    exit 2): half a torchrun environment, more ranks per node than GPUs, ranks that
    disagree."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2)


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int
    local_rank: int
    local_world: int
    host: str
    backend: str
    timeout_s: float
    device: str = "cpu"  # "cuda" (cuda:LOCAL_RANK) or "cpu": where this rank measures


# The gloo group of the fleet's own exchanges (None: the default group, itself gloo).
_control: Any = None
# This rank's heartbeat and watcher (started with the process group).
_live: Liveness | None = None


def launched() -> bool:
    """Whether torchrun (or an equivalent launcher) started this process."""
    return all(k in os.environ for k in LAUNCH_ENV)


def cpu_threads(cores: int, local_world: int) -> int:
    """Threads of one rank on a CPU: the node's cores shared evenly by its ranks."""
    return max(1, cores // max(1, local_world))


def _environment() -> tuple[int, int, int, int]:
    """(rank, world, local rank, local world) from torchrun's variables, or FleetRefused
    naming what is missing or wrong (half a torchrun environment: RANK and WORLD_SIZE
    left over from something else)."""
    missing = [k for k in (*LAUNCH_ENV, *RENDEZVOUS_ENV) if not os.environ.get(k)]
    if missing:
        raise FleetRefused(
            f"RANK and WORLD_SIZE are set but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: start fleet runs with torchrun "
            "(it sets them all), or unset RANK and WORLD_SIZE for a single run")
    values = {}
    for k, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "RANK"),
                       ("LOCAL_WORLD_SIZE", "WORLD_SIZE"), ("MASTER_PORT", None)):
        text = os.environ.get(k) or os.environ[default or k]
        try:
            values[k] = int(text)
        except ValueError:
            raise FleetRefused(f"{k}={text!r} is not an integer (torchrun's environment is "
                               "incomplete or overwritten)") from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    local_rank, local_world = values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"]
    if not (0 <= rank < world and 0 <= local_rank < local_world):
        raise FleetRefused(f"RANK={rank} of WORLD_SIZE={world} (LOCAL_RANK={local_rank} of "
                           f"LOCAL_WORLD_SIZE={local_world}) is not a rank of the world")
    return rank, world, local_rank, local_world


def wants_gpu(requested: str) -> bool:
    """Whether `--device requested` measures on GPUs: cpu never, auto where CUDA is
    present, a GPU model always (FleetRefused without CUDA).  Decided from the request
    alone, so a CPU fleet on a GPU machine neither binds its ranks to GPUs nor joins
    NCCL (nor is refused for having more ranks than GPUs)."""
    if requested == "cpu":
        return False
    if requested == "auto":
        return torch.cuda.is_available()
    from contract.devices import DEVICES, DeviceError, resolve_device

    model = DEVICES.get(requested)
    if model is not None and model.kind == "cpu":
        return False
    if not torch.cuda.is_available():
        # No GPU here, so resolving touches none: it refuses the GPU model in its words.
        try:
            resolve_device(requested)
        except DeviceError as e:
            raise FleetRefused(str(e)) from None
    return True


def start(timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "auto") -> Rank:
    """Join the process group torchrun set up, for the device the request names; refuse
    half a torchrun environment and more GPU ranks per node than GPUs before anything is
    initialized.  Starts this rank's heartbeat."""
    global _control, _live
    rank, world, local_rank, local_world = _environment()
    gpu = wants_gpu(device)
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
    device_id = torch.device("cuda", local_rank) if gpu else None
    try:
        if device_id is not None:
            collective("joining the process group", dist.init_process_group,
                       backend=backend, timeout=timeout, device_id=device_id)
        else:
            collective("joining the process group", dist.init_process_group,
                       backend=backend, timeout=timeout)
    except TypeError:  # a torch without device_id
        collective("joining the process group", dist.init_process_group, backend=backend,
                   timeout=timeout)
    except ValueError as e:  # the env:// rendezvous's complaints about its variables
        raise FleetRefused(f"joining the process group: {first_line(e)}") from None
    _control = (collective("making the gloo group", dist.new_group, backend="gloo",
                           timeout=timeout) if gpu else None)
    store = _store()
    if store is not None:
        _live = Liveness(store, rank, world, timeout_s)
        _live.start()
    return Rank(rank, world, local_rank, local_world, socket.gethostname(), backend,
                timeout_s, "cuda" if gpu else "cpu")


def stop() -> None:
    global _control, _live
    if _live is not None:
        _live.close()
        _live = None
    if dist.is_initialized():
        dist.destroy_process_group()
    _control = None


def liveness() -> Liveness | None:
    return _live


# `parts`: the JSON document every rank posts in agree() and agree() compares.
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


# `parts`: a JSON document each rank posts here and this reads back from every rank.
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
    """The store torchrun's rendezvous gave the process group, or None where torch does
    not expose it."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def collective(doing: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A torch.distributed call whose failure (a peer that died, or the timeout) becomes
    a one-line FleetError saying what the fleet was doing."""
    try:
        return fn(*args, **kw)
    except RuntimeError as e:  # torch.distributed's errors (DistBackendError...) are these
        raise FleetError(f"{doing}: a peer died or did not answer within the timeout "
                         f"({first_line(e)})") from None


# ---- the store: objects under keys, the fleet's stop --------------------------------

def _live_store() -> Liveness:
    if _live is None:
        raise FleetError("the fleet's store is not started")
    return _live


def post(key: str, obj: Any) -> None:
    """`obj` under `key` in the rendezvous store (compressed: rows repeat their keys)."""
    live = _live_store()
    live.store_call("posting " + key, live.store.set, PREFIX + key,
                    zlib.compress(pickle.dumps(obj)))


def posted(key: str) -> bool:
    live = _live_store()
    return bool(live.store_call("reading the store", live.store.check, [PREFIX + key]))


def peek(key: str) -> Any:
    """The object posted under `key` (which must be there)."""
    live = _live_store()
    return pickle.loads(zlib.decompress(live.store_call("reading " + key, live.store.get,
                                                        PREFIX + key)))


def decide(key: str, value: str) -> str:
    """The value that stands for `key`: the first any rank proposed (this one, if none
    had).  Ranks that may race to settle one question (rank 0 choosing the collectives,
    a rank stopping) agree on its answer this way."""
    live = _live_store()
    stands = live.store_call("deciding " + key, live.store.compare_set, PREFIX + key, "",
                             value)
    return stands.decode() if isinstance(stands, bytes) else str(stands)


def decided(key: str) -> str | None:
    """The value decided for `key`, or None while no rank has decided it."""
    live = _live_store()
    if not live.store_call("reading the store", live.store.check, [PREFIX + key]):
        return None
    return live.store_call("reading " + key, live.store.get, PREFIX + key).decode()


def take(key: str) -> Any:
    """The object posted under `key` (which must be there), removed from the store."""
    obj = peek(key)
    live = _live_store()
    live.store_call("clearing " + key, live.store.delete_key, PREFIX + key)
    return obj
