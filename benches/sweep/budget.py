"""Time budgets of a sweep (docs/measurement.md): every row's (TimingConfig.row_budget_s)
and the run's (RunBudget.run_s), shared among the cases left, lowering samples (never
dropping a case).  A case is skipped without a call where its path (run smallest first)
cannot fit the row budget: a smaller shape was over it, or its call, scaled by work from
the path's largest shape that ran, would take all of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from benches.sweep.cases import Case
from benches.timing.plan import CpuPlan
from contract.record import RunRow

# --run-budget's default on a CPU: what the default sweep's timing may take (the whole
# run, with ceilings, checks and figures, stays under 3 minutes on 2 busy cores).
DEFAULT_CPU_RUN_BUDGET_S = 90.0
PathKey = tuple[str, str, str, str]  # kernel, provider, dtype, cache mode


def work(case: Case) -> float:
    """What a case's time scales with: its FLOPs plus its bytes (one of them dominates)."""
    s = case.spec
    return float(s.flops(case.shape, case.dtype) + s.nbytes(case.shape, case.dtype))


def path(case: Case) -> PathKey:
    """A case's path: kernel, provider, dtype and cache mode (a shape's cold and warm rows
    run one after the other: a warm row is no "larger" shape of its cold twin)."""
    return (case.spec.name, case.provider, case.dtype, case.cache)


@dataclass
class RowBudget:
    """A row's share of what is left of the run budget (None: the row budget alone), and
    what run_case found (the checked call's time, the CPU plan)."""

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
    ran: dict[PathKey, tuple[float, str, float]] = field(default_factory=dict)
    over: dict[PathKey, tuple[float, str, float]] = field(default_factory=dict)

    def row(self, cases_left: int) -> RowBudget:
        """The next row's budget, with `cases_left` cases (it included) still to run."""
        if self.run_s is None:
            return RowBudget()
        left = self.run_s - (time.monotonic() - self.started)
        return RowBudget(share_s=max(0.0, left) / max(1, cases_left))

    def skip_reason(self, case: Case) -> str | None:
        """Why `case` is not run at all (the module's docstring); None when it may run."""
        key, w = path(case), work(case)
        over, ran = self.over.get(key), self.ran.get(key)
        if over is not None and w >= over[0]:
            return (f"over the row budget: the smaller {over[1]} of this kernel, provider "
                    f"and dtype already takes {over[2]:.3g} s a call here, so this one was "
                    "not run")
        if ran is not None and 0 < ran[0] < w and ran[2] * w / ran[0] > self.row_budget_s:
            return (f"over the row budget: about {ran[2] * w / ran[0]:.3g} s a call "
                    f"predicted (its {ran[1]} took {ran[2]:.3g} s, scaled by FLOPs + bytes), "
                    f"more than the whole row budget of {self.row_budget_s:g} s; not run")
        return None

    def record(self, case: Case, row: RunRow, budget: RowBudget) -> None:
        """What a finished row says about its path's speed."""
        if budget.call_s is None:
            return
        key, w = path(case), work(case)
        entry = (w, case.shape_str, budget.call_s)
        if row.status == "skipped" and (row.reason or "").startswith("over the row budget"):
            if key not in self.over or w < self.over[key][0]:
                self.over[key] = entry
        elif row.ok and (key not in self.ran or w >= self.ran[key][0]):
            self.ran[key] = entry
