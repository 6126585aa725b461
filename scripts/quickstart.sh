#!/usr/bin/env bash
# The main job: install what it needs, build collie, its schedulers and the backend, model
# and codecs configs/quickstart.yaml names (not the tests, nor the other plugins), and run
# it. Arguments go to `collie run` (its --set ones also choose what is built).
# scripts/test.sh installs and builds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
config=configs/quickstart.yaml
start=$SECONDS
scripts/setup.sh main
echo "quickstart: packages ready in $((SECONDS - start)) s"
start=$SECONDS
scripts/build.sh collie collie_schedulers
# The --set arguments change what the file names (--set backend=ucx); collie takes one value
# after each --set.
sets=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --set) sets+=(--set "${args[i + 1]:-}"); i=$((i + 1)) ;;
    --set=*) sets+=("${args[i]}") ;;
  esac
done
uses=$(build/bin/collie validate "$config" ${sets[@]+"${sets[@]}"} --list-plugins)
# Each backend, model and codec named, where this build makes it. A plugin given as a path is
# not ours to build; a name this build has no target for (another tree's plugin, or one whose
# packages configure did not find) is said here, and collie says it again if it is missing.
known=$(cmake --build build -- -t targets all | cut -d: -f1)
targets=()
while read -r kind name; do
  [[ "$kind" =~ ^(backend|model|codec)$ && "$name" =~ ^[a-z0-9_]+$ ]] || continue
  if grep -qxF "collie_${kind}_${name}" <<< "$known"; then
    targets+=("collie_${kind}_${name}")
  else
    echo "quickstart: this build makes no $kind plugin '$name'; the run needs it from elsewhere"
  fi
done <<< "$uses"
[[ ${#targets[@]} == 0 ]] || scripts/build.sh "${targets[@]}"
echo "quickstart: built collie and the plugins it runs in $((SECONDS - start)) s"
exec build/bin/collie run "$config" "$@"
