#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, CUDA and a PyTorch with CUDA, and no
# internet, builds collie against that PyTorch's LibTorch, runs the GPU tests, trains
# configs/micro-pllm-108m.yaml on one GPU for a few steps (bf16 autocast, activation
# checkpointing, the nccl backend under the trainer) and the same model in PyTorch eager on
# the same GPU, and prints both tokens/s side by side. About 5 minutes on a large GPU.
#
#   scripts/gpu-check.sh --fetch   here, with Debian's archive: downloads the Debian packages
#                                  collie builds with (listed below) into .gpu-debs/ (ignored
#                                  by git; carry it to the GPU machine with the tree)
#   scripts/gpu-check.sh [OUT]     there: everything above; logs and results under OUT
#                                  (default $OUT, else runs/gpu-check-<time>)
#
# The packages are unpacked under OUT/debs, never into /, and found through CMAKE_PREFIX_PATH.
# Environment: STEPS (default 6), MICRO_BATCH (sequences of 2,048 tokens per step, default 8),
# JOBS (build jobs, default the CPU count).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
debs_dir=$here/.gpu-debs
# What collie's build needs from Debian beyond a compiler, CMake, CUDA and PyTorch.
packages=(libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
          libcli11-dev nlohmann-json3-dev libboost1.74-dev libxxhash-dev libxxhash0
          libgtest-dev googletest)

if [[ ${1:-} == --fetch ]]; then
  mkdir -p "$debs_dir"
  (cd "$debs_dir" && apt-get download "${packages[@]}")
  ls -l "$debs_dir"
  exit 0
fi

out=${1:-${OUT:-$here/runs/gpu-check-$(date +%Y%m%d-%H%M%S)}}
mkdir -p "$out"
steps=${STEPS:-6}
micro_batch=${MICRO_BATCH:-8}
jobs=${JOBS:-$(nproc)}
python=${PYTHON:-python3}
say() { printf '# gpu-check: %s\n' "$*" | tee -a "$out/gpu-check.txt"; }
fail() { say "FAILED: $*"; exit 1; }

# ---- what this machine has ---------------------------------------------------------------
command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this machine has no NVIDIA driver"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader |
  sed 's/^/# gpu-check: GPU /' | tee -a "$out/gpu-check.txt"
read -r torch_version torch_cmake torch_abi torch_cuda < <("$python" -c '
import torch
print(torch.__version__, torch.utils.cmake_prefix_path, int(torch.compiled_with_cxx11_abi()),
      int(torch.cuda.is_available()))')
say "PyTorch $torch_version, CMake prefix $torch_cmake"
[[ $torch_cuda == 1 ]] || fail "PyTorch $torch_version sees no GPU (torch.cuda.is_available())"
[[ $torch_abi == 1 ]] || fail "PyTorch $torch_version uses the old C++ ABI; collie links Debian's libraries (new ABI). HINT: PyTorch 2.7 or later"
cuda_root=${COLLIE_CUDA_ROOT:-/usr/local/cuda}
nccl_root=$cuda_root
if [[ ! -e $cuda_root/include/nccl.h ]]; then  # NCCL from PyTorch's own wheel
  nccl_root=$("$python" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))')
fi
say "CUDA $cuda_root, NCCL $nccl_root"

# ---- the Debian packages, unpacked beside the results ------------------------------------
compgen -G "$debs_dir/*.deb" >/dev/null ||
  fail "no $debs_dir/*.deb. HINT: run scripts/gpu-check.sh --fetch where Debian's archive is reachable, and carry .gpu-debs"
