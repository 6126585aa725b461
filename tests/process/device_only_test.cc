// The device-only contract, checked without a GPU: everything collie runs over a backend that
// moves device memory only, as nccl does, must hand that backend device memory, its own
// messages included.
//
// How the device is stood in for: COLLIE_EMULATED_DEVICE=1 installs the emulated device
// (collie/device_memory.h) as the process's device memory. Its memory is host memory that it
// allocates and records itself; every copy and reduction it is asked for checks that each
// device-side pointer lies inside one of its live allocations, so host memory labelled as
// device memory (or memory used after its release, unless its address was handed out again)
// fails at the first touch. With train.device: cuda every LibTorch tensor of the process is
// allocated by it (the model, the gradient buckets, the ZeRO shards, the optimizer state), as
// on a GPU. The backend is
// loopback with `memory: device`: it refuses every host buffer in checkTransfer and moves
// device buffers through the emulated device's checked copy.
//
// What it cannot show: a tensor copied to the host with .to(kCPU) is the same tensor on a
// CPU, so a collective handed such a copy passes here and fails only on a GPU
// (scripts/gpu-check.sh); and it says nothing of streams.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/device_memory.h"
#include "collie/error.h"
#include "expect.h"
#include "plugin/loader.h"
#include "run_command.h"
#include "runtime/control.h"
#include "runtime/in_process.h"

namespace fs = std::filesystem;
using namespace collie::testing;  // NOLINT: the helpers of run_command.h

namespace {

const std::vector<std::string> kEmulated = {"COLLIE_EMULATED_DEVICE=1"};

std::string scratch(const std::string& name) {
  const fs::path dir = fs::path(COLLIE_TEST_BINARY_DIR) / "device_only" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// The backend every run below uses: ranks as threads that move device memory only.
const char* kBackend =
    "backend: {plugin: loopback, params: {memory: device, completion: batch, timeout: 20s}}\n";

// ---- the stand-in's own rules --------------------------------------------------------

// The emulated device refuses memory it did not allocate: host memory relabelled as device
// memory, and its own memory after release.
TEST(DeviceOnly, TheEmulatedDeviceRefusesMemoryItDidNotAllocate) {
  const collie::DeviceMemoryOps previous = collie::setDeviceMemoryOps(collie::emulatedDeviceOps());
  collie::Buffer like;
  like.memory = collie::MemoryKind::kCuda;
  std::vector<float> host(16, 1.0f);
  const collie::Buffer host_view{host.data(), host.size(), collie::DType::kF32};
  {
    collie::ScratchBuffer a(like, 16), b(like, 16);
    collie::copyInto(a.view(), host_view);  // host to device: allowed
    collie::copyInto(b.view(), a.view());
    collie::reduceInto(b.view(), a.view(), collie::ReduceOp::kSum);
    collie::copyInto(host_view, b.view());
    EXPECT_EQ(host[3], 2.0f);
    collie::Buffer relabelled = host_view;
    relabelled.memory = collie::MemoryKind::kCuda;
    EXPECT_THROW(collie::copyInto(a.view(), relabelled), collie::CommError);
    EXPECT_THROW(collie::reduceInto(relabelled, a.view(), collie::ReduceOp::kSum),
                 collie::CommError);
    // A view wider than its buffer reaches past the allocation: refused.
    collie::ScratchBuffer one(like, 1);
    collie::Buffer wide = one.view();
    wide.count = 16;
    EXPECT_THROW(collie::copyInto(host_view, wide), collie::CommError);
    // One element past an allocation's end is outside it.
    collie::Buffer past = a.view();
    past.data = static_cast<float*>(past.data) + 1;
    EXPECT_THROW(collie::copyInto(past, b.view()), collie::CommError);
  }
  {
    collie::ScratchBuffer gone(like, 16);
    const collie::Buffer stale = gone.view();
    gone = collie::ScratchBuffer(like, 1 << 20);  // the first allocation is released
    EXPECT_THROW(collie::copyInto(stale, host_view), collie::CommError);
  }
  collie::setDeviceMemoryOps(previous);  // once no buffer of the emulated device is left
}

// What the old control plane did, a host buffer handed to the backend, fails; the control
// plane's wire stages the same message through device memory and it arrives.
TEST(DeviceOnly, AHostMessageIsRefusedAndTheControlPlaneStagesIt) {
  const collie::DeviceMemoryOps previous = collie::setDeviceMemoryOps(collie::emulatedDeviceOps());
  collie::PluginLoader loader({COLLIE_TEST_PLUGIN_DIR});
  collie::config::PluginRef ref;
  ref.plugin = ref.label = "loopback";
  ref.params.set("memory", "device");
  ref.params.set("timeout", "5s");
  std::vector<std::vector<double>> sums(3);
  collie::runInProcess(loader, ref, 3, [&](std::shared_ptr<collie::Backend> b) {
    double value = b->rank() + 1;
    const collie::Buffer host{&value, 1, collie::DType::kF64};
    EXPECT_THROW(b->isend((b->rank() + 1) % 3, host, 99), collie::CommError);
    collie::Control control(*b);
    sums[b->rank()] = control.sum({value, 10.0 * value});
    control.barrier();
  });
  for (const auto& s : sums) EXPECT_EQ(s, (std::vector<double>{6, 60}));
  collie::setDeviceMemoryOps(previous);
}

// ---- collie's commands over the device-only backend -------------------------------------

// The bench with calibration (probes, barriers, folds), a trace (clock offsets, the trace
// gather) and the consistency check, on 2 and 3 ranks, and on 2 emulated nodes x 2 ranks,
// whose calibration probes the level between nodes too (its stream, and its round trips
// after a pause, each of which posts its answer's receive before waiting on its send);
// every result checked.
TEST(DeviceOnly, TheBenchCalibratesTracesAndChecksOnDeviceMemory) {
  const std::string config = writeTempFile(
      "device-only-bench.yaml",
      std::string("name: device_only_bench\nlaunch: {nproc_per_node: 2}\n") + kBackend +
          "debug: {consistency: true}\n"
          "bench: {schedulers: [ring, halving_doubling, tree], min_bytes: 4KiB, "
          "max_bytes: 64KiB, step_factor: 16, iters: 2, warmup_iters: 1, repeats: 1, "
          "calibrate: true, trace: true, plots: false}\n"
          "matrix: [{launch.nproc_per_node: 2}, {launch.nproc_per_node: 3},\n"
          "         {launch.nproc_per_node: 4, launch.ranks_per_node: 2}]\n");
  const auto r = runCollie({"run", config, "--out", scratch("bench")}, kEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"calibrat", "when idle"}));
  EXPECT_TRUE(collie::testing::lacks(r.output, {"WRONG"}));
}

