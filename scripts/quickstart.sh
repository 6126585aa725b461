#!/usr/bin/env bash
# The main job: install what it needs, build collie and its plugins (not the tests), and
# run configs/quickstart.yaml. scripts/test.sh installs and builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
scripts/setup.sh main
echo "quickstart: packages ready in $((SECONDS - start)) s"
start=$SECONDS
scripts/build.sh collie_main
echo "quickstart: built collie and its plugins in $((SECONDS - start)) s"
exec build/bin/collie run configs/quickstart.yaml "$@"
