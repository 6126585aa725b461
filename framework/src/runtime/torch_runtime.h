// collie's LibTorch part, libcollie_torch.so: the trainer (the train experiment kind),
// tensors on devices, CUDA device memory and host staging. Nothing else in the application
// links LibTorch, so the commands and workers that only move bytes (a bench, plugin-check,
// the lab) start without loading it and its ~290 libraries (about a second per process).
// A process loads it the first time it needs one of these; a build whose LibTorch has CUDA
// loads it when the process starts, so that CUDA device memory is there before any buffer.
#pragma once

#include <memory>
#include <string>

#include "collie/plugin.h"

#include "runtime/run.h"
#include "runtime/staging.h"

namespace collie {

// What libcollie_torch.so hands the application (its entry point, kTorchRuntimeSymbol,
// returns it).
struct TorchRuntime {
  const char* build = nullptr;  // kTorchRuntimeBuild of the build that made it
  std::unique_ptr<ExperimentKind> (*train_kind)() = nullptr;
  std::unique_ptr<HostStaging> (*host_staging)() = nullptr;
  // "LibTorch 1.13.0 (CPU only)" / "LibTorch 2.11.0 with CUDA, 1 device": for messages.
  std::string (*describe)() = nullptr;
};

// Both sides' build: the module is refused when another compiler, C++ ABI, version of collie
// or LibTorch made it (the table passes C++ objects).
inline constexpr const char* kTorchRuntimeBuild = COLLIE_TORCH_FINGERPRINT;
inline constexpr const char* kTorchRuntimeSymbol = "collie_torch_runtime";

// The LibTorch part, loaded on the first call from beside libcollie_app.so. Throws
// PluginError naming the file and the loader's reason when it cannot be loaded (a build or
// an installation without it) or comes from another build; a later call tries again.
// Thread-safe.
const TorchRuntime& torchRuntime();

// The process's device memory, once, when it starts (before any device buffer exists):
// the emulated device when `setting` (COLLIE_EMULATED_DEVICE) is "1"; CUDA through LibTorch
// in a build whose LibTorch has CUDA (loading the LibTorch part: when it cannot be loaded,
// a warning, and no device memory); none otherwise. Throws ConfigError for any value but
// "", "0" and "1".
void installDeviceMemory(const char* setting);

}  // namespace collie
