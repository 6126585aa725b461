#!/usr/bin/env bash
# The GPU check: on a machine with NVIDIA GPUs, CUDA, NCCL and a PyTorch with CUDA, and no
# internet, builds collie against that PyTorch's LibTorch with the nccl, gloo and ucx backends,
# then checks in parts, each ending in one PASS, FAIL or SKIPPED line:
#   0. the machine (GPUs, PyTorch, CUDA, NCCL) and the build;
#   1. nccl, one rank: nccl_test, device_test and the trainer's GPU test; a bench of the native
#      and ring schedulers; the same bench with collie's NCCL tuner loaded (NCCL_TUNER_PLUGIN,
#      NCCL_DEBUG=INFO shows NCCL loading it); configs/micro-pllm-108m.yaml trained for a few steps (bf16 autocast,
#      activation checkpointing) and the same model and batch in PyTorch eager
#      (benchmarks/ddp_gpt.py), tokens/s side by side;
#   2. gloo and ucx, host-staged: configs/zero.yaml's GPT on 2 ranks sharing the GPU ends where
#      the same training on the CPU ends (ZeRO stage 3 too), and the summary says host-staged;
#      whether Debian's Gloo clashes with the Gloo inside PyTorch (gloo is skipped, with the
#      reason, if it does); ZeRO stage 3's peak GPU memory against the state formula for N = 2;
#   3. schedulers' reductions on device memory: ring and halving_doubling over loopback with
#      memory: device (ranks as threads sharing the GPU), plugin-check and a bench;
#   4. with two GPUs or more: nccl_test's 2-rank cases, a 2-rank training over nccl against the
#      CPU run, and plugin-check nccl; skipped with one GPU (NCCL refuses two ranks on one GPU).
# A failing part does not stop the others; the exit status is 1 when any part failed. Sized
# for 5 minutes on one H200, the build about half of it (an estimate: not yet timed there);
# BUDGET caps it, and parts it leaves no time for are SKIPPED.
#
#   scripts/gpu-check.sh --fetch   here, with Debian's archive: downloads the Debian packages
#                                  the build needs (listed below) into .gpu-debs/ (ignored by
#                                  git; carry it to the GPU machine with the tree)
#   scripts/gpu-check.sh [OUT]     there: everything above. OUT (default $OUT, else the work
#                                  folder) receives two files: gpu-check.txt, the summary, and
#                                  gpu-check-logs.tar.gz, every log, config and summary.json
#
# The work folder is runs/gpu-check-<time>; the packages are unpacked under it, never into /,
# and found through CMAKE_PREFIX_PATH and PKG_CONFIG_PATH; the build goes to build-gpu/.
# Environment: STEPS (108M training steps, default 6), MICRO_BATCH (its sequences of 2,048
# tokens per step, default 8), JOBS (build jobs, default the CPU count), BUDGET (seconds for
# the whole check, default 290), PYTHON (the one with PyTorch, default python3).
set -uo pipefail  # no -e: a part that fails says so and the others still run
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
debs_dir=$here/.gpu-debs
# What the build needs from Debian beyond a compiler, CMake, CUDA and PyTorch: the core's
# libraries and GoogleTest; Gloo and UCX with the libraries they load (Redis client, ibverbs,
# netlink, rdmacm, NUMA, the verbs providers); pkg-config, through which CMake finds UCX.
packages=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
          libcli11-dev nlohmann-json3-dev libboost1.74-dev libxxhash-dev libxxhash0
          libgtest-dev googletest
          libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200
          libucx-dev libucx0 libnuma1 librdmacm1 ibverbs-providers
          pkgconf pkgconf-bin libpkgconf3)
# Their dependencies that are not fetched: the C and C++ runtimes and the compiler's headers
# (a machine that builds C++ has them), adduser, and headers no collie source includes
# (Gloo's Redis and ibverbs transports, spdlog's tests).
not_fetched=(libc6 libgcc-s1 libstdc++6 libstdc++-12-dev adduser libhiredis-dev libibverbs-dev
             catch2)
# The parts, in the summary's order.
parts=(0a 0b 1a 1b 1c 1d 1f 1e 2a 2b 2c 2d 3a 3b 3c 4a 4b 4c)
declare -A title=(
  [0a]="machine" [0b]="build" [1a]="nccl_test, one GPU" [1b]="device_test"
  [1c]="trainer_test GpuTraining.*" [1d]="bench over nccl, 1 rank, native and ring"
  [1e]="108M GPT over nccl, 1 rank, against PyTorch eager"
  [1f]="NCCL loads collie's tuner (libnccl-tuner-collie.so, NCCL_DEBUG=INFO)"
  [2a]="Debian's Gloo against PyTorch's" [2b]="gloo, 2 ranks on one GPU, host-staged"
  [2c]="ucx, 2 ranks on one GPU, host-staged" [2d]="ZeRO stage 3 peak GPU memory (ucx)"
  [3a]="plugin-check ring over loopback, memory: device"
  [3b]="plugin-check halving_doubling over loopback, memory: device"
  [3c]="bench over loopback, memory: device" [4a]="nccl_test, 2-rank cases"
  [4b]="2 ranks over nccl against the CPU run"
  [4c]="plugin-check nccl, 2 ranks (barriers of zero-byte messages, the contract)")

