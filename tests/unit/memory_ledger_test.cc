// train/memory_ledger: LibTorch's CPU blocks counted by the rank (thread) that made them and
// by use, and the make-up of each ledger's peak.
#include "train/memory_ledger.h"

#include <ATen/ops/empty.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <thread>
#include <vector>

namespace collie::train {
namespace {

constexpr uint64_t kMiB = 1 << 20;

at::Tensor block(uint64_t bytes) {
  return at::empty({static_cast<int64_t>(bytes / 4)}, at::kFloat);
}

uint64_t use(const MemoryPeak& p, MemoryUse u) { return p.by_use[static_cast<size_t>(u)]; }

TEST(MemoryLedger, APeakIsWhatEachUseHeldAtItsHighest) {
  ASSERT_TRUE(MemoryLedger::install());
  MemoryLedger& ledger = MemoryLedger::create();
  const MemoryLedger::Bind bound(&ledger, MemoryUse::kSetUp);
  const at::Tensor state = block(2 * kMiB);
  EXPECT_EQ(ledger.live(), 2 * kMiB);
  EXPECT_EQ(ledger.peak().bytes, 0u);  // no window open yet: counted, not a peak
  {
    const MemoryLedger::PeakWindow window(ledger);
    at::Tensor activations;
    {
      const MemoryLedger::Use counted(MemoryUse::kForward);
      activations = block(3 * kMiB);
    }
    activations = at::Tensor();  // freed: the peak stays
    const MemoryLedger::Use counted(MemoryUse::kBackward);
    const at::Tensor grads = block(1 * kMiB);
    EXPECT_EQ(ledger.live(), 3 * kMiB);
  }
  const MemoryPeak peak = ledger.peak();
  EXPECT_EQ(peak.bytes, 5 * kMiB);
  EXPECT_EQ(use(peak, MemoryUse::kSetUp), 2 * kMiB);
  EXPECT_EQ(use(peak, MemoryUse::kForward), 3 * kMiB);
  EXPECT_EQ(use(peak, MemoryUse::kBackward), 0u);  // allocated after the peak
  // Outside a window a new high is counted but is no peak.
  const at::Tensor between = block(8 * kMiB);
  EXPECT_EQ(ledger.live(), 10 * kMiB);
  EXPECT_EQ(ledger.peak().bytes, 5 * kMiB);
}

// Ranks that are threads count into their own ledgers, and a block freed on another thread
// leaves the ledger that counted it; a thread bound to none counts nowhere.
TEST(MemoryLedger, EachThreadCountsIntoItsOwnLedger) {
  ASSERT_TRUE(MemoryLedger::install());
  MemoryLedger& a = MemoryLedger::create();
  MemoryLedger& b = MemoryLedger::create();
  at::Tensor made_by_b;
  std::thread rank_b([&] {
    const MemoryLedger::Bind bound(&b, MemoryUse::kGathered);
    made_by_b = block(4 * kMiB);
  });
  rank_b.join();
  const MemoryLedger::Bind bound(&a, MemoryUse::kOther);
  const at::Tensor made_by_a = block(1 * kMiB);
  EXPECT_EQ(a.live(), 1 * kMiB);
  EXPECT_EQ(b.live(), 4 * kMiB);
  made_by_b = at::Tensor();  // freed here, on a's thread
  EXPECT_EQ(b.live(), 0u);
  EXPECT_EQ(a.live(), 1 * kMiB);
  std::thread unbound([] { const at::Tensor t = block(1 * kMiB); });
  unbound.join();
  EXPECT_EQ(a.live(), 1 * kMiB);
}

TEST(MemoryLedger, ResidentPeakRestartsFromTheCurrentSize) {
  {
    // A peak, given back to the kernel on the way out: mapped here, not malloc'd, since a
    // malloc may keep what is freed (tcmalloc, which the tests run on, does).
    const size_t bytes = 64 * kMiB;
    void* peak = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(peak, MAP_FAILED);
    std::memset(peak, 1, bytes);
    ::munmap(peak, bytes);
  }
  const uint64_t before = residentBytes();
  ASSERT_GT(before, 0u);
  ASSERT_GE(residentPeakBytes(), before + 60 * kMiB);
  if (!restartResidentPeak()) GTEST_SKIP() << "the kernel would not restart the peak here";
  EXPECT_LT(residentPeakBytes(), residentBytes() + 16 * kMiB);
}

}  // namespace
}  // namespace collie::train
