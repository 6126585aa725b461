#!/usr/bin/env bash
# All-reduce busbw per size, side by side in one run on this machine (DESIGN §9):
#   collie's schedulers over gloo (TCP) and over ucx (shared memory: sysv + cma),
#   Gloo's own all-reduce algorithms called directly (TCP),
#   Open MPI's MPI_Allreduce over shared memory (vader) and over TCP,
# for 2 and 4 ranks, float32 sum, 4 KiB - 256 MiB. Prints one table per rank count with the
# best of each group per size and the ratios collie/peer; every raw row goes to OUT/*.csv.
#
#   benchmarks/allreduce_peers.sh [--max-bytes BYTES] [--ranks "2 4"] [--iters N] [OUT]
#
# Needs a build (scripts/build.sh) with the gloo and ucx backends and the benchmarks.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${COLLIE_BUILD_DIR:-$root/build}"
max_bytes=$((256 * 1024 * 1024))
ranks="2 4"
iters=5
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --max-bytes) max_bytes="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) out="$1"; shift ;;
  esac
done
out="${out:-$root/runs/allreduce-peers-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
min_bytes=4096
collie="$build/bin/collie"
for tool in "$collie" "$build/benchmarks/gloo_allreduce" "$build/benchmarks/mpi_allreduce"; do
  [ -x "$tool" ] || { echo "allreduce_peers: $tool is missing; run scripts/build.sh" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "allreduce_peers: mpirun is missing (openmpi-bin)" >&2; exit 2; }

echo "# all-reduce peers, $(nproc) CPUs, float32 sum, $min_bytes..$max_bytes bytes, $iters iterations; raw rows in $out"
peers="$out/peers.csv"
echo "peer,algorithm,ranks,bytes,time_us,busbw_gbps" > "$peers"
for n in $ranks; do
  for backend in gloo ucx; do
    echo "# collie over $backend, $n ranks" >&2
    "$collie" run "$root/benchmarks/collie-$backend.yaml" --out "$out/collie-$backend-$n" \
      --set launch.nproc_per_node="$n" --set bench.max_bytes="$max_bytes" \
      --set bench.iters="$iters" --log-level warn > "$out/collie-$backend-$n.log" 2>&1 ||
      { cat "$out/collie-$backend-$n.log" >&2; exit 1; }
  done
  for algorithm in ring ring_chunked halving_doubling bcube; do
    echo "# Gloo $algorithm, $n ranks" >&2
    store="$out/gloo-store-$algorithm-$n"
    rm -rf "$store"; mkdir -p "$store"
    pids=()
    for ((r = 0; r < n; r++)); do
      "$build/benchmarks/gloo_allreduce" "$r" "$n" "$store" "$algorithm" "$min_bytes" \
        "$max_bytes" "$iters" >> "$out/gloo-$algorithm-$n-rank$r.csv" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cat "$out/gloo-$algorithm-$n-rank0.csv" >> "$peers"
  done
  for btl in vader tcp; do
    echo "# MPI_Allreduce over $btl, $n ranks" >&2
    mpirun --allow-run-as-root --oversubscribe -np "$n" --mca pml ob1 --mca btl "self,$btl" \
      "$build/benchmarks/mpi_allreduce" "$btl" "$min_bytes" "$max_bytes" "$iters" >> "$peers"
  done
done
python3 "$root/benchmarks/compare_peers.py" "$out" "$peers" | tee "$out/table.txt"
