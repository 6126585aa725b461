// One source, many deliberately broken plugins: each BROKEN_* define breaks the descriptor
// in one way the loader must catch before (or while) calling into the plugin.
#include "collie/plugin.h"

namespace {

// A working scheduler body, so that only the descriptor is at fault.
class EchoScheduler : public collie::Scheduler {
 public:
  explicit EchoScheduler(const collie::PluginContext& context) {
#ifdef BROKEN_CREATE_THROWS
    throw std::runtime_error("deliberate failure in the constructor");
#endif
    context.params->getInt("knob", 1, 0, 10);
  }
  collie::Decision accepts(const collie::CollectiveArgs&, const collie::Topology&) const override {
    return collie::Decision::no("test plugin");
  }
  void run(const collie::CollectiveArgs&, collie::Backend&, const collie::Topology&) override {}
};

}  // namespace

#ifndef BROKEN_NO_SYMBOL

#if defined(BROKEN_BAD_MAGIC)
#define MAGIC 0xDEADBEEFu
#else
#define MAGIC COLLIE_PLUGIN_MAGIC
#endif

#if defined(BROKEN_WRONG_MAJOR)
#define MAJOR (COLLIE_ABI_MAJOR + 1)
#else
#define MAJOR COLLIE_ABI_MAJOR
#endif

#if defined(BROKEN_NEWER_MINOR)
#define MINOR (COLLIE_ABI_MINOR + 1)
#else
#define MINOR COLLIE_ABI_MINOR
#endif

#if defined(BROKEN_WRONG_KIND)
#define KIND COLLIE_KIND_BACKEND
#else
#define KIND COLLIE_KIND_SCHEDULER
#endif

#if defined(BROKEN_FINGERPRINT)
#define FINGERPRINT "othercc-1.0;cxx11abi=0;torch=0.0;collie=0.0.1"
#else
#define FINGERPRINT COLLIE_FINGERPRINT_OF(KIND)
#endif

extern "C" COLLIE_EXPORT const collie_plugin_descriptor_v1 collie_plugin_v1 = {
    MAGIC,
    MAJOR,
    MINOR,
    KIND,
    PLUGIN_NAME,
    "0.0.1",
    "a deliberately broken plugin for tests/abi",
    FINGERPRINT,
    &collie::detail::createPlugin<collie::Scheduler, EchoScheduler>,
    &collie::detail::destroyPlugin<collie::Scheduler>,
    0u,
};

#else
// Exports something, but not the descriptor.
extern "C" {
COLLIE_EXPORT int collie_not_a_descriptor = 42;
}
#endif
