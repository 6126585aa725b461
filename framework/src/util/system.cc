// Process introspection through /proc.
#include "util/system.h"

#include "util/spawn.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>

#include <cmath>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <iterator>

namespace collie::detail {

std::string libraryOf(const void* address) {
  Dl_info info{};
  if (address == nullptr || dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

namespace {

// The real file behind `path` (through the alternatives' symlinks), or `path` itself.
std::string realFile(const std::string& path) {
  std::error_code ec;
  auto real = std::filesystem::canonical(path, ec);
  return ec ? path : real.string();
}

}  // namespace

std::string blasInUse() {
  // The library whose sgemm_ this process binds to is the BLAS LibTorch's matmuls call.
  if (const std::string sgemm = libraryOf(dlsym(RTLD_DEFAULT, "sgemm_")); !sgemm.empty()) {
    return realFile(sgemm);
  }
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    std::string file = std::filesystem::path(path).filename().string();
    if (file.rfind("libblas.so", 0) == 0 || file.rfind("libopenblas", 0) == 0 ||
        file.rfind("libmkl_rt", 0) == 0) {
      return realFile(path);
    }
  }
  return "none loaded";
}

std::string mallocInUse() {
  const std::string file = libraryOf(dlsym(RTLD_DEFAULT, "malloc"));
  return file.empty() ? "unknown" : realFile(file);
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

char processState(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // "PID (COMM) S ...": the name may hold spaces and parentheses, the last ')' ends it.
  const size_t paren = text.rfind(')');
  if (!stat || paren == std::string::npos || paren + 2 >= text.size()) return 0;
  return text[paren + 2];
}

int onlineCpus() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto first = line.find_first_not_of(" \t", colon + 1);
    return first == std::string::npos ? "" : line.substr(first);
  }
  return "";
}

double loadAverage() {
  double load[1];
  return getloadavg(load, 1) == 1 ? load[0] : NAN;
}

int linkSpeedMbps(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") return -1;
  std::ifstream in("/sys/class/net/" + name + "/speed");
  int speed = -1;
  if (!(in >> speed) || speed <= 0) return -1;
  return speed;
}

int runProgram(const std::vector<std::string>& argv, std::string* output) {
  output->clear();
  if (argv.empty()) return 127;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return 127;
  SpawnOptions options;
  options.argv = argv;
  options.stdout_fd = options.stderr_fd = pipe_fds[1];
  pid_t pid = -1;
  try {
    pid = spawn(options);
  } catch (const std::exception& x) {
    *output = x.what();
  }
  ::close(pipe_fds[1]);
  if (pid < 0) {
    ::close(pipe_fds[0]);
    return 127;
  }
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      output->append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_fds[0]);
  const int status = waitFor(pid);
  while (!output->empty() && (output->back() == '\n' || output->back() == ' ')) output->pop_back();
  return exitCodeOf(status);
}

}  // namespace collie::detail
