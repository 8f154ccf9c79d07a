"""Communication of a training step on G devices (docs/design.md, Communication), in nccl-tests'
terms: a collective of S bytes takes t = S x f(G) / busbw, where busbw is the bus
bandwidth nccl-tests (and this suite's collective rows) report and f the factor that
turned algbw = S / t into busbw (doc/PERFORMANCE.md of NVIDIA/nccl-tests):

- all_reduce f = 2 (G - 1) / G (a ring sends every byte out and back, less its own share);
- all_gather and reduce_scatter f = (G - 1) / G, S the size of the whole gathered array;
- broadcast f = 1.

Per step, with the gradients in `grad_bytes` per parameter and the weights in
`weight_bytes` per parameter:
- data parallel: one all_reduce of the gradients, 2 (G-1)/G x N x grad_bytes / busbw
  (8B parameters, bf16 gradients, 32 GPUs, 400 GB/s: 2 x 31/32 x 16 GB / 400 GB/s =
  77.5 ms);
- fully sharded (FSDP / ZeRO-3): the weights all-gathered for the forward and again for
  the backward, 2 x (G-1)/G x N x weight_bytes / busbw, and the gradients
  reduce-scattered, (G-1)/G x N x grad_bytes / busbw.

Whether it hides: data-parallel gradients are reduced bucket by bucket while the
backward runs, so they hide when the all-reduce takes no longer than the backward (4 of
the step's 6 N FLOPs per token); FSDP prefetches each layer's weights under the previous
layer's compute, so it hides when all of it takes no longer than the whole step's
compute.  A step then takes max(compute, communication) with overlap and their sum
without.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import NotRequired, TypedDict, cast

from contract.metrics import BUSBW_FACTOR
from contract.models import DEFAULT_SEQ_LEN, ModelShape
from roofline.plan.arithmetic import SECONDS_PER_DAY, attention_score_flops
from roofline.plan.model import PlanError
from roofline.plan.plan_request import HardwareRequest


def collective_seconds(op: str, size_bytes: float, gpus: int, busbw_gbps: float) -> float:
    """Time of one collective of `size_bytes` (the whole array) at a bus bandwidth."""
    if gpus < 1 or busbw_gbps <= 0:
        raise PlanError("communication needs --gpus >= 1 and a positive busbw")
    return size_bytes * BUSBW_FACTOR[op](gpus) / (busbw_gbps * 1e9)


class SchemeJson(TypedDict):
    """A scheme in the plan's `communication` (Scheme.to_json)."""

    comm_s: float
    hides: bool
    step_s_overlap: float
    step_s_serial: float
    days_overlap: NotRequired[float]
    days_serial: NotRequired[float]
    all_gather_s: NotRequired[float]
    reduce_scatter_s: NotRequired[float]


@dataclass(frozen=True)
class Scheme:
    """One way to communicate a step: its time, whether it hides under its window of
    compute, the step with and without overlap, the days (with a token count), and for
    FSDP its two collectives."""

    comm_s: float
    hides: bool
    step_s_overlap: float
    step_s_serial: float
    days_overlap: float | None = None
    days_serial: float | None = None
    all_gather_s: float | None = None
    reduce_scatter_s: float | None = None

    def to_json(self) -> SchemeJson:
        return cast(SchemeJson, {k: v for k, v in asdict(self).items()
                                 if v is not None})

    @classmethod
    def from_json(cls, doc: SchemeJson) -> Scheme:
        return cls(**doc)


class CommunicationJson(TypedDict):
    """The plan's `communication` (Communication.to_json)."""

    gpus: int
    busbw_gbps: float
    busbw_source: str
    grad_bytes_per_param: float
    weight_bytes_per_param: float
    compute_s: float
    backward_s: float
    steps: float | None
    data_parallel: SchemeJson
    fsdp: SchemeJson
    compute_basis: str


