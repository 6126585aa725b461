#!/usr/bin/env bash
# Every test: set up, build, and run ctest (its summary line shows the count). Each phase
# says how long it took: the packages apart from the rest, as the main job's script does.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup.sh
echo "test: packages ready in $((SECONDS - start)) s"
start=$SECONDS
scripts/build.sh
echo "test: built every target in $((SECONDS - start)) s"
exec ctest --test-dir build --output-on-failure -j 2 "$@"
