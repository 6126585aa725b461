// Plugin loading with Boost.DLL: inspect the ELF file, load it, check the descriptor, and
// only then call create().
#define BOOST_DLL_USE_STD_FS
#include "plugin/loader.h"

#include <fmt/format.h>

#include <dlfcn.h>

#include <algorithm>
#include <boost/dll/library_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "collie/error.h"
#include "collie/log.h"
#include "collie/plugin.h"
#include "config/rules.h"
#include "core/strings.h"
#include "util/system.h"

namespace fs = std::filesystem;

namespace collie {

class PluginLibrary {
 public:
  boost::dll::shared_library library;
  const collie_plugin_descriptor_v1* descriptor = nullptr;
  PluginInfo info;
};

const PluginInfo& pluginInfo(const PluginLibrary& library) { return library.info; }

namespace {

constexpr const char* kSymbol = "collie_plugin_v1";

[[noreturn]] void reject(const std::string& path, const std::string& what,
                         const std::string& hint) {
  throw PluginError("plugin " + path + ": " + what + (hint.empty() ? "" : ". HINT: " + hint));
}

std::string fileName(PluginKind kind, const std::string& name) {
  return std::string("libcollie_") + pluginKindName(kind) + "_" + name + ".so";
}

bool isElf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

// Checks the file itself, before the dynamic loader runs anything in it.
void inspectFile(const std::string& path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) reject(path, "no such file", "check the path or the name");
  if (!fs::is_regular_file(status)) reject(path, "not a regular file", "");
  if (!isElf(path)) {
    reject(path, "not a shared library (no ELF header)",
           "a plugin is a .so built with collie_add_plugin()");
  }
  std::vector<std::string> symbols;
  try {
    boost::dll::library_info info(fs::path(path), /*throw_if_not_native=*/true);
    symbols = info.symbols();
  } catch (const std::exception& e) {
    reject(path, std::string("unreadable ELF file (") + e.what() + ")", "");
  }
  if (std::find(symbols.begin(), symbols.end(), kSymbol) == symbols.end()) {
    reject(path, std::string("no '") + kSymbol + "' descriptor symbol exported",
           "define the plugin with COLLIE_BACKEND_PLUGIN or COLLIE_SCHEDULER_PLUGIN");
  }
}

std::string text(const char* field) { return field == nullptr ? "" : field; }

PluginKind checkKind(const std::string& path, uint32_t kind) {
  if (kind < 1 || kind > 4) {
    reject(path, fmt::format("descriptor kind {} is unknown (expected 1-4)", kind), "");
  }
  return static_cast<PluginKind>(kind);
}

// Validates the descriptor's plain-data fields; no plugin function is called.
PluginInfo validate(const std::string& path, const collie_plugin_descriptor_v1& d,
                    const PluginKind* expected_kind) {
  if (d.magic != COLLIE_PLUGIN_MAGIC) {
    std::ostringstream found;
    found << std::hex << "0x" << d.magic;
    reject(path, "bad descriptor magic: expected 0x434f4c4c, found " + found.str() + "; ignored",
           "the file exports collie_plugin_v1 but it is not a collie descriptor");
  }
  if (d.abi_major != COLLIE_ABI_MAJOR) {
    reject(path,
           fmt::format("plugin ABI {}.{} is not supported: this collie speaks ABI {}.{}; ignored",
                       d.abi_major, d.abi_minor, COLLIE_ABI_MAJOR, COLLIE_ABI_MINOR),
           "rebuild the plugin against this collie's headers");
  }
  if (d.abi_minor > COLLIE_ABI_MINOR) {
    reject(path,
           fmt::format("plugin needs ABI {}.{} but this collie provides only {}.{}; ignored",
                       d.abi_major, d.abi_minor, COLLIE_ABI_MAJOR, COLLIE_ABI_MINOR),
           "upgrade collie or rebuild the plugin against this collie");
  }
  PluginKind kind = checkKind(path, d.kind);
  if (expected_kind != nullptr && kind != *expected_kind) {
    reject(path,
           std::string("is a ") + pluginKindName(kind) + " plugin, but the slot needs a " +
               pluginKindName(*expected_kind),
           std::string("name a ") + pluginKindName(*expected_kind) +
               " here; `collie plugins` lists them");
  }
  const std::string fingerprint = COLLIE_FINGERPRINT_OF(d.kind);
  if (text(d.fingerprint) != fingerprint) {
    reject(path,
           "build fingerprint mismatch: expected '" + fingerprint + "', found '" +
               text(d.fingerprint) + "'",
           kind == PluginKind::kModel || kind == PluginKind::kCodec
               ? "rebuild the plugin with the same compiler, LibTorch and collie as the host"
               : "rebuild the plugin with the same compiler and collie as the host");
  }
  if (text(d.name).empty() || d.create == nullptr || d.destroy == nullptr) {
    reject(path, "descriptor has no name, create or destroy", "");
  }
  PluginInfo info;
  info.path = path;
  info.kind = kind;
  info.name = text(d.name);
  info.version = text(d.version);
  info.description = text(d.description);
  info.abi_major = d.abi_major;
  info.abi_minor = d.abi_minor;
  info.in_process = (d.flags & COLLIE_FLAG_IN_PROCESS) != 0;
  info.runs_ranks = info.in_process && (d.flags & COLLIE_FLAG_RUNS_RANKS) != 0;
  info.device_memory_only = (d.flags & COLLIE_FLAG_DEVICE_MEMORY_ONLY) != 0;
  if (info.runs_ranks && d.run_ranks == nullptr) {
    reject(path, "declares that it runs its ranks but has no run_ranks", "");
  }
  return info;
}

// Calls the plugin's create() and wraps the object so that it keeps its library loaded.
template <typename Base>
std::shared_ptr<Base> create(const std::shared_ptr<PluginLibrary>& library,
                             const PluginContext& context) {
  void* object = nullptr;
  char error[1024] = {};
  const auto& d = *library->descriptor;
  const PluginInfo& info = library->info;
  int32_t status = d.create(&context, &object, error, sizeof(error));
  if (status == COLLIE_BAD_PARAMS) throw ConfigError(error);
  if (status != COLLIE_OK || object == nullptr) {
    throw PluginError(std::string(pluginKindName(info.kind)) + " '" + info.name +
                      "' failed to start: " + (error[0] ? error : "create() returned no object") +
                      " (plugin " + info.path + ")");
  }
  auto destroy = d.destroy;
  return std::shared_ptr<Base>(static_cast<Base*>(object),
                               [library, destroy](Base* p) { destroy(p); });
}

void rejectUnreadParams(const Params& params, const PluginLibrary& library) {
  auto unread = params.unreadKeys();
  if (unread.empty()) return;
  // Every key the plugin asked for is a key it knows, set or not.
  std::vector<std::string> known(params.readKeys().begin(), params.readKeys().end());
  const std::string& key = unread.front();
  throw ConfigError(params.where(key) + params.owner() + ": unknown param '" + key + "'" +
                    detail::didYouMean(key, known) + "; " + pluginKindName(library.info.kind) +
                    " '" + library.info.name +
                    "' knows: " + (known.empty() ? "no params" : detail::join(known, ", ")));
}

// The folder `collie/` beside the libcollie_core.so this process runs with (found by a
// function of the core, since the loader itself is linked into the executable).
std::string besideCoreLibrary() {
  const std::string core = detail::libraryOf(reinterpret_cast<const void*>(&dtypeSize));
  return core.empty() ? "" : (fs::path(core).parent_path() / "collie").string();
}

}  // namespace