// Without the emulated device there is no device memory on this machine: the same bench
// fails with the core's one-line reason instead of moving host memory.
TEST(DeviceOnly, WithoutADeviceTheBenchStopsWithAReason) {
  const std::string config = writeTempFile(
      "device-only-nodevice.yaml",
      std::string("name: device_only_nodevice\nlaunch: {nproc_per_node: 2}\n") + kBackend +
          "bench: {schedulers: [ring], min_bytes: 4KiB, max_bytes: 4KiB, iters: 1, "
          "warmup_iters: 0, calibrate: true, plots: false}\n");
  const auto r =
      runCollie({"run", config, "--out", scratch("nodevice")}, {"COLLIE_EMULATED_DEVICE=0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(
      collie::testing::contains(r.output, {"no device memory is installed in this process"}));
}

// plugin-check of the backend itself (ordered and zero-byte messages, a silent peer) and of
// every scheduler over it (the conformance matrix on device buffers), on 2 to 5 ranks, with
// nccl's batch completion: a scheduler that posts a receive ahead of a wait, or interleaves
// two pipelines, hangs there (and fails here at the timeout); one that counts on tags to
// tell its messages apart gets another message's bytes.
TEST(DeviceOnly, PluginCheckPassesOnDeviceMemoryWithBatchCompletion) {
  auto backend = runCollie({"plugin-check", "loopback", "--param", "memory=device", "--param",
                            "completion=batch", "--worlds", "2,3"},
                           kEmulated);
  EXPECT_EQ(backend.exit_code, 0) << backend.output;
  EXPECT_TRUE(collie::testing::contains(backend.output, {"PASS"}));
  // Each pipelined scheduler in pieces of 1 KiB, so that the large case (4000 bytes) flows
  // as several chunks or segments; hierarchical (whose levels run one after the other
  // here, as over nccl: concurrent_groups is false) also on 6 and 8 ranks, where its
  // levels have 3 and 4 ranks.
  struct Case {
    std::string scheduler, param, worlds = "2,3,4,5";
  };
  const std::vector<Case> cases = {{"ring", "chunk_bytes=1KiB"},
                                   {"bidirectional_ring", "chunk_bytes=1KiB"},
                                   {"hierarchical", "", "2,3,4,5,6,8"},
                                   {"tree", "segment_bytes=1KiB"},
                                   {"knomial", "segment_bytes=1KiB"},
                                   {"double_binary_tree", "segment_bytes=1KiB"},
                                   {"halving_doubling", ""},
                                   {"recursive_doubling", ""},
                                   {"swing", ""},
                                   {"bruck", ""},
                                   {"auto", ""}};
  for (const auto& [scheduler, param, worlds] : cases) {
    std::vector<std::string> args = {
        "plugin-check",    scheduler,       "--backend",       "loopback",
        "--backend-param", "memory=device", "--backend-param", "completion=batch",
        "--backend-param", "timeout=5s",    "--worlds",        worlds,
        "--large-count",   "1000"};
    if (!param.empty()) args.insert(args.end(), {"--param", param});
    auto r = runCollie(args, kEmulated);
    EXPECT_EQ(r.exit_code, 0) << scheduler << "\n" << r.output;
    EXPECT_TRUE(collie::testing::contains(r.output, {"PASS"})) << scheduler;
  }
}

// A training run: `extra` goes into its train: map, `tail` after it (a matrix).
std::string trainConfig(const std::string& name, const std::string& extra,
                        const std::string& tail = "") {
  return writeTempFile(
      name + ".yaml",
      "name: " + name + "\nlaunch: {nproc_per_node: 2}\n" + kBackend +
          "debug: {consistency: true}\n"
          "model: {plugin: gpt, params: {layers: 2, d_model: 32, heads: 2, seq_len: 16, "
          "vocab: 64}}\n"
          "train: {device: cuda, scheduler: ring, steps: 3, micro_batch: 2, lr: 1e-3, "
          "bucket_bytes: 16KiB, log_every: 1, verify_sync_every: 1, trace: true" +
          extra + "}\n" + tail);
}

// Training with every sharding on 2 and 3 ranks, traced, with the consistency check and the
// weight check after every step; the state lives in the emulated device.
TEST(DeviceOnly, TrainingWithEveryShardingKeepsItsStateOnTheDevice) {
  const std::string config =
      trainConfig("device_only_train", "",
                  "matrix: {launch.nproc_per_node: [2, 3], "
                  "train.sharding: [none, optimizer, gradients, parameters]}\n");
  const auto r = runCollie({"run", config, "--out", scratch("train")}, kEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"emulated device"}));
  EXPECT_TRUE(collie::testing::lacks(r.output, {"host-staged", "diverged"}));
  EXPECT_TRUE(collie::testing::contains(r.output, {"weights identical"}));
}

