"""`python -m roofline plot RUN [--out PNG]`, `python -m roofline compare BASELINE RUN`,
promote, plan, targets, finalize and history: the command line of the readers of saved
runs, which wires in the harness where one measures (plan --measure, --retime)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roofline.gate.rules import Retime

COMMANDS = ("plot", "compare", "promote", "plan", "targets", "finalize", "history")
USAGE = (
    f"usage: python -m roofline {{{','.join(COMMANDS)}}} ...\n"
    "  plot RUN [--out PNG]          re-plot a saved run (folder or results.json)\n"
    "  plot RUN RUN... --devices     several devices' roofs and points on one figure\n"
    "  compare BASELINE RUN [...]    regression verdicts; exit 1 on a regression\n"
    "  promote RUN [--device KEY]    make RUN the stored baseline for its device\n"
    "  plan [--preset|--params|--d-model ...] [--mfu|--measure|--from-run RUN] ...\n"
    "                                model size, tokens, days and memory (plan --help)\n"
    "  targets RUN [RUN ...]         the performance targets: met, missed, not measured\n"
    "  finalize RUN                  a run killed before results.json: its journal's rows\n"
    "                                written whole, summary and figures (still incomplete)\n"
    "  history {add,report,html} ... every run kept per device, change points, dashboard"
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "plot":
        from roofline.report.plot_cli import main as plot_main

        return plot_main(rest)
    if cmd in ("compare", "promote"):
        from roofline.gate.cli import main as compare_main

        return compare_main([cmd, *rest], retimer=_retimer)
    if cmd == "targets":
        from roofline.report.targets_cli import main as targets_main

        return targets_main(rest)
    if cmd == "finalize":
        from roofline.report.finalize import main as finalize_main

        return finalize_main(rest)
    if cmd == "plan":
        # The one place roofline/ reaches into benches/: the command line wires the
        # harness's measurements into the planner (docs/design.md, Layers).
        from benches.ceilings import device_ceilings
        from benches.step.gemms import measure_gemms, measure_kernels
        from benches.step.measure import measure_step
        from roofline.plan.cli import main as plan_main
        from roofline.plan.harness import Harness

        return plan_main(rest, Harness(measure_gemms, measure_step, measure_kernels,
                                       device_ceilings))
    if cmd == "history":
        from roofline.history.cli import main as history_main

        return history_main(rest, retimer=_retimer)
    # One line, as every other refusal: what was wrong, and where the usage is.
    print(f"error: unknown command '{cmd}' (choose from {', '.join(COMMANDS)}; usage: "
          "python -m roofline --help)", file=sys.stderr)
    return 2


def _retimer(device: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> Retime:
    """`compare --retime` and `history report --retime`: the harness's re-timing client
    (benches/sweep/retime.py), wired here as plan's measurements are."""
    from benches.sweep.retime import retimer_of_run

    return retimer_of_run(device, meta, rows)


if __name__ == "__main__":
    sys.exit(main())
