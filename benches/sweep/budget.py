"""Time budgets of a sweep: every row has one (TimingConfig.row_budget_s, applied by the
timers), and a run may have one for the whole sweep (RunBudget.run_s).

The run's budget never drops a case: what is left of it is shared among the cases left,
and a row's share lowers its sample count toward the regression gate's minimum
(benches.timing.plan.plan_cpu) once the sweep runs behind.  What a budget does skip is a
case that cannot fit its row budget even at that minimum, and it does so before the case
burns minutes: a kernel, provider, dtype and cache mode (a "path") whose smaller shape
was already over the budget, or whose time per call, scaled from its largest shape that
ran by the work (FLOPs + bytes), would exceed the whole row budget in one call, is
skipped without a call, its reason saying so.  Cases of a path run smallest first
(benches.sweep.cases), so a path too slow for this device (fp8 torch._scaled_mm at 14 MFLOP/s
on a CPU without fp8 support: 17.7 s a call at 512^3) costs its smallest shapes' checks,
not minutes per row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from benches.sweep.cases import Case
from benches.timing.plan import CpuPlan

# --run-budget's default on a CPU: what the default sweep's timing may take (the whole
# run, with ceilings, checks and figures, stays under 3 minutes on 2 busy cores).
DEFAULT_CPU_RUN_BUDGET_S = 90.0


def work(case: Case) -> float:
    """What a case's time scales with: its FLOPs plus its bytes (both grow with the
    shape; one of them dominates each kernel)."""
    return float(case.spec.flops(case.shape, case.dtype) + case.spec.nbytes(case.shape,
                                                                              case.dtype))


def path(case: Case) -> tuple[str, str, str, str]:
    """A case's path: kernel, provider, dtype and cache mode.  The mode is part of it
    because a case's cold and warm rows run one after the other at each shape (cases run
    in that order): keyed without it, a warm row after its over-budget cold twin would be
    skipped as a "larger" shape of a path that is its own shape, and one mode's call
    time would predict the other's."""
    return (case.spec.name, case.provider, case.dtype, case.cache)


@dataclass
class RowBudget:
    """One row's budget: what the sweep grants (`share_s`, the row's share of what is
    left of the run budget; None: the row budget alone) and what run_case found (the
    checked call's time, the plan of the row's CPU rounds)."""

    share_s: float | None = None
    call_s: float | None = None
    plan: CpuPlan | None = None


@dataclass
class RunBudget:
    row_budget_s: float
    run_s: float | None = None
    started: float = field(default_factory=time.monotonic)
    # path -> (work, shape, seconds a call) of its largest shape that ran, and of its
    # smallest shape that was over the row budget
    ran: dict[tuple[str, str, str, str], tuple[float, str, float]] = field(
        default_factory=dict)
    over: dict[tuple[str, str, str, str], tuple[float, str, float]] = field(
        default_factory=dict)

    def row(self, cases_left: int, now: float | None = None) -> RowBudget:
        """The next row's budget, with `cases_left` cases (it included) still to run, at
        `now` (time.monotonic(); a plan's estimate passes its own clock)."""
        if self.run_s is None:
            return RowBudget()
        now = time.monotonic() if now is None else now
        left = self.run_s - (now - self.started)
        return RowBudget(share_s=max(0.0, left) / max(1, cases_left))

    def skip_reason(self, case: Case) -> str | None:
        """Why `case` is not run at all: its path cannot fit the row budget at its size
        (see the module's docstring); None when it may run."""
        key, w = path(case), work(case)
        over = self.over.get(key)
        if over is not None and w >= over[0]:
            return (f"over the row budget: the smaller {over[1]} of this kernel, provider "
                    f"and dtype already takes {over[2]:.3g} s a call here, so this one was "
                    "not run")
        ran = self.ran.get(key)
        if ran is not None and ran[0] > 0 and w > ran[0]:
            predicted = ran[2] * w / ran[0]
            if predicted > self.row_budget_s:
                return (f"over the row budget: about {predicted:.3g} s a call predicted "
                        f"(its {ran[1]} took {ran[2]:.3g} s, scaled by FLOPs + bytes), more "
                        f"than the whole row budget of {self.row_budget_s:g} s; not run")
        return None

    def record(self, case: Case, row: dict[str, Any], budget: RowBudget) -> None:
        """What a finished row says about its path's speed."""
        if budget.call_s is None:
            return
        key, w = path(case), work(case)
        entry = (w, case.shape_str, budget.call_s)
        if row.get("status") == "skipped" and str(row.get("reason", "")).startswith(
                "over the row budget"):
            if key not in self.over or w < self.over[key][0]:
                self.over[key] = entry
        elif row.get("status") == "ok" and (key not in self.ran or w >= self.ran[key][0]):
            self.ran[key] = entry
