"""The history commands' error type, and the check for their optional libraries."""

from __future__ import annotations

import importlib
from types import ModuleType

from contract.cli import UsageError

# The extra that installs the libraries below (pyproject.toml); `dev` includes it.
EXTRA = "history"


# A usage error of a history command (a bad store, a bad run, a run added twice, a missing
# library): one line, exit 2.  It means what every command line's bad input means, so it
# is that one type (contract.cli.UsageError, as the gate's CompareError); the name stays
# for the callers that import it.
HistoryError = UsageError


def require(module: str, what: str) -> ModuleType:
    """Import `module` or raise HistoryError saying which extra installs it: the GPU
    runners carry none of these libraries, and `history add` needs none of them."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HistoryError(f"{what} needs the Python package '{module}', which is not "
                           f"installed (pip install -e '.[{EXTRA}]')") from None
