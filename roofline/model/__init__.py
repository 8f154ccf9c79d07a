"""What a number means, imported by everything above the kernels: device models and
detection (devices.py), a row's metrics (metrics.py), the results schema and run files
(schema.py), rows and ceilings as read back (rows.py)."""
