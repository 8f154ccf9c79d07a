"""What reads saved runs: the figures and summary.md (report/), the regression gate
(gate/), the history store (history/) and resource accounting (plan/).  Built on the
contract (contract/) and the kernels' registry; `python -m roofline` is its command line."""
