#!/usr/bin/env bash
# Unequal ranks on equal hardware (launch.cpu_share), in one run:
#   uneven   shares [1.0, 0.5], an even split [16, 16]: the job goes at the slow rank's pace
#   auto     shares [1.0, 0.5], micro_batch: auto (global 32), rebalancing every 20 steps
#   balanced shares [0.75, 0.75], an even split: the same 1.5 CPUs shared equally, what the
#            shares allow when no rank waits for another (communication included)
#   watch-off / watch-on  no shares, straggler_every 0 against the default 10: what the
#            straggler attribution costs
# Prints tokens/s of each (median over the rounds, with min–max) and the ratios auto /
# balanced, uneven / balanced and watch-on / watch-off, each the median over rounds with its
# min–max. Rounds interleave the configurations.
#   benchmarks/heterogeneous.sh [OUT]   (ROUNDS=5 STEPS=80 to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/heterogeneous-$(date +%Y%m%d-%H%M%S)}"
rounds="${ROUNDS:-5}"
steps="${STEPS:-80}"
collie=build/bin/collie
python=/usr/bin/python3
[[ -x "$collie" ]] || { echo "build first: scripts/build.sh" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "launch.cpu_share needs root (the cgroup cpu controller)" >&2; exit 2; }
mkdir -p "$out"
run() {  # NAME ROUND --set...
  local name="$1" round="$2"
  shift 2
  "$collie" --log-level warn run benchmarks/collie-heterogeneous.yaml --out "$out/$name-$round" \
    --set train.steps="$steps" "$@" > "$out/$name-$round.log" 2>&1
}
for round in $(seq 1 "$rounds"); do
  run uneven "$round" --set launch.cpu_share='[1.0, 0.5]'
  run auto "$round" --set launch.cpu_share='[1.0, 0.5]' --set train.micro_batch=auto \
    --set train.global_batch=32
  run balanced "$round" --set launch.cpu_share='[0.75, 0.75]'
  run watch-off "$round" --set train.straggler_every=0
  run watch-on "$round"
  echo "# round $round done"
done
"$python" - "$out" "$rounds" <<'PY' | tee "$out/table.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def tps(name, k):
    return json.load(open(f"{out}/{name}-{k}/summary.json"))[0]["tokens_per_s"]
def spread(values):
    return f"{statistics.median(values):.3g} ({min(values):.3g}–{max(values):.3g})"
names = ["uneven", "auto", "balanced", "watch-off", "watch-on"]
t = {n: [tps(n, k) for k in range(1, rounds + 1)] for n in names}
print(f"| run | tokens/s, median (min–max) over {rounds} rounds |\n| --- | --- |")
for n in names:
    print(f"| {n} | {spread(t[n])} |")
def ratio(a, b):
    return spread([x / y for x, y in zip(t[a], t[b])])
print(f"\n| ratio | median (min–max) over rounds |\n| --- | --- |")
print(f"| auto / balanced | {ratio('auto', 'balanced')} |")
print(f"| uneven / balanced | {ratio('uneven', 'balanced')} |")
print(f"| watch-on / watch-off | {ratio('watch-on', 'watch-off')} |")
splits = [json.load(open(f"{out}/auto-{k}/summary.json"))[0]["micro_batch"] for k in range(1, rounds + 1)]
print(f"\nauto's final splits: {splits}")
PY
