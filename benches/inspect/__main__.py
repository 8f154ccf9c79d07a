"""`python -m benches.inspect`: the inspect job in a process of its own (run_bench.py
--inspect re-executes itself so when the Triton interpreter is on)."""

import sys

from benches.inspect.compile import main

sys.exit(main())