# ---- --fetch: here, with Debian's archive --------------------------------------------------
contains() { local x=$1; shift; for y in "$@"; do [[ $x == "$y" ]] && return 0; done; return 1; }

fetch() {
  local tmp sandbox=() deb field group alt ok missing=()
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-debs.XXXXXX") || return 1
  [[ $(id -u) == 0 ]] && sandbox=(-o APT::Sandbox::User=root)
  if ! (cd "$tmp" && apt-get "${sandbox[@]}" download "${packages[@]}"); then
    rm -rf "$tmp"
    echo "gpu-check: apt-get download failed. HINT: apt-get update, then again" >&2
    return 1
  fi
  # The list is closed: every dependency of a fetched package is fetched or in not_fetched.
  for deb in "$tmp"/*.deb; do
    for field in Depends Pre-Depends; do
      while IFS= read -r group; do
        ok=0
        IFS='|' read -r -a alts <<<"$group"
        for alt in "${alts[@]}"; do
          alt=${alt%%(*}; alt=${alt// /}; alt=${alt%%:*}
          contains "$alt" "${packages[@]}" "${not_fetched[@]}" && ok=1
        done
        ((ok)) || missing+=("$(dpkg-deb -f "$deb" Package) needs ${group# }")
      done < <(dpkg-deb -f "$deb" "$field" | tr ',' '\n' | sed '/^ *$/d')
    done
  done
  if ((${#missing[@]})); then
    rm -rf "$tmp"
    printf 'gpu-check: not fetched and not in not_fetched: %s\n' "${missing[@]}" >&2
    return 1
  fi
  rm -rf "$debs_dir" && mv "$tmp" "$debs_dir" || return 1
  ls -l "$debs_dir"
  echo "gpu-check: $(find "$debs_dir" -name '*.deb' | wc -l) packages, $(du -sh "$debs_dir" | cut -f1), in $debs_dir"
}

# ---- results: one file per part, the summary rebuilt from them -----------------------------
elapsed() { echo $(($(date +%s) - start)); }
left() { echo $((budget - $(elapsed))); }

publish() {  # rewrites OUT/gpu-check.txt from the header and the parts so far (atomically)
  local tmp=$out/.gpu-check.txt.$BASHPID f
  {
    cat "$work/header.txt"
    echo
    cat "$work"/results/* 2>/dev/null
    for f in "$work"/details/*; do
      if [[ -s $f ]]; then printf '\n[%s] %s\n%s\n' "${f##*/}" "${title[${f##*/}]}" "$(cat "$f")"; fi
    done
  } >"$tmp" && mv -f "$tmp" "$out/gpu-check.txt"
}

info() { printf '%s\n' "$*" >>"$work/header.txt"; printf '# gpu-check: %s\n' "$*"; }

result() {  # result <part> PASS|FAIL|SKIPPED <what was checked>; a caller's $t0 adds its time
  local line
  line=$(printf '[%s] %-7s %s: %s%s' "$1" "$2" "${title[$1]}" "$3" "${t0:+ ($(($(date +%s) - t0)) s)}")
  printf '%s\n' "$line" >"$work/results/$1"
  printf '# gpu-check: %s\n' "$line"
  publish
}

details() { cat >>"$work/details/$1"; }  # details <part> < lines: shown under the results

# run_logged <seconds> <log> <command...>: the command under the smaller of that limit and
# what BUDGET leaves, its output in the log after the command line; exit status 124 on timeout.
run_logged() {
  local limit=$1 log=$2 room
  shift 2
  room=$(($(left) - 5))
  ((room < limit)) && limit=$room
  printf '$ %s\n' "$*" >"$log"
  if ((limit < 10)); then
    echo "gpu-check: not started: $(left) s of BUDGET=$budget s left" >>"$log"
    return 124
  fi
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
}

why() {  # why <rc> <log>: a short reason for a failed command
  if [[ $1 == 124 || $1 == 137 ]]; then
    grep -q "^gpu-check: not started" "$2" && echo "out of time (BUDGET=$budget s)" && return
    echo "timed out (log ${2#"$work"/})"
  else
    echo "exit $1: $(grep -m1 -E "error|FAIL|Error" "$2" | cut -c1-200) (log ${2#"$work"/})"
  fi
}

verdict() {  # verdict <part> <label> <helper args...>: the helper's verdict as the part's result
  local part=$1 label=$2 log=$work/logs/verdict-$1.txt rc status=FAIL
  shift 2
  "$python" "$here/scripts/gpu-check-verdict.py" "$@" >"$log" 2>&1
  rc=$?
  ((rc == 0)) && status=PASS
  local first; first=$(head -1 "$log")
  first=${first#PASS }
  tail -n +2 "$log" | sed 's/^    //' | details "$part"
  result "$part" "$status" "$label${label:+: }${first#FAIL }"
}

room() {  # room <part> <seconds>: is there that much of BUDGET left? If not, the part is SKIPPED
  (($(left) >= $2)) && return 0
  t0='' result "$1" SKIPPED "out of time: $(left) s of BUDGET=$budget s left, $2 s needed"
  return 1
}

finish() {  # EXIT: parts never reached are SKIPPED; the summary and the archive; the status
  local status=$? pid p fails
  for pid in $(jobs -pr); do kill "$pid" 2>/dev/null; done
  for p in "${parts[@]}"; do
    [[ -e $work/results/$p ]] || t0='' result "$p" SKIPPED "not reached: ${stop_reason:-the script stopped (exit $status)}"
  done
  fails=$(cat "$work"/results/* | grep -c '^\[..\] FAIL')
  printf '\n%s passed, %s failed, %s skipped in %s s (BUDGET %s s); logs: %s\n' \
    "$(cat "$work"/results/* | grep -c '^\[..\] PASS')" "$fails" \
    "$(cat "$work"/results/* | grep -c '^\[..\] SKIPPED')" "$(elapsed)" "$budget" \
    "gpu-check-logs.tar.gz" >>"$work/header.txt"
  publish
  cp "$out/gpu-check.txt" "$work/logs/gpu-check.txt"
  tar -czf "$out/gpu-check-logs.tar.gz" -C "$work" logs runs 2>/dev/null ||
    echo "gpu-check: could not write $out/gpu-check-logs.tar.gz" >&2
  echo "# gpu-check: summary $out/gpu-check.txt, logs $out/gpu-check-logs.tar.gz"
  ((fails == 0 && status == 0))
  exit $?
}

# ---- 0: the machine, the packages, the build -----------------------------------------------
probe_machine() {
  local t0; t0=$(date +%s)
  if ! command -v nvidia-smi >/dev/null; then
    result 0a FAIL "no nvidia-smi: this machine has no NVIDIA driver"
    stop_reason="no GPU"
    return 1
  fi
  nvidia-smi >"$work/logs/nvidia-smi.txt" 2>&1
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  gpu=${CUDA_VISIBLE_DEVICES:-0}
  gpu=${gpu%%,*}
  while IFS= read -r line; do info "GPU $line"; done < <(
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader)
  local torch
  torch=$("$python" -c '
import torch
print(torch.__version__, torch.utils.cmake_prefix_path, int(torch.compiled_with_cxx11_abi()),
      int(torch.cuda.is_available()), torch.version.cuda)' 2>"$work/logs/torch-probe.log")
  read -r torch_version torch_cmake torch_abi torch_cuda torch_cuda_version <<<"$torch"
  info "PyTorch ${torch_version:-?} (CUDA ${torch_cuda_version:-?}), CMake prefix ${torch_cmake:-?}; $(nproc) CPUs"
  if [[ ${torch_cuda:-0} != 1 ]]; then
    result 0a FAIL "PyTorch ${torch_version:-?} (${python}) sees no GPU (torch.cuda.is_available())"
    stop_reason="PyTorch sees no GPU"
    return 1
  fi
  if [[ $torch_abi != 1 ]]; then
    result 0a FAIL "PyTorch $torch_version uses the old C++ ABI; collie links Debian's libraries (new ABI). HINT: PyTorch 2.7 or later"
    stop_reason="PyTorch's C++ ABI"
    return 1
  fi
  cuda_root=${COLLIE_CUDA_ROOT:-/usr/local/cuda}
  nccl_root=$cuda_root
  if [[ ! -e $cuda_root/include/nccl.h ]]; then  # NCCL from PyTorch's own wheel
    nccl_root=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  fi
  if [[ -z $nccl_root || ! -e $nccl_root/include/nccl.h ]]; then
    result 0a FAIL "no nccl.h under $cuda_root/include nor in PyTorch's nvidia.nccl"
    stop_reason="no NCCL"
    return 1
  fi
  info "CUDA $cuda_root, NCCL $nccl_root"
  result 0a PASS "$gpus GPU(s), checks on GPU $gpu; PyTorch $torch_version with CUDA $torch_cuda_version; NCCL from $nccl_root"
}

unpack_debs() {  # Debian's packages under the work folder, their absolute paths pointed there
  if ! compgen -G "$debs_dir/*.deb" >/dev/null; then
    result 0b FAIL "no $debs_dir/*.deb. HINT: run scripts/gpu-check.sh --fetch where Debian's archive is reachable, and carry .gpu-debs"
    stop_reason="no Debian packages"
    return 1
  fi
  debs=$work/debs
  mkdir -p "$debs"
  local deb
  for deb in "$debs_dir"/*.deb; do dpkg-deb -x "$deb" "$debs" || return 1; done
  multiarch=$debs/usr/lib/x86_64-linux-gnu
  # Gloo's CMake targets and every .pc file name /usr; here they are under $debs/usr.
  sed -i "s|\"/usr/lib/|\"$debs/usr/lib/|g" "$debs"/usr/share/cmake/Gloo/GlooTargets-*.cmake
  find "$debs" -name '*.pc' -exec sed -i -E "s@^([a-z_]+ *= *)/usr@\1$debs/usr@" {} +
  export PKG_CONFIG_PATH=$multiarch/pkgconfig:$debs/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  # libnl-3 lives in /lib, Gloo in /usr/lib, the rest in /usr/lib/<arch>.
  export LD_LIBRARY_PATH=$multiarch:$debs/lib/x86_64-linux-gnu:$debs/usr/lib:$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  info "unpacked $(find "$debs_dir" -name '*.deb' | wc -l) Debian packages under $debs"
}

build_collie() {
  local t0 generator=Ninja args targets rc
  t0=$(date +%s)
  command -v ninja >/dev/null || generator="Unix Makefiles"
  args=(-S "$here" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release
        -DCMAKE_PREFIX_PATH="$debs/usr;$torch_cmake" -DCMAKE_INCLUDE_PATH="$debs/usr/include"
        -DCMAKE_LIBRARY_PATH="$multiarch;$debs/usr/lib" -DCOLLIE_CUDA_ROOT="$cuda_root"
        -DCOLLIE_NCCL_ROOT="$nccl_root" -DCOLLIE_WITH_NCCL=ON -DCOLLIE_WITH_GLOO=ON
        -DCOLLIE_WITH_UCX=ON -DCOLLIE_WITH_SIMGRID=OFF -DCOLLIE_BUILD_BENCHMARKS=OFF
        -DPKG_CONFIG_EXECUTABLE="$debs/usr/bin/pkgconf")
  # The tests look for Debian's python3 in /usr/bin; without one, this one.
  [[ -x /usr/bin/python3 ]] || args+=(-DCOLLIE_DEBIAN_PYTHON="$(command -v "$python")")
  run_logged 120 "$work/logs/configure.log" cmake "${args[@]}"
  rc=$?
  if ((rc != 0)); then
    tail -30 "$work/logs/configure.log" | details 0b
    result 0b FAIL "cmake: $(why $rc "$work/logs/configure.log")"
    stop_reason="the build failed"
    return 1
  fi
  grep -E "^-- collie: " "$work/logs/configure.log" | sed 's/^-- //' | details 0b
  grep -E "^(Gloo_DIR|pkgcfg_lib_UCX_ucp|COLLIE_NCCL_LIBRARY):" "$build/CMakeCache.txt" | details 0b
  targets=(collie collie_backend_loopback collie_backend_nccl collie_backend_gloo
           collie_backend_ucx collie_model_gpt collie_model_mlp collie_scheduler_ring
           collie_scheduler_native collie_scheduler_tree collie_scheduler_halving_doubling
           nccl_tuner_collie nccl_test device_test trainer_test)
  run_logged 240 "$work/logs/build.log" "${build_pin[@]}" cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  rc=$?
  if ((rc != 0)); then
    grep -E "error" "$work/logs/build.log" | head -20 | details 0b
    result 0b FAIL "cmake --build: $(why $rc "$work/logs/build.log")"
    stop_reason="the build failed"
    return 1
  fi
  result 0b PASS "nccl, gloo, ucx and loopback backends against $(grep -o 'LibTorch [^ ]* from [^ ]*' "$work/logs/configure.log" | head -1), $jobs jobs"
}

# ---- 1: nccl, one rank ---------------------------------------------------------------------
gtest_summary() {  # "N passed, M skipped (names), K failed (names)" from a GoogleTest log
  awk '/\([0-9]+ ms\)$/ && /^\[ +(OK|SKIPPED|FAILED) +\] / {
         s = $2; n = $4; if (s == "OK") ok++; else if (s == "SKIPPED") sk = sk " " n; else f = f " " n }
       END { printf "%d passed", ok
             if (sk != "") { c = split(substr(sk, 2), a, " "); printf ", %d skipped (%s)", c, substr(sk, 2) }
             if (f != "") { c = split(substr(f, 2), a, " "); printf ", %d FAILED (%s)", c, substr(f, 2) } }' "$1"
}

gtest_part() {  # gtest_part <part> <visible GPUs> <binary> [args...]
  local part=$1 visible=$2 bin=$3 t0 rc nogpu log=$work/logs/$3.log
  shift 3
  room "$part" 15 || return
  t0=$(date +%s)
  run_logged 150 "$log" env CUDA_VISIBLE_DEVICES="$visible" "$build/bin/$bin" "$@"
  rc=$?
  nogpu=$(grep -A1 ': Skipped$' "$log" | grep -m1 '^no GPU')
  if ((rc == 0)) && [[ -z $nogpu ]] && grep -qE '^\[ +OK +\] ' "$log"; then
    result "$part" PASS "$(gtest_summary "$log")"
  elif ((rc == 0)); then
    result "$part" FAIL "$(gtest_summary "$log"); ${nogpu:-no case passed} (log ${log#"$work"/})"
  else
    result "$part" FAIL "$(gtest_summary "$log"); $(why $rc "$log")"
  fi
}

bench_part() {  # bench_part <part> <name> <yaml> [collie run args]: wrong elements must be 0
  local part=$1 name=$2 yaml=$3 t0 rc log=$work/logs/$2.txt
  shift 3
  room "$part" 15 || return
  t0=$(date +%s)
  run_logged 120 "$log" env CUDA_VISIBLE_DEVICES="$gpu" "$collie" run "$yaml" --out "$work/runs/$name" "$@"
  rc=$?
  # The header of each run, its largest sizes, the average bus bandwidth and the verdict.
  awk '/^# (collective|Avg bus|Wrong)/ || ($1 ~ /^[0-9]+$/ && $1 >= 16777216)' "$log" | details "$part"
  if ((rc == 0)) && grep -q "^# Wrong elements: 0 (all results correct)" "$log"; then
    result "$part" PASS "$(grep -c '^ \+[0-9]\+ ' "$log") measurements (sizes x schedulers x runs), wrong elements 0"
  else
    result "$part" FAIL "$(grep -m1 '^# Wrong elements' "$log" || why $rc "$log")"
  fi
}

write_configs() {  # the bench files, kept with the logs
  cat >"$work/logs/bench-nccl.yaml" <<'EOF'
name: gpu-check-nccl
description: native (NCCL's own) and ring all-reduce over nccl, one rank, device buffers
launch: {nproc_per_node: 1}
backend: {plugin: nccl}
bench: {collective: allreduce, schedulers: [native, ring], dtype: f32, op: sum,
        min_bytes: 4KiB, max_bytes: 64MiB, step_factor: 16, warmup_iters: 2, iters: 5,
        calibrate: false, plots: false}
EOF
  cat >"$work/logs/bench-loopback-device.yaml" <<'EOF'
name: gpu-check-loopback-device
description: ring and halving_doubling over loopback ranks (threads) sharing one GPU, device buffers
launch: {nproc_per_node: 2}
backend: {plugin: loopback, params: {memory: device, timeout: 60s}}
bench: {collective: allreduce, schedulers: [ring, halving_doubling], dtype: f32, op: sum,
        min_bytes: 4KiB, max_bytes: 64MiB, step_factor: 16, warmup_iters: 2, iters: 5,
        calibrate: false, plots: false}
matrix:
  launch.nproc_per_node: [2, 3]
EOF
}

peer_args=(--layers 16 --d-model 768 --heads 12 --seq-len 2048 --vocab 16384 --mlp-ratio 3
           --device cuda --bf16 --checkpointing)

start_peer() {  # PyTorch eager on the GPU, during the build when CPUs can be kept for it
  peer_log=$work/logs/pytorch-eager.log
  rm -f "$work/peer.rc"
  (
    run_logged 200 "$peer_log" env LD_LIBRARY_PATH="$ld_library_path_before" \
      CUDA_VISIBLE_DEVICES="$gpu" PYTHONUNBUFFERED=1 "${peer_pin[@]}" "$python" \
      "$here/benchmarks/ddp_gpt.py" "${peer_args[@]}" --micro-batch "$micro_batch" --steps "$steps"
    echo $? >"$work/peer.rc"
  ) &
  peer_pid=$!
}

part_108m() {  # alone on the GPU: its tokens/s are the comparison
  local t0 rc log=$work/logs/collie-108m.txt
  room 1e 40 || return
  t0=$(date +%s)
  run_logged 150 "$log" env CUDA_VISIBLE_DEVICES="$gpu" "$collie" run \
    "$here/configs/micro-pllm-108m.yaml" --out "$work/runs/micro-pllm-108m" \
    --set launch.nproc_per_node=1 --set backend=nccl --set train.scheduler=native \
    --set train.device=cuda --set train.precision=bf16 --set train.grad_checkpointing=true \
    --set train.micro_batch="$micro_batch" --set train.steps="$steps" \
    --set train.checkpoint_every=0 --set train.checkpoint_dir="$work/runs/108m-checkpoints"
  rc=$?
  wait "$peer_pid" 2>/dev/null
  grep -E "^# (device|Training)|^  micro-pllm" "$log" | details 1e
  [[ -n ${peer_pin[*]} ]] && echo "PyTorch eager ran during the build, on CPUs ${peer_pin[2]} kept free of it" | details 1e
  if ((rc != 0)); then
    result 1e FAIL "collie run: $(why $rc "$log")"
  elif [[ $(cat "$work/peer.rc" 2>/dev/null) != 0 ]]; then
    result 1e FAIL "PyTorch eager peer: $(why "$(cat "$work/peer.rc" 2>/dev/null || echo 1)" "$peer_log")"
  else
    verdict 1e "" throughput "$work/runs/micro-pllm-108m/summary.json" "$peer_log" --steps "$steps"
  fi
}

part_tuner() {  # 1f: NCCL loads collie's tuner and reads the policy it is given
  local rc log=$work/logs/bench-nccl-tuner.txt policy=$work/logs/nccl-tuner.policy
  room 1f 10 || return
  printf '# ring for every size on one rank\nallreduce 1 0 ring\n' >"$policy"
  run_logged 120 "$log" env CUDA_VISIBLE_DEVICES="$gpu" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL \
    NCCL_TUNER_PLUGIN="$build/lib/libnccl-tuner-collie.so" COLLIE_NCCL_POLICY="$policy" \
    "$collie" run "$work/logs/bench-nccl.yaml" --out "$work/runs/bench-nccl-tuner" \
    --set 'bench.schedulers=[native]'
  rc=$?
  grep -E "collie tuner: |TUNER/Plugin" "$log" | head -5 | details 1f
  if ((rc != 0)); then
    result 1f FAIL "collie run: $(why $rc "$log")"
  elif grep -q "collie tuner: 1 size range" "$log"; then
    result 1f PASS "NCCL loaded the tuner, which read the policy: $(grep -m1 'collie tuner: ' "$log")"
  else
    result 1f FAIL "NCCL_DEBUG=INFO shows no line of collie's tuner (see $log)"
  fi
}

lane_nccl() {  # 1a-1d, 1f
  gtest_part 1a "$gpu" nccl_test
  # The cases one GPU skips for want of a second; part 4a runs them on two.
  awk '/: Skipped$/ {getline msg} /^\[  SKIPPED \] .*\([0-9]+ ms\)$/ {if (msg ~ /^needs [0-9]+ GPUs/) print $4; msg = ""}' \
    "$work/logs/nccl_test.log" >"$work/nccl-skipped-1gpu.txt"
  gtest_part 1b "$gpu" device_test
  gtest_part 1c "$gpu" trainer_test --gtest_filter='GpuTraining.*'
  bench_part 1d bench-nccl "$work/logs/bench-nccl.yaml"
  part_tuner
}

# ---- 2: gloo and ucx, host-staged ----------------------------------------------------------
part_gloo_symbols() {  # 2a: does the gloo plugin get its Gloo from Debian's libgloo alone?
  local t0 plugin=$build/lib/collie/libcollie_backend_gloo.so resolved clash own foreign
  local dir=$work/logs/gloo-symbols
  room 2a 15 || return
  t0=$(date +%s)
  mkdir -p "$dir"
  if [[ ! -e $plugin ]]; then
    result 2a FAIL "no $plugin"
    return 1
  fi
  ldd "$plugin" >"$dir/ldd-plugin.txt" 2>&1
  resolved=$(awk '$1 == "libgloo.so.0" {print $3}' "$dir/ldd-plugin.txt")
  # What collie loads at its start (LibTorch among it) comes first in every symbol lookup.
  ldd "$collie" >"$dir/ldd-collie.txt" 2>&1
  local libs=()
  mapfile -t libs < <(awk -v own="$resolved" '{p = $2 == "=>" ? $3 : $1} p ~ /^\// && p != own {print p}' "$dir/ldd-collie.txt")
  nm -D --defined-only -A "${libs[@]}" 2>/dev/null |
    awk '$NF ~ /4gloo/ {sub(/:[0-9a-f]*$/, "", $1); print $NF, $1}' >"$dir/global-gloo.txt"
  { nm -D --defined-only "$resolved" | awk '$3 ~ /4gloo/ {print $3}'
    nm -D --undefined-only "$plugin" | awk '$2 ~ /4gloo/ {print $2}'; } 2>/dev/null | sort -u >"$dir/debian-gloo.txt"
  awk 'NR == FNR {want[$1] = 1; next} ($1 in want)' "$dir/debian-gloo.txt" "$dir/global-gloo.txt" >"$dir/clash.txt"
  clash=$(wc -l <"$dir/clash.txt")
  own=$(grep -cE '^_Z(N|NK|TV|TI|TS)N?4gloo' "$dir/global-gloo.txt")
  # At run time: the loader's bindings of gloo symbols while collie loads its plugins.
  LD_DEBUG=bindings LD_DEBUG_OUTPUT=$work/ld-bindings timeout 60 "$collie" plugins >"$dir/collie-plugins.txt" 2>&1
  cat "$work"/ld-bindings.* 2>/dev/null | grep '4gloo' |
    grep -E 'binding file [^ ]*(libgloo\.so\.0|libcollie_backend_gloo\.so) ' >"$dir/bindings.txt"
  rm -f "$work"/ld-bindings.*
  foreign=$(grep -cvE " to [^ ]*(/debs/usr/lib/libgloo\.so\.0|libcollie_backend_gloo\.so) " "$dir/bindings.txt")
  {
    echo "the plugin loads libgloo.so.0 from ${resolved:-nowhere}"
    echo "symbols naming gloo exported by what collie loads at start (LibTorch first):" \
         "$(wc -l <"$dir/global-gloo.txt"), $own of namespace gloo itself, in" \
         "$(cut -d' ' -f2 "$dir/global-gloo.txt" | sort -u | xargs -r -n1 basename | paste -sd' ')"
    echo "of them also defined by Debian's libgloo or needed by the plugin: $clash; e.g.:"
    head -3 "$dir/clash.txt" | cut -d' ' -f1 | c++filt | sed 's/^/  /'
    echo "run-time bindings of gloo symbols from the plugin or libgloo: $(wc -l <"$dir/bindings.txt"), $foreign to another library"
    grep -vE " to [^ ]*(/debs/usr/lib/libgloo\.so\.0|libcollie_backend_gloo\.so) " "$dir/bindings.txt" | head -3 | sed 's/^ *[0-9]*: */  /'
  } | details 2a
  if [[ $resolved != "$debs"/usr/lib/libgloo.so.0 ]]; then
    result 2a FAIL "the gloo plugin loads libgloo.so.0 from ${resolved:-nowhere}, not Debian's under $debs"
  elif ((clash > 0 || foreign > 0)); then
    result 2a SKIPPED "CLASH: what collie loads at start ($(cut -d' ' -f2 "$dir/clash.txt" | sort -u | xargs -r -n1 basename | paste -sd' ')) exports $clash gloo symbols that Debian's libgloo defines or the plugin needs, and $foreign run-time bindings of the plugin's or libgloo's gloo symbols went elsewhere than Debian's libgloo: symbol lookup finds those first, so the plugin would run PyTorch's Gloo (another version) built against Debian's headers. The gloo parts are skipped; see the details"
  else
    touch "$work/gloo-ok"
    result 2a PASS "the plugin resolves its gloo symbols from Debian's libgloo.so.0 ($debs): LibTorch exports $own symbols of namespace gloo ($(wc -l <"$dir/global-gloo.txt") naming it), none that Debian's Gloo defines or the plugin needs; $(wc -l <"$dir/bindings.txt") run-time bindings, all to Debian's"
  fi
}

part_staged() {  # part_staged <part> <backend>: 2 ranks on one GPU, host-staged, against the CPU
  local part=$1 backend=$2 t0 rc log=$work/logs/$2-staged.txt
  room "$part" 25 || return
  t0=$(date +%s)
  run_logged 120 "$log" env CUDA_VISIBLE_DEVICES="$gpu" "$collie" run "$here/configs/zero.yaml" \
    --out "$work/runs/$backend-staged" --set backend="$backend" --set train.steps=4 \
    --set 'matrix=[{train.device: cpu}, {train.device: cuda}, {train.device: cuda, train.sharding: parameters}]'
  rc=$?
  grep -E "^# Training|^  device=" "$log" | details "$part"
  if ((rc != 0)); then
    result "$part" FAIL "collie run: $(why $rc "$log")"
  else
    verdict "$part" "" devices "$work/runs/$backend-staged/summary.json" --expect host-staged \
      --loss-rtol "$loss_rtol" --weight-atol "$weight_atol"
  fi
}

lane_gloo() {  # 2a, 2b
  part_gloo_symbols
  if [[ -e $work/gloo-ok ]]; then
    part_staged 2b gloo
  else
    t0='' result 2b SKIPPED "Debian's Gloo and PyTorch's clash or the check failed (2a)"
  fi
}

sample_memory() {  # sample_memory <file>: the GPU's memory.used (MiB) every 0.2 s until killed
  while :; do
    nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader,nounits
    sleep 0.2
  done >>"$1" 2>/dev/null
}

part_zero_memory() {  # 2d, alone on the GPU: its memory readings are the GPU's
  local t0 sharding rc=0 sampler log
  room 2d 40 || return
  t0=$(date +%s)
  for sharding in none parameters; do
    log=$work/logs/zero-memory-$sharding.txt
    nvidia-smi -i "$gpu" --query-gpu=memory.used --format=csv,noheader,nounits >"$work/logs/zero-memory-$sharding.mib"
    sample_memory "$work/logs/zero-memory-$sharding.mib" &
    sampler=$!
    run_logged 90 "$log" env CUDA_VISIBLE_DEVICES="$gpu" "$collie" run "$here/configs/zero.yaml" \
      --out "$work/runs/zero-memory-$sharding" --set backend=ucx --set train.device=cuda \
      --set train.steps=3 --set train.micro_batch=4 --set 'matrix=[{}]' \
      --set train.sharding="$sharding" \
      --set 'model.params={layers: 8, d_model: 768, heads: 12, seq_len: 128, vocab: 4096}'
    rc=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    grep -E "state per rank|parameters gathered" "$log" | sed 's/^# //' | details 2d
    if ((rc != 0)); then
      result 2d FAIL "collie run, sharding $sharding: $(why $rc "$log")"
      return 1
    fi
  done
  verdict 2d "" zero-memory "$work/runs/zero-memory-none/summary.json" "$work/logs/zero-memory-none.mib" \
    "$work/runs/zero-memory-parameters/summary.json" "$work/logs/zero-memory-parameters.mib" --ranks 2
}

# ---- 3: schedulers' reductions on device memory --------------------------------------------
part_device_check() {  # part_device_check <part> <scheduler>
  local part=$1 scheduler=$2 t0 rc log=$work/logs/plugin-check-$2-device.txt verdict_line
  room "$part" 15 || return
  t0=$(date +%s)
  run_logged 120 "$log" env CUDA_VISIBLE_DEVICES="$gpu" "$collie" plugin-check "$scheduler" \
    --backend loopback --backend-param memory=device --worlds 2,3 --large-count 100003
  rc=$?
  verdict_line=$(grep -m1 -E "^(PASS|FAIL) scheduler" "$log")
  grep -E "^  (FAIL|declined)" "$log" | head -10 | details "$part"
  if ((rc == 0)) && grep -q "^plugin-check: PASS" "$log"; then
    result "$part" PASS "${verdict_line#PASS }, ranks as threads on GPU $gpu"
  else
    result "$part" FAIL "${verdict_line:-$(why $rc "$log")}"
  fi
}

lane_device() {  # 3a-3c
  part_device_check 3a ring
  part_device_check 3b halving_doubling
  bench_part 3c bench-loopback-device "$work/logs/bench-loopback-device.yaml"
}

# ---- 4: two GPUs ---------------------------------------------------------------------------
part_two_gpus() {
  local t0 rc two ref=ucx log=$work/logs/nccl-2gpu.txt skipped
  t0=$(date +%s)
  skipped=$(paste -sd' ' "$work/nccl-skipped-1gpu.txt" 2>/dev/null)
  if ((gpus < 2)); then
    t0='' result 4a SKIPPED "one GPU (nvidia-smi -L lists $gpus): NCCL refuses two ranks of one communicator on one GPU; 1a skipped ${skipped:-them}"
    t0='' result 4b SKIPPED "one GPU (nvidia-smi -L lists $gpus): NCCL refuses two ranks on one GPU"
    t0='' result 4c SKIPPED "one GPU (nvidia-smi -L lists $gpus): NCCL refuses two ranks on one GPU"
    return 0
  fi
  two=$(nvidia-smi --query-gpu=index --format=csv,noheader | head -2 | paste -sd,)
  room 4a 30 || return
  run_logged 150 "$work/logs/nccl_test-2gpu.log" env CUDA_VISIBLE_DEVICES="$two" "$build/bin/nccl_test"
  rc=$?
  local now_passed=0 name
  for name in $skipped; do
    grep -qE "^\[ +OK +\] $name \(" "$work/logs/nccl_test-2gpu.log" && now_passed=$((now_passed + 1))
  done
  if ((rc == 0 && now_passed > 0)); then
    result 4a PASS "on GPUs $two, $now_passed case(s) one GPU skipped now pass; $(gtest_summary "$work/logs/nccl_test-2gpu.log")"
  else
    result 4a FAIL "on GPUs $two: $(gtest_summary "$work/logs/nccl_test-2gpu.log"); of the cases one GPU skipped, $now_passed passed; $(why $rc "$work/logs/nccl_test-2gpu.log")"
  fi
  room 4b 25 || return
  t0=$(date +%s)
  [[ -e $work/gloo-ok ]] && ref=gloo
  run_logged 120 "$log" env CUDA_VISIBLE_DEVICES="$two" "$collie" run "$here/configs/zero.yaml" \
    --out "$work/runs/nccl-2gpu" --set train.steps=4 \
    --set "matrix=[{backend: $ref, train.device: cpu}, {backend: nccl, train.device: cuda, train.scheduler: native}]"
  rc=$?
  grep -E "^# Training|^  backend=" "$log" | details 4b
  if ((rc != 0)); then
    result 4b FAIL "collie run: $(why $rc "$log")"
  else
    verdict 4b "CPU run over $ref" devices "$work/runs/nccl-2gpu/summary.json" --expect "device memory" \
      --loss-rtol "$loss_rtol" --weight-atol "$weight_atol"
  fi
  # The backend contract and the schedulers' matrix over nccl itself: ordered and zero-byte
  # messages (a zero-byte receive must wait for its sender: barriers are made of them).
  room 4c 25 || return
  t0=$(date +%s)
  log=$work/logs/plugin-check-nccl.txt
  run_logged 150 "$log" env CUDA_VISIBLE_DEVICES="$two" "$collie" plugin-check nccl --worlds 2 \
    --large-count 10007
  rc=$?
  grep -E "^(PASS|FAIL)|^  FAIL" "$log" | head -10 | details 4c
  if ((rc == 0)) && grep -q "^plugin-check: PASS" "$log"; then
    result 4c PASS "on GPUs $two: $(grep -c '^PASS' "$log") plugin-check verdict(s) PASS"
  else
    result 4c FAIL "on GPUs $two: $(why $rc "$log")"
  fi
}

# ---- the check -----------------------------------------------------------------------------
main() {
  if [[ ${1:-} == --fetch ]]; then
    fetch
    return
  fi
  start=$(date +%s)
  budget=${BUDGET:-290}
  steps=${STEPS:-6}
  micro_batch=${MICRO_BATCH:-8}
  python=${PYTHON:-python3}
  # GPU against CPU, fp32: the last loss within 1e-3 relative, sampled weights within 5e-3 (two
  # AdamW steps at zero.yaml's peak learning rate: an element whose gradient is at rounding
  # level may step the other way).
  loss_rtol=1e-3
  weight_atol=5e-3
  work=$here/runs/gpu-check-$(date +%Y%m%d-%H%M%S)
  out=${1:-${OUT:-$work}}
  mkdir -p "$out" "$work/logs" "$work/runs" "$work/results" "$work/details" || return 1
  out=$(cd "$out" && pwd) && cd "$here" || return 1
  build=$here/build-gpu
  collie=$build/bin/collie
  stop_reason=""
  : >"$work/header.txt"
  info "$(date -u '+%Y-%m-%d %H:%M UTC') on ${HOSTNAME:-?}; collie $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')"
  trap finish EXIT
  trap 'stop_reason="stopped by a signal"; exit 130' INT TERM
  unset COLLIE_EMULATED_DEVICE  # device memory here is the GPU's
  export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA's GPU numbers are nvidia-smi's
  ld_library_path_before=${LD_LIBRARY_PATH:-}

  probe_machine || return 1
  unpack_debs || return 1
  write_configs
  # PyTorch eager needs the GPU but no build: it runs during the build on two CPUs kept for it.
  local cpus; cpus=$(nproc)
  jobs=${JOBS:-$cpus}
  peer_pin=() build_pin=()
  if command -v taskset >/dev/null && ((cpus >= 8)); then
    local peer_cpus=0,1
    peer_pin=(taskset -c "$peer_cpus")
    build_pin=(taskset -c "2-$((cpus - 1))")
    jobs=${JOBS:-$((cpus - 2))}
    start_peer
  fi
  build_collie || return 1
  if [[ -z ${peer_pin[*]} ]]; then
    start_peer
    wait "$peer_pid"
  fi

  part_108m
  # Parts that check results, not speed or memory, share the GPU: four lanes at once.
  lane_nccl &
  lane_gloo &
  part_staged 2c ucx &
  lane_device &
  wait
  part_zero_memory
  part_two_gpus
  stop_reason="out of time (BUDGET=$budget s)"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
