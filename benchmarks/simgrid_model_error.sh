#!/usr/bin/env bash
# The flat alpha-beta-gamma cost model against the simulator on contended platforms
# (configs/platforms/: a 4:1 oversubscribed fat tree, a 3-D torus, a dragonfly): for each
# platform and world size, every scheduler's prediction beside its simulated time over
# 64 KiB - 64 MiB, and the median |prediction error| per scheduler. Simulated time has no
# noise, so one run per point is exact.
#   benchmarks/simgrid_model_error.sh [OUT]   (RANKS="64 512")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
out=${1:-$root/runs/simgrid-model-error-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
for platform in fat-tree torus dragonfly; do
  for n in ${RANKS:-64 512}; do
    cat > "$out/$platform-$n.yaml" <<YAML
name: model-error-$platform-$n
launch: {nproc_per_node: $n}
backend: {plugin: simgrid, params: {payload: false, platform: $root/configs/platforms/$platform.xml}}
bench:
  collective: allreduce
  schedulers: [ring, {plugin: tree, params: {segment_bytes: 4MiB}}, halving_doubling, recursive_doubling]
  min_bytes: 64KiB
  max_bytes: 64MiB
  step_factor: 4
  warmup_iters: 0
  iters: 1
  repeats: 1
  calibrate: true
  plots: false
YAML
    echo "## $platform, $n ranks"
    "$root/build/bin/collie" run "$out/$platform-$n.yaml" --out "$out/$platform-$n" > "$out/$platform-$n.txt" 2>&1
    grep -E '^# (cost model|Median prediction)|^ +[0-9]' "$out/$platform-$n.txt"
  done
done
