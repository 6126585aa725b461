#!/usr/bin/env bash
# Configures and builds collie into ./build (Ninja, ccache when present, two jobs): every
# target, or only the targets named (scripts/build.sh collie_main: the executable and every
# plugin, without the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "${COLLIE_BUILD_JOBS:-2}" ${1:+--target "$@"}
