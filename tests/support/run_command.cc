// popen-based command runner for CLI tests.
#include "run_command.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace collie::testing {
namespace {

std::string quote(const std::string& arg) {
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

CommandResult runCollie(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::string command = "env";
  for (const auto& e : env) command += " " + quote(e);
  command += " ";
  command += quote(COLLIE_TEST_BINARY);
  for (const auto& a : args) command += " " + quote(a);
  command += " 2>&1";
  CommandResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string writeTempFile(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / ("collie-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace collie::testing
