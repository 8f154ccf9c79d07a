"""`python -m roofline plan`'s flags (argparse, with one-line errors), grouped as the
request's records (roofline/plan/plan_request.py) that roofline/plan/cli.py builds from
them."""


import argparse
import math

from contract.cli import Parser
from contract.devices import ROOF_CLASS
from contract.models import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, PRESETS
from roofline.plan.arithmetic import DEFAULT_MFU, MEMORY_POLICIES, WEIGHT_FORMATS
from roofline.plan.plan_request import (
    MEASURES,
    PROVIDERS,
    EfficiencyRequest,
    HardwareRequest,
    MemoryRequest,
    TrainingRequest,
)

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'70e9', '70B', '15T', '124M' -> a positive number."""
    s = text.strip().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1].lower() in _SUFFIX:
        mult, s = _SUFFIX[s[-1].lower()], s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number (e.g. 70e9 or 70B)") \
            from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be positive")
    return v


def _positive_int(text: str) -> int:
    v = parse_count(text)
    if v != int(v):
        raise argparse.ArgumentTypeError(f"'{text}' must be a whole number")
    return int(v)


def _positive_float(text: str) -> float:
    return parse_count(text)


def _mfu(text: str) -> float:
    v = parse_count(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a fraction in (0, 1] (0.5 = 50%)")
    return v


def build_parser() -> Parser:
    """The plan's flags, group by group as --help lists them; each group is a record of
    the request (roofline/plan/plan_request.py), whose defaults these are."""
    p = Parser(prog="python -m roofline plan",
               description="How big a model, on how many tokens, in how many days, in how "
                            "much memory; MFU assumed or measured (docs/plan.md).")
    _model_flags(p)
    _data_flags(p)
    _hardware_flags(p)
    _efficiency_flags(p)
    _memory_flags(p)
    _output_flags(p)
    return p


def _model_flags(p: Parser) -> None:
    """ModelRequest, and TrainingRequest's micro-batch (listed with the model's shape)."""
    m = p.add_argument_group("model (--params, or a shape, or a preset; shape flags "
                             "override a preset's)")
    m.add_argument("--preset", help=f"published shape: {', '.join(PRESETS)}")
    m.add_argument("--params", type=_positive_float, metavar="N",
                   help="parameter count, e.g. 70e9 or 70B (no shape: no GEMMs)")
    m.add_argument("--d-model", type=_positive_int)
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--d-ff", type=_positive_int, help="MLP width (default 4 d_model)")
    m.add_argument("--vocab", type=_positive_int, help=f"default {DEFAULT_VOCAB}")
    m.add_argument("--seq-len", type=_positive_int, help=f"default {DEFAULT_SEQ_LEN}")
    m.add_argument("--heads", type=_positive_int, help="default d_model / 64")
    m.add_argument("--kv-heads", type=_positive_int,
                   help="key/value heads (grouped-query attention; default = heads)")
    m.add_argument("--gated", action=argparse.BooleanOptionalAction, default=None,
                   help="SwiGLU MLP with 3 d x d_ff matrices (default: not gated)")
    tie = m.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="LM head shares the token embedding")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="separate LM head (default for shape-only models)")
    mb = TrainingRequest.micro_batch
    m.add_argument("--micro-batch", type=_positive_int, default=mb,
                   help="sequences per GPU per step: GEMM M = micro-batch x seq-len "
                        f"(default {mb})")


def _data_flags(p: Parser) -> None:
    """TrainingRequest's tokens."""
    d = p.add_argument_group("data")
    dd = d.add_mutually_exclusive_group()
    dd.add_argument("--tokens", type=_positive_float, metavar="D", help="e.g. 15e12 or 15T")
    dd.add_argument("--chinchilla", action="store_true", help="D = 20 N")


