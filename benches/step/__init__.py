"""The training step measured on the device: its model (transformer.py), FLOP counting
(flops.py), profile split (profile.py, kernel_split.py), the step itself (measure.py) and
the planner's GEMMs and kernels timed alone (gemms.py)."""
