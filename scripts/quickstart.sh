#!/usr/bin/env bash
# The main job: set up, build, and run configs/quickstart.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/bin/collie run configs/quickstart.yaml "$@"
