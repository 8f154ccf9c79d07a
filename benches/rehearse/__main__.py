"""`python -m benches.rehearse`: see benches/rehearse/cli.py and docs/rehearsal.md."""

import sys

from benches.rehearse.cli import main

sys.exit(main())
