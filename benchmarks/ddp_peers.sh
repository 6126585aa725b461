#!/usr/bin/env bash
# collie's DDP trainer against PyTorch DDP (Python, torchrun, Gloo; Debian's python3-torch)
# on the same GPT, 1 and 2 processes, 1 thread each, in one run: tokens/s side by side and
# the ratio collie / PyTorch. Both load the same OpenBLAS and run on the same malloc (tcmalloc).
#   benchmarks/ddp_peers.sh [OUT]        (STEPS=30 ROUNDS=2 RANKS="1 2" to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/ddp-peers-$(date +%Y%m%d-%H%M%S)}"
steps="${STEPS:-30}"
rounds="${ROUNDS:-2}"
ranks_list="${RANKS:-1 2}"
source benchmarks/pytorch_peer.sh
mkdir -p "$out"

# Rounds alternate the peers so that a noisy minute does not favour one of them.
for round in $(seq 1 "$rounds"); do
  for ranks in $ranks_list; do
    for scheduler in ring native; do
      "$collie" --log-level warn run benchmarks/collie-gpt.yaml \
        --out "$out/collie-$scheduler-$ranks-$round" --set launch.nproc_per_node="$ranks" \
        --set train.steps="$steps" --set train.scheduler="$scheduler" > /dev/null
    done
    LD_PRELOAD="$preload" OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node="$ranks" \
      --redirects 2 --tee 1 --log_dir "$out/torchrun-logs" benchmarks/ddp_gpt.py \
      --steps "$steps" > "$out/pytorch-$ranks-$round.log" 2>&1
    echo "# round $round, $ranks rank(s) done"
  done
done

"$python" benchmarks/compare_ddp.py "$out" "$ranks_list" "$rounds" | tee "$out/table.md"
