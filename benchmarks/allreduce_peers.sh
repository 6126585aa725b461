#!/usr/bin/env bash
# All-reduce busbw per size, side by side in one run on this machine:
#   collie's schedulers over gloo (TCP) and over ucx (shared memory: sysv + cma),
#   Gloo's own all-reduce algorithms called directly (TCP),
#   Open MPI's MPI_Allreduce over shared memory (vader) and over TCP,
#   and, with --baseline, an older collie (a checkout with its own build/) as one more peer,
# for 2 and 4 ranks, float32 sum, 4 KiB - 256 MiB. Prints one table per rank count with the
# best of each group per size and the ratios collie/peer; every raw row goes to OUT/*.csv.
#
#   benchmarks/allreduce_peers.sh [--min-bytes BYTES] [--max-bytes BYTES] [--ranks "2 4"] [--iters N]
#                                 [--small-iters N] [--rounds R] [--baseline CHECKOUT] [OUT]
#
# Sizes up to 1 MiB are timed over --small-iters calls (50), larger ones over --iters (5).
# With --rounds R every peer runs R times, the rounds interleaved (peer by peer within a
# round); the table then shows each ratio's median over the rounds with its min-max.
#
# Gloo's event-loop thread runs under SCHED_BATCH in both collie's gloo backend and the
# Gloo-direct peer (their common default; see backends/gloo/README.md, `loop_thread`).
#
# Needs a build (scripts/build.sh) with the gloo and ucx backends and the benchmarks.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${COLLIE_BUILD_DIR:-$root/build}"
min_bytes=4096
max_bytes=$((256 * 1024 * 1024))
ranks="2 4"
iters=5
small_iters=50
rounds=1
baseline=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --min-bytes) min_bytes="$2"; shift 2 ;;
    --max-bytes) max_bytes="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --small-iters) small_iters="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --baseline) baseline="$(cd "$2" && pwd)"; shift 2 ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) out="$1"; shift ;;
  esac
done
out="${out:-$root/runs/allreduce-peers-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
collie="$build/bin/collie"
for tool in "$collie" "$build/benchmarks/gloo_allreduce" "$build/benchmarks/mpi_allreduce"; do
  [ -x "$tool" ] || { echo "allreduce_peers: $tool is missing; run scripts/build.sh" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "allreduce_peers: mpirun is missing (openmpi-bin)" >&2; exit 2; }
if [ -n "$baseline" ] && [ ! -x "$baseline/build/bin/collie" ]; then
  echo "allreduce_peers: --baseline $baseline has no build/bin/collie; build it there first" >&2
  exit 2
fi
case "$rounds" in ''|*[!0-9]*|0) echo "allreduce_peers: --rounds takes a positive number" >&2; exit 2 ;; esac

echo "# all-reduce peers, $(nproc) CPUs, float32 sum, $min_bytes..$max_bytes bytes, $rounds round(s); raw rows in $out"

# collie_pass NAME COLLIE CONFIGS N LO HI ITERS TAG: one collie's schedulers (its
# CONFIGS/collie-BACKEND.yaml) over both backends, into $dir/NAME-BACKEND-TAG/.
collie_pass() {
  local name=$1 binary=$2 configs=$3 n=$4 lo=$5 hi=$6 iters=$7 tag=$8
  for backend in gloo ucx; do
    echo "# $name over $backend, $n ranks, $lo..$hi B" >&2
    "$binary" --log-level warn run "$configs/collie-$backend.yaml" \
      --out "$dir/$name-$backend-$tag" --set launch.nproc_per_node="$n" \
      --set bench.min_bytes="$lo" --set bench.max_bytes="$hi" --set bench.iters="$iters" \
      > "$dir/$name-$backend-$tag.log" 2>&1 ||
      { cat "$dir/$name-$backend-$tag.log" >&2; exit 1; }
  done
}

# One pass of every peer over sizes lo..hi with `iters` timed calls each.
pass() {
  local n=$1 lo=$2 hi=$3 iters=$4 tag="$1-$2"
  collie_pass collie "$collie" "$root/benchmarks" "$n" "$lo" "$hi" "$iters" "$tag"
  [ -z "$baseline" ] ||
    collie_pass baseline "$baseline/build/bin/collie" "$baseline/benchmarks" "$n" "$lo" "$hi" \
      "$iters" "$tag"
  for algorithm in ring ring_chunked halving_doubling bcube; do
    echo "# Gloo $algorithm, $n ranks, $lo..$hi B" >&2
    local store="$dir/gloo-store-$algorithm-$tag" pids=() r
    rm -rf "$store"; mkdir -p "$store"
    for ((r = 0; r < n; r++)); do
      "$build/benchmarks/gloo_allreduce" "$r" "$n" "$store" "$algorithm" "$lo" "$hi" "$iters" \
        > "$dir/gloo-$algorithm-$tag-rank$r.csv" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cat "$dir/gloo-$algorithm-$tag-rank0.csv" >> "$peers"
  done
  for btl in vader tcp; do
    echo "# MPI_Allreduce over $btl, $n ranks, $lo..$hi B" >&2
    mpirun --allow-run-as-root --oversubscribe -np "$n" --mca pml ob1 --mca btl "self,$btl" \
      "$build/benchmarks/mpi_allreduce" "$btl" "$lo" "$hi" "$iters" >> "$peers"
  done
}

# Small messages take microseconds: many calls each; large ones take up to a second: few.
split=$((1024 * 1024))
for ((round = 1; round <= rounds; round++)); do
  dir="$out/round-$round"
  mkdir -p "$dir"
  peers="$dir/peers.csv"
  echo "peer,algorithm,ranks,bytes,time_us,busbw_gbps" > "$peers"
  for n in $ranks; do
    if [ "$max_bytes" -le "$split" ]; then
      pass "$n" "$min_bytes" "$max_bytes" "$small_iters"
    elif [ "$min_bytes" -gt "$split" ]; then
      pass "$n" "$min_bytes" "$max_bytes" "$iters"
    else
      pass "$n" "$min_bytes" "$split" "$small_iters"
      pass "$n" $((split * 2)) "$max_bytes" "$iters"
    fi
  done
done
python3 "$root/benchmarks/compare_peers.py" "$out"/round-* | tee "$out/table.txt"
