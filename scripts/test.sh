#!/usr/bin/env bash
# Every test: set up, build, and run ctest (its summary line shows the count).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec ctest --test-dir build --output-on-failure -j 2 "$@"
