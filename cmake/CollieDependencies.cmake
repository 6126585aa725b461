# Third-party dependencies of the core, all from Debian packages (scripts/setup.sh).
find_package(Threads REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(CLI11 CONFIG QUIET)
find_package(nlohmann_json 3 REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_path(COLLIE_XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(COLLIE_XXHASH_LIBRARY xxhash REQUIRED)
add_library(collie_xxhash INTERFACE)
target_include_directories(collie_xxhash SYSTEM INTERFACE "${COLLIE_XXHASH_INCLUDE_DIR}")
target_link_libraries(collie_xxhash INTERFACE "${COLLIE_XXHASH_LIBRARY}")

# LibTorch: only the core's reduction and bench code include its headers. Any LibTorch
# builds collie: Debian's (1.13, CPU only; the default) or the one inside a PyTorch, found
# with -DCMAKE_PREFIX_PATH=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
# (LibTorch 2.x, with CUDA on a GPU machine; docs/running.md "GPUs"). TorchConfig is read for
# its version, C++ ABI and place only: linking its libraries directly avoids its CUDA probing.
find_package(Torch QUIET CONFIG)
set(_collie_torch_root "")
if(Torch_DIR)
  # <torch>/share/cmake/Torch in a PyTorch, /usr/lib/<arch>/cmake/Torch on Debian.
  get_filename_component(_collie_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
endif()
find_path(COLLIE_TORCH_INCLUDE_DIR ATen/core/Tensor.h
  HINTS "${_collie_torch_root}/include" PATHS /usr/include REQUIRED)
find_library(COLLIE_TORCH_CPU_LIBRARY torch_cpu HINTS "${_collie_torch_root}/lib" REQUIRED)
find_library(COLLIE_C10_LIBRARY c10 HINTS "${_collie_torch_root}/lib" REQUIRED)
# A LibTorch with CUDA: its CUDA half registers itself with LibTorch when it is loaded, and
# nothing of collie calls it by name, so it is linked with --no-as-needed (else the linker
# would drop it and LibTorch would see no GPU).
find_library(COLLIE_TORCH_CUDA_LIBRARY torch_cuda HINTS "${_collie_torch_root}/lib")
find_library(COLLIE_C10_CUDA_LIBRARY c10_cuda HINTS "${_collie_torch_root}/lib")
if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "LibTorch at ${_collie_torch_root} was built with the old C++ ABI "
    "(_GLIBCXX_USE_CXX11_ABI=0), and collie links Debian's libraries (yaml-cpp, spdlog, fmt, "
    "Boost), which use the new one. HINT: use a PyTorch of 2.7 or later (its wheels use the new "
    "ABI) or LibTorch's cxx11-ABI archive")
endif()
if(Torch_VERSION)
  set(COLLIE_TORCH_VERSION "${Torch_VERSION}")
else()
  set(COLLIE_TORCH_VERSION "unknown")
endif()
set(COLLIE_TORCH_CUDA 0)
add_library(collie_torch INTERFACE)
target_include_directories(collie_torch SYSTEM INTERFACE "${COLLIE_TORCH_INCLUDE_DIR}")
target_link_libraries(collie_torch INTERFACE "${COLLIE_TORCH_CPU_LIBRARY}" "${COLLIE_C10_LIBRARY}")
if(COLLIE_TORCH_CUDA_LIBRARY AND COLLIE_C10_CUDA_LIBRARY)
  # The plugin fingerprint records it: a plugin built against the CPU-only LibTorch of the
  # same version is another build.
  string(APPEND COLLIE_TORCH_VERSION "+cuda")
  set(COLLIE_TORCH_CUDA 1)
  target_link_libraries(collie_torch INTERFACE -Wl,--no-as-needed "${COLLIE_TORCH_CUDA_LIBRARY}"
                        "${COLLIE_C10_CUDA_LIBRARY}" -Wl,--as-needed)
endif()
message(STATUS "collie: LibTorch ${COLLIE_TORCH_VERSION} from ${COLLIE_TORCH_INCLUDE_DIR}")

# LibTorch's C++ frontend (torch::nn, torch::optim): model plugins and the trainer only.
find_path(COLLIE_TORCH_API_INCLUDE_DIR torch/nn/module.h
  PATHS /usr/include/torch/csrc/api/include "${COLLIE_TORCH_INCLUDE_DIR}/torch/csrc/api/include"
  REQUIRED)
add_library(collie_torch_api INTERFACE)
target_include_directories(collie_torch_api SYSTEM INTERFACE "${COLLIE_TORCH_API_INCLUDE_DIR}")
target_link_libraries(collie_torch_api INTERFACE collie_torch)
