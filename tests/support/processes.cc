// Test helpers for jobs of processes.
#include "processes.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/launcher.h"

namespace fs = std::filesystem;

namespace collie::testing {

std::string Spawned::output() const { return readText(log); }

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

Spawned spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
              const std::string& log, const std::string& cwd) {
  Spawned s;
  s.log = log;
  std::vector<std::string> argv{COLLIE_TEST_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  s.pid = ::fork();
  if (s.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test that dies takes its ranks with it
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    (void)out;
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    _exit(127);
  }
  return s;
}

// Waits for `s` until `deadline`; false when it is still running then.
bool waitFor(Spawned& s, Clock::time_point start, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    pid_t r = ::waitpid(s.pid, &s.status, WNOHANG);
    if (r == s.pid) {
      s.exited = true;
      s.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

void killAndReap(Spawned& s) {
  if (s.exited || s.pid <= 0) return;
  ::kill(s.pid, SIGCONT);
  ::kill(s.pid, SIGKILL);
  ::waitpid(s.pid, &s.status, 0);
  s.exited = true;
}

int exitCode(const Spawned& s) {
  return WIFEXITED(s.status) ? WEXITSTATUS(s.status) : 128 + WTERMSIG(s.status);
}

// Processes whose command line mentions `marker` (a unique --out folder).
std::vector<pid_t> processesWith(const std::string& marker) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ifstream stat(entry.path() / "stat");
    std::string stat_line;
    std::getline(stat, stat_line);
    if (stat_line.find(") Z ") != std::string::npos) continue;  // zombies are not running
    if (cmdline.find(marker) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

std::string torchrunCommand(int nproc) {
  const uint16_t port = pickFreePort("127.0.0.1");
  return "torchrun --no_python --nnodes=1 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:" +
         std::to_string(port) + " --rdzv_id=collie-test-" + std::to_string(getpid()) + "-" +
         std::to_string(port) + " --nproc_per_node=" + std::to_string(nproc) +
         " --redirects 2 --tee 1";
}

std::string scratch(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("collie-proc-" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);
  return dir.string();
}

Reaper::~Reaper() {
  for (auto& r : *ranks) killAndReap(r);
}

bool noneLeft(const std::string& marker, std::chrono::milliseconds patience) {
  const auto deadline = Clock::now() + patience;
  while (!processesWith(marker).empty() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return processesWith(marker).empty();
}

// Starts `world` workers of `config` directly (as mpirun would, with no teardown of its
// own), leaving out the ranks in `skip`.
std::vector<Spawned> startWorkers(const std::string& config, int world, const std::string& out,
                                  const std::vector<std::string>& sets,
                                  const std::vector<int>& skip) {
  const int port = collie::pickFreePort("127.0.0.1");
  std::vector<Spawned> ranks(world);
  for (int r = 0; r < world; ++r) {
    if (std::find(skip.begin(), skip.end(), r) != skip.end()) continue;
    std::vector<std::string> args{"run", config, "--out", out};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    ranks[r] =
        spawn(args,
              {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
               "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
               "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)},
              out + "/rank" + std::to_string(r) + ".log");
  }
  return ranks;
}

// Waits (up to a minute: a loaded machine starts LibTorch slowly) until `log` holds
// `count` "connected" lines, then a second more, so that the ranks are inside the sweep.
bool waitUntilConnected(const std::vector<std::string>& logs, size_t count) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    size_t seen = 0;
    for (const auto& log : logs) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      for (size_t at = text.find(" connected, "); at != std::string::npos;
           at = text.find(" connected, ", at + 1)) {
        ++seen;
      }
    }
    if (seen >= count) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

bool haveProgram(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

}  // namespace collie::testing