const char* pluginKindName(PluginKind kind) {
  switch (kind) {
    case PluginKind::kBackend:
      return "backend";
    case PluginKind::kScheduler:
      return "scheduler";
    case PluginKind::kModel:
      return "model";
    case PluginKind::kCodec:
      return "codec";
  }
  return "unknown";
}

std::shared_ptr<PluginLibrary> openPluginFile(const std::string& path, const PluginKind* kind) {
  inspectFile(path);
  auto library = std::make_shared<PluginLibrary>();
  try {
    library->library.load(fs::path(path),
                          boost::dll::load_mode::rtld_lazy | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    const char* why = dlerror();
    reject(path, std::string("cannot be loaded: ") + (why ? why : e.what()),
           "check its dependencies with ldd");
  }
  library->descriptor = &library->library.get<const collie_plugin_descriptor_v1>(kSymbol);
  library->info = validate(path, *library->descriptor, kind);
  return library;
}

PluginLoader::PluginLoader(std::vector<std::string> dirs) : dirs_(std::move(dirs)) {}

std::vector<std::string> PluginLoader::defaultSearchPath() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("COLLIE_PLUGIN_PATH")) {
    std::stringstream in(env);
    std::string dir;
    while (std::getline(in, dir, ':')) {
      if (!dir.empty()) dirs.push_back(dir);
    }
  }
  for (const std::string& dir : {besideCoreLibrary(), std::string(COLLIE_INSTALL_PLUGIN_DIR)}) {
    if (!dir.empty() && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) {
      dirs.push_back(dir);
    }
  }
  return dirs;
}

PluginLoader::Scan PluginLoader::scan() const {
  Scan result;
  std::vector<std::string> seen;
  for (const auto& dir : dirs_) {
    std::error_code ec;
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("libcollie_", 0) == 0 && entry.path().extension() == ".so") {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      try {
        result.found.push_back(openPluginFile(file, nullptr)->info);
      } catch (const PluginError& e) {
        result.rejected.push_back({file, e.what()});
      }
    }
  }
  return result;
}

std::shared_ptr<PluginLibrary> PluginLoader::open(PluginKind kind,
                                                  const std::string& name_or_path) const {
  auto library = resolve(kind, name_or_path);
  remember(library->info.path);
  return library;
}

