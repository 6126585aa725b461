#!/usr/bin/env bash
# ZeRO against its PyTorch peer, in one run: collie's trainer with train.sharding: none,
# optimizer (stage 1), gradients (stage 2) and parameters (stage 3), and PyTorch 1.13 DDP with torch.optim.AdamW
# and with ZeroRedundancyOptimizer (stage 1; both with gradient_as_bucket_view, as collie's
# buckets; Python, torchrun, Gloo; Debian's python3-torch, the same OpenBLAS and tcmalloc), on the same
# GPT and the same number of processes. Prints tokens/s and the peak RSS of every rank, each
# the median over the rounds, the state collie measured in its buffers beside ZeRO's
# formula, and the ratios. (PyTorch 1.13's stages 2 and 3, FSDP's SHARD_GRAD_OP and
# FULL_SHARD, need CUDA.)
#   benchmarks/zero_peers.sh [OUT]
#     (RANKS=4 STEPS=6 ROUNDS=2 LAYERS=16 D_MODEL=512 SEQ_LEN=64 VOCAB=256 MICRO_BATCH=2
#      to change; the default GPT has 50.6 M parameters)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/zero-peers-$(date +%Y%m%d-%H%M%S)}"
ranks="${RANKS:-4}"
steps="${STEPS:-6}"
rounds="${ROUNDS:-2}"
layers="${LAYERS:-16}"
d_model="${D_MODEL:-512}"
seq_len="${SEQ_LEN:-64}"
vocab="${VOCAB:-256}"
micro_batch="${MICRO_BATCH:-2}"
source benchmarks/pytorch_peer.sh
mkdir -p "$out"
echo "# GPT: $layers layers, d_model $d_model, seq_len $seq_len, vocab $vocab; $ranks ranks x $micro_batch samples, $steps steps"

model=(--set model.params.layers="$layers" --set model.params.d_model="$d_model"
       --set model.params.heads=8 --set model.params.seq_len="$seq_len"
       --set model.params.vocab="$vocab")
# Rounds alternate the peers so that a noisy minute does not favour one of them.
for round in $(seq 1 "$rounds"); do
  for sharding in none optimizer gradients parameters; do
    "$collie" --log-level warn run benchmarks/collie-gpt.yaml \
      --out "$out/collie-$sharding-$round" --set launch.nproc_per_node="$ranks" \
      --set train.steps="$steps" --set train.micro_batch="$micro_batch" \
      --set train.sharding="$sharding" "${model[@]}" > /dev/null
  done
  for optimizer in ddp zero; do
    flag=(--bucket-view)
    [[ "$optimizer" == zero ]] && flag+=(--zero)
    LD_PRELOAD="$preload" OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node="$ranks" \
      --redirects 2 --tee 1 --log_dir "$out/torchrun-logs" benchmarks/ddp_gpt.py \
      --steps "$steps" --layers "$layers" --d-model "$d_model" --heads 8 \
      --seq-len "$seq_len" --vocab "$vocab" --micro-batch "$micro_batch" "${flag[@]}" \
      > "$out/pytorch-$optimizer-$round.log" 2>&1
  done
  echo "# round $round done"
done

"$python" benchmarks/compare_zero.py "$out" "$rounds" | tee "$out/table.md"