// The other half of the rule: device tensors over a backend that moves host memory only
// (gloo, as processes) pass through host buffers, and the summary says so.
TEST(DeviceOnly, DeviceTensorsOverAHostBackendAreHostStaged) {
  const std::string config = trainConfig("device_only_staged", ", sharding: optimizer");
  const auto r = runCollie({"run", config, "--out", scratch("staged"), "--set",
                            "backend={plugin: gloo, params: {timeout: 20s}}"},
                           kEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"host-staged", "weights identical"}));
}

// A checkpoint written from device memory (stage 3: every rank's shards) and a resume into
// it, on 3 ranks.
TEST(DeviceOnly, ACheckpointOfDeviceStateResumes) {
  const std::string dir = scratch("checkpoints");
  const std::string first = trainConfig(
      "device_only_ckpt", ", sharding: parameters, checkpoint_every: 2, checkpoint_dir: " + dir);
  auto r = runCollie({"run", first, "--out", scratch("ckpt1"), "--set", "launch.nproc_per_node=3"},
                     kEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = runCollie({"run", first, "--out", scratch("ckpt2"), "--set", "launch.nproc_per_node=3",
                 "--set", "train.steps=5"},
                kEmulated);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"resumed from", "weights identical"}));
}

// train.device: cpu over a backend that moves device memory only is refused by name.
TEST(DeviceOnly, HostTensorsOverADeviceOnlyBackendAreRefused) {
  const std::string config = trainConfig("device_only_cpu", "");
  const auto r =
      runCollie({"run", config, "--out", scratch("cpu"), "--set", "train.device=cpu"}, kEmulated);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(collie::testing::contains(r.output, {"moves device memory only"}));
}

}  // namespace
