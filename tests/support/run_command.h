// Runs the collie executable the way a user would, capturing output and exit code.
#pragma once

#include <string>
#include <vector>

namespace collie::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr, interleaved
};

// Runs COLLIE_TEST_BINARY with `args` (each shell-quoted) and optional "K=V" environment.
CommandResult runCollie(const std::vector<std::string>& args,
                        const std::vector<std::string>& env = {});

// Writes `text` to a fresh file under the test's scratch folder and returns its path.
std::string writeTempFile(const std::string& name, const std::string& text);

}  // namespace collie::testing
