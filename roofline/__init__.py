"""Roofline analysis: device models, ceilings, metrics, plots and run-to-run comparison."""
