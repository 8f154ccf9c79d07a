"""The torchrun fleet job: process group and store (dist.py), heartbeats and stops
(liveness.py), the run (run.py), its rows and folder (folder.py), a rank's console and
signals (rank_io.py), collectives as a kernel family (collectives.py) and the acceptance
check (acceptance*.py)."""
