// Ranks as processes: collie's launcher, torchrun and mpirun as launchers, and the faults a
// job of processes must survive with a clear error (a killed rank, a stopped rank, a rank
// that never arrives, a launcher that is killed). Every test leaves no process behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstring>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "expect.h"
#include "processes.h"
#include "run_command.h"
#include "runtime/launcher.h"

namespace fs = std::filesystem;
using namespace collie::testing;  // NOLINT: the helpers of run_command.h and processes.h

namespace {

// A bench that runs until it is stopped: 1 MiB all-reduces with a short backend timeout.
// Its ranks log "connected" once their backend is up (debug level).
std::string longConfig(const std::string& backend, const std::string& timeout) {
  return writeTempFile("long-" + backend + ".yaml",
                       "name: long\nlog_level: debug\n"
                       "launch: {nproc_per_node: 4, rendezvous_timeout: 60s}\n"
                       "backend: {plugin: " +
                           backend + ", params: {timeout: " + timeout +
                           "}}\n"
                           "bench: {schedulers: [ring], min_bytes: 1MiB, max_bytes: 1MiB, "
                           "iters: 1000000, warmup_iters: 1, calibrate: false, plots: false}\n");
}

std::string shortConfig(const std::string& backend, int ranks, const std::string& params = "") {
  return writeTempFile("short-" + backend + std::to_string(ranks) + ".yaml",
                       "name: short\nlaunch: {nproc_per_node: " + std::to_string(ranks) +
                           "}\nbackend: {plugin: " + backend + ", params: {timeout: 20s" + params +
                           "}}\n"
                           "bench: {schedulers: [ring, tree, halving_doubling], min_bytes: 4KiB, "
                           "max_bytes: 64KiB, step_factor: 4, iters: 3, warmup_iters: 1, "
                           "calibrate: false, plots: false}\n");
}

}  // namespace

TEST(Processes, CollieRunStartsGlooWorkers) {
  auto r = runCollie({"run", shortConfig("gloo", 3), "--out", scratch("gloo3")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(
      r.output, {"3 ranks on gloo (processes)", "Wrong elements: 0 (all results correct)"}));
}

TEST(Processes, CollieRunStartsUcxWorkersOverSharedMemory) {
  auto r = runCollie({"run", shortConfig("ucx", 2, ", transports: sm"), "--out", scratch("ucx2")});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"Wrong elements: 0 (all results correct)"}));
}

TEST(Processes, TorchrunStartsCollieWorkers) {
  if (!haveProgram("torchrun")) GTEST_SKIP() << "torchrun (python3-torch) is not installed";
  std::string out = scratch("torchrun");
  std::string command = torchrunCommand(2) + " '" COLLIE_TEST_BINARY "' run '" +
                        shortConfig("gloo", 2) + "' --out '" + out + "' > '" + out + "/log' 2>&1";
  int status = std::system(command.c_str());
  std::ifstream in(out + "/log");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 0) << log;
  EXPECT_TRUE(collie::testing::contains(log, {"Wrong elements: 0 (all results correct)"}));
  EXPECT_TRUE(fs::exists(out + "/results.csv")) << log;
}

TEST(Processes, MpirunStartsCollieWorkers) {
  if (!haveProgram("mpirun")) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  std::string out = scratch("mpirun");
  std::string command = "mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_PORT=" +
                        std::to_string(collie::pickFreePort("127.0.0.1")) +
                        " '" COLLIE_TEST_BINARY "' run '" + shortConfig("ucx", 2) + "' --out '" +
                        out + "' > '" + out + "/log' 2>&1";
  int status = std::system(command.c_str());
  std::ifstream in(out + "/log");
  std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 0) << log;
  EXPECT_TRUE(collie::testing::contains(log, {"Wrong elements: 0 (all results correct)"}));
}

// Each of `ranks` exits within 60 s with code 2 (bad input), saying `says`.
void everyRankRefuses(std::vector<Spawned>& ranks, const std::string& says) {
  const auto start = Clock::now();
  for (auto& s : ranks) {
    ASSERT_TRUE(waitFor(s, start, start + std::chrono::seconds(60))) << s.output();
    EXPECT_EQ(exitCode(s), 2) << s.output();
    EXPECT_TRUE(collie::testing::contains(s.output(), {says}));
  }
}

