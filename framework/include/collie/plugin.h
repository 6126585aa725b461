// The plugin ABI: every plugin .so exports exactly one C descriptor,
// `collie_plugin_v1`, which the loader validates before it calls any plugin code.
// Plugin authors use COLLIE_BACKEND_PLUGIN / COLLIE_SCHEDULER_PLUGIN and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <string>

#include "collie/backend.h"
#include "collie/config.h"
#include "collie/error.h"
#include "collie/params.h"
#include "collie/rules.h"
#include "collie/scheduler.h"

// "COLL" in ASCII: the first field of every descriptor.
#define COLLIE_PLUGIN_MAGIC 0x434F4C4Cu

#define COLLIE_STRINGIFY_DETAIL(x) #x
#define COLLIE_STRINGIFY(x) COLLIE_STRINGIFY_DETAIL(x)

#if defined(__clang__)
#define COLLIE_COMPILER_ID "clang-" __clang_version__
#elif defined(__GNUC__)
#define COLLIE_COMPILER_ID "gcc-" __VERSION__
#else
#define COLLIE_COMPILER_ID "unknown-compiler"
#endif

#ifdef _GLIBCXX_USE_CXX11_ABI
#define COLLIE_CXX11_ABI COLLIE_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#else
#define COLLIE_CXX11_ABI "none"
#endif

// Everything that must agree between the host and a plugin for C++ objects to cross the
// boundary safely: the compiler, its C++ ABI and collie. Backends and schedulers link no
// LibTorch, so its version is not theirs; model and codec plugins, which compute on
// LibTorch's tensors, add it (COLLIE_TORCH_FINGERPRINT). A plugin built elsewhere with
// another compiler, collie or (a model, a codec) LibTorch is rejected.
#define COLLIE_BUILD_FINGERPRINT \
  COLLIE_COMPILER_ID ";cxx11abi=" COLLIE_CXX11_ABI ";collie=" COLLIE_VERSION
#define COLLIE_TORCH_FINGERPRINT COLLIE_BUILD_FINGERPRINT ";torch=" COLLIE_TORCH_VERSION
// The fingerprint a plugin of `kind` carries.
#define COLLIE_FINGERPRINT_OF(KIND)                                                      \
  ((KIND) == COLLIE_KIND_MODEL || (KIND) == COLLIE_KIND_CODEC ? COLLIE_TORCH_FINGERPRINT \
                                                              : COLLIE_BUILD_FINGERPRINT)

#define COLLIE_EXPORT __attribute__((visibility("default")))

