#!/usr/bin/env bash
# Training over a slow link, collie against PyTorch in the same run on the same lab (root):
# the quickstart GPT on 2 lab hosts x 2 processes joined at RATE, trained four ways by both:
#   ddp       the float32 all-reduce every step        (DDP, no hook)
#   fp16      gradients summed in float16               (DDP's fp16_compress_hook)
#   powersgd  rank 4 from step 8, error feedback        (DDP's powerSGD_hook)
#   localsgd  parameters averaged every EVERY steps after EVERY (PostLocalSGDOptimizer, a
#             subgroup of each rank alone)
# The same model, token file, AdamW, constant learning rate and clipping, DDP's default 25 MB
# buckets; 1 thread per rank, the same OpenBLAS and malloc.
# Both peers use 25 MB buckets: PyTorch's one holds this model's 3.4 MB of gradients; collie's
# reducer keeps the root parameters (embeddings, final LayerNorm) in two small buckets of
# their own beside the blocks' one. PyTorch's
# DDP is told to make its first bucket as large as the others (--first-bucket-mb), which
# its powerSGD_hook over Gloo needs (ddp_gpt.py says why); FIRST_BUCKET_MB=1 gives DDP its
# default 1 MB first bucket instead, which overlaps part of the all-reduce with the backward
# (and is refused with powersgd in WAYS). Round k seeds both peers' initial weights and sampling with 1233 + k, so that
# each peer's final loss has a spread over the rounds. Prints, per way, each peer's median
# tokens/s over the rounds, collie / PyTorch with its range over the rounds, and each peer's
# final loss (the job's mean) with its range.
# MICRO_BATCH (8: each rank's samples per step, on both peers) sets how much a step computes
# against what it sends; EVERY (8) is local SGD's H and its warm-up; PYTORCH=0 runs collie
# alone (its ÷ DDP column, without the PyTorch columns).
# SCHEDULERS (ring: the algorithm PyTorch's Gloo runs) names collie's all-reduce schedulers;
# collie trains each way once per scheduler ("ring auto": also the one its cost model picks
# for this lab, which PyTorch over Gloo cannot run), each against the same PyTorch run.
# RATE=none runs both peers' 4 ranks on this host without the lab (no root needed): the
# losses are those of the lab's runs (the same ranks, batches and seeds; no way's result
# depends on the link), so many rounds give each peer's loss spread in minutes; tokens/s is
# then this host's, not a slow link's.
#   benchmarks/slow_link_peers.sh [OUT]     (RATE=100mbit ROUNDS=3 STEPS=64
#                                            WAYS="ddp fp16 powersgd localsgd"
#                                            FIRST_BUCKET_MB=25 MICRO_BATCH=8 EVERY=8
#                                            SCHEDULERS=ring PYTORCH=1 to change;
#                                            RATE=none: one host)
set -euo pipefail
cd "$(dirname "$0")/.."
rate="${RATE:-100mbit}"
[[ "$rate" == none || "$(id -u)" == 0 ]] || { echo "the lab needs root (RATE=none: one host)" >&2; exit 2; }
out="${1:-runs/slow-link-peers-$(date +%Y%m%d-%H%M%S)}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-64}"
ways="${WAYS:-ddp fp16 powersgd localsgd}"
first_bucket="${FIRST_BUCKET_MB:-25}"
micro_batch="${MICRO_BATCH:-8}"
every="${EVERY:-8}"
pytorch="${PYTORCH:-1}"
schedulers="${SCHEDULERS:-ring}"
if [[ "$first_bucket" != 25 && " $ways " == *" powersgd "* ]]; then
  echo "FIRST_BUCKET_MB=$first_bucket: PyTorch's powerSGD_hook over Gloo needs one bucket;" \
    "leave powersgd out of WAYS" >&2
  exit 2
fi
source benchmarks/pytorch_peer.sh
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# The lab goes however the run ends.
[[ "$rate" == none ]] || trap '"$collie" lab down > /dev/null 2>&1 || true' EXIT

# Learnable tokens, as collie's synthetic source makes them: each token follows from the one
# before (t -> 5t + 3 mod 256) three times in four, else uniform.
"$python" - "$out/tokens.bin" <<'PY'
import sys
import numpy
rng = numpy.random.default_rng(1234)
n = 1 << 21
tokens = numpy.empty(n, dtype=numpy.uint16)
tokens[0] = 0
follow = rng.random(n) < 0.75
fresh = rng.integers(0, 256, n)
for i in range(1, n):
    tokens[i] = (5 * int(tokens[i - 1]) + 3) % 256 if follow[i] else fresh[i]