TEST(Processes, RanksWithDifferentConfigsAreNamed) {
  std::string out = scratch("differ");
  const std::string config = shortConfig("gloo", 2);
  const int port = collie::pickFreePort("127.0.0.1");
  std::vector<Spawned> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args{"run", config, "--out", out};
    if (r == 1) args.insert(args.end(), {"--set", "bench.iters=4"});  // rank 1 alone differs
    ranks.push_back(spawn(args,
                          {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=" + std::to_string(port)},
                          out + "/rank" + std::to_string(r) + ".log"));
  }
  ASSERT_NO_FATAL_FAILURE(
      everyRankRefuses(ranks,
                       "rank(s) 1 loaded a different experiment (config digest) than "
                       "rank 0"));
}

TEST(Processes, RanksWithADifferentNestedPluginAreNamed) {
  // Rank 1 finds another file for `tree`, which only hierarchical opens (as its inter
  // scheduler): the check must cover the plugins that plugins load, not only the config's.
  std::string out = scratch("nested");
  const fs::path alt = fs::path(out) / "alt-plugins";
  fs::create_directories(alt);
  const std::string tree = "libcollie_scheduler_tree.so";
  fs::copy_file(fs::path(COLLIE_TEST_PLUGIN_DIR) / tree, alt / tree,
                fs::copy_options::overwrite_existing);
  std::ofstream(alt / tree, std::ios::app | std::ios::binary) << "another build";
  const std::string config = writeTempFile("nested.yaml", R"(name: nested
launch: {nproc_per_node: 2}
backend: {plugin: gloo, params: {timeout: 20s}}
bench: {schedulers: [{plugin: hierarchical, params: {intra: ring, inter: tree}}],
        min_bytes: 4KiB, max_bytes: 4KiB, iters: 1, warmup_iters: 0, calibrate: false,
        plots: false}
)");
  const int port = collie::pickFreePort("127.0.0.1");
  std::vector<Spawned> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> env{"RANK=" + std::to_string(r), "WORLD_SIZE=2",
                                 "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)};
    if (r == 1) env.push_back("COLLIE_PLUGIN_PATH=" + alt.string());
    ranks.push_back(
        spawn({"run", config, "--out", out}, env, out + "/rank" + std::to_string(r) + ".log"));
  }
  Reaper reaper{&ranks};
  ASSERT_NO_FATAL_FAILURE(
      everyRankRefuses(ranks,
                       "rank(s) 1 loaded a different plugin and rules files (digests) "
                       "than rank 0"));
}

