#!/usr/bin/env bash
# The largest model that fits, predicted against found: for each sharding stage, collie trains
# a small GPT (BASE layers) with every rank held to LIMIT (launch.memory_limit, root), reads
# the summary's prediction of the most layers of that width that fit, then finds the most
# that actually train by a bisection over the layers (a run fits when it ends with exit 0; it
# does not when the kernel killed a rank at its limit, error.json's out_of_memory; any other
# failure stops the script). Prints, per stage and base, the predicted and the found layers
# and parameters and the prediction's error in parameters.
#   benchmarks/zero_fits.sh [OUT]
#     (LIMIT=600MiB BASES="2 4" RANKS=2 STEPS=3 D_MODEL=512 SEQ_LEN=64 MICRO_BATCH=2 to
#      change; the model is configs/zero-fits.yaml's otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/zero-fits-$(date +%Y%m%d-%H%M%S)}"
limit="${LIMIT:-600MiB}"
bases="${BASES:-2 4}"
ranks="${RANKS:-2}"
steps="${STEPS:-3}"
d_model="${D_MODEL:-512}"
seq_len="${SEQ_LEN:-64}"
micro_batch="${MICRO_BATCH:-2}"
collie=build/bin/collie
[[ $(id -u) == 0 ]] || { echo "zero_fits.sh: launch.memory_limit needs root" >&2; exit 2; }
mkdir -p "$out"

# fits STAGE LAYERS: trains it; true when it fits, false when a rank was killed at its
# limit; any other failure stops the script.
fits() {
  local dir="$out/$1-$2"
  rm -rf "$dir"
  if "$collie" --log-level warn run configs/zero-fits.yaml --out "$dir" \
      --set launch.memory_limit="$limit" --set launch.nproc_per_node="$ranks" \
      --set train.sharding="$1" --set model.params.layers="$2" \
      --set model.params.d_model="$d_model" --set model.params.seq_len="$seq_len" \
      --set train.micro_batch="$micro_batch" --set train.steps="$steps" \
      > "$dir.log" 2>&1; then
    return 0
  elif grep -q '"out_of_memory": true' "$dir/error.json" 2>/dev/null; then
    return 1
  else
    echo "zero_fits.sh: $1 with $2 layers failed otherwise; see $dir.log" >&2
    tail -3 "$dir.log" >&2
    kill -TERM $$
    exit 1
  fi
}

{
echo "# GPT d_model $d_model, seq_len $seq_len, micro-batch $micro_batch; $ranks ranks, each held to $limit"
echo "| sharding | base layers | predicted layers | found layers | predicted parameters | found parameters | error |"
echo "|---|---|---|---|---|---|---|"
for sharding in none optimizer gradients parameters; do
  found=""
  for base in $bases; do
    fits "$sharding" "$base" || { echo "zero_fits.sh: the base run of $base layers does not fit $limit" >&2; exit 1; }
    line=$(grep 'largest model that fits' "$out/$sharding-$base.log")
    predicted=$(sed -E 's/.* holds ([0-9]+) units of.*/\1/' <<< "$line")
    unit=$(sed -E 's/.* units of ([0-9,]+) parameters.*/\1/' <<< "$line" | tr -d ,)
    base_params=$(grep -m1 '^# Training' "$out/$sharding-$base.log" | grep -o '([0-9,]* parameters' | tr -dc 0-9)
    if [[ -z "$found" ]]; then
      # The most layers that train: from a run that fits (lo) and one that does not (hi).
      lo=$base; hi=""
      try=$(( predicted > lo ? predicted : lo + 1 ))
      while [[ -z "$hi" ]]; do
        if fits "$sharding" "$try"; then lo=$try; try=$(( try * 2 )); else hi=$try; fi
      done
      while (( hi - lo > 1 )); do
        mid=$(( (lo + hi) / 2 ))
        if fits "$sharding" "$mid"; then lo=$mid; else hi=$mid; fi
      done
      found=$lo
    fi
    # Parameters grow by one unit per layer from the base run's count.
    p_pred=$(( base_params + (predicted - base) * unit ))
    p_found=$(( base_params + (found - base) * unit ))
    error=$(awk -v p="$p_pred" -v f="$p_found" 'BEGIN { printf "%+.1f %%", 100 * (p - f) / f }')
    echo "| $sharding | $base | $predicted | $found | $p_pred | $p_found | $error |"
  done
done
} | tee "$out/table.md"
