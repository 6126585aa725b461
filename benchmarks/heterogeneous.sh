#!/usr/bin/env bash
# Unequal ranks on equal hardware (launch.cpu_share), in one run:
#   uneven   shares [1.0, 0.5], an even split [16, 16]: the job goes at the slow rank's pace
#   auto     shares [1.0, 0.5], micro_batch: auto (global 32), rebalancing every 20 steps
#   balanced shares [0.75, 0.75], an even split: the same 1.5 CPUs shared equally, what the
#            shares allow when no rank waits for another (communication included)
#   plain / observed  no shares; straggler_every 0 and no trace against the default
#            attribution (every 10 steps) with train.trace: true: what observing costs
# Prints tokens/s of each (median over the rounds, with min–max), the ratios auto /
# balanced, uneven / balanced and observed / plain, each the median over rounds with its
# min–max, and for observed / plain also the ratio of the median step time (per step the
# slowest rank's step_s from rank-*.jsonl, all steps but the first). Rounds interleave the
# configurations.
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
  run plain "$round" --set train.straggler_every=0
  run observed "$round" --set train.trace=true
  echo "# round $round done"
done
"$python" - "$out" "$rounds" <<'PY' | tee "$out/table.md"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def tps(name, k):
    return json.load(open(f"{out}/{name}-{k}/summary.json"))[0]["tokens_per_s"]
def spread(values):
    return f"{statistics.median(values):.3g} ({min(values):.3g}–{max(values):.3g})"
names = ["uneven", "auto", "balanced", "plain", "observed"]
def median_step(name, k):
    steps = {}
    for r in range(2):
        for line in open(f"{out}/{name}-{k}/rank-{r}.jsonl"):
            e = json.loads(line)
            steps[e["step"]] = max(steps.get(e["step"], 0), e["step_s"])
    return statistics.median(v for s, v in steps.items() if s > 1)
t = {n: [tps(n, k) for k in range(1, rounds + 1)] for n in names}
print(f"| run | tokens/s, median (min–max) over {rounds} rounds |\n| --- | --- |")
for n in names:
    print(f"| {n} | {spread(t[n])} |")
def ratio(a, b):
    return spread([x / y for x, y in zip(t[a], t[b])])
print(f"\n| ratio | median (min–max) over rounds |\n| --- | --- |")
print(f"| auto / balanced | {ratio('auto', 'balanced')} |")
print(f"| uneven / balanced | {ratio('uneven', 'balanced')} |")
print(f"| observed / plain, tokens/s | {ratio('observed', 'plain')} |")
step = {n: [median_step(n, k) for k in range(1, rounds + 1)] for n in ("plain", "observed")}
print(f"| observed / plain, median step time | "
      f"{spread([a / b for a, b in zip(step['observed'], step['plain'])])} |")
splits = [json.load(open(f"{out}/auto-{k}/summary.json"))[0]["micro_batch"] for k in range(1, rounds + 1)]
print(f"\nauto's final splits: {splits}")
PY