TEST(Processes, EveryRankResumesFromTheCheckpointRank0Chose) {
  // Two "nodes" without a shared file system: the same relative checkpoint_dir is another
  // folder for each rank. Unsharded, rank 0 alone writes checkpoints, so on resume rank 1
  // lacks the checkpoint rank 0 resumes from; it must say so rather than start from step 0.
  // Sharded, every rank writes its shard and the manifest on its own node, and reads only
  // its own shard back: the job resumes with nothing copied.
  const fs::path out = scratch("resume-agree");
  const fs::path node0 = out / "node0", node1 = out / "node1";
  fs::create_directories(node0);
  fs::create_directories(node1);
  const std::string config = writeTempFile("resume-agree.yaml", R"(name: resume-agree
launch: {nproc_per_node: 2}
backend: {plugin: gloo, params: {timeout: 20s}}
model: {plugin: mlp, params: {seq_len: 6, vocab: 48, d_embed: 8, hidden: 32, layers: 2}}
train: {steps: 4, micro_batch: 4, checkpoint_every: 2, checkpoint_dir: ckpt, log_every: 100}
)");
  auto runJob = [&](const std::vector<std::string>& sets, const std::string& tag) {
    const int port = collie::pickFreePort("127.0.0.1");
    std::vector<Spawned> ranks;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args{"run", config, "--out", (out / tag).string()};
      for (const auto& s : sets) args.insert(args.end(), {"--set", s});
      ranks.push_back(spawn(args,
                            {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=" + std::to_string(port)},
                            (out / (tag + "-rank" + std::to_string(r) + ".log")).string(),
                            (r == 0 ? node0 : node1).string()));
    }
    auto start = Clock::now();
    for (auto& s : ranks) {
      if (!waitFor(s, start, start + std::chrono::seconds(90))) killAndReap(s);
    }
    return ranks;
  };
  auto first = runJob({}, "first");
  for (auto& s : first) ASSERT_EQ(exitCode(s), 0) << s.output();
  ASSERT_TRUE(fs::exists(node0 / "ckpt" / "step-00000004" / "manifest.json"));
  ASSERT_FALSE(fs::exists(node1 / "ckpt"));
  auto missing = runJob({"train.steps=6"}, "missing");
  for (auto& s : missing) {
    EXPECT_EQ(exitCode(s), 1) << s.output();
    EXPECT_TRUE(collie::testing::contains(
        s.output(), {"rank 1 has no ckpt/step-00000004, the checkpoint of step 4 "
                     "that rank 0 resumes from"}));
  }
  fs::copy(node0 / "ckpt", node1 / "ckpt", fs::copy_options::recursive);
  auto copied = runJob({"train.steps=6"}, "copied");
  for (auto& s : copied) EXPECT_EQ(exitCode(s), 0) << s.output();
  EXPECT_TRUE(
      collie::testing::contains(copied[0].output(), {"resumed from ckpt/step-00000004 at step 4"}));
  const std::vector<std::string> sharded = {"train.sharding=optimizer",
                                            "train.checkpoint_dir=zero"};
  for (auto& s : runJob(sharded, "sharded")) ASSERT_EQ(exitCode(s), 0) << s.output();
  EXPECT_TRUE(fs::exists(node0 / "zero/step-00000004/shard-00000-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(node0 / "zero/step-00000004/shard-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(node1 / "zero/step-00000004/shard-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(node1 / "zero/step-00000004/manifest.json"));
  auto more = sharded;
  more.push_back("train.steps=6");
  auto resumed = runJob(more, "sharded-resumed");
  for (auto& s : resumed) EXPECT_EQ(exitCode(s), 0) << s.output();
  EXPECT_TRUE(collie::testing::contains(resumed[0].output(),
                                        {"resumed from zero/step-00000004 at step 4"}));
}

TEST(Faults, RankThatNeverArrivesIsNamed) {
  std::string out = scratch("missing");
  auto ranks =
      startWorkers(longConfig("gloo", "5s"), 4, out, {"launch.rendezvous_timeout=2s"}, {2});
  auto start = Clock::now();
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(waitFor(ranks[r], start, start + std::chrono::seconds(30))) << ranks[r].output();
    EXPECT_NE(exitCode(ranks[r]), 0);
    EXPECT_TRUE(collie::testing::contains(
        ranks[r].output(),
        {"1 of 4 ranks did not arrive at the rendezvous within 2", "rank(s) 2 (store"}));
  }
}

// 4 ranks of a long all-reduce over the test's backend, one of which is signalled.
class Faults : public ::testing::TestWithParam<std::string> {
 protected:
  // Starts the ranks with a `timeout_s` timeout and, once every one is connected and
  // running, sends rank 2 `signal`. Then waits for each other rank to exit, within the
  // timeout and 5 s; one that does not is killed, and the test fails saying so.
  void signalRankTwo(const std::string& name, int signal, int timeout_s) {
    ranks_ = startWorkers(longConfig(GetParam(), std::to_string(timeout_s) + "s"), 4,
                          scratch(name + "-" + GetParam()));
    // Under an outside launcher only rank 0 logs below warnings; it is connected once
    // every rank is.
    ASSERT_TRUE(waitUntilConnected({ranks_[0].log}, 1)) << ranks_[0].output();
    for (auto& r : ranks_) ASSERT_FALSE(waitFor(r, Clock::now(), Clock::now())) << r.output();
    ::kill(ranks_[2].pid, signal);
    const auto start = Clock::now();
    for (int r : {0, 1, 3}) {
      const bool exited = waitFor(ranks_[r], start, start + std::chrono::seconds(timeout_s + 5));
      if (!exited) killAndReap(ranks_[r]);
      EXPECT_TRUE(exited) << "rank " << r << " still running " << timeout_s + 5
                          << " s after rank 2 got " << strsignal(signal);
    }
  }

  std::vector<Spawned> ranks_;
  Reaper reaper_{&ranks_};
};

// SIGKILL one rank of 4 in the middle of the all-reduces: every other rank exits non-zero
// within timeout + 5 s, naming the dead rank.
TEST_P(Faults, KilledRankIsNamedByEveryOtherRank) {
  ASSERT_NO_FATAL_FAILURE(signalRankTwo("killed", SIGKILL, 5));
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(exitCode(ranks_[r]), 1) << ranks_[r].output();
    EXPECT_TRUE(collie::testing::contains(ranks_[r].output(), {"rank(s) 2 reported nothing"}));
  }
  killAndReap(ranks_[2]);
}

// SIGSTOP one rank: the others wait out the timeout (not less) and then say so.
TEST_P(Faults, StoppedRankMakesTheOthersTimeOut) {
  ASSERT_NO_FATAL_FAILURE(signalRankTwo("stopped", SIGSTOP, 3));
  for (int r : {0, 1, 3}) {
    EXPECT_GE(ranks_[r].seconds, 2.9) << "rank " << r << " gave up before the 3 s timeout";
    EXPECT_EQ(exitCode(ranks_[r]), 1) << ranks_[r].output();
    std::string o = ranks_[r].output();
    // Its own wait timed out, or a neighbour that timed out first left (Gloo says the
    // connection closed; UCX that the endpoint's connection failed).
    EXPECT_TRUE(o.find("timed out after 3000 ms") != std::string::npos ||
                o.find("Connection closed by peer") != std::string::npos ||
                o.find("'s connection failed") != std::string::npos)
        << o;
    EXPECT_TRUE(collie::testing::contains(o, {"rank(s) 2 reported nothing"}));
  }
  killAndReap(ranks_[2]);
}

INSTANTIATE_TEST_SUITE_P(Backends, Faults, ::testing::Values("gloo", "ucx"),
                         [](const auto& info) { return info.param; });

TEST(Launcher, WorkerDeathStopsTheJobAndLeavesNoProcess) {
  std::string out = scratch("launcher-kill");
  auto launcher = spawn({"run", longConfig("gloo", "5s"), "--out", out}, {}, out + ".log");
  ASSERT_TRUE(waitUntilConnected({launcher.log}, 4)) << launcher.output();
  auto workers = processesWith(out);
  workers.erase(std::remove(workers.begin(), workers.end(), launcher.pid), workers.end());
  ASSERT_EQ(workers.size(), 4u) << launcher.output();
  ::kill(workers[1], SIGKILL);
  auto start = Clock::now();
  ASSERT_TRUE(waitFor(launcher, start, start + std::chrono::seconds(20))) << launcher.output();
  EXPECT_EQ(exitCode(launcher), 1) << launcher.output();
  EXPECT_TRUE(collie::testing::contains(
      launcher.output(),
      {"failed; every other rank was stopped. First failure: rank ",
       "(pid " + std::to_string(workers[1]) + ") was killed by signal 9 (SIGKILL)"}));
  EXPECT_TRUE(processesWith(out).empty());
}

// launch.max_restarts: a worker killed mid-training makes the launcher restart every
// worker, and they resume from the newest checkpoint and finish the run.
TEST(Launcher, RestartResumesTrainingFromTheNewestCheckpoint) {
  const std::string out = scratch("restart"), checkpoints = out + "-ckpt";
  const std::string config = writeTempFile(
      "restart.yaml",
      "name: restart\nlaunch: {nproc_per_node: 2, max_restarts: 1}\n"
      "backend: {plugin: gloo, params: {timeout: 20s}}\n"
      "model: {plugin: gpt, params: {layers: 2, d_model: 64, heads: 4, seq_len: 64, vocab: 256}}\n"
      "train: {steps: 80, micro_batch: 8, checkpoint_every: 5, log_every: 1000, "
      "checkpoint_dir: " +
          checkpoints + "}\n");
  auto launcher = spawn({"run", config, "--out", out}, {}, out + ".log");
  std::vector<Spawned> keep{launcher};
  Reaper reaper{&keep};
  auto haveCheckpoint = [&] {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(checkpoints, ec)) {
      if (fs::exists(entry.path() / "manifest.json")) return true;
    }
    return false;
  };
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline && !haveCheckpoint()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(haveCheckpoint()) << launcher.output();
  auto workers = processesWith(out);
  workers.erase(std::remove(workers.begin(), workers.end(), launcher.pid), workers.end());
  ASSERT_EQ(workers.size(), 2u) << launcher.output();
  ::kill(workers[1], SIGKILL);
  auto start = Clock::now();
  ASSERT_TRUE(waitFor(keep[0], start, start + std::chrono::seconds(120))) << keep[0].output();
  const std::string text = keep[0].output();
  EXPECT_EQ(exitCode(keep[0]), 0) << text;
  EXPECT_TRUE(collie::testing::contains(
      text, {"was killed by signal 9 (SIGKILL); restarting all 2 workers (restart 1 of "
             "1) from the newest checkpoint",
             "resumed from " + checkpoints, "weights identical at step 80"}));
  EXPECT_TRUE(processesWith(out).empty());
}

