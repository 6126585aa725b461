#!/usr/bin/env bash
# Installs the Debian packages collie needs: `scripts/setup.sh main` what building it and
# running the main job need, `scripts/setup.sh` (all) what the tests and benchmarks need too.
# Idempotent: it only calls apt-get when something is missing. Works as root or through sudo.
set -euo pipefail

# What building collie and running the main job (configs/quickstart.yaml: gloo) need.
main=(
  build-essential cmake ninja-build ccache pkg-config git file python3
  libtorch-dev libopenblas0-pthread libtcmalloc-minimal4
  libyaml-cpp-dev libboost-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libxxhash-dev libgloo-dev
)
# What the tests and benchmarks need besides.
tests=(
  gnuplot-nox
  # the ucx backend, and the peers the tests and benchmarks launch or compare against
  libucx-dev ucx-utils libopenmpi-dev openmpi-bin python3-torch
  # the simgrid backend: ranks as actors on a simulated platform
  libsimgrid-dev
  # a test reads checkpoint shards (safetensors) with Python and NumPy alone
  python3-numpy
  # the lab: network namespaces, veth, bridge, tbf (ip, tc); unshare, setpriv
  iproute2 util-linux
  # a one-machine Slurm cluster for the srun test
  slurmctld slurmd slurm-client munge
)
case "${1:-all}" in
  main) packages=("${main[@]}") ;;
  all) packages=("${main[@]}" "${tests[@]}") ;;
  *) echo "setup: unknown set '$1'; expected main or all" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
