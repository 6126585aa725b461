// The collie command line as a user meets it: exit codes 0/1/2 and one clear error line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "bench/policy.h"
#include "collie/config.h"
#include "config/rules.h"
#include "expect.h"
#include "run_command.h"
#include "util/system.h"

namespace collie {
namespace {

using testing::runCollie;
using testing::writeTempFile;

const std::string kRingVsTree = std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/ring-vs-tree.yaml";

// Options that make the ring-vs-tree bench take a second.
const std::vector<std::string> kShort = {"--set", "bench.max_bytes=64KiB", "--set", "bench.iters=2",
                                         "--set", "bench.warmup_iters=1"};

std::vector<std::string> args(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

void expectBadInput(const testing::CommandResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"collie: error: ", needle}));
  EXPECT_TRUE(testing::lacks(r.output, {"internal error"}));
}

TEST(Cli, VersionNamesAbiFingerprintAndBlas) {
  auto r = runCollie({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(testing::contains(r.output, {"plugin ABI " + std::to_string(COLLIE_ABI_MAJOR) + ".",
                                           "build fingerprint: ", "BLAS: "}));
}

TEST(Cli, HelpOnEachCommandExitsZero) {
  for (auto cmd : {std::vector<std::string>{"--help"},
                   {"run", "--help"},
                   {"validate", "--help"},
                   {"plugins", "--help"}}) {
    auto r = runCollie(cmd);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(testing::contains(r.output, {"Usage"}));
  }
}

TEST(Cli, BadCommandLineExitsTwo) {
  EXPECT_EQ(runCollie({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(runCollie({"run"}).exit_code, 2);
  EXPECT_EQ(runCollie({"--log-level", "loud", "plugins"}).exit_code, 2);
}

TEST(Cli, PluginsListsTheShippedPlugins) {
  auto r = runCollie({"plugins"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (auto name : {"loopback", "ring", "tree"}) {
    EXPECT_TRUE(testing::contains(r.output, {std::string(" ") + name + " "}));
  }
  // The longest name still stands apart from its version.
  EXPECT_TRUE(testing::contains(r.output, {"double_binary_tree  1."}));
}

TEST(Cli, PluginsListsRejectedFilesWithTheirReason) {
  auto r =
      runCollie({"plugins"}, {std::string("COLLIE_PLUGIN_PATH=") + COLLIE_TEST_ABI_PLUGIN_DIR});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      testing::contains(r.output, {"Rejected", "bad descriptor magic", "not a shared library"}));
}

TEST(Cli, QuickstartRunsAndSavesResolvedConfigAndResults) {
  auto out = std::filesystem::temp_directory_path() / ("collie-cli-" + std::to_string(::getpid()));
  auto r = runCollie(args({"run", kRingVsTree, "--out", out.string()}, kShort));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"#wrong", "Wrong elements: 0"}));
  for (auto f : {"config.yaml", "results.csv", "results.json"}) {
    EXPECT_TRUE(std::filesystem::exists(out / f)) << f;
  }
  std::ifstream saved(out / "config.yaml");
  std::string text((std::istreambuf_iterator<char>(saved)), {});
  EXPECT_TRUE(testing::contains(text, {"max_bytes: 64KiB"}));  // --set applied
  EXPECT_TRUE(testing::contains(text, {"step_factor: 2"}));    // default filled
  std::filesystem::remove_all(out);
}

TEST(Cli, MatrixRunsCollectIntoOneTable) {
  auto out = std::filesystem::temp_directory_path() / ("collie-mx-" + std::to_string(::getpid()));
  std::string config = writeTempFile("matrix.yaml", R"(backend: loopback
launch: {nproc_per_node: 2}
bench: {schedulers: [ring, tree], min_bytes: 1KiB, max_bytes: 4KiB, iters: 2, warmup_iters: 0}
matrix:
  bench.op: [sum, max]
  launch.nproc_per_node: [2, 3]
)");
  auto r = runCollie({"run", config, "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"# run: bench.op=max, launch.nproc_per_node=3"}));
  EXPECT_TRUE(std::filesystem::exists(out / "config-3.yaml"));
  std::filesystem::remove_all(out);
}

TEST(Cli, ValidateChecksWithoutRunning) {
  auto r = runCollie({"validate", kRingVsTree});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"OK, 1 run(s)"}));
  // --set takes one value: the file may follow it, and a second value is refused.
  r = runCollie({"validate", "--set", "bench.iters=3", kRingVsTree});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = runCollie({"validate", kRingVsTree, "--set", "bench.iters=3", "bench.warmup=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(
      testing::contains(r.output, {"The following argument was not expected: bench.warmup=1"}));
}

// What scripts/quickstart.sh builds before the main job: every plugin a file names, once, with
// the --set overrides applied, and none opened (a name that no file provides is listed, not
// refused).
TEST(Cli, ValidateListsThePluginsAFileNamesWithoutOpeningThem) {
  const std::string dir = std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/";
  auto r = runCollie({"validate", dir + "quickstart.yaml", "--list-plugins"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "backend gloo\nmodel gpt\nscheduler ring\n");
  r = runCollie({"validate", dir + "quickstart.yaml", "--set", "backend=no_such_backend", "--set",
                 "train.compression=bf16", "--list-plugins"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "backend no_such_backend\nmodel gpt\nscheduler ring\ncodec bf16\n");
  // A matrix: each plugin once, in the order the runs first name it (auto's candidates too).
  r = runCollie({"validate", dir + "slow-link.yaml", "--list-plugins"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "backend gloo\nmodel gpt\nscheduler ring\ncodec bf16\ncodec powersgd\n");
  expectBadInput(
      runCollie({"validate", dir + "quickstart.yaml", "--set", "train.steps=0", "--list-plugins"}),
      "train.steps");
}

TEST(Cli, BadConfigsExitTwoWithLocation) {
  std::string path = writeTempFile("typo.yaml", "backend: loopback\nbench:\n  schedulrs: [ring]\n");
  expectBadInput(runCollie({"run", path}),
                 "typo.yaml:3:3: bench.schedulrs: unknown key (did you mean 'schedulers'?)");
  expectBadInput(runCollie({"validate", path}), "bench.schedulers: missing required key");
  expectBadInput(runCollie({"run", kRingVsTree, "--set", "bench.iters=-4"}),
                 "--set bench.iters: bench.iters: expected an integer");
  expectBadInput(runCollie({"run", "/nonexistent.yaml"}), "cannot open config");
  expectBadInput(runCollie({"run", COLLIE_TEST_SOURCE_DIR}), "is a directory");
  expectBadInput(runCollie({"run", writeTempFile("empty.yaml", "")}), "the file is empty");
  expectBadInput(runCollie({"run", writeTempFile("list.yaml", "- a\n- b\n")}),
                 "expected a map of experiment keys");
}

TEST(Cli, UnreadableFileExitsTwo) {
  std::string path = writeTempFile("secret.yaml", "backend: loopback\n");
  ::chmod(path.c_str(), 0);
  expectBadInput(runCollie({"validate", "/proc/self/mem"}), "cannot read config");
  if (::geteuid() != 0) {
    expectBadInput(runCollie({"run", path}), "Permission denied");
    return;
  }
  // root reads anything through its capabilities (CAP_DAC_OVERRIDE): run this one command as
  // root without any, with setpriv (util-linux, which scripts/setup.sh installs), so that the
  // build tree stays executable whoever owns it.
  if (::access("/usr/bin/setpriv", X_OK) != 0)
    GTEST_SKIP() << "as root the file is readable, and /usr/bin/setpriv (util-linux) is missing "
                    "to drop the capabilities that make it so";
  testing::CommandResult r;
  r.exit_code = detail::runProgram({"/usr/bin/setpriv", "--inh-caps=-all", "--bounding-set=-all",
                                    COLLIE_TEST_BINARY, "run", path},
                                   &r.output);
  // setpriv needs CAP_SETPCAP to drop the bounding set; a container without it refuses.
  if (r.output.rfind("setpriv:", 0) == 0)
    GTEST_SKIP() << "setpriv could not drop root's capabilities here: " << r.output;
  expectBadInput(r, "Permission denied");
}

TEST(Cli, MissingPluginIsAHardErrorWithAHint) {
  auto r = runCollie(args({"run", kRingVsTree, "--set", "bench.schedulers=[rnig]"}, kShort));
  expectBadInput(r, "no scheduler plugin named 'rnig' (did you mean 'ring'?)");
  EXPECT_TRUE(testing::contains(r.output, {"HINT: `collie plugins`"}));
  r = runCollie(args({"run", kRingVsTree, "--set", "backend=mpi"}, kShort));
  expectBadInput(r, "no backend plugin named 'mpi'");
}

// An installation without libcollie_torch.so (the part that links LibTorch): a bench still
// runs, since nothing but training loads it, and training names the file it cannot load.
TEST(Cli, TrainingWithoutTheLibTorchPartNamesTheMissingFile) {
  namespace fs = std::filesystem;
  const fs::path lib = fs::path(COLLIE_TEST_BINARY).parent_path().parent_path() / "lib";
  const fs::path dir = fs::path(writeTempFile("no-libtorch-part.txt", "")).parent_path() / "lib";
  fs::create_directories(dir);
  for (const std::string& file :
       {std::string("libcollie_app.so"), "libcollie_core.so." + std::to_string(COLLIE_ABI_MAJOR)}) {
    fs::copy_file(lib / file, dir / file, fs::copy_options::overwrite_existing);
  }
  // The copies come first on the library path, so they are the ones this collie runs with.
  const std::vector<std::string> env = {"LD_LIBRARY_PATH=" + dir.string(),
                                        "COLLIE_PLUGIN_PATH=" + (lib / "collie").string()};
  auto r = runCollie(args({"run", kRingVsTree}, kShort), env);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string quickstart = std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/quickstart.yaml";
  r = runCollie({"run", quickstart, "--set", "train.steps=2"}, env);
  expectBadInput(r, "cannot load collie's LibTorch part " + (dir / "libcollie_torch.so").string());
  r = runCollie({"--version"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"LibTorch (for training): not loadable"}));
}

TEST(Cli, UnknownPluginParamIsRejected) {
  auto r = runCollie(args({"run", kRingVsTree, "--set",
                           "bench.schedulers=[{plugin: ring, params: {chunk_byte: 4KiB}}]"},
                          kShort));
  expectBadInput(r, "unknown param 'chunk_byte' (did you mean 'chunk_bytes'?)");
}

TEST(Cli, SchedulerThatCannotRunTheCollectiveIsBadInput) {
  auto r =
      runCollie(args({"run", kRingVsTree, "--set", "bench.collective=reduce_scatter"}, kShort));
  expectBadInput(r, "bench.schedulers: 'tree' cannot run reduce_scatter");
}

TEST(Cli, LogLevelFlagAndEnvironment) {
  auto quiet = runCollie(args({"--log-level", "error", "run", kRingVsTree}, kShort));
  EXPECT_EQ(quiet.exit_code, 0);
  EXPECT_TRUE(testing::lacks(quiet.output, {"[info]"}));
  auto verbose = runCollie(args({"run", kRingVsTree}, kShort), {"COLLIE_LOG_LEVEL=debug"});
  EXPECT_EQ(verbose.exit_code, 0);
  EXPECT_TRUE(testing::contains(verbose.output, {"[r0 debug]"}));
}

}  // namespace
}  // namespace collie

namespace collie {
namespace {

// nccl moves device memory only: quickstart over it (train.device: cpu) is refused by name,
// and without a GPU train.device: cuda stops too, each before any rank starts, in one line.
TEST(Cli, NcclIsRefusedBeforeAnyRankStartsWhereItCannotRun) {
  if (!std::filesystem::exists(COLLIE_TEST_PLUGIN_DIR "/libcollie_backend_nccl.so")) {
    GTEST_SKIP() << "the nccl backend is not built here (no CUDA toolkit with NCCL)";
  }
  const std::string quickstart = std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/quickstart.yaml";
  auto one_line = [](const testing::CommandResult& r) {
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_EQ(r.output.find("[r0"), std::string::npos) << "a rank started:\n" << r.output;
  };
  auto r = runCollie({"run", quickstart, "--set", "backend=nccl"});
  expectBadInput(r, "backend 'nccl' moves device memory only, but train.device is cpu");
  one_line(r);
  if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr || std::filesystem::exists("/dev/nvidia0")) {
    return;  // a machine with a GPU may run the cuda case
  }
  r = runCollie({"run", quickstart, "--set", "backend=nccl", "--set", "train.device=cuda"});
  expectBadInput(r, "train.device: cuda, but this process sees no CUDA device");
  one_line(r);
}

// Each run of a file listens on the next port: one that would pass 65535 is refused before
// the first run starts (it wrapped to 0, which read as "MASTER_PORT is not set").
TEST(Cli, RunPortsPastTheLastPortAreRefusedBeforeAnyRun) {
  auto r = runCollie(
      args({"run", kRingVsTree, "--set", "backend=gloo", "--set", "launch.master_port=65535",
            "--set", "matrix=[{bench.iters: 1}, {bench.iters: 2}]"},
           kShort));
  expectBadInput(r, "run 2 of 2 would listen on port 65535 + 1 = 65536, past 65535");
  EXPECT_EQ(r.output.find("run 1/2"), std::string::npos) << "a run started:\n" << r.output;
}

TEST(CliPluginCheck, PassesForAShippedSchedulerAndABackend) {
  auto r = testing::runCollie({"plugin-check", "tree", "--worlds", "1,2,3", "--large-count", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"PASS scheduler tree over loopback"}));
  r = testing::runCollie({"plugin-check", "loopback", "--worlds", "2,3", "--large-count", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"PASS backend loopback contract"}));
}

TEST(CliPluginCheck, FailsOnABrokenSchedulerWithAReport) {
  auto r = testing::runCollie(
      {"plugin-check",
       std::string(COLLIE_TEST_BINARY_DIR) + "/conformance/plugins/libcollie_scheduler_lossy.so",
       "--worlds", "2,3", "--large-count", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(
      testing::contains(r.output, {"FAIL scheduler", "wrong elements", "plugin-check: FAIL"}));
}

TEST(CliPluginCheck, BackendParamsReachTheBackendAScheduleIsCheckedOver) {
  // The loopback's timeout is a param it reads; a typo is refused, naming what it knows.
  auto r = testing::runCollie({"plugin-check", "ring", "--backend-param", "timeout=5s", "--worlds",
                               "2", "--large-count", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = testing::runCollie({"plugin-check", "ring", "--backend-param", "timeuot=5s", "--worlds", "2",
                          "--large-count", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"unknown param 'timeuot'"}));
  // For a backend under test its params are --param: --backend-param is refused.
  r = testing::runCollie({"plugin-check", "loopback", "--backend-param", "timeout=5s"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"give its params with --param"}));
}

TEST(CliPluginCheck, UnknownPluginIsBadInput) {
  auto r = testing::runCollie({"plugin-check", "rnig"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"did you mean 'ring'"}));
}

// Where a payload of the tests below would have left its mark: gnuplot runs in the output
// folder, collie in the test's working directory.
bool payloadRan(const std::filesystem::path& out) {
  return std::filesystem::exists(out / "owned") || std::filesystem::exists("owned");
}

TEST(CliBench, ALabelCannotReachGnuplot) {
  auto out =
      std::filesystem::temp_directory_path() / ("collie-label-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  std::filesystem::remove("owned");
  const std::string payload = "x'; system('touch owned'); #";
  auto r = runCollie(args({"run", kRingVsTree, "--out", out.string(), "--set",
                           "backend={plugin: loopback, label: \"" + payload + "\"}"},
                          kShort));
  expectBadInput(r, "backend: the label 'x'; system('touch owned'); #' holds the character 0x27");
  EXPECT_FALSE(payloadRan(out));
  r = runCollie(args({"run", kRingVsTree, "--out", out.string(), "--set",
                      "bench.schedulers=[{plugin: ring, label: \"a\\nb\"}]"},
                     kShort));
  expectBadInput(r, "bench.schedulers[0]: the label");
  std::filesystem::remove_all(out);
}

TEST(CliBench, MinTimeGivesShortMessagesMoreCalls) {
  // bench.min_time: 1 timed call of a microsecond-long all-reduce becomes as many as 50 ms
  // need, the same on every rank (else they would wait for each other's extra calls).
  auto out =
      std::filesystem::temp_directory_path() / ("collie-mintime-" + std::to_string(::getpid()));
  std::string config = writeTempFile("mintime.yaml", R"(backend: loopback
launch: {nproc_per_node: 2}
bench: {schedulers: [ring], min_bytes: 1KiB, max_bytes: 1KiB, iters: 1, warmup_iters: 0,
        repeats: 1, calibrate: false, plots: false}
)");
  for (const std::string min_time : {"0s", "50ms"}) {
    std::filesystem::remove_all(out);
    auto r =
        runCollie({"run", config, "--out", out.string(), "--set", "bench.min_time=" + min_time});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream csv(out / "results.csv");
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    ASSERT_TRUE(testing::contains(header, {",repeats,iters,"}));
    // The iters field: the 13th.
    std::stringstream fields(row);
    std::string field;
    for (int i = 0; i < 13; ++i) std::getline(fields, field, ',');
    const int iters = std::stoi(field);
    if (min_time == "0s") {
      EXPECT_EQ(iters, 1) << row;
      EXPECT_TRUE(testing::contains(r.output, {"(1 calls each)"}));
    } else {
      EXPECT_GT(iters, 10) << row;  // a 1 KiB loopback all-reduce takes well under 5 ms
    }
  }
  std::filesystem::remove_all(out);
}

TEST(CliBench, MatrixTextReachesPlotsAndCsvAsDataOnly) {
  // A matrix point's text is free (here a description) and names every line of the plots
  // and the CSV's run column: it must stay data there.
  auto out = std::filesystem::temp_directory_path() / ("collie-plot-" + std::to_string(::getpid()));
  std::filesystem::remove_all(out);
  std::filesystem::remove("owned");
  std::string config = writeTempFile("payload.yaml", R"(backend: loopback
launch: {nproc_per_node: 2}
bench: {schedulers: [ring], min_bytes: 1KiB, max_bytes: 2KiB, iters: 1, warmup_iters: 0}
matrix:
  description: ["a'\nsystem('touch owned')\n#", "b, \"quoted\""]
)");
  auto r = runCollie({"run", config, "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(testing::contains(r.output, {"# Plots: "}));
  EXPECT_FALSE(payloadRan(out)) << "text of the config ran as a gnuplot command";
  // RFC 4180: every row has the header's 20 fields, however the run's text reads.
  std::ifstream csv(out / "results.csv");
  std::string text((std::istreambuf_iterator<char>(csv)), {});
  std::vector<int> fields(1, 1);
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      ++fields.back();
    } else if (c == '\n' && !quoted && i + 1 < text.size()) {
      fields.push_back(1);
    }
  }
  EXPECT_FALSE(quoted) << text;
  ASSERT_EQ(fields.size(), 5u) << text;  // the header and 2 sizes x 2 points
  for (int f : fields) EXPECT_EQ(f, 20) << text;
  std::filesystem::remove_all(out);
}

nlohmann::json resultRows(const std::filesystem::path& out) {
  std::ifstream json(out / "results.json");
  return nlohmann::json::parse(json);
}

TEST(CliBench, EveryMeasurementIsRepeatedAndGivesItsSpread) {
  auto out =
      std::filesystem::temp_directory_path() / ("collie-repeat-" + std::to_string(::getpid()));
  auto r = runCollie(args(args({"run", kRingVsTree, "--out", out.string()}, kShort),
                          {"--set", "bench.repeats=3", "--set", "bench.max_bytes=16KiB"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      testing::contains(r.output, {"# time: median of 3 repeat(s)", "# host ", "rank(s), "}));
  const auto rows = resultRows(out);
  ASSERT_EQ(rows.size(), 6u);  // 4, 8 and 16 KiB x ring, tree
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("repeats"), 3);
    const double low = row.at("time_min_us"), mid = row.at("time_us"), high = row.at("time_max_us");
    EXPECT_GT(low, 0);
    EXPECT_LE(low, mid);
    EXPECT_LE(mid, high);
  }
  r = runCollie(
      args({"run", kRingVsTree, "--out", out.string(), "--set", "bench.repeats=0"}, kShort));
  expectBadInput(r, "bench.repeats");
  std::filesystem::remove_all(out);
}

TEST(CliBench, TimesBarriersOfTheSchedulersThatHaveOne) {
  auto out =
      std::filesystem::temp_directory_path() / ("collie-barrier-" + std::to_string(::getpid()));
  auto r = runCollie(
      args({"run", kRingVsTree, "--out", out.string(), "--set", "bench.collective=barrier", "--set",
            "bench.schedulers=[tree, halving_doubling]", "--set", "bench.repeats=3"},
           kShort));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"# Fastest (measured): "}));
  EXPECT_TRUE(testing::lacks(r.output, {"Avg bus bandwidth"}));
  const auto rows = resultRows(out);
  ASSERT_EQ(rows.size(), 2u);  // sizes do not apply: one row per scheduler
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("collective"), "barrier");
    EXPECT_EQ(row.at("bytes"), 0);
    EXPECT_GT(row.at("time_us").get<double>(), 0);
    EXPECT_EQ(row.at("wrong"), 0);
  }
  // ring has no barrier: said before anything is timed, naming it once.
  r = runCollie(args(
      {"run", kRingVsTree, "--out", out.string(), "--set", "bench.collective=barrier"}, kShort));
  expectBadInput(r, "'ring' cannot run a barrier: ring: barrier is not implemented");
  std::filesystem::remove_all(out);
}

