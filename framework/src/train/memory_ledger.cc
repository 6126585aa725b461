// The counting allocator and the ledgers (train/memory_ledger.h).
#include "train/memory_ledger.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "runtime/cpu_allocator.h"

namespace collie::train {
namespace {

thread_local MemoryLedger* t_ledger = nullptr;
thread_local MemoryUse t_use = MemoryUse::kOther;

// Each block carries who counted it in a header of c10's alignment, so that the data after
// it stays 64-byte aligned and a block freed on another thread, or after its rank's trainer
// is gone, is taken off the ledger that counted it.
struct Header {
  MemoryLedger* ledger;
  uint64_t bytes;
  MemoryUse use;
};
constexpr size_t kHeader = 64;
static_assert(sizeof(Header) <= kHeader && kHeader % c10::gAlignment == 0);

// LibTorch's CPU allocator with the ledger's counting: the same alloc_cpu and free_cpu as
// its default one (aligned memory from malloc), each block counted as it comes and
// goes.
void releaseCounted(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  const auto* header = reinterpret_cast<const Header*>(base);
  if (header->ledger != nullptr) header->ledger->remove(header->use, header->bytes);
  c10::free_cpu(base);
}
c10::DataPtr takeCounted(size_t bytes) {
  if (bytes == 0) return {nullptr, nullptr, &releaseCounted, c10::Device(c10::kCPU)};
  auto* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
  auto* header = reinterpret_cast<Header*>(base);
  header->ledger = t_ledger;
  header->bytes = bytes;
  header->use = t_use;
  if (t_ledger != nullptr) t_ledger->add(t_use, bytes);
  void* data = base + kHeader;
  return {data, data, &releaseCounted, c10::Device(c10::kCPU)};
}
using CountingAllocator = detail::CpuAllocator<&takeCounted, &releaseCounted>;

// Above LibTorch's default (0), below the emulated device's allocator (100).
constexpr uint8_t kPriority = 50;

}  // namespace

const char* memoryUseName(MemoryUse use) {
  // In the enum's order.
  static constexpr const char* kNames[] = {"set-up",        "forward",   "backward", "gathered",
                                           "gradient sync", "optimizer", "other"};
  static_assert(std::size(kNames) == kMemoryUses);
  const int i = static_cast<int>(use);
  return i >= 0 && i < kMemoryUses ? kNames[i] : "?";
}

bool MemoryLedger::install() {
  static CountingAllocator allocator;
  static std::once_flag once;
  std::call_once(once, [] { c10::SetCPUAllocator(&allocator, kPriority); });
  return c10::GetCPUAllocator() == &allocator;
}

MemoryLedger& MemoryLedger::create() { return *new MemoryLedger(); }  // never freed, see above

MemoryLedger::Bind::Bind(MemoryLedger* ledger, MemoryUse use) : ledger_(t_ledger), use_(t_use) {
  t_ledger = ledger;
  t_use = use;
}
MemoryLedger::Bind::~Bind() {
  t_ledger = ledger_;
  t_use = use_;
}

MemoryLedger::Use::Use(MemoryUse use) : previous_(t_use) { t_use = use; }
MemoryLedger::Use::~Use() { t_use = previous_; }

MemoryLedger* MemoryLedger::current() { return t_ledger; }

void MemoryLedger::add(MemoryUse use, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int u = static_cast<int>(use);
  live_[u] += bytes;
  total_ += bytes;
  if (!open_) return;
  if (total_ > peak_.bytes) {
    peak_.bytes = total_;
    peak_.by_use = live_;
  }
  peak_.highs[u] = std::max(peak_.highs[u], live_[u]);
}

void MemoryLedger::remove(MemoryUse use, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  live_[static_cast<int>(use)] -= bytes;
  total_ -= bytes;
}

MemoryLedger::PeakWindow::PeakWindow(MemoryLedger& ledger) : ledger_(ledger) {
  std::lock_guard<std::mutex> lock(ledger_.mu_);
  ledger_.open_ = true;
  if (ledger_.total_ > ledger_.peak_.bytes) {  // what is live as the window opens counts too
    ledger_.peak_.bytes = ledger_.total_;
    ledger_.peak_.by_use = ledger_.live_;
  }
  for (int u = 0; u < kMemoryUses; ++u)
    ledger_.peak_.highs[u] = std::max(ledger_.peak_.highs[u], ledger_.live_[u]);
}
MemoryLedger::PeakWindow::~PeakWindow() {
  std::lock_guard<std::mutex> lock(ledger_.mu_);
  ledger_.open_ = false;
}

MemoryPeak MemoryLedger::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t MemoryLedger::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

namespace {

// A "Vm...: N kB" line of /proc/self/status, in bytes.
uint64_t statusBytes(const char* format) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), format, &kib) == 1) return kib * 1024;
  }
  return 0;
}

}  // namespace

void releaseFreeMemory() {
  using Release = void (*)();
  if (auto release =
          reinterpret_cast<Release>(dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory"))) {
    release();
  } else {
    ::malloc_trim(0);
  }
}

uint64_t residentBytes() { return statusBytes("VmRSS: %llu kB"); }
uint64_t residentPeakBytes() { return statusBytes("VmHWM: %llu kB"); }
uint64_t residentFileBytes() { return statusBytes("RssFile: %llu kB"); }

uint64_t hostMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kib) == 1) return kib * 1024;
  }
  return 0;
}

bool restartResidentPeak() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool written = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && written;
}

}  // namespace collie::train