TEST(Launcher, AFailureAfterTheLastRestartEndsTheJobWithAnErrorFile) {
  // SGD at lr 1000 diverges the same way on every attempt: one restart, then the end.
  const std::string out = scratch("last-restart");
  const std::string config = writeTempFile("last-restart.yaml", R"(name: last-restart
launch: {nproc_per_node: 2, max_restarts: 1}
backend: {plugin: gloo, params: {timeout: 20s}}
model: {plugin: mlp, params: {seq_len: 6, vocab: 48, d_embed: 8, hidden: 32, layers: 2}}
train: {steps: 50, micro_batch: 4, optimizer: sgd, lr: 1000, grad_clip: 0,
        lr_schedule: constant, log_every: 100}
)");
  auto r = runCollie({"run", config, "--out", out});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(collie::testing::contains(
      r.output, {"restarting all 2 workers (restart 1 of 1)", "(after 1 restart(s))"}));
  std::ifstream in(fs::path(out) / "error.json");
  ASSERT_TRUE(in.is_open()) << "no error.json in " << out << "\n" << r.output;
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* field :
       {"\"restarts\": 1", "\"max_restarts\": 1", "\"exit_code\": 1", "\"signal\": 0",
        "\"failed_rank\": ", "\"time\": \"20", "the loss is"}) {
    EXPECT_TRUE(collie::testing::contains(text, {field})) << field << " not in " << text;
  }
  EXPECT_TRUE(processesWith(out).empty()) << "a worker outlived the job";
}

