"""Former home of the regression gate, now the package roofline.gate (statistics,
verdicts, runs, rendering, promotion, command line); its names are re-exported here so
`from roofline.compare import ...` keeps working."""

from roofline.gate import *  # noqa: F403
from roofline.gate import __all__  # noqa: F401
from roofline.gate.cli import main  # noqa: F401

if __name__ == "__main__":
    import sys

    sys.exit(main())
