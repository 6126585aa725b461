#!/usr/bin/env bash
# Installs collie into a scratch prefix, builds the example scheduler in
# tests/install/example_scheduler against it with find_package(collie), and runs it through
# a config, by path and by name (COLLIE_PLUGIN_PATH).
set -euo pipefail
build_dir="$1"
scratch="$2"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$scratch"
mkdir -p "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
cmake -S "$here/example_scheduler" -B "$scratch/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/build"
plugin="$scratch/build/libcollie_scheduler_direct.so"
test -f "$plugin"

collie="$scratch/prefix/bin/collie"
"$collie" plugins | grep -Eq "scheduler +ring " || { echo "installed collie does not list ring"; exit 1; }
config="$here/../../configs/ring-vs-tree.yaml"
short=(--set bench.max_bytes=64KiB --set bench.iters=2 --set bench.warmup_iters=1)
"$collie" run "$config" "${short[@]}" --set "bench.schedulers=[$plugin, ring]" \
  --out "$scratch/run-path" | tee "$scratch/by-path.txt"
grep -q "Wrong elements: 0" "$scratch/by-path.txt"
grep -q " direct " "$scratch/by-path.txt"
COLLIE_PLUGIN_PATH="$scratch/build" "$collie" run "$config" "${short[@]}" \
  --set "bench.schedulers=[direct]" --out "$scratch/run-name" | tee "$scratch/by-name.txt"
grep -q "Wrong elements: 0" "$scratch/by-name.txt"
echo "out-of-tree plugin built against the installed package and ran: OK"