extern "C" {

enum collie_plugin_kind : uint32_t {
  COLLIE_KIND_BACKEND = 1,
  COLLIE_KIND_SCHEDULER = 2,
  COLLIE_KIND_MODEL = 3,
  COLLIE_KIND_CODEC = 4,  // ABI 11.1: collie/codec.h
};

// Return values of create().
enum collie_status : int32_t {
  COLLIE_OK = 0,
  COLLIE_BAD_PARAMS = 1,  // the params were wrong: a config error (exit 2)
  COLLIE_FAILED = 2,      // anything else the constructor threw
};

// The one exported symbol. All fields are plain data, readable without running plugin code.
struct collie_plugin_descriptor_v1 {
  uint32_t magic;           // COLLIE_PLUGIN_MAGIC
  uint16_t abi_major;       // must equal the host's COLLIE_ABI_MAJOR
  uint16_t abi_minor;       // must be <= the host's COLLIE_ABI_MINOR
  uint32_t kind;            // collie_plugin_kind
  const char* name;         // the name configs use: "ring"
  const char* version;      // the plugin's own version: "1.0.0"
  const char* description;  // one line for `collie plugins`
  const char* fingerprint;  // COLLIE_FINGERPRINT_OF(kind) as the plugin was compiled
  // Creates the plugin object from `context` (a collie::PluginContext). On success stores a
  // pointer to the kind's base class (collie::Backend, collie::Scheduler) in *object.
  // Never throws: failures return a status and a NUL-terminated message in `error`.
  int32_t (*create)(const void* context, void** object, char* error, size_t error_len) noexcept;
  // Destroys an object returned by create. Never throws.
  void (*destroy)(void* object) noexcept;
  uint32_t flags;  // COLLIE_FLAG_* bits
  // ABI 6.0, with COLLIE_FLAG_RUNS_RANKS (null otherwise): runs body(user, r) for every rank
  // r of a group of `world` where the backend's ranks live (a simulator: as its actors, in
  // simulated time), and returns when every body has returned. `context` is a
  // collie::PluginContext (the backend's params, job id and size). A body never throws; the
  // return value and `error` report what stopped the runner itself (a bad platform file).
  int32_t (*run_ranks)(const void* context, int32_t world, void (*body)(void* user, int32_t rank),
                       void* user, char* error, size_t error_len) noexcept;
};

// The backend runs every rank as a thread of one process (the loopback backend); without
// it, collie starts one process per rank.
#define COLLIE_FLAG_IN_PROCESS 1u
// With COLLIE_FLAG_IN_PROCESS: the backend runs its ranks itself (run_ranks); collie does
// not start a thread per rank.
#define COLLIE_FLAG_RUNS_RANKS 2u
// The backend moves device memory only, whatever its params (nccl): collie refuses a run
// whose tensors would live in host memory (train.device: cpu) before any rank starts.
#define COLLIE_FLAG_DEVICE_MEMORY_ONLY 4u

}  // extern "C"

namespace collie {

// Creates another scheduler by name or path, with its own params (for schedulers built from
// others, such as hierarchical and auto). Throws PluginError or ConfigError.
using SchedulerFactory =
    std::function<std::shared_ptr<Scheduler>(const std::string& plugin, Params& params)>;

// Reads and validates a rules file written by the bench (collie/rules.h). Throws
// ConfigError with file:line:col for anything malformed.
using RulesReader = std::function<RulesFile(const std::string& path)>;

// What create() receives. Backends read `backend`; every kind reads `params`; schedulers
// may create other schedulers through `make_scheduler` and read a rules file through
// `read_rules` (both valid only while create() runs).
struct PluginContext {
  Params* params = nullptr;
  BackendContext backend;
  SchedulerFactory make_scheduler;
  RulesReader read_rules;
};

namespace detail {

// Runs `body` and turns what it throws into a descriptor's status, the message copied into
// `error` (never more than error_len bytes, always terminated): ConfigError is
// COLLIE_BAD_PARAMS, any other exception COLLIE_FAILED.
template <typename Body>
int32_t statusOf(char* error, size_t error_len, Body&& body) noexcept {
  auto fail = [&](int32_t status, const char* what) {
    if (error_len > 0) {
      std::strncpy(error, what, error_len - 1);
      error[error_len - 1] = '\0';
    }
    return status;
  };
  try {
    body();
    return COLLIE_OK;
  } catch (const ConfigError& e) {
    return fail(COLLIE_BAD_PARAMS, e.what());
  } catch (const std::exception& e) {
    return fail(COLLIE_FAILED, e.what());
  } catch (...) {
    return fail(COLLIE_FAILED, "unknown exception");
  }
}

template <typename Base, typename Type>
int32_t createPlugin(const void* context, void** object, char* error, size_t error_len) noexcept {
  return statusOf(error, error_len, [&] {
    *object = static_cast<Base*>(new Type(*static_cast<const PluginContext*>(context)));
  });
}

template <typename Base>
void destroyPlugin(void* object) noexcept {
  delete static_cast<Base*>(object);
}

// run_ranks for a backend whose RUNNER is a function
// void RUNNER(const collie::PluginContext&, int world, const std::function<void(int)>& body).
template <void (*Runner)(const PluginContext&, int, const std::function<void(int)>&)>
int32_t runRanks(const void* context, int32_t world, void (*body)(void*, int32_t), void* user,
                 char* error, size_t error_len) noexcept {
  return statusOf(error, error_len, [&] {
    Runner(*static_cast<const PluginContext*>(context), world,
           [body, user](int rank) { body(user, rank); });
  });
}

}  // namespace detail
}  // namespace collie