tokens.tofile(sys.argv[1])
PY

torch_args() {
  case "$1" in
    ddp) ;;
    fp16) echo "--hook fp16" ;;
    powersgd) echo "--hook powersgd --powersgd-rank 4 --powersgd-start 8" ;;
    localsgd) echo "--local-sgd-every $every --local-sgd-warmup $every" ;;
  esac
}

run_collie() {  # way round scheduler
  local way=() where=(--set launch.lab.rate="$rate")
  [[ "$rate" != none ]] || where=(--set 'launch={nproc_per_node: 4, threads_per_rank: 1}')
  case "$1" in
    fp16) way=(--set train.compression=fp16) ;;
    powersgd) way=(--set "train.compression={plugin: powersgd, params: {rank: 4, start_step: 8}}") ;;
    localsgd) way=(--set "train.sync={mode: local_sgd, every: $every, warmup_steps: $every}") ;;
  esac
  "$collie" --log-level warn run configs/slow-link.yaml --out "$out/collie-$1-$3-$2" \
    --set 'matrix=[{}]' --set name="$1" "${where[@]}" --set train.scheduler="$3" \
    --set data.source=tokens --set data.path="$out/tokens.bin" --set train.steps="$steps" \
    --set train.micro_batch="$micro_batch" \
    --set train.lr_schedule=constant --set train.warmup_steps=0 --set train.bucket_bytes=25MB \
    --set train.seed=$((1233 + $2)) --set data.seed=$((1233 + $2)) \
    "${way[@]}" > /dev/null
}

run_pytorch() {  # way round: torchrun on each lab host, host 0 the master
  if [[ "$rate" == none ]]; then  # 4 processes here; the log named as host 0's
    # shellcheck disable=SC2046
    LD_PRELOAD="$preload" OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
      torchrun --standalone --nproc_per_node 4 \
      --redirects 2 --tee 1 --log_dir "$out/torchrun-logs/$1-$2" \
      "$PWD/benchmarks/ddp_gpt.py" --steps "$steps" --data "$out/tokens.bin" --bucket-mb 25 \
      --micro-batch "$micro_batch" --first-bucket-mb "$first_bucket" \
      --seed $((1233 + $2)) $(torch_args "$1") > "$out/pytorch-$1-$2-h0.log" 2>&1
    return
  fi
  "$collie" lab up --hosts 2 --rate "$rate" > /dev/null
  local pids=()
  for host in 0 1; do
    # shellcheck disable=SC2046
    "$collie" lab exec "collie-h$host" -- env LD_PRELOAD="$preload" OMP_NUM_THREADS=1 \
      GLOO_SOCKET_IFNAME="eth$host" torchrun --nnodes 2 --node_rank "$host" \
      --nproc_per_node 2 --master_addr 198.18.0.1 --master_port 29700 \
      --redirects 2 --tee 1 --log_dir "$out/torchrun-logs/$1-$2-h$host" \
      "$PWD/benchmarks/ddp_gpt.py" --steps "$steps" --data "$out/tokens.bin" --bucket-mb 25 \
      --micro-batch "$micro_batch" \
      --first-bucket-mb "$first_bucket" \
      --seed $((1233 + $2)) $(torch_args "$1") > "$out/pytorch-$1-$2-h$host.log" 2>&1 &
    pids+=($!)
  done
  # Both hosts' launchers are waited for, whichever fails first: none is left running.
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return "$status"
}

# Rounds alternate the peers so that a noisy minute does not favour one of them.
for round in $(seq 1 "$rounds"); do
  for way in $ways; do
    for scheduler in $schedulers; do run_collie "$way" "$round" "$scheduler"; done
    [[ "$pytorch" == 0 ]] || run_pytorch "$way" "$round"
    echo "# round $round: $way done"
  done
done

EVERY="$every" PYTORCH="$pytorch" MICRO_BATCH="$micro_batch" SCHEDULERS="$schedulers" \
  "$python" benchmarks/compare_slow_link.py "$out" "$rounds" "$rate" $ways | tee "$out/table.md"
