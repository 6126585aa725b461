// The worker environment of each launcher: torchrun/collie, Open MPI, Slurm, and bad values.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "collie/error.h"
#include "expect.h"
#include "forked_job.h"
#include "runtime/environment.h"
#include "runtime/tcp_store.h"

using collie::detectWorkerEnv;
using collie::WorkerEnv;

namespace {

// The worker environment a launcher leaves as `vars`, "NAME=VALUE NAME=VALUE ..." (a value
// holds no space), and nothing else.
WorkerEnv detect(const std::string& vars_text) {
  std::map<std::string, std::string> vars;
  std::istringstream words(vars_text);
  for (std::string word; words >> word;) {
    const auto eq = word.find('=');
    vars[word.substr(0, eq)] = word.substr(eq + 1);
  }
  return detectWorkerEnv([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace

TEST(WorkerEnv, NoLauncherMeansNoWorker) { EXPECT_FALSE(detect("").present); }

TEST(WorkerEnv, Torchrun) {
  auto w = detect(
      "RANK=3 WORLD_SIZE=8 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=node1 MASTER_PORT=29400");
  EXPECT_TRUE(w.present);
  EXPECT_EQ(w.source, "torchrun");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world, 2);
  EXPECT_EQ(w.master_addr, "node1");
  EXPECT_EQ(w.master_port, 29400);
}

TEST(WorkerEnv, CollieLauncherNamesTheRun) {
  auto w = detect("RANK=0 WORLD_SIZE=2 COLLIE_EXPERIMENT=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=5000");
  EXPECT_EQ(w.source, "collie");
  EXPECT_EQ(w.experiment, 4);
}

TEST(WorkerEnv, OpenMpiOnOneNode) {
  auto w = detect(
      "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 "
      "OMPI_COMM_WORLD_LOCAL_SIZE=4");
  EXPECT_TRUE(w.present);
  EXPECT_EQ(w.source, "Open MPI");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.world, 4);
  EXPECT_TRUE(w.master_addr.empty());  // the caller's default (loopback) is right on one node
}

TEST(WorkerEnv, OpenMpiAcrossNodesNeedsMasterAddr) {
  EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>(
      [&] {
        detect(
            "OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 "
            "OMPI_COMM_WORLD_LOCAL_SIZE=2");
      },
      {"MASTER_ADDR is not set"}))
      << "expected a ConfigError";
}

TEST(WorkerEnv, Slurm) {
  auto w =
      detect("SLURM_PROCID=5 SLURM_NTASKS=8 SLURM_LOCALID=1 SLURM_STEP_NUM_NODES=4 MASTER_ADDR=n1");
  EXPECT_EQ(w.source, "Slurm");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world, 8);
  EXPECT_EQ(w.local_rank, 1);
}

TEST(WorkerEnv, MalformedValuesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"RANK=two WORLD_SIZE=4", "RANK='two'"},
      {"RANK=4 WORLD_SIZE=4", "RANK=4 is not below WORLD_SIZE=4"},
      {"RANK=0", "must both be set"},
      {"RANK=0 WORLD_SIZE=1 MASTER_PORT=70000", "MASTER_PORT='70000'"}};
  for (const auto& [vars, says] : refused) {
    const std::string& env = vars;  // C++17 lambdas do not capture structured bindings
    EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>([&] { detect(env); }, {says}))
        << vars;
  }
}

// Another node waits for node 0's token file to exist and then reads it: the file must
// appear whole (written aside and renamed into place), never empty or cut short, and only
// its owner may read it. A reader here polls as fast as it can while a child writes.
TEST(JobToken, TheTokenFileAppearsWholeAndPrivate) {
  const std::string dir = ::testing::TempDir() + "collie-token-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/token";
  int torn = 0;
  std::string expected;
  for (int i = 0; i < 300; ++i) {
    std::filesystem::remove(path);
    const pid_t child = ::fork();
    if (child == 0) {
      ::unsetenv("COLLIE_JOB_TOKEN");
      try {
        collie::provideJobToken(path, true, std::chrono::seconds(1));
      } catch (...) {
        _exit(1);
      }
      _exit(0);
    }
    std::string read;
    int status = 0;
    bool exited = false;
    for (;;) {  // until the file exists, or the writer exited without making it
      std::ifstream in(path);
      if (in) {
        std::getline(in, read);
        break;
      }
      if (::waitpid(child, &status, WNOHANG) == child) {
        exited = true;
        ASSERT_TRUE(std::filesystem::exists(path)) << "the writer left no token file";
      }
    }
    if (!exited) ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    std::ifstream whole(path);
    std::getline(whole, expected);
    if (read != expected) ++torn;
  }
  EXPECT_EQ(torn, 0) << "of 300 token files read as soon as they existed";
  // The writer's scratch file is gone: only the token is left in the folder.
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"token"});
  EXPECT_EQ(expected.size(), 64u) << expected;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // What a reader gets from the finished file is the token.
  ::unsetenv("COLLIE_JOB_TOKEN");
  EXPECT_EQ(collie::jobToken(path), expected);
  std::filesystem::remove_all(dir);
}

