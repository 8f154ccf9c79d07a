"""The result contract, at the bottom beside kernels/: what every layer above agrees on.
Device models and detection (devices.py), a row's metrics (metrics.py), the results
schema and run files (schema.py), the phases of a run's time (phases.py), rows and
ceilings as read back (rows.py, ceilings.py), a row's cache mode and timer (modes.py),
the physics check of every number a row carries (physics.py), the declared versions
(versions.py), the command lines' shared parsing (cli.py).  Imports nothing above
kernels/."""