void PluginLoader::remember(const std::string& path) const {
  std::lock_guard<std::mutex> lock(opened_mu_);
  opened_.insert(path);
}

std::vector<std::string> PluginLoader::openedFiles() const {
  std::lock_guard<std::mutex> lock(opened_mu_);
  return {opened_.begin(), opened_.end()};
}

std::string PluginLoader::find(PluginKind kind, const std::string& name) const {
  for (const auto& dir : dirs_) {
    fs::path candidate = fs::path(dir) / fileName(kind, name);
    std::error_code ec;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return "";
}

std::shared_ptr<PluginLibrary> PluginLoader::resolve(PluginKind kind,
                                                     const std::string& name_or_path) const {
  if (name_or_path.find('/') != std::string::npos) return openPluginFile(name_or_path, &kind);
  const std::string file = fileName(kind, name_or_path);
  if (const std::string candidate = find(kind, name_or_path); !candidate.empty()) {
    auto library = openPluginFile(candidate, &kind);
    if (library->info.name != name_or_path) {
      reject(
          candidate,
          "declares name '" + library->info.name + "' but was looked up as '" + name_or_path + "'",
          "the file name must be " + fileName(kind, library->info.name));
    }
    return library;
  }
  std::vector<std::string> known;
  for (const auto& info : scan().found) {
    if (info.kind == kind) known.push_back(info.name);
  }
  throw PluginError(std::string("no ") + pluginKindName(kind) + " plugin named '" + name_or_path +
                    "'" + detail::didYouMean(name_or_path, known) + "; looked for " + file +
                    " in: " + detail::join(dirs_, ", ") +
                    "; available: " + (known.empty() ? "none" : detail::join(known, ", ")) +
                    ". HINT: `collie plugins` lists every plugin found; set COLLIE_PLUGIN_PATH "
                    "to add a folder, or give a path; in collie's source tree "
                    "`scripts/build.sh collie_main` builds every plugin the build configured");
}

std::shared_ptr<Backend> PluginLoader::createBackend(const std::string& name, Params& params,
                                                     const BackendContext& context) const {
  auto library = open(PluginKind::kBackend, name);
  PluginContext plugin_context;
  plugin_context.params = &params;
  plugin_context.backend = context;
  auto backend = create<Backend>(library, plugin_context);
  rejectUnreadParams(params, *library);
  return backend;
}

void PluginLoader::runRanks(const std::string& name, Params params, const BackendContext& context,
                            int world, const std::function<void(int rank)>& body) const {
  auto library = open(PluginKind::kBackend, name);
  const auto& d = *library->descriptor;
  if (!library->info.runs_ranks) {
    throw PluginError("backend '" + library->info.name +
                      "' does not run its ranks itself (internal: the caller should start them)");
  }
  PluginContext plugin_context;
  plugin_context.params = &params;
  plugin_context.backend = context;
  struct Trampoline {
    static void call(void* user, int32_t rank) {
      (*static_cast<const std::function<void(int)>*>(user))(rank);
    }
  };
  char error[1024] = {};
  int32_t status = d.run_ranks(&plugin_context, world, &Trampoline::call,
                               const_cast<std::function<void(int)>*>(&body), error, sizeof(error));
  if (status == COLLIE_BAD_PARAMS) throw ConfigError(error);
  if (status != COLLIE_OK) {
    throw PluginError("backend '" + library->info.name +
                      "' could not run its ranks: " + (error[0] ? error : "run_ranks failed") +
                      " (plugin " + library->info.path + ")");
  }
}

std::shared_ptr<Scheduler> PluginLoader::createScheduler(const std::string& name,
                                                         Params& params) const {
  auto library = open(PluginKind::kScheduler, name);
  PluginContext plugin_context;
  plugin_context.params = &params;
  plugin_context.make_scheduler = [this](const std::string& plugin, Params& child) {
    return createScheduler(plugin, child);
  };
  plugin_context.read_rules = [this](const std::string& path) {
    remember(path);
    return config::readRulesFile(path);
  };
  auto scheduler = create<Scheduler>(library, plugin_context);
  rejectUnreadParams(params, *library);
  return scheduler;
}

namespace {
// A plugin whose create() reads only its params (a model, a codec).
template <typename Base>
std::shared_ptr<Base> createFromParams(const PluginLoader& loader, PluginKind kind,
                                       const std::string& name, Params& params) {
  auto library = loader.open(kind, name);
  PluginContext plugin_context;
  plugin_context.params = &params;
  auto object = create<Base>(library, plugin_context);
  rejectUnreadParams(params, *library);
  return object;
}
}  // namespace

std::shared_ptr<Model> PluginLoader::createModel(const std::string& name, Params& params) const {
  return createFromParams<Model>(*this, PluginKind::kModel, name, params);
}

std::shared_ptr<Codec> PluginLoader::createCodec(const std::string& name, Params& params) const {
  return createFromParams<Codec>(*this, PluginKind::kCodec, name, params);
}

}  // namespace collie
