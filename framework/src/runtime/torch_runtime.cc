// Loading collie's LibTorch part (runtime/torch_runtime.h).
#include "runtime/torch_runtime.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <string>

#include "collie/config.h"
#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/log.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {
namespace {

// The folder of the libcollie_app.so this process runs with: libcollie_torch.so is built and
// installed beside it.
fs::path besideAppLibrary() {
  const std::string app = detail::libraryOf(reinterpret_cast<const void*>(&torchRuntime));
  if (app.empty()) throw InternalError("cannot tell where libcollie_app.so is (dladdr failed)");
  return fs::path(app).parent_path();
}

const TorchRuntime* load() {
  const fs::path path = besideAppLibrary() / "libcollie_torch.so";
  // RTLD_GLOBAL: LibTorch's symbols for the model plugins loaded after it, as when the
  // executable linked LibTorch itself; RTLD_NOW: a missing symbol is this error, not a
  // "symbol lookup error" in the middle of a run.
  const DeviceMemoryOps before = deviceMemoryOps();  // its loading may install CUDA's
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    throw PluginError(fmt::format(
        "cannot load collie's LibTorch part {}: {}. HINT: build it (cmake --build build "
        "--target collie_torch_runtime) or reinstall collie",
        path.string(), dlerror()));
  }
  using Entry = const TorchRuntime* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kTorchRuntimeSymbol));
  const TorchRuntime* runtime = entry == nullptr ? nullptr : entry();
  if (runtime == nullptr || runtime->build == nullptr ||
      std::string(runtime->build) != kTorchRuntimeBuild) {
    setDeviceMemoryOps(before);  // nothing of a refused build's stays in use
    throw PluginError(fmt::format(
        "{} is not this build's LibTorch part (it says {}, collie is {}). HINT: rebuild collie",
        path.string(), runtime == nullptr || runtime->build == nullptr ? "nothing" : runtime->build,
        kTorchRuntimeBuild));
  }
  return runtime;  // never unloaded: LibTorch's state lives as long as the process
}

}  // namespace

const TorchRuntime& torchRuntime() {
  static const TorchRuntime* const runtime = load();  // tried again after a failure
  return *runtime;
}

void installDeviceMemory(const char* setting) {
  const std::string value = setting == nullptr ? "" : setting;
  if (value == "1") {
    if (deviceMemoryOps().owns == nullptr) setDeviceMemoryOps(emulatedDeviceOps());
    return;
  }
  if (!value.empty() && value != "0") {
    throw ConfigError(fmt::format(
        "COLLIE_EMULATED_DEVICE={}: expected 1 (on) or 0 (off). HINT: 1 stands an emulated "
        "device in for a GPU, for checking device-only paths without one (docs/running.md)",
        value));
  }
  if (!COLLIE_TORCH_CUDA) return;
  try {
    torchRuntime();  // installs CUDA's table as it loads
  } catch (const PluginError& e) {
    // What moves bytes still runs; a device buffer is refused by the core, naming why.
    logWarn(std::string("no CUDA device memory in this process: ") + e.what());
  }
}

}  // namespace collie
