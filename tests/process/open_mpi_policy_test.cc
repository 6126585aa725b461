// The Open MPI rules collie writes are the ones Open MPI runs: 4 ranks of Open MPI's own
// MPI_Allreduce with the file give, size by size, the result bits of the algorithm the file
// names (forced with coll_tuned_allreduce_algorithm), where that differs from Open MPI's own
// decision. Debian's Open MPI prints no per-call algorithm; the bits of a float sum do.
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

// Rank 0's hash of the summed floats, for `floats` per rank on 4 ranks with `mca` settings.
std::string bitsOf(long floats, const std::string& mca) {
  const std::string command = "mpirun --allow-run-as-root --oversubscribe -np 4 " + mca + " '" +
                              COLLIE_TEST_MPI_BITS + "' " + std::to_string(floats) + " 2>&1";
  std::string output;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
    EXPECT_EQ(::pclose(pipe), 0) << command << "\n" << output;
  }
  while (!output.empty() && output.back() == '\n') output.pop_back();
  EXPECT_EQ(output.size(), 16u) << command << "\n" << output;  // one hash, nothing else
  return output;
}

std::string forced(int algorithm) {
  return "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm " +
         std::to_string(algorithm);
}

TEST(OpenMpiPolicy, OpenMpiRunsTheAlgorithmTheFileNames) {
  if (!haveMpirun()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  // ring up to 64 KiB, recursive doubling above: Open MPI's own decision on 4 ranks is
  // recursive doubling's bits at both sizes below, so 16 KiB shows that the file decided.
  RulesFile rules;
  rules.collective = "allreduce";
  rules.world_size = 4;
  rules.rules = {{64 << 10, RuleChoice{"ring", {}}}, {0, RuleChoice{"recursive_doubling", {}}}};
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "runs" / "open-mpi-policy";
  fs::create_directories(dir);
  const std::string path = writeOpenMpiRules(dir.string(), openMpiPolicy(rules), "a test");
  const std::string with_file =
      "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_dynamic_rules_filename '" + path + "'";
  const long small = 4096, large = 262144;  // 16 KiB and 1 MiB of floats per rank
  const std::string ring_small = bitsOf(small, forced(4));
  const std::string doubling_small = bitsOf(small, forced(3));
  ASSERT_NE(ring_small, doubling_small) << "the two algorithms add in the same order here";
  EXPECT_NE(bitsOf(small, ""), ring_small) << "Open MPI's own decision is ring at 16 KiB";
  EXPECT_EQ(bitsOf(small, with_file), ring_small) << "the file's ring did not run at 16 KiB";
  const std::string doubling_large = bitsOf(large, forced(3));
  ASSERT_NE(doubling_large, bitsOf(large, forced(4)));
  EXPECT_EQ(bitsOf(large, with_file), doubling_large)
      << "the file's recursive doubling did not run at 1 MiB";
}

}  // namespace
}  // namespace collie::bench
