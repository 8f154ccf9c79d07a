"""Measurement primitives the sweep, the ceilings and the step share: the samples and
their summary (clock), how many and which method (plan), CUDA graphs (graphs).  Nothing
here knows a case or a row."""