TEST(CliBench, EmittedRulesKeepEachSchedulersParams) {
  // Only the hierarchical entries: whichever wins a size, its rule must name its intra and
  // inter, or auto would run the default hierarchical (ring, ring) instead.
  auto dir =
      std::filesystem::temp_directory_path() / ("collie-hrules-" + std::to_string(::getpid()));
  const std::string rules = (dir / "rules.yaml").string();
  auto r = runCollie(
      args({"run", std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/compare-hierarchical.yaml",
            "--out", dir.string(), "--emit-rules", rules, "--set",
            "bench.schedulers=[{plugin: hierarchical, label: ht, params: {intra: "
            "ring, inter: tree}}, {plugin: hierarchical, label: hh, params: "
            "{intra: ring, inter: halving_doubling}}]"},
           kShort));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  RulesFile written = config::readRulesFile(rules);
  ASSERT_FALSE(written.rules.empty());
  EXPECT_EQ(written.world_size, 4);
  for (const auto& rule : written.rules) {
    EXPECT_EQ(rule.choice.plugin, "hierarchical");
    ASSERT_EQ(rule.choice.params.size(), 2u) << rule.choice.name();
    EXPECT_EQ(rule.choice.params.at("intra"), "ring") << rule.choice.name();
    EXPECT_NE(rule.choice.params.at("inter"), "ring") << rule.choice.name();
  }
  // And the calibration the bench made is saved for auto, between the emulated nodes with
  // the one-way stream's β beside the exchange's.
  std::ifstream saved(dir / "calibration.json");
  ASSERT_TRUE(saved) << r.output;
  const auto calibration = nlohmann::json::parse(saved);
  EXPECT_GT(calibration.at("inter").at("beta").get<double>(), 0);
  EXPECT_EQ(calibration.at("fits").at("inter_one_way").at("sizes"), 2);
  // Threads on two shared cores can time the larger stream no slower than the smaller one;
  // then the slope is not a bandwidth, the header says so and auto falls back on the
  // exchange's β (0 in the file). Either way the header reports the stream.
  if (calibration.at("inter").at("beta_one_way").get<double>() > 0)
    EXPECT_TRUE(testing::contains(r.output, {" GB/s (streamed, 2 sizes)"}));
  else
    EXPECT_TRUE(testing::contains(r.output, {"one way not resolved (streamed, 2 sizes"}));
  std::filesystem::remove_all(dir);
}

