// The Open MPI rules collie writes are the ones Open MPI runs: 4 ranks of Open MPI's own
// MPI_Allreduce with the file give, size by size, the result bits of the algorithm the file
// names (forced with coll_tuned_allreduce_algorithm). Debian's Open MPI prints no per-call
// algorithm; the bits of a float sum do, where the algorithms add in different orders.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "bench/policy.h"
#include "run_command.h"

namespace collie::bench {
namespace {

namespace fs = std::filesystem;

bool haveMpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// Rank 0's hash of the summed floats, for `floats` per rank on 4 ranks with `mca` settings
// (the last line of the output: Open MPI may print notices before it).
std::string bitsOf(long floats, const std::string& mca) {
  const std::string command = "timeout -k 5 60 mpirun --allow-run-as-root --oversubscribe -np 4 " +
                              mca + " '" + COLLIE_TEST_MPI_BITS + "' " + std::to_string(floats) +
                              " 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
    EXPECT_EQ(::pclose(pipe), 0) << command << "\n" << output;
  }
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const std::string last = output.substr(output.rfind('\n') + 1);
  EXPECT_EQ(last.find_first_not_of("0123456789abcdef"), std::string::npos) << output;
  EXPECT_EQ(last.size(), 16u) << command << "\n" << output;
  return last;
}

std::string forced(int algorithm) {
  return "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm " +
         std::to_string(algorithm);
}

// The rules file of `small` up to 64 KiB and `large` above, on 4 ranks, as --emit-policy
// writes it; the mpirun settings that use it.
std::string withRules(const std::string& name, const std::string& small, const std::string& large) {
  RulesFile rules;
  rules.collective = "allreduce";
  rules.world_size = 4;
  rules.rules = {{64 << 10, RuleChoice{small, {}}}, {0, RuleChoice{large, {}}}};
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "runs" / "open-mpi-policy" / name;
  fs::create_directories(dir);
  const std::string path = writeOpenMpiRules(dir.string(), openMpiPolicy(rules), "a test");
  return "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_dynamic_rules_filename '" + path +
         "'";
}

// On 4 ranks Open MPI's own decision gives recursive doubling's bits at 16 KiB and 1 MiB
// (recursive doubling below 8 KiB, rabenseifner above, which adds in the same order on a
// power of two): ring's bits are what shows that a file decided. Two files put ring on
// either side of their 64 KiB boundary; each must run ring exactly where it names it.
TEST(OpenMpiPolicy, OpenMpiRunsTheAlgorithmTheFileNames) {
  if (!haveMpirun()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const long small = 4096, large = 262144;  // 16 KiB and 1 MiB of floats per rank
  const std::string ring_small = bitsOf(small, forced(4)), ring_large = bitsOf(large, forced(4));
  const std::string doubling_small = bitsOf(small, forced(3));
  const std::string doubling_large = bitsOf(large, forced(3));
  ASSERT_NE(ring_small, doubling_small) << "the two algorithms add in the same order here";
  ASSERT_NE(ring_large, doubling_large);
  ASSERT_NE(bitsOf(small, ""), ring_small) << "Open MPI alone gives ring's bits at 16 KiB";
  ASSERT_NE(bitsOf(large, ""), ring_large) << "Open MPI alone gives ring's bits at 1 MiB";

  const std::string ring_first = withRules("ring-first", "ring", "recursive_doubling");
  EXPECT_EQ(bitsOf(small, ring_first), ring_small) << "the file's ring did not run at 16 KiB";
  EXPECT_EQ(bitsOf(large, ring_first), doubling_large);
  const std::string ring_last = withRules("ring-last", "recursive_doubling", "ring");
  EXPECT_EQ(bitsOf(small, ring_last), doubling_small);
  EXPECT_EQ(bitsOf(large, ring_last), ring_large) << "the file's ring did not run at 1 MiB";
}

}  // namespace
}  // namespace collie::bench
