"""Resource accounting (docs/plan.md): the error of a plan's bad input (model.py), the
FLOP and memory arithmetic of a training run (arithmetic.py), communication (comm.py),
where peaks and efficiencies come from (sources.py, efficiency.py), what a measured step
says (step.py, explain.py), the plan from its typed request (plan_request.py,
planner.py), the plan rendered as text and figures (plan_text.py, gemm_plot.py, step_plot.py)
and its command line (flags.py declares the flags, cli.py alone reads them and builds
the request).  The measuring a plan asks for is the harness's (harness.py), passed in by
the command line."""