// --emit-policy writes Open MPI's rules from the same choices --emit-rules makes, read back as
// written, and says what each size range became; a train experiment and a collective Open
// MPI's rules cannot name are refused before anything runs.
TEST(CliBench, EmitPolicyWritesOpenMpisRulesFromTheRulesForAuto) {
  auto dir =
      std::filesystem::temp_directory_path() / ("collie-policy-" + std::to_string(::getpid()));
  const std::string rules = (dir / "rules.yaml").string();
  const std::string policy = (dir / "policy").string();
  std::filesystem::create_directories(dir);
  auto r = testing::runCollie({"run", kRingVsTree, "--out", dir.string(), "--emit-rules", rules,
                               "--emit-policy", policy, "--set", "bench.max_bytes=64KiB", "--set",
                               "bench.iters=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string file = policy + "/openmpi-coll-tuned.rules";
  EXPECT_TRUE(testing::contains(r.output, {"# Open MPI policy: " + file}));
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Each rule for auto is a range of the policy: ring as Open MPI's ring (4), tree as Open
  // MPI's own decision (0).
  const RulesFile written = config::readRulesFile(rules);
  const bench::OpenMpiPolicy read = bench::readOpenMpiRules(text, written.world_size);
  ASSERT_EQ(read.ranges.size(), written.rules.size()) << text;
  for (size_t i = 0; i < read.ranges.size(); ++i) {
    const std::string plugin = written.rules[i].choice.plugin;
    EXPECT_EQ(read.ranges[i].algorithm.id, plugin == "ring" ? 4 : 0) << plugin << "\n" << text;
    EXPECT_TRUE(
        testing::contains(r.output, {bench::rangeText(read.ranges[i].min_bytes) + ": " + plugin +
                                     (plugin == "ring" ? ": NCCL ring, Open MPI ring (4)"
                                                       : ": NCCL decides, Open MPI decides")}));
  }
  auto train =
      testing::runCollie({"run", std::string(COLLIE_TEST_SOURCE_DIR) + "/configs/quickstart.yaml",
                          "--emit-policy", policy});
  EXPECT_EQ(train.exit_code, 2) << train.output;
  EXPECT_TRUE(testing::contains(train.output, {"--emit-policy: "}));
  auto broadcast = testing::runCollie({"run", kRingVsTree, "--out", dir.string(), "--emit-policy",
                                       policy, "--set", "bench.collective=broadcast", "--set",
                                       "bench.schedulers=[tree]"});
  EXPECT_EQ(broadcast.exit_code, 2) << broadcast.output;
  EXPECT_TRUE(
      testing::contains(broadcast.output, {"no Open MPI equivalent for any broadcast scheduler"}));
  std::filesystem::remove_all(dir);
}

TEST(CliBench, EmitRulesThenAutoUsesThem) {
  auto dir =
      std::filesystem::temp_directory_path() / ("collie-rules-" + std::to_string(::getpid()));
  std::string rules = (dir / "rules.yaml").string();
  auto r = testing::runCollie({"bench", kRingVsTree, "--out", dir.string(), "--emit-rules", rules,
                               "--set", "bench.max_bytes=64KiB", "--set", "bench.iters=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(
      r.output, {"# Rules for auto: " + rules, "Crossovers (measured)", "predicted"}));
  r = testing::runCollie({"run", kRingVsTree, "--out", (dir / "auto").string(), "--set",
                          "bench.schedulers=[{plugin: auto, params: {rules_file: " + rules + "}}]",
                          "--set", "bench.max_bytes=64KiB", "--set", "bench.iters=2"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"Wrong elements: 0"}));
  // auto ran, at every size, the scheduler the rules name for it.
  RulesFile written = config::readRulesFile(rules);
  std::ifstream json(dir / "auto" / "results.json");
  const auto rows = nlohmann::json::parse(json);
  ASSERT_GT(rows.size(), 3u);
  for (const auto& row : rows) {
    const uint64_t bytes = row.at("bytes");
    const auto* rule = firstAdmitting(written.rules, bytes);
    ASSERT_NE(rule, nullptr) << bytes;
    EXPECT_EQ(row.at("scheduler"), "auto");
    EXPECT_EQ(row.at("ran"), rule->choice.name()) << bytes << " B";
  }
  // Rules against the grain of the built-in model (ring for small messages, tree for large)
  // are followed too: what ran is what the file says, not what auto would pick alone.
  const std::string against = writeTempFile("against.yaml", R"(collective: allreduce
rules:
  - {max_bytes: 8KiB, plugin: ring}
  - {plugin: tree}
)");
  r = runCollie({"run", kRingVsTree, "--out", (dir / "against").string(), "--set",
                 "bench.schedulers=[{plugin: auto, params: {rules_file: " + against + "}}]",
                 "--set", "bench.max_bytes=64KiB", "--set", "bench.iters=2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream against_json(dir / "against" / "results.json");
  for (const auto& row : nlohmann::json::parse(against_json)) {
    const uint64_t bytes = row.at("bytes");
    EXPECT_EQ(row.at("ran"), bytes <= 8192 ? "ring" : "tree") << bytes << " B";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace collie

namespace collie {
namespace {

// with the reference BLAS selected, collie must still run on OpenBLAS.
TEST(CliBlas, OpenBlasWinsOverTheReferenceBlas) {
  const std::string reference = "/usr/lib/x86_64-linux-gnu/blas";
  if (!std::filesystem::exists(reference + "/libblas.so.3")) {
    GTEST_SKIP() << "the reference BLAS (libblas3) is not installed";
  }
  auto r = testing::runCollie({"--version"}, {"LD_LIBRARY_PATH=" + reference});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"BLAS: ", "openblas"}));
}

// collie runs on tcmalloc (linked into the executable), whose returned memory ZeRO's savings
// need; every worker is this executable again.
TEST(CliMalloc, TheExecutableRunsOnTcmalloc) {
  if (!COLLIE_LINKS_TCMALLOC) GTEST_SKIP() << "built without tcmalloc (libtcmalloc-minimal4)";
  auto r = testing::runCollie({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::contains(r.output, {"malloc: ", "libtcmalloc"}));
}

}  // namespace
}  // namespace collie