@dataclass(frozen=True)
class Communication:
    """A step's communication on `gpus` devices at a busbw (step_communication): data
    parallel and fully sharded, against the step's compute (on `compute_basis` FLOPs
    per token), over `steps` steps where the tokens are known."""

    gpus: int
    busbw_gbps: float
    busbw_source: str
    grad_bytes_per_param: float
    weight_bytes_per_param: float
    compute_s: float
    backward_s: float
    steps: float | None
    data_parallel: Scheme
    fsdp: Scheme
    compute_basis: str = "6 N"

    def to_json(self) -> CommunicationJson:
        return CommunicationJson(**{**asdict(self),  # type: ignore[typeddict-item]
                                    "data_parallel": self.data_parallel.to_json(),
                                    "fsdp": self.fsdp.to_json()})

    @classmethod
    def from_json(cls, doc: CommunicationJson) -> Communication:
        return cls(**{**doc, "data_parallel": Scheme.from_json(doc["data_parallel"]),
                      "fsdp": Scheme.from_json(doc["fsdp"])})


def step_communication(params: float, gpus: int, busbw_gbps: float, grad_bytes: float,
                       weight_bytes: float, compute_s: float, steps: float | None,
                       busbw_source: str) -> Communication:
    """Per-step communication of data parallelism and of fully sharded training, against
    the step's compute, with the days each takes with and without overlap."""
    dp = collective_seconds("all_reduce", params * grad_bytes, gpus, busbw_gbps)
    fsdp_gather = 2 * collective_seconds("all_gather", params * weight_bytes, gpus,
                                         busbw_gbps)
    fsdp_scatter = collective_seconds("reduce_scatter", params * grad_bytes, gpus,
                                      busbw_gbps)
    backward_s = compute_s * 4 / 6

    def scheme(comm_s: float, window_s: float) -> Scheme:
        overlap = compute_s + max(0.0, comm_s - window_s)
        serial = compute_s + comm_s
        days = (None, None) if steps is None else \
            (steps * overlap / SECONDS_PER_DAY, steps * serial / SECONDS_PER_DAY)
        return Scheme(comm_s, comm_s <= window_s, overlap, serial, *days)

    return Communication(
        gpus, busbw_gbps, busbw_source, grad_bytes, weight_bytes, compute_s, backward_s,
        steps, scheme(dp, backward_s),
        replace(scheme(fsdp_gather + fsdp_scatter, compute_s), all_gather_s=fsdp_gather,
                reduce_scatter_s=fsdp_scatter))


def policy_bytes(items: dict[str, float]) -> tuple[float, float]:
    """(gradient, weight) bytes per parameter of a memory policy's itemized bytes; 2 and
    2 (bf16) when the policy does not say."""
    grad = next((v for k, v in items.items() if k.startswith("gradients")), 2.0)
    weight = next((v for k, v in items.items() if k.startswith("weights")), 2.0)
    return float(grad), float(weight)


# Where collective rows come from: run_bench.py under torchrun times them whenever a
# fleet has more than one rank (README, "Beyond one GPU"); --kernels does not select them.
FLEET_HINT = ("collectives are timed by a fleet run: `torchrun --nproc-per-node=G "
              "run_bench.py`, whose fleet/<run-id> folder holds the all_reduce rows")

