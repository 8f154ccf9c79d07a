"""Every Triton kernel compiled for a GPU this machine need not have, and read: the
compile and its cases (compile.py), what a compiled kernel says (read.py: registers,
spills, MMA, loads, SASS), the records it is kept in (inspected.py) and the table and
files it is written to (inspect_report.py)."""
