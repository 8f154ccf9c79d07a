"""`python -m roofline plan`'s flags (argparse, with one-line errors) and the model
shape they describe."""


import argparse
import math
from dataclasses import replace

from contract.cli import Parser
from contract.devices import ROOF_CLASS
from contract.models import DEFAULT_SEQ_LEN, DEFAULT_VOCAB, PRESETS, ModelShape
from roofline.plan.arithmetic import DEFAULT_MFU, DEFAULT_POLICY, MEMORY_POLICIES, WEIGHT_FORMATS
from roofline.plan.model import PlanError

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
    p = Parser(prog="python -m roofline plan",
               description="How big a model, on how many tokens, in how many days, in how "
                            "much memory; MFU assumed or measured (docs/plan.md).")
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
    m.add_argument("--micro-batch", type=_positive_int, default=1,
                   help="sequences per GPU per step: GEMM M = micro-batch x seq-len "
                        "(default 1)")
    d = p.add_argument_group("data")
    dd = d.add_mutually_exclusive_group()
    dd.add_argument("--tokens", type=_positive_float, metavar="D", help="e.g. 15e12 or 15T")
    dd.add_argument("--chinchilla", action="store_true", help="D = 20 N")
    h = p.add_argument_group("hardware")
    h.add_argument("--device", help="device key (contract.devices): default h100, or the "
                                    "device present with --measure, or the run's with "
                                    "--from-run")
    h.add_argument("--gpus", type=_positive_int, default=1, metavar="G")
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
    e = p.add_argument_group("efficiency (one of)")
    ee = e.add_mutually_exclusive_group()
    ee.add_argument("--mfu", type=_mfu, help=f"assumed MFU (default {DEFAULT_MFU})")
    ee.add_argument("--from-run", metavar="RUN",
                    help="MFU of a saved run's matmul rows at or near the model's GEMMs")
    ee.add_argument("--measure", nargs="?", const="gemms", choices=("gemms", "step"),
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
    e.add_argument("--steps", type=_positive_int, default=5,
                   help="--measure step: timed steps after 2 warm-up steps (default 5)")
    e.add_argument("--dtype", default="bf16", choices=sorted(ROOF_CLASS),
                   help="GEMM dtype (peak and measurements; default bf16)")
    e.add_argument("--provider", default="torch", choices=("torch", "triton"),
                   help="GEMM implementation measured (default torch)")
    e.add_argument("--rep-ms", type=_positive_float,
                   help="timing budget per GEMM in ms (default: the suite's TimingConfig)")
    mem = p.add_argument_group("memory")
    mm = mem.add_mutually_exclusive_group()
    mm.add_argument("--policy", choices=tuple(MEMORY_POLICIES), default=DEFAULT_POLICY,
                    help=f"precision policy (default {DEFAULT_POLICY})")
    mm.add_argument("--bytes-per-param", type=_positive_float, metavar="B")
    mem.add_argument("--weight-format", choices=tuple(WEIGHT_FORMATS),
                     help="format of the weights the GEMMs read, scales included (nvfp4: "
                          "4.5 bits, mxfp4 4.25, mxfp8 8.25, fp8 8); the policy's master "
                          "weights and optimizer state stay (default: the policy's)")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR",
                   help="folder for plan.md, plan.json, plan.png (default "
                        "results/plans/<timestamp>/; never overwritten)")
    o.add_argument("--no-save", action="store_true", help="write no files")
    o.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    return p


_SHAPE_FLAGS = ("d_model", "layers", "d_ff", "vocab", "seq_len", "heads", "kv_heads",
                "gated", "tied")


def model_from_args(args: argparse.Namespace) -> ModelShape | None:
    given = [f for f in _SHAPE_FLAGS if getattr(args, f) is not None]
    if args.params is not None and (given or args.preset):
        raise PlanError("give --params or a shape (--preset, --d-model/--layers), not both")
    if args.preset:
        if args.preset not in PRESETS:
            raise PlanError(f"unknown preset '{args.preset}' (choose from "
                            f"{', '.join(PRESETS)})")
        base = PRESETS[args.preset]
    elif given:
        if args.d_model is None or args.layers is None:
            raise PlanError("a model shape needs --d-model and --layers")
        d = args.d_model
        heads = args.heads or (d // 64 if d % 64 == 0 else 1)
        base = ModelShape("custom", d, args.layers, 4 * d, DEFAULT_VOCAB, DEFAULT_SEQ_LEN,
                          heads, heads, tied=False)
    else:
        return None
    over = {"d_model": args.d_model, "n_layers": args.layers, "d_ff": args.d_ff,
            "vocab": args.vocab, "seq_len": args.seq_len, "heads": args.heads,
            "kv_heads": args.kv_heads, "gated": args.gated, "tied": args.tied}
    over = {k: v for k, v in over.items() if v is not None}
    if "d_model" in over and "d_ff" not in over and not args.preset:
        over["d_ff"] = 4 * over["d_model"]
    if "heads" in over and "kv_heads" not in over:
        over["kv_heads"] = over["heads"]
    shape = replace(base, **over)
    if args.preset and over:
        shape = replace(shape, name=f"{args.preset} (modified)")
    if shape.d_model % shape.heads:
        raise PlanError(f"--heads {shape.heads} does not divide d_model {shape.d_model}")
    if shape.heads % shape.kv_heads:
        raise PlanError(f"--kv-heads {shape.kv_heads} does not divide heads {shape.heads}")
    return shape
