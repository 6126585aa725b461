// Finds, validates and instantiates plugins. A plugin named in a config that
// cannot be loaded is always a PluginError: there is no silent fallback.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/params.h"
#include "collie/scheduler.h"

namespace collie {

class Model;  // collie/model.h (LibTorch): only files that train include it
class Codec;  // collie/codec.h (LibTorch), likewise

enum class PluginKind { kBackend = 1, kScheduler = 2, kModel = 3, kCodec = 4 };
const char* pluginKindName(PluginKind kind);  // "backend", ...

// What a valid plugin's descriptor says, and where it was found.
struct PluginInfo {
  std::string path;
  PluginKind kind = PluginKind::kBackend;
  std::string name;
  std::string version;
  std::string description;
  int abi_major = 0;
  int abi_minor = 0;
  bool in_process = false;          // COLLIE_FLAG_IN_PROCESS: a backend whose ranks are threads
  bool runs_ranks = false;          // COLLIE_FLAG_RUNS_RANKS: it runs them itself (a simulator)
  bool device_memory_only = false;  // COLLIE_FLAG_DEVICE_MEMORY_ONLY (nccl)
};

// A file that looked like a plugin and was refused, with the one-line reason.
struct PluginRejection {
  std::string path;
  std::string reason;
};

class PluginLibrary;  // a loaded, validated .so; objects it created keep it alive

class PluginLoader {
 public:
  // Searches `dirs` in order. defaultSearchPath(): COLLIE_PLUGIN_PATH (colon-separated), then
  // the plugin folder beside the running libcollie_core (the build tree or the install
  // prefix), then the configured install prefix.
  explicit PluginLoader(std::vector<std::string> dirs = defaultSearchPath());
  static std::vector<std::string> defaultSearchPath();
  const std::vector<std::string>& searchPath() const { return dirs_; }

  struct Scan {
    std::vector<PluginInfo> found;
    std::vector<PluginRejection> rejected;
  };
  // Every libcollie_*.so in the search path, validated (descriptors only; no create()).
  Scan scan() const;

  // The file a bare name of `kind` resolves to along the search path ("" when there is
  // none); nothing is loaded.
  std::string find(PluginKind kind, const std::string& name) const;

  // Resolves a bare name ("ring": libcollie_scheduler_ring.so along the search path) or a
  // path (anything with '/') and validates it for `kind`. Throws PluginError.
  std::shared_ptr<PluginLibrary> open(PluginKind kind, const std::string& name_or_path) const;

  // open() + create(). `params` keys the plugin did not read are rejected with a
  // "did you mean". Throws PluginError (or ConfigError for bad params).
  std::shared_ptr<Backend> createBackend(const std::string& name, Params& params,
                                         const BackendContext& context) const;
  std::shared_ptr<Scheduler> createScheduler(const std::string& name, Params& params) const;
  std::shared_ptr<Model> createModel(const std::string& name, Params& params) const;
  std::shared_ptr<Codec> createCodec(const std::string& name, Params& params) const;
  // For a backend with COLLIE_FLAG_RUNS_RANKS: its run_ranks with `params` (a copy of the
  // backend's: each rank's createBackend reads and checks them again) and `context`.
  // Throws PluginError (or ConfigError for what the runner refused in its params).
  void runRanks(const std::string& name, Params params, const BackendContext& context, int world,
                const std::function<void(int rank)>& body) const;

  // Every file this loader has opened so far, each once: plugin files (open(), also for the
  // schedulers plugins create from others) and the rules files plugins read through
  // read_rules. Paths as opened, sorted.
  std::vector<std::string> openedFiles() const;

 private:
  std::shared_ptr<PluginLibrary> resolve(PluginKind kind, const std::string& name_or_path) const;
  void remember(const std::string& path) const;

  std::vector<std::string> dirs_;
  mutable std::mutex opened_mu_;
  mutable std::set<std::string> opened_;
};

// Validates one file as a plugin of `kind` (or of any kind when `kind` is null) without
// calling into it. Throws PluginError with the one-line reason.
std::shared_ptr<PluginLibrary> openPluginFile(const std::string& path, const PluginKind* kind);
const PluginInfo& pluginInfo(const PluginLibrary& library);

}  // namespace collie
