"""The phases a run's time splits into (metadata.time_split_s, row_split_s), in the order
a row meets them; what each books: benches/sweep/time_split.py.  A module of its own, with
no imports: the compile-ahead workers load it at their start, where pandas (which
contract/schema.py imports) would cost each of them 0.4 s."""

PHASES = ("ceilings", "compile", "tune", "inputs", "check", "capture", "timing", "profile",
          "energy", "write", "other")