def _hardware_flags(p: Parser) -> None:
    """HardwareRequest, and TrainingRequest's --days budget."""
    h = p.add_argument_group("hardware")
    h.add_argument("--device", help="device key (contract.devices): default h100, or the "
                                    "device present with --measure, or the run's with "
                                    "--from-run")
    h.add_argument("--gpus", type=_positive_int, default=HardwareRequest.gpus, metavar="G")
    h.add_argument("--vs", metavar="KEY[,KEY...]",
                   help="days for the same tokens, GPU count and MFU on other devices "
                        "(datasheet peaks), e.g. --device b200 --vs h100")
    bw = h.add_mutually_exclusive_group()
    bw.add_argument("--busbw", type=_positive_float, metavar="GB/s",
                    help="collective bus bandwidth (nccl-tests' busbw) for the step's "
                         "communication on --gpus G: data-parallel all-reduce and FSDP")
    bw.add_argument("--busbw-run", metavar="RUN",
                    help="take the busbw from a fleet run's largest all_reduce row (a run "
                         "on another kind of device than --device is refused)")
    h.add_argument("--force-busbw-run", action="store_true",
                   help="use --busbw-run's busbw even when the run was measured on another "
                        "kind of device than the plan's (with a warning)")
    h.add_argument("--days", type=_positive_float, metavar="T",
                   help="time budget: the largest compute-optimal model it trains")
    h.add_argument("--gpu-memory-gb", type=_positive_float,
                   help="memory per device in GB (default: table in roofline/plan/arithmetic.py)")


def _efficiency_flags(p: Parser) -> None:
    """EfficiencyRequest."""
    e = p.add_argument_group("efficiency (one of)")
    ee = e.add_mutually_exclusive_group()
    ee.add_argument("--mfu", type=_mfu, help=f"assumed MFU (default {DEFAULT_MFU})")
    ee.add_argument("--from-run", metavar="RUN",
                    help="MFU of a saved run's matmul rows at or near the model's GEMMs")
    ee.add_argument("--measure", nargs="?", const="gemms", choices=MEASURES,
                    help="measure on the device present: 'gemms' (the default) times the "
                         "model's GEMMs; 'step' runs real training steps of the model "
                         "(forward, backward, AdamW) and counts, times and profiles them")
    e.add_argument("--measure-layers", type=_positive_int, metavar="K",
                   help="--measure step on a slice of K blocks (with the embedding and "
                        "head), extrapolated to all layers: for a model too big for the "
                        "device")
    e.add_argument("--explain", action="store_true",
                   help="--measure step: time the step's own kernels alone (its GEMMs, "
                        "attention, norms, loss; torch) through the harness and set each "
                        "category's profiled time beside them, with its roofline place")
    steps, dtype, provider = (EfficiencyRequest.steps, EfficiencyRequest.dtype,
                              EfficiencyRequest.provider)
    e.add_argument("--steps", type=_positive_int, default=steps,
                   help=f"--measure step: timed steps after 2 warm-up steps (default {steps})")
    e.add_argument("--dtype", default=dtype, choices=sorted(ROOF_CLASS),
                   help=f"GEMM dtype (peak and measurements; default {dtype})")
    e.add_argument("--provider", default=provider, choices=PROVIDERS,
                   help=f"GEMM implementation measured (default {provider})")
    e.add_argument("--rep-ms", type=_positive_float,
                   help="timing budget per GEMM in ms (default: the suite's TimingConfig)")


def _memory_flags(p: Parser) -> None:
    """MemoryRequest."""
    mem = p.add_argument_group("memory")
    mm = mem.add_mutually_exclusive_group()
    policy = MemoryRequest.policy
    mm.add_argument("--policy", choices=tuple(MEMORY_POLICIES), default=policy,
                    help=f"precision policy (default {policy})")
    mm.add_argument("--bytes-per-param", type=_positive_float, metavar="B")
    mem.add_argument("--weight-format", choices=tuple(WEIGHT_FORMATS),
                     help="format of the weights the GEMMs read, scales included (nvfp4: "
                          "4.5 bits, mxfp4 4.25, mxfp8 8.25, fp8 8); the policy's master "
                          "weights and optimizer state stay (default: the policy's)")


def _output_flags(p: Parser) -> None:
    """OutputRequest."""
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR",
                   help="folder for plan.md, plan.json, plan.png (default "
                        "results/plans/<timestamp>/; never overwritten)")
    o.add_argument("--no-save", action="store_true", help="write no files")
    o.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
