#!/usr/bin/env bash
# The simgrid backend at scale, payload off (backends/simgrid/README.md):
#  1. wall time and peak memory of one calibrated all-reduce (halving_doubling, 64 MiB) on
#     64 to 4,096 ranks of the built-in two-level cluster, median (min-max) of REPEATS runs;
#  2. against SimGrid's own MPI (SMPI, the peer, in the same run): a ring all-reduce of 1 MiB
#     on the first N hosts of configs/platforms/fat-tree.xml, the same network model, both
#     without payload: simulated time of each (they should agree: the same schedule on the
#     same platform) and wall time collie / SMPI.
#   benchmarks/simgrid_scale.sh [OUT] (REPEATS=3 RANKS="64 256 1024 4096" PEER_RANKS="64 256 1024")
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$here/..
out=${1:-$root/runs/simgrid-scale-$(date +%Y%m%d-%H%M%S)}
repeats=${REPEATS:-3}
mkdir -p "$out"
collie=$root/build/bin/collie

cat > "$out/scale.yaml" <<YAML
name: simgrid-scale
launch: {nproc_per_node: 64}
backend:
  plugin: simgrid
  params: {payload: false, ranks_per_node: 8, link_gbps: 1600, latency_us: 1, node_gbps: 400,
           node_latency_us: 5, reduce_gbps: 200}
bench: {collective: allreduce, schedulers: [halving_doubling], min_bytes: 64MiB, max_bytes: 64MiB,
        warmup_iters: 0, iters: 1, repeats: 1, calibrate: true, plots: false}
YAML
cat > "$out/peer.yaml" <<YAML
name: simgrid-peer
launch: {nproc_per_node: 64}
backend: {plugin: simgrid, params: {payload: false, platform: $root/configs/platforms/fat-tree.xml, reduce_gbps: 0}}
bench: {collective: allreduce, schedulers: [ring], min_bytes: 1MiB, max_bytes: 1MiB,
        warmup_iters: 0, iters: 1, repeats: 1, calibrate: false, plots: false}
YAML

# "seconds kilobytes" of one command (GNU time: the largest resident set of it and its
# children, the simulation's child process included).
timed() { /usr/bin/time -f "%e %M" -o "$out/time.txt" "$@" > "$out/last.txt" 2>&1; cat "$out/time.txt"; }
stats() { python3 -c '
import statistics, sys
v = [float(x) for x in sys.argv[1:]]
print(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")' "$@"; }

echo "# 1. halving_doubling, 64 MiB, calibrated, payload off: wall s and peak GB, median (min-max) of $repeats"
printf "%8s %22s %22s %14s\n" ranks "wall (s)" "peak memory (GB)" "simulated (us)"
for n in ${RANKS:-64 256 1024 4096}; do
  walls=() mems=()
  for _ in $(seq "$repeats"); do
    read -r wall kb < <(timed "$collie" run "$out/scale.yaml" --out "$out/scale-$n" --set "launch.nproc_per_node=$n")
    walls+=("$wall"); mems+=("$(python3 -c "print($kb / 1048576)")")
  done
  sim=$(awk '$5 == "halving_doubling" {print $6; exit}' "$out/last.txt")
  printf "%8s %22s %22s %14s\n" "$n" "$(stats "${walls[@]}")" "$(stats "${mems[@]}")" "$sim"
done

echo
echo "# 2. ring, 1 MiB, fat-tree.xml, CM02: collie against SMPI (MPI_Allreduce, algorithm lr), $repeats runs each"
smpicc -O2 -o "$out/smpi_allreduce" "$here/smpi_allreduce.c"
smpi_cfg=(--cfg=smpi/privatization:no --cfg=smpi/shared-malloc:global
          --cfg=smpi/simulate-computation:no --cfg=smpi/allreduce:lr --cfg=network/model:CM02
          --cfg=network/TCP-gamma:0 --cfg=network/crosstraffic:0 --log=root.thres:critical)
printf "%8s %16s %16s %22s %22s %18s\n" ranks "collie sim (us)" "SMPI sim (us)" "collie wall (s)" "SMPI wall (s)" "wall collie/SMPI"
for n in ${PEER_RANKS:-64 256 1024}; do
  seq 0 $((n - 1)) | sed 's/^/host/' > "$out/hosts-$n"
  cw=() sw=() ratios=()
  for _ in $(seq "$repeats"); do
    read -r c _ < <(timed "$collie" run "$out/peer.yaml" --out "$out/peer-$n" --set "launch.nproc_per_node=$n")
    csim=$(awk '$5 == "ring" {print $6; exit}' "$out/last.txt")
    read -r s _ < <(timed smpirun -np "$n" -platform "$root/configs/platforms/fat-tree.xml" \
      -hostfile "$out/hosts-$n" "${smpi_cfg[@]}" "$out/smpi_allreduce" 1048576)
    ssim=$(awk '/smpi allreduce/ {print $5; exit}' "$out/last.txt")
    cw+=("$c"); sw+=("$s"); ratios+=("$(python3 -c "print($c / $s)")")
  done
  printf "%8s %16s %16s %22s %22s %18s\n" "$n" "$csim" "$ssim" "$(stats "${cw[@]}")" "$(stats "${sw[@]}")" "$(stats "${ratios[@]}")"
done
