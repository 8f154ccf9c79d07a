"""What a number means: device models and measured ceilings, the metrics (MFU, % of
roof), the results schema, the figures and summary.md; the regression gate
(roofline/gate/) and resource accounting (roofline/plan/) are its two sub-packages."""
