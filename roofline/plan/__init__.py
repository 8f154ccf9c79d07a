"""Resource accounting (docs/plan.md): model shapes and parameter counts (model.py), the
FLOP and memory arithmetic of a training run (arithmetic.py), communication (comm.py),
where peaks and efficiencies come from (sources.py), what a measured step says
(step.py), the plan rendered as text and figures (render.py, plot.py, step_plot.py) and
its command line (flags.py, cli.py).  The measuring a plan asks for is the harness's
(harness.py), passed in by the command line."""