// `collie run` of the long all-reduce on 4 ranks over `backend` into `out`, returned once
// every rank has connected, with the launcher and its 4 workers running.
void startLongJob(const std::string& backend, const std::string& out, Spawned* launcher) {
  *launcher = spawn({"run", longConfig(backend, "5s"), "--out", out}, {}, out + ".log");
  ASSERT_TRUE(waitUntilConnected({launcher->log}, 4)) << launcher->output();
  ASSERT_EQ(processesWith(out).size(), 5u) << launcher->output();
}

TEST(Launcher, SigtermIsForwardedAndEveryWorkerStops) {
  const std::string out = scratch("launcher-term");
  Spawned launcher;
  ASSERT_NO_FATAL_FAILURE(startLongJob("ucx", out, &launcher));
  ::kill(launcher.pid, SIGTERM);
  auto start = Clock::now();
  ASSERT_TRUE(waitFor(launcher, start, start + std::chrono::seconds(15))) << launcher.output();
  EXPECT_EQ(exitCode(launcher), 128 + SIGTERM) << launcher.output();
  EXPECT_TRUE(processesWith(out).empty());
}

TEST(Launcher, KilledLauncherTakesItsWorkersWithIt) {
  const std::string out = scratch("launcher-killed");
  Spawned launcher;
  ASSERT_NO_FATAL_FAILURE(startLongJob("gloo", out, &launcher));
  ::kill(launcher.pid, SIGKILL);
  ::waitpid(launcher.pid, nullptr, 0);
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!processesWith(out).empty() && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(processesWith(out).empty());
}

