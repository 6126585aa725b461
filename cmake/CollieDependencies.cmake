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

# LibTorch: only the core's reduction and bench code include its headers. Linking the
# libraries directly avoids TorchConfig's CUDA probing on machines with a CUDA toolkit.
find_path(COLLIE_TORCH_INCLUDE_DIR ATen/core/Tensor.h PATHS /usr/include REQUIRED)
find_library(COLLIE_TORCH_CPU_LIBRARY torch_cpu REQUIRED)
find_library(COLLIE_C10_LIBRARY c10 REQUIRED)
find_package(Torch QUIET CONFIG)
if(Torch_VERSION)
  set(COLLIE_TORCH_VERSION "${Torch_VERSION}")
else()
  set(COLLIE_TORCH_VERSION "unknown")
endif()
add_library(collie_torch INTERFACE)
target_include_directories(collie_torch SYSTEM INTERFACE "${COLLIE_TORCH_INCLUDE_DIR}")
target_link_libraries(collie_torch INTERFACE "${COLLIE_TORCH_CPU_LIBRARY}" "${COLLIE_C10_LIBRARY}")

# LibTorch's C++ frontend (torch::nn, torch::optim): model plugins and the trainer only.
find_path(COLLIE_TORCH_API_INCLUDE_DIR torch/nn/module.h
  PATHS /usr/include/torch/csrc/api/include "${COLLIE_TORCH_INCLUDE_DIR}/torch/csrc/api/include"
  REQUIRED)
add_library(collie_torch_api INTERFACE)
target_include_directories(collie_torch_api SYSTEM INTERFACE "${COLLIE_TORCH_API_INCLUDE_DIR}")
target_link_libraries(collie_torch_api INTERFACE collie_torch)