// A token file that cannot be written is refused naming the setting, the file and the cause,
// and no token is exported.
TEST(JobToken, ATokenFileThatCannotBeWrittenIsNamed) {
  const std::string dir = ::testing::TempDir() + "collie-token-ro-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string missing = dir + "/no-such-folder/token";
  ::unsetenv("COLLIE_JOB_TOKEN");
  EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>(
      [&] { collie::provideJobToken(missing, true, std::chrono::seconds(1)); },
      {"launch.token_file " + missing, "No such file or directory", "HINT:"}))
      << "a token file in a missing folder was accepted";
  EXPECT_EQ(std::getenv("COLLIE_JOB_TOKEN"), nullptr);
  std::filesystem::remove_all(dir);
}

// The token of an outside launcher's ranks on one host: a file only this user can read, in a
// folder only this user can open; a folder someone else could read is refused.
TEST(JobToken, AnOutsideLaunchersTokenOnOneHostIsPrivate) {
  const std::string dir = ::testing::TempDir() + "collie-runtime-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const char* saved = std::getenv("XDG_RUNTIME_DIR");
  const std::string restore = saved == nullptr ? "" : saved;
  ::setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  const uint16_t port = 41234;
  const std::string token = collie::drawJobToken();
  EXPECT_EQ(token.size(), 64u);
  collie::writeLocalJobToken(collie::localJobTokenPath(port), token);
  const std::string path = collie::localJobTokenPath(port);
  EXPECT_EQ(path, dir + "/collie/job-41234.token");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir + "/collie").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(
      collie::readLocalJobToken(collie::localJobTokenPath(port), std::chrono::steady_clock::now()),
      token);
  EXPECT_EQ(collie::readLocalJobToken(collie::localJobTokenPath(port + 1),
                                      std::chrono::steady_clock::now()),
            "");
  ::chmod((dir + "/collie").c_str(), 0755);
  EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>(
      [&] { collie::writeLocalJobToken(collie::localJobTokenPath(port), token); },
      {"is not a private folder of this user"}))
      << "a token was left in a folder other users can open";
  // An inherited XDG_RUNTIME_DIR that does not exist here (srun exports the login node's) is
  // passed over for this user's folder in /tmp, not an error.
  ::setenv("XDG_RUNTIME_DIR", (dir + "/no-such-runtime-dir").c_str(), 1);
  EXPECT_EQ(collie::localJobTokenPath(port),
            "/tmp/collie-" + std::to_string(::geteuid()) + "/job-41234.token");
  if (restore.empty()) {
    ::unsetenv("XDG_RUNTIME_DIR");
  } else {
    ::setenv("XDG_RUNTIME_DIR", restore.c_str(), 1);
  }
  std::filesystem::remove_all(dir);
}

// Ranks an outside launcher started on one host (no COLLIE_JOB_TOKEN, no token file) meet with
// a token: a stranger on this host who connects to their store without it is refused, and
// rank 0's token file is gone once every rank has joined.
TEST(JobToken, AStrangerCannotJoinAnOutsideLaunchersJobOnOneHost) {
  ::unsetenv("COLLIE_JOB_TOKEN");
  auto codes = collie::testing::runJobWith(
      "gloo", [](collie::ProcessJob& job, const collie::config::PluginRef&) {
        auto* store = dynamic_cast<collie::TcpStore*>(&job.store());
        if (store == nullptr) return false;
        const uint16_t port = store->port();
        bool refused = false;
        if (job.rank() == 0) {
          try {
            collie::TcpStore stranger("127.0.0.1", port, false, std::chrono::seconds(2));
            stranger.check({"anything"});
            std::fprintf(stderr, "rank 0: a stranger without the token read the store\n");
          } catch (const collie::CommError& e) {
            refused = std::string(e.what()).find("needs its token") != std::string::npos;
            if (!refused) std::fprintf(stderr, "rank 0: %s\n", e.what());
          }
          struct stat st {};
          if (::stat(collie::localJobTokenPath(port).c_str(), &st) == 0) {
            std::fprintf(stderr, "rank 0: the token file outlived the join\n");
            refused = false;
          }
        }
        job.allGather("checked", "");
        return job.rank() != 0 || refused;
      });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}
