"""What a saved run was asked for, as its readers show it: the selection of its stored
request (contract/request.py: kernels, dtypes, providers, sizes, cache modes, seed,
check-only, the baseline provider), typed.  The metadata keeps the request once
(contract/run_meta.py); a run written before it was stored has one rebuilt from its old
keys there."""

from __future__ import annotations

from contract.request import RequestError, RunRequest, Selection
from contract.run_meta import RunMeta


def run_selection(meta: RunMeta) -> Selection | None:
    """The run's requested selection; None for metadata without a request (written by
    hand, or before the kernels were recorded) or with one this version cannot read (a
    newer run's), whose facts the readers then leave out."""
    if not meta.request:
        return None
    try:
        return RunRequest.from_json(meta.request).selection
    except (RequestError, TypeError, ValueError):
        return None


def baseline_provider(meta: RunMeta) -> str:
    """The provider the run's speedups are against (--baseline-provider; the request's
    default where the run does not say)."""
    return (run_selection(meta) or Selection()).baseline_provider
