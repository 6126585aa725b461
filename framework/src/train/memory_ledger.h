// Where a rank's memory goes during training, measured rather than computed: every block
// LibTorch allocates on the CPU passes through one allocator, which counts the blocks a
// rank's threads make (its own and its communication thread; ATen's worker threads count
// nowhere) for that rank, under the part of the training running then (set-up, forward,
// backward, stage 3's gathered units, gradient sync, the optimizer). When a rank's live bytes
// reach a new peak, its ledger keeps what each part held at that moment: the peak's make-up,
// which adds up to it. What LibTorch does not allocate (small objects of the C++ heap, the
// transports' and collie's scratch buffers, the libraries) and the free memory malloc keeps
// are the rest of the resident set: its peak less the tracked peak. Free of
// LibTorch headers.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace collie::train {

enum class MemoryUse : int {
  kSetUp,         // before the first step: the model, buckets, shards, optimizer state
  kForward,       // activations and the forward's temporaries
  kBackward,      // gradients on their way into buckets and the backward's temporaries
  kGathered,      // parameter values all-gathered: stage 3's units, stages 1-2 after the update
  kGradientSync,  // the buckets' reductions and their temporaries
  kOptimizer,     // clipping and the optimizer's step (its state, where made lazily)
  kOther,         // anything else during a step (the batch, the loss)
};
inline constexpr int kMemoryUses = 7;
// "set-up", "forward", ...: as the summary and summary.json name them.
const char* memoryUseName(MemoryUse use);

// One rank's peak: the most bytes it had live at once, and what each use held then; and the
// most each use held at any moment (not at once: a use's high may come before or after the
// peak), in the same windows.
struct MemoryPeak {
  uint64_t bytes = 0;
  std::array<uint64_t, kMemoryUses> by_use{};
  std::array<uint64_t, kMemoryUses> highs{};
};

class MemoryLedger {
 public:
  // Makes the counting allocator LibTorch's CPU allocator (once per process); false when an
  // allocator of higher priority is there (tensors on the emulated device), which then
  // counts nothing.
  static bool install();
  // A new ledger. Ledgers live as long as the process: a block can be freed after the
  // trainer that counted it is gone.
  static MemoryLedger& create();

  // While it lives, the calling thread's allocations count into `ledger` as `use` (a null
  // ledger counts nothing); the previous binding comes back after.
  class Bind {
   public:
    Bind(MemoryLedger* ledger, MemoryUse use);
    ~Bind();
    Bind(const Bind&) = delete;
    Bind& operator=(const Bind&) = delete;

   private:
    MemoryLedger* ledger_;
    MemoryUse use_;
  };
  // While it lives, the calling thread's allocations count as `use` in the ledger it is
  // bound to (nothing without one).
  class Use {
   public:
    explicit Use(MemoryUse use);
    ~Use();
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    MemoryUse previous_;
  };
  // The ledger the calling thread counts into (null: none).
  static MemoryLedger* current();

  // While it lives, a new high of the ledger's live bytes is its peak; outside such windows
  // blocks are counted but the peak stays (the trainer opens one for each step, so that
  // what runs between steps, a checkpoint or stage 3 gathering every unit to check the
  // weights, is not a step's peak).
  class PeakWindow {
   public:
    explicit PeakWindow(MemoryLedger& ledger);
    ~PeakWindow();
    PeakWindow(const PeakWindow&) = delete;
    PeakWindow& operator=(const PeakWindow&) = delete;

   private:
    MemoryLedger& ledger_;
  };

  // The highest peak in a window since the ledger was made or its last restart.
  MemoryPeak peak() const;
  // Bytes live now, of all uses.
  uint64_t live() const;

  // The allocator's side; `use` is the one the block was counted as.
  void add(MemoryUse use, uint64_t bytes);
  void remove(MemoryUse use, uint64_t bytes);

 private:
  MemoryLedger() = default;
  mutable std::mutex mu_;
  std::array<uint64_t, kMemoryUses> live_{};
  uint64_t total_ = 0;
  bool open_ = false;  // a PeakWindow is open
  MemoryPeak peak_;
};

// Gives what the process's malloc holds free back to the system: tcmalloc's
// MallocExtension_ReleaseFreeMemory where the process runs on it (collie does), glibc's
// malloc_trim otherwise. The trainer calls it once the set-up's temporaries are freed.
void releaseFreeMemory();

// The resident set of this process now (VmRSS), and its peak since the last
// restartResidentPeak() (VmHWM), in bytes; 0 when it cannot be read.
uint64_t residentBytes();
uint64_t residentPeakBytes();
// Of the resident set, the pages backed by files (RssFile: the libraries, mostly), which a
// memory cgroup does not hold against the process the way it holds its own allocations: the
// kernel drops them under pressure and reads them again. Shared memory (RssShmem) is not
// among them: it is charged, and stays.
uint64_t residentFileBytes();
// The machine's memory (MemTotal), in bytes; 0 when it cannot be read.
uint64_t hostMemoryBytes();
// Restarts the process's resident-set peak from its current size (Linux's clear_refs);
// false when the kernel refused. Ranks that are threads share one.
bool restartResidentPeak();

}  // namespace collie::train
