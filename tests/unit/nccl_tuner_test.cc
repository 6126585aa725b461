// libnccl-tuner-collie.so as NCCL sees it: loaded with dlopen, found by its v4 symbol, asked
// size by size for a collective's algorithm. Where the policy collie wrote names NCCL's ring
// or tree, every other algorithm's cost becomes "ignore" (NCCL then runs that one, with the
// protocol it prefers); where it says '-', for another communicator size, or where the chosen
// algorithm cannot run, the table NCCL made is left as it was.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "bench/policy.h"
#include "expect.h"
#include "nccl_tuner_v4.h"

namespace collie {
namespace {

namespace fs = std::filesystem;
using nccl_tuner::kIgnore;
using nccl_tuner::kProtocols;
using nccl_tuner::TunerV4;

constexpr int kAlgorithms = 7;  // NCCL 2.28: tree, ring, collnet x2, nvls x2, pat

class Tuner : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = ::dlopen(COLLIE_TEST_NCCL_TUNER, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(library_, nullptr) << ::dlerror();
    tuner_ = static_cast<const TunerV4*>(::dlsym(library_, "ncclTunerPlugin_v4"));
    ASSERT_NE(tuner_, nullptr) << "no ncclTunerPlugin_v4";
    // ring up to 64 KiB, double_binary_tree (NCCL's tree) to 1 MiB, halving_doubling (no
    // NCCL algorithm) above, measured on 4 ranks.
    RulesFile rules;
    rules.collective = "allreduce";
    rules.world_size = 4;
    rules.rules = {{64 << 10, RuleChoice{"ring", {}}},
                   {1 << 20, RuleChoice{"double_binary_tree", {}}},
                   {0, RuleChoice{"halving_doubling", {}}}};
    const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "runs" / "nccl-tuner";
    fs::create_directories(dir);
    policy_ = bench::writeNcclPolicy(dir.string(), rules, "a test");
    ::setenv("COLLIE_NCCL_POLICY", policy_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("COLLIE_NCCL_POLICY");
    if (library_ != nullptr) ::dlclose(library_);
  }

  // The cost table NCCL would pass (every combination runnable, tree's cheapest) after the
  // tuner saw `bytes` of `collective` on a communicator of `ranks`.
  struct Table {
    float cost[kAlgorithms][kProtocols];
    bool only(int algorithm) const {
      for (int a = 0; a < kAlgorithms; ++a) {
        for (int p = 0; p < kProtocols; ++p) {
          if ((a == algorithm) == (cost[a][p] == kIgnore)) return false;
        }
      }
      return true;
    }
    bool untouched() const {
      for (int a = 0; a < kAlgorithms; ++a) {
        for (int p = 0; p < kProtocols; ++p) {
          if (cost[a][p] != fresh(a, p)) return false;
        }
      }
      return true;
    }
    static float fresh(int a, int p) { return 10.0f + a + 0.5f * p; }
  };
  Table ask(size_t ranks, nccl_tuner::Function collective, size_t bytes, int unrunnable = -1) {
    Table t;
    for (int a = 0; a < kAlgorithms; ++a) {
      for (int p = 0; p < kProtocols; ++p)
        t.cost[a][p] = a == unrunnable ? kIgnore : Table::fresh(a, p);
    }
    void* context = nullptr;
    EXPECT_EQ(tuner_->init(ranks, 1, nullptr, &context), nccl_tuner::kSuccess);
    int channels = 8;
    EXPECT_EQ(tuner_->getCollInfo(context, collective, bytes, 1, reinterpret_cast<float**>(t.cost),
                                  kAlgorithms, kProtocols, 0, &channels),
              nccl_tuner::kSuccess);
    EXPECT_EQ(channels, 8);  // NCCL keeps its channel count
    EXPECT_EQ(tuner_->destroy(context), nccl_tuner::kSuccess);
    return t;
  }

  void* library_ = nullptr;
  const TunerV4* tuner_ = nullptr;
  std::string policy_;
};

TEST_F(Tuner, TellsNcclTheAlgorithmThePolicyNamesSizeBySize) {
  using nccl_tuner::kAllReduce;
  EXPECT_TRUE(ask(4, kAllReduce, 0).only(nccl_tuner::kRing));
  EXPECT_TRUE(ask(4, kAllReduce, 64 << 10).only(nccl_tuner::kRing));
  EXPECT_TRUE(ask(4, kAllReduce, (64 << 10) + 1).only(nccl_tuner::kTree));
  EXPECT_TRUE(ask(4, kAllReduce, 1 << 20).only(nccl_tuner::kTree));
  EXPECT_TRUE(ask(4, kAllReduce, (1 << 20) + 1).untouched());     // halving_doubling: NCCL decides
  EXPECT_TRUE(ask(8, kAllReduce, 4096).untouched());              // another communicator size
  EXPECT_TRUE(ask(4, nccl_tuner::kAllGather, 4096).untouched());  // a collective not measured
  // Where NCCL cannot run the chosen algorithm, it keeps its own table.
  const Table t = ask(4, kAllReduce, 4096, nccl_tuner::kRing);
  for (int a = 0; a < kAlgorithms; ++a) {
    if (a != nccl_tuner::kRing) {
      EXPECT_EQ(t.cost[a][0], Table::fresh(a, 0));
    }
  }
}

TEST_F(Tuner, AMalformedPolicyFailsTheInitNamingTheLine) {
  const std::string bad = (fs::path(policy_).parent_path() / "bad.policy").string();
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("# ok\nallreduce 4 0 ring\nallreduce 4 100 butterfly\n", f);
    std::fclose(f);
  }
  ::setenv("COLLIE_NCCL_POLICY", bad.c_str(), 1);
  void* context = nullptr;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(tuner_->init(4, 1, nullptr, &context), nccl_tuner::kInvalidUsage);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(
      testing::contains(said, {"bad.policy:3: algorithm 'butterfly' is not ring, tree or -"}));
  EXPECT_EQ(context, nullptr);
}

}  // namespace
}  // namespace collie