# The torch.distributed backend a device kind's fleet runs on (benches/fleet/dist.py).
BACKEND = {"cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class BusbwRow:
    """A saved run's collective row a plan takes its busbw from: the busbw (GB/s), a
    source line, and where it was measured (device key, backend, ranks)."""

    busbw_gbps: float
    source: str
    device: str | None
    backend: str | None
    ranks: int | None


def busbw_row(run: str, op: str = "all_reduce", size: int | None = None) -> BusbwRow:
    """The saved run's ok `op` collective row at `size` bytes (the whole array, as the
    rows' shape says), else at its largest size, the higher of its dtypes' rows there."""
    from contract.schema import load_doc, parse_shape

    doc = load_doc(run)
    if not doc.rows:
        raise PlanError(f"{run} has no collective rows ({FLEET_HINT})")
    rows = [r for r in doc.rows if r.case.kernel == op and r.status == "ok"
            and (r.fleet.busbw_gbps or 0) > 0]
    if not rows:
        raise PlanError(f"{run} has no ok {op} rows with a busbw ({FLEET_HINT})")
    shapes = [parse_shape(r.case.shape) for r in rows]
    sized = [(sh.get("bytes", 0), float(r.fleet.busbw_gbps or 0), i, r, sh.get("ranks"))
             for i, (r, sh) in enumerate(zip(rows, shapes, strict=True))]
    if size is not None:
        if not any(s[0] == size for s in sized):
            raise PlanError(f"{run} has no ok {op} row of {size:,} bytes (it has "
                            f"{', '.join(f'{s:,}' for s in sorted({s[0] for s in sized}))})")
        sized = [s for s in sized if s[0] == size]
    nbytes, busbw, _, best, ranks = max(sized, key=lambda s: (s[0], s[1], s[2]))
    return BusbwRow(busbw, f"{run}: {op} {best.case.dtype} at {int(nbytes):,} bytes",
                    best.accounting.device or None, best.case.provider,
                    int(ranks) if ranks is not None else None)


def busbw_from_run(run: str, op: str = "all_reduce", size: int | None = None
                   ) -> tuple[float, str]:
    """(busbw GB/s, source) of busbw_row."""
    row = busbw_row(run, op, size)
    return row.busbw_gbps, row.source


def _check_origin(row: BusbwRow, run: str, device: str, gpus: int, force: bool,
                  warnings: list[str]) -> None:
    """Refuse a busbw measured on another kind of device than the plan's (unless
    forced); warn when its backend or rank count is not what the plan's would be."""
    from contract.devices import DEVICES

    where = (f"{row.device or 'an unnamed device'}"
             + (f", {row.backend}" if row.backend else "")
             + (f", {row.ranks} ranks" if row.ranks else ""))
    if row.device != device:
        if not force:
            raise PlanError(f"{run} measured its collectives on {where}; the plan is for "
                            f"{gpus} x {device}: that busbw says nothing about {device} "
                            "(pass --busbw GB/s, a run from the plan's device, or "
                            "--force-busbw-run to use it anyway)")
        warnings.append(f"--force-busbw-run: the busbw of {run} ({where}) applied to "
                        f"{gpus} x {device}")
    kind = DEVICES[device].kind if device in DEVICES else None
    want = BACKEND.get(kind or "")
    if want and row.backend and row.backend != want:
        warnings.append(f"the busbw of {run} was measured over {row.backend}; "
                        f"{device} trains over {want}")
    if row.ranks and row.ranks < gpus:
        warnings.append(f"the busbw of {run} was measured on {row.ranks} ranks, the "
                        f"plan has {gpus} devices: past one node the collectives cross "
                        "the network, usually slower than within it")


def plan_communication(hw: HardwareRequest, micro_batch: int, shape: ModelShape | None,
                       params: float | None, peak: float, mfu: float, tokens: float | None,
                       items: dict[str, float], warnings: list[str], device: str
                       ) -> Communication | None:
    """The step's communication on --gpus G (roofline/plan/comm.py), when a busbw is
    given; a step is --micro-batch sequences per device.  Its compute is on the basis the
    plan's days with attention use: 6 N + the attention scores per token when the shape
    is known (6 N with --params alone)."""
    if hw.busbw is None and hw.busbw_run is None:
        if hw.gpus > 1:
            warnings.append("no communication in this plan: pass --busbw GB/s (or "
                            "--busbw-run RUN) for the gradients' all-reduce and FSDP")
        return None
    if params is None:
        raise PlanError("--busbw needs a model (--params, --preset or a shape)")
    if hw.busbw is not None:
        busbw, source = hw.busbw, "--busbw"
    else:
        assert hw.busbw_run is not None  # one of the two, above
        row = busbw_row(hw.busbw_run)
        _check_origin(row, hw.busbw_run, device, hw.gpus, hw.force_busbw_run, warnings)
        busbw, source = row.busbw_gbps, row.source
    seq = shape.seq_len if shape else DEFAULT_SEQ_LEN
    tokens_per_step = micro_batch * seq  # per device
    per_token = 6 * params + (attention_score_flops(shape, 1.0) if shape else 0.0)
    compute_s = per_token * tokens_per_step / (peak * 1e12 * mfu)
    steps = tokens / (hw.gpus * tokens_per_step) if tokens else None
    grad, weight = policy_bytes(items)
    out = step_communication(params, hw.gpus, busbw, grad, weight, compute_s, steps,
                             source)
    return replace(out, compute_basis="6 N + attention" if shape else "6 N")