#define COLLIE_DEFINE_PLUGIN_DETAIL(KIND, BASE, NAME, VERSION, DESCRIPTION, TYPE, FLAGS)       \
  COLLIE_DEFINE_PLUGIN_WITH_RUNNER_DETAIL(KIND, BASE, NAME, VERSION, DESCRIPTION, TYPE, FLAGS, \
                                          nullptr)

#define COLLIE_DEFINE_PLUGIN_WITH_RUNNER_DETAIL(KIND, BASE, NAME, VERSION, DESCRIPTION, TYPE, \
                                                FLAGS, RUN_RANKS)                             \
  extern "C" COLLIE_EXPORT const collie_plugin_descriptor_v1 collie_plugin_v1 = {             \
      COLLIE_PLUGIN_MAGIC,                                                                    \
      COLLIE_ABI_MAJOR,                                                                       \
      COLLIE_ABI_MINOR,                                                                       \
      KIND,                                                                                   \
      NAME,                                                                                   \
      VERSION,                                                                                \
      DESCRIPTION,                                                                            \
      COLLIE_FINGERPRINT_OF(KIND),                                                            \
      &::collie::detail::createPlugin<BASE, TYPE>,                                            \
      &::collie::detail::destroyPlugin<BASE>,                                                 \
      FLAGS,                                                                                  \
      RUN_RANKS,                                                                              \
  }

// TYPE derives from collie::Backend and has a constructor TYPE(const collie::PluginContext&).
#define COLLIE_BACKEND_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                                   \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_BACKEND, ::collie::Backend, NAME, VERSION, DESCRIPTION, \
                              TYPE, 0u)

// The same for a backend that moves device memory only (COLLIE_FLAG_DEVICE_MEMORY_ONLY).
#define COLLIE_DEVICE_BACKEND_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                            \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_BACKEND, ::collie::Backend, NAME, VERSION, DESCRIPTION, \
                              TYPE, COLLIE_FLAG_DEVICE_MEMORY_ONLY)

// The same for a backend whose ranks are threads of one process (COLLIE_FLAG_IN_PROCESS).
#define COLLIE_IN_PROCESS_BACKEND_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                        \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_BACKEND, ::collie::Backend, NAME, VERSION, DESCRIPTION, \
                              TYPE, COLLIE_FLAG_IN_PROCESS)

// The same for a backend that runs its ranks itself (a simulator, COLLIE_FLAG_RUNS_RANKS):
// RUNNER is a function void RUNNER(const collie::PluginContext&, int world,
// const std::function<void(int rank)>& body) that calls body(r) for every rank where the
// backend's ranks live; TYPE's constructor runs inside body, on the rank it is made for.
#define COLLIE_SIMULATED_BACKEND_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE, RUNNER) \
  COLLIE_DEFINE_PLUGIN_WITH_RUNNER_DETAIL(                                        \
      COLLIE_KIND_BACKEND, ::collie::Backend, NAME, VERSION, DESCRIPTION, TYPE,   \
      COLLIE_FLAG_IN_PROCESS | COLLIE_FLAG_RUNS_RANKS, &::collie::detail::runRanks<&RUNNER>)

// TYPE derives from collie::Scheduler and has a constructor TYPE(const collie::PluginContext&).
#define COLLIE_SCHEDULER_PLUGIN(NAME, VERSION, DESCRIPTION, TYPE)                        \
  COLLIE_DEFINE_PLUGIN_DETAIL(COLLIE_KIND_SCHEDULER, ::collie::Scheduler, NAME, VERSION, \
                              DESCRIPTION, TYPE, 0u)
