// The helpers every backend shares (collie/backend.h): transfer checks and descriptions, the
// abort flag, the rank arithmetic of split, and the host's answers where a backend is no
// simulator (collie/simulation.h).
#include "collie/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "collie/error.h"
#include "collie/simulation.h"

namespace collie {

void requireInterface(const std::string& owner, const std::string& name) {
  std::vector<std::string> names;
  if (struct if_nameindex* list = ::if_nameindex()) {
    for (auto* i = list; i->if_index != 0 && i->if_name != nullptr; ++i)
      names.emplace_back(i->if_name);
    ::if_freenameindex(list);
  }
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  throw ConfigError(fmt::format("{}: params.interface '{}' does not exist on host {}; it has: {}",
                                owner, name, host, fmt::join(names, ", ")));
}

namespace {
std::atomic<void* (*)(int)> g_producer_event{nullptr};
std::atomic<void (*)(int, void*)> g_consumer_wait{nullptr};
}  // namespace

void setDeviceStreamHooks(DeviceStreamHooks hooks) {
  g_producer_event.store(hooks.producer_event, std::memory_order_release);
  g_consumer_wait.store(hooks.consumer_wait, std::memory_order_release);
}

DeviceStreamHooks deviceStreamHooks() {
  DeviceStreamHooks hooks;
  hooks.producer_event = g_producer_event.load(std::memory_order_acquire);
  hooks.consumer_wait = g_consumer_wait.load(std::memory_order_acquire);
  return hooks;
}

double clockSeconds(const Backend& backend) {
  if (const Simulation* simulation = backend.simulation()) return simulation->clockSeconds();
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void sleepSeconds(const Backend& backend, double seconds) {
  if (const Simulation* simulation = backend.simulation()) {
    simulation->sleepSeconds(seconds);
  } else if (seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
}

bool simulatedTime(const Backend& backend) { return backend.simulation() != nullptr; }

std::vector<std::string> nodeLabels(const Backend& backend) {
  const Simulation* simulation = backend.simulation();
  return simulation ? simulation->nodeLabels() : std::vector<std::string>{};
}

bool movesPayload(const Backend& backend) {
  const Simulation* simulation = backend.simulation();
  return simulation == nullptr || simulation->payload();
}

bool concurrentGroups(const Backend& backend) {
  return backend.simulation() == nullptr && backend.capabilities().concurrent_groups;
}

void checkTransfer(const std::string& backend, int rank, int size, int peer, const Buffer& buf,
                   bool sending, MemoryKind moves) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw CommError(fmt::format("{}: rank {} cannot {} rank {} in a group of {}", backend, rank,
                                sending ? "send to" : "receive from", peer, size));
  }
  if (buf.memory == MemoryKind::kNone && moves != MemoryKind::kNone) {
    throw CommError(backend +
                    ": a size-only buffer (MemoryKind::kNone) has no bytes to move. HINT: only "
                    "a simulator without payload (simgrid, payload: false) takes one");
  }
  if (buf.memory != moves) {
    throw CommError(backend +
                    (moves == MemoryKind::kHost
                         ? ": only host memory is supported. HINT: use the nccl backend for "
                           "CUDA tensors"
                         : ": only device memory is supported. HINT: use gloo or ucx for host "
                           "buffers"));
  }
}

void checkCollectiveShape(const std::string& who, const CollectiveArgs& args, int size) {
  const Buffer& in = args.data;
  const Buffer& out = args.output;
  const uint64_t n = static_cast<uint64_t>(size);
  // What is wrong, or "" (no words are made for a call that fits: this runs per collective).
  std::string wrong;
  switch (args.coll) {
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      if (out.dtype != in.dtype || out.memory != in.memory) {
        wrong = fmt::format("needs an output of the same dtype and memory kind, found {}{}",
                            dtypeName(out.dtype),
                            out.memory != in.memory ? " in another memory kind" : "");
      } else if (args.coll == Collective::kReduceScatter && in.count % n != 0) {
        wrong = fmt::format("needs an input whose count is a multiple of {}", n);
      } else if (args.coll == Collective::kReduceScatter && out.count != in.count / n) {
        wrong = fmt::format("needs an output of {}, found {}", in.count / n, out.count);
      } else if (args.coll == Collective::kAllGather && out.count != in.count * n) {
        wrong = fmt::format("needs an output of {}, found {}", in.count * n, out.count);
      }
      break;
    case Collective::kBroadcast:
      if (args.root < 0 || args.root >= size)
        wrong = fmt::format("has root {}, not a rank of the group", args.root);
      break;
    case Collective::kBarrier:
      if (in.count != 0) wrong = fmt::format("needs an input of 0, found {}", in.count);
      break;
    case Collective::kAllReduce:
      break;
  }
  if (wrong.empty()) return;
  throw CommError(fmt::format("{}: {} of {} x {} on {} rank{} {}", who, collectiveName(args.coll),
                              in.count, dtypeName(in.dtype), size, size == 1 ? "" : "s", wrong));
}

std::string describeTransfer(int rank, int peer, bool sending, Tag tag,
                             const std::string& peer_name) {
  return fmt::format("rank {}: {} {} {}", rank, sending ? "send to" : "receive from",
                     peer_name.empty() ? fmt::format("rank {}", peer) : peer_name,
                     describeTag(tag));
}

bool AbortFlag::set(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (set_.load(std::memory_order_relaxed)) return false;
  reason_ = reason;
  set_.store(true, std::memory_order_release);
  return true;
}

std::string AbortFlag::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void AbortFlag::throwIfSet(const std::string& what) const {
  if (isSet()) throw CommError(what + ": aborted: " + reason());
}

int splitPosition(const std::vector<int>& ranks, int rank, const std::string& who) {
  auto me = std::find(ranks.begin(), ranks.end(), rank);
  if (me == ranks.end() || !std::is_sorted(ranks.begin(), ranks.end())) {
    throw CommError(fmt::format(
        "{}: rank {} called split with a list that does not hold it or is not ascending", who,
        rank));
  }
  return static_cast<int>(me - ranks.begin());
}

std::string splitName(int ordinal, const std::vector<int>& ranks) {
  return fmt::format("split{}[{}]", ordinal, fmt::join(ranks, ","));
}

}  // namespace collie
