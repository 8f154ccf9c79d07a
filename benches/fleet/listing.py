"""--list's table of the collectives: they are not a --kernels family, every fleet run
times them (benches/fleet/collectives.py)."""

from __future__ import annotations

from rich.table import Table

from benches.fleet.collectives import CPU_SIZES, DTYPES, GPU_SIZES, OPS
from benches.sweep.console import console
from contract.metrics import BUSBW_FACTOR


def _size(n: int) -> str:
    return f"{n >> 30} GB" if n >= 2**30 else f"{n >> 20} MB" if n >= 2**20 else f"{n >> 10} KB"


def print_collectives() -> None:
    """The collectives: not a --kernels family, they run in every fleet run (torchrun)."""
    t = Table(title="Collectives: timed by every fleet run, one rank included "
                    "(torchrun --nproc-per-node=G run_bench.py ...; --no-collectives skips "
                    "them); not chosen with --kernels")
    for col in ("collective", "dtypes", "sizes (whole array)", "busbw = algbw x"):
        t.add_column(col)
    sizes = (f"GPUs (NCCL): {_size(GPU_SIZES[0])}..{_size(GPU_SIZES[-1])}; "
             f"CPUs (gloo): {_size(CPU_SIZES[0])}..{_size(CPU_SIZES[-1])}; x4 apart")
    # The factor's formula, recognised from its value at 4 ranks (contract/metrics.py
    # holds the factors).
    formula = {1.5: "2(n-1)/n", 0.75: "(n-1)/n", 1.0: "1"}
    for op in OPS:
        t.add_row(op, ",".join(DTYPES), sizes, formula.get(BUSBW_FACTOR[op](4), "?"))
    console.print(t)
