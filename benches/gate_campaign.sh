#!/usr/bin/env bash
# The regression-gate campaign quoted in README.md ("Regression tracking"), on the CPU
# quick sweep: 3 runs pooled into a baseline, then 5 `run_bench.py --compare` runs each
# against that baseline, against a copy with 4 rows made 30% faster, and one with the
# same rows 10% faster.  One line per run in OUTDIR/summary.txt.  About 15 minutes on
# the 2-core CI VM.  Usage: bash benches/gate_campaign.sh OUTDIR
set -u
cd "$(dirname "$0")/.."
O=${1:?usage: gate_campaign.sh OUTDIR}
mkdir -p "$O"
Q="--sizes quick --providers torch --dtypes fp32,bf16 --no-plots"
for i in 1 2 3; do
  python run_bench.py $Q --out "$O/runs" --run-id "b$i" > "$O/b$i.log" 2>&1
done
python -m roofline promote "$O"/runs/cpu/b1 "$O"/runs/cpu/b2 "$O"/runs/cpu/b3 \
  --baselines "$O/bl" > "$O/promote.log" 2>&1
python - "$O" <<'PY'
import json
import sys

out = sys.argv[1]
doc = json.load(open(f"{out}/bl/cpu.json"))
picked = {("add", "fp32", "n=262144"), ("gelu", "fp32", "n=262144"),
          ("dot", "bf16", "n=4096"), ("matmul", "bf16", "M=128,N=128,K=128")}
for factor in (0.7, 0.9):
    faster = json.loads(json.dumps(doc))
    for r in faster["rows"]:
        if (r["kernel"], r["dtype"], r["shape"]) in picked and r["status"] == "ok":
            for k in ("ms_median", "ms_p20", "ms_p80"):
                r[k] *= factor
            r["samples_ms"] = [x * factor for x in r["samples_ms"]]
    json.dump(faster, open(f"{out}/bl/cpu-x{factor}.json", "w"))
PY
for b in cpu cpu-x0.7 cpu-x0.9; do
  for i in 1 2 3 4 5; do
    python run_bench.py $Q --out "$O/runs" --run-id "$b-$i" --compare "$O/bl/$b.json" \
      > "$O/$b-$i.log" 2>&1
    echo "$b $i exit=$? $(grep -h '^compare\|^re-timed' "$O/$b-$i.log" | tr '\n' ' ')" \
      >> "$O/summary.txt"
  done
done
cat "$O/summary.txt"