debs=$out/debs
rm -rf "$debs" && mkdir -p "$debs"
for deb in "$debs_dir"/*.deb; do dpkg-deb -x "$deb" "$debs"; done
say "unpacked $(ls "$debs_dir"/*.deb | wc -l) packages under $debs"
multiarch=$debs/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$multiarch:$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# ---- build against PyTorch's LibTorch ----------------------------------------------------
build=$here/build-gpu
start=$SECONDS
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_cmake;$debs/usr" -DCMAKE_INCLUDE_PATH="$debs/usr/include" \
  -DCMAKE_LIBRARY_PATH="$multiarch" -DCOLLIE_CUDA_ROOT="$cuda_root" \
  -DCOLLIE_NCCL_ROOT="$nccl_root" -DCOLLIE_WITH_NCCL=ON -DCOLLIE_WITH_GLOO=OFF \
  -DCOLLIE_WITH_UCX=OFF -DCOLLIE_WITH_SIMGRID=OFF -DCOLLIE_BUILD_BENCHMARKS=OFF \
  >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; fail "cmake (log: $out/configure.log)"; }
grep -E "collie: LibTorch" "$out/configure.log" | sed 's/^-- /# gpu-check: /' | tee -a "$out/gpu-check.txt"
targets=(collie collie_backend_loopback collie_backend_nccl collie_model_gpt collie_model_mlp
         collie_scheduler_ring collie_scheduler_native collie_scheduler_tree nccl_test device_test
         trainer_test)
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head -20; fail "build (log: $out/build.log)"; }
say "built in $((SECONDS - start)) s"

# ---- the GPU tests -----------------------------------------------------------------------
for t in nccl_test device_test "trainer_test --gtest_filter=GpuTraining.*"; do
  read -r -a test <<<"$t"
  "$build/bin/${test[0]}" "${test[@]:1}" 2>&1 | tee "$out/${test[0]}.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[ +(OK|FAILED|SKIPPED) \]" |
    sed 's/^/# gpu-check: /' | tee -a "$out/gpu-check.txt"
  [[ ${PIPESTATUS[0]} == 0 ]] || fail "$t (log: $out/${test[0]}.log)"
done

# ---- collie and PyTorch eager on the same GPU, the same model ----------------------------
model=(--layers 16 --d-model 768 --heads 12 --seq-len 2048 --vocab 16384 --mlp-ratio 3)
"$build/bin/collie" run "$here/configs/micro-pllm-108m.yaml" --out "$out/collie" \
  --set launch.nproc_per_node=1 --set backend=nccl --set train.scheduler=native \
  --set train.device=cuda --set train.precision=bf16 --set train.grad_checkpointing=true \
  --set train.micro_batch="$micro_batch" --set train.steps="$steps" --set train.checkpoint_every=0 \
  >"$out/collie.txt" 2>&1 || { tail -20 "$out/collie.txt"; fail "collie run (log: $out/collie.txt)"; }
grep -E "^# (device|Training)|^  micro-pllm" "$out/collie.txt" | sed 's/^/# gpu-check: collie: /' |
  tee -a "$out/gpu-check.txt"
"$python" "$here/benchmarks/ddp_gpt.py" "${model[@]}" --device cuda --bf16 --checkpointing \
  --micro-batch "$micro_batch" --steps "$steps" >"$out/pytorch.json" 2>"$out/pytorch.log" ||
  { tail -20 "$out/pytorch.log"; fail "PyTorch eager peer (log: $out/pytorch.log)"; }

"$python" - "$out/collie/summary.json" "$out/pytorch.json" <<'PY' | tee -a "$out/gpu-check.txt"
import json, sys
collie = json.load(open(sys.argv[1]))[0]
peer = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
print(f"# gpu-check: 108M GPT, 1 GPU, bf16 + activation checkpointing, "
      f"{collie['world_batch_tokens']} tokens per step, {collie['timed_steps']} timed steps")
print(f"# gpu-check: {'':22}{'tokens/s':>12}{'step (s)':>10}{'loss first->last':>20}")
for name, r in (("collie (" + collie["comm_memory"] + ")", collie), ("PyTorch eager", peer)):
    print(f"# gpu-check: {name[:22]:22}{r['tokens_per_s']:>12,.0f}{r['step_s']:>10.3f}"
          f"{r['first_loss']:>10.3f} -> {r['last_loss']:.3f}")
print(f"# gpu-check: collie / PyTorch eager: {collie['tokens_per_s'] / peer['tokens_per_s']:.2f}x")
PY
say "done in $((SECONDS - start)) s; logs in $out"
