"""What reads saved runs and says what they mean: summary.md (summary.py, findings.py),
the figures (plot.py, plot_scaling.py, plot_devices.py, style.py, and the plot command
plot_cli.py), a fleet's report (fleet.py), the performance targets (targets.py,
targets_cli.py) and a killed run made whole (finalize.py)."""
