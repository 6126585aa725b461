#!/usr/bin/env bash
# The cost model on the lab: runs benchmarks/lab-cost-model.yaml (root: it sets the lab up)
# and prints, per backend, each scheduler's median |prediction error| and the measured
# hierarchical : ring ratio at the largest size beside the predicted one.
#   benchmarks/lab_cost_model.sh [OUT [collie run options...]]
# e.g. one backend only: benchmarks/lab_cost_model.sh /tmp/lcm --set 'matrix=[{}]' (gloo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../runs/lab-cost-model-$(date +%Y%m%d-%H%M%S)}
shift $(($# > 0 ? 1 : 0))
"$here/../build/bin/collie" run "$here/lab-cost-model.yaml" --out "$out" "$@" | tee "$out.txt" |
  grep -E '^# (run|collective|cost model|Median prediction|auto against)'
python3 - "$out/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for run in dict.fromkeys(r["run"] for r in rows):
    mine = [r for r in rows if r["run"] == run]
    sizes = sorted({int(r["bytes"]) for r in mine})
    print(f"[{run}] prediction error per size (predicted / measured median - 1):")
    print(f"  {'scheduler':>18}" + "".join(f"{size(b):>9}" for b in sizes))
    for sched in dict.fromkeys(r["scheduler"] for r in mine):
        cells = []
        for b in sizes:
            r = next((r for r in mine if r["scheduler"] == sched and int(r["bytes"]) == b), None)
            ok = r and r["predicted_us"] not in ("", "nan") and float(r["time_us"]) > 0
            cells.append(f"{float(r['predicted_us']) / float(r['time_us']) - 1:+9.0%}" if ok
                         else f"{'-':>9}")
        print(f"  {sched[:18]:>18}" + "".join(cells))
    largest = max(int(r["bytes"]) for r in mine)
    at = {r["scheduler"]: r for r in mine if int(r["bytes"]) == largest}
    ring, hier = at["ring"], at["hierarchical"]
    measured = float(ring["time_us"]) / float(hier["time_us"])
    low = float(ring["time_min_us"]) / float(hier["time_max_us"])
    high = float(ring["time_max_us"]) / float(hier["time_min_us"])
    predicted = float(ring["predicted_us"]) / float(hier["predicted_us"])
    print(f"[{run}] ring / hierarchical at {largest >> 20} MiB: measured {measured:.2f}x "
          f"(range {low:.2f}-{high:.2f}), predicted {predicted:.2f}x")
PY