// `collie launch` on two "nodes" of this machine: 2 workers each, one job of 4 ranks; only
// node 0 prints the table.
TEST(Launcher, TwoNodesMakeOneJob) {
  std::string out = scratch("two-nodes");
  const std::string port = std::to_string(collie::pickFreePort("127.0.0.1"));
  const std::string config = shortConfig("gloo", 2);
  std::vector<Spawned> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(spawn(
        {"launch", "--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
         "127.0.0.1", "--master-port", port, config, "--out", out + "/node" + std::to_string(node)},
        {}, out + "/node" + std::to_string(node) + ".log"));
  }
  auto start = Clock::now();
  for (auto& n : nodes) {
    bool exited = waitFor(n, start, start + std::chrono::seconds(60));
    if (!exited) killAndReap(n);
    ASSERT_TRUE(exited) << n.output();
    EXPECT_EQ(exitCode(n), 0) << n.output();
  }
  EXPECT_TRUE(collie::testing::contains(
      nodes[0].output(),
      {"4 ranks on gloo (processes)", "Wrong elements: 0 (all results correct)"}));
  EXPECT_EQ(nodes[1].output().find("Wrong elements"), std::string::npos) << nodes[1].output();
  auto bad = runCollie({"launch", "--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1",
                        "--master-port", port, config});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(collie::testing::contains(bad.output, {"--node-rank 2 must be below --nnodes 2"}));
  // Across hosts, a job needs a token before anything starts.
  bad = runCollie({"launch", "--nnodes", "2", "--node-rank", "1", "--master-addr", "198.18.0.1",
                   "--master-port", port, config});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(collie::testing::contains(
      bad.output, {"meets at 198.18.0.1, which other hosts reach, and has no job token"}));
}

// launch.token_file: node 0 writes it (mode 0600) and node 1 reads it; a node with another
// token is refused by the store, by name.
TEST(Launcher, NodesShareTheTokenFileAndAnotherTokenIsRefused) {
  const std::string out = scratch("token");
  const std::string token = out + "/job-token", other = out + "/other-token";
  std::ofstream(other) << "not the job's\n";
  const std::string config = shortConfig("gloo", 1);
  auto launch = [&](const std::string& file, const std::string& tag) {
    const std::string port = std::to_string(collie::pickFreePort("127.0.0.1"));
    std::vector<Spawned> nodes;
    for (int node = 0; node < 2; ++node) {
      nodes.push_back(
          spawn({"launch", "--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
                 "127.0.0.1", "--master-port", port, config, "--set",
                 "launch.token_file=" + (node == 0 ? token : file), "--set",
                 "launch.rendezvous_timeout=5s", "--out", out + "/" + tag + std::to_string(node)},
                {}, out + "/" + tag + std::to_string(node) + ".log"));
    }
    auto start = Clock::now();
    for (auto& n : nodes) {
      if (!waitFor(n, start, start + std::chrono::seconds(60))) killAndReap(n);
    }
    return nodes;
  };
  auto shared = launch(token, "shared");
  for (auto& n : shared) EXPECT_EQ(exitCode(n), 0) << n.output();
  struct stat st {};
  ASSERT_EQ(::stat(token.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto refused = launch(other, "refused");
  EXPECT_NE(exitCode(refused[1]), 0);
  EXPECT_TRUE(
      collie::testing::contains(refused[1].output(), {"refused this rank: a wrong job token"}));
  EXPECT_NE(exitCode(refused[0]), 0) << "node 0 ran without node 1";
}

// A backend param that cannot work is bad input on every rank, named, not a hang.
TEST(Processes, BadBackendParamsAreBadInput) {
  auto r = runCollie(
      {"run", shortConfig("ucx", 2, ", transports: carrier-pigeon"), "--out", scratch("pigeon")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"unknown transport 'carrier-pigeon'"}));
  // The launcher's own last line repeats the failed rank's error.
  EXPECT_TRUE(collie::testing::contains(
      r.output, {"exited with code 2: backend ucx: params.transports: unknown "
                 "transport"}));
  r = runCollie(
      {"run", shortConfig("gloo", 2, ", interface: nonexistent0"), "--out", scratch("nic")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Named before Gloo tries it, with the interfaces this host has.
  EXPECT_TRUE(collie::testing::contains(
      r.output,
      {"backend gloo: params.interface 'nonexistent0' does not exist on host", "it has: lo"}));
  r = runCollie(
      {"run", shortConfig("ucx", 2, ", interface: nonexistent0"), "--out", scratch("nic-ucx")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(collie::testing::contains(
      r.output, {"backend ucx: params.interface 'nonexistent0' does not exist"}));
  r = runCollie(
      {"run", shortConfig("ucx", 2, ", rendezvous_threshold: soon"), "--out", scratch("rndv")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"rendezvous_threshold"}));
  r = runCollie(
      {"run", shortConfig("gloo", 2, ", loop_thread: sometimes"), "--out", scratch("loop-gloo")});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(
      collie::testing::contains(r.output, {"params.loop_thread: expected batch or normal"}));
}
