// runtime/device: train.device's choice, tensors as buffers, and host staging, which CPU
// tensors exercise here standing in for device memory (Communicator::stageAlways). The
// checks that need a GPU skip without one and run in scripts/gpu-check.sh.
#include <gtest/gtest.h>

#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <mutex>
#include <vector>

#include "collie/error.h"
#include "expect.h"
#include "loopback_job.h"
#include "runtime/communicator.h"
#include "runtime/device.h"

namespace collie {
namespace {

using testing::loadScheduler;
using testing::runLoopback;

TEST(Device, CpuIsTheCpuAndCudaWithoutAGpuIsRefusedWithAHint) {
  EXPECT_TRUE(rankDevice("cpu", 3).is_cpu());
  if (cudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU: " << torchDescription();
  try {
    rankDevice("cuda", 0);
    FAIL() << "train.device: cuda was accepted without a GPU";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find("train.device: cuda, but this process sees no CUDA device (LibTorch "), 0u)
        << m;
    EXPECT_TRUE(testing::contains(m, {"HINT"}));
  }
}

TEST(Device, ABufferOfATensorCarriesItsElementsTypeAndMemory) {
  at::Tensor f = at::arange(10, at::kFloat);
  Buffer b = bufferOf(f);
  EXPECT_EQ(b.data, f.data_ptr());
  EXPECT_EQ(b.count, 10u);
  EXPECT_EQ(b.dtype, DType::kF32);
  EXPECT_EQ(b.memory, MemoryKind::kHost);
  EXPECT_EQ(bufferOf(at::zeros({3}, at::kBFloat16)).dtype, DType::kBF16);
  EXPECT_EQ(bufferOf(at::zeros({3}, at::kLong)).dtype, DType::kI64);
  EXPECT_THROW(bufferOf(at::zeros({4, 4}).t()), InternalError);  // not contiguous
  EXPECT_THROW(bufferOf(at::zeros({3}, at::kBool)), InternalError);
}

TEST(HostStaging, NeededOnlyForDeviceBuffersTheBackendCannotMove) {
  Capabilities host_only, device_too;
  device_too.cuda_memory = true;
  CollectiveArgs args;
  args.data.memory = MemoryKind::kCuda;
  EXPECT_TRUE(HostStaging::needed(args, host_only));
  EXPECT_FALSE(HostStaging::needed(args, device_too));
  args.coll = Collective::kBarrier;  // moves no buffer of the caller's
  EXPECT_FALSE(HostStaging::needed(args, host_only));
  args.coll = Collective::kAllGather;
  args.data.memory = MemoryKind::kHost;
  EXPECT_FALSE(HostStaging::needed(args, host_only));
  args.output.memory = MemoryKind::kCuda;
  EXPECT_TRUE(HostStaging::needed(args, host_only));
  args.output.memory = MemoryKind::kHost;
  EXPECT_TRUE(HostStaging::needed(args, host_only, /*force=*/true));
}

TEST(HostStaging, StagedCopiesAreOtherMemoryAndResultsComeBack) {
  auto staging = makeHostStaging();
  at::Tensor data = at::arange(7, at::kFloat), output = at::zeros({21}, at::kFloat);
  CollectiveArgs args;
  args.coll = Collective::kAllGather;
  args.data = bufferOf(data);
  args.output = bufferOf(output);
  CollectiveArgs staged = staging->stageIn(args);
  ASSERT_NE(staged.data.data, args.data.data);
  ASSERT_NE(staged.output.data, args.output.data);
  EXPECT_EQ(staged.data.memory, MemoryKind::kHost);
  EXPECT_EQ(staged.output.count, 21u);
  const auto* in = static_cast<const float*>(staged.data.data);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(in[i], static_cast<float>(i));
  auto* out = static_cast<float*>(staged.output.data);
  for (int i = 0; i < 21; ++i) out[i] = static_cast<float>(100 + i);
  staging->stageOut(args, staged);
  EXPECT_EQ(output[20].item<float>(), 120.0f);
  EXPECT_EQ(data[6].item<float>(), 6.0f);  // an all-gather's input is not written back
  EXPECT_GE(staging->heldBytes(), 28u * 4u);
  // The next staging of a larger message grows the buffers; a smaller one reuses them.
  args.coll = Collective::kAllReduce;
  args.output = Buffer();
  const size_t held = staging->heldBytes();
  staging->stageIn(args);
  EXPECT_EQ(staging->heldBytes(), held);
}

// Every collective of the trainer and the weight check, on 3 loopback ranks, through host
// copies: the results are the closed forms, and each one says it was staged.
TEST(HostStaging, EveryCollectiveThroughHostCopiesGivesTheUnstagedResult) {
  constexpr int kWorld = 3;
  std::mutex mu;
  runLoopback(kWorld, [&](std::shared_ptr<Backend> backend) {
    const int r = backend->rank();
    Communicator comm(backend, "loopback", Topology::singleNode(kWorld));
    comm.addRule("ring", loadScheduler("ring"));
    comm.addRule("tree", loadScheduler("tree"));  // broadcast
    comm.stageAlways(true);
    for (int64_t n : {0, 1, 7, 1000}) {
      at::Tensor x = at::full({n}, static_cast<float>(r + 1), at::kFloat);
      CollectiveArgs args;
      args.data = bufferOf(x);
      const Provenance p = comm.run(args);
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(p.staged);
      if (n > 0) {
        EXPECT_EQ(x.max().item<float>(), 6.0f) << n;  // 1 + 2 + 3
        EXPECT_EQ(x.min().item<float>(), 6.0f) << n;
      }
    }
    at::Tensor whole = at::arange(9, at::kFloat).add_(r), block = at::zeros({3}, at::kFloat);
    CollectiveArgs scatter;
    scatter.coll = Collective::kReduceScatter;
    scatter.data = bufferOf(whole);
    scatter.output = bufferOf(block);
    EXPECT_TRUE(comm.run(scatter).staged);
    at::Tensor mine = at::zeros({3}, at::kFloat).copy_(block);
    at::Tensor gathered = at::zeros({9}, at::kFloat);
    CollectiveArgs gather;
    gather.coll = Collective::kAllGather;
    gather.data = bufferOf(mine);
    gather.output = bufferOf(gathered);
    EXPECT_TRUE(comm.run(gather).staged);
    at::Tensor root = at::full({5}, r == 0 ? 42.0f : -1.0f, at::kFloat);
    CollectiveArgs broadcast;
    broadcast.coll = Collective::kBroadcast;
    broadcast.data = bufferOf(root);
    EXPECT_TRUE(comm.run(broadcast).staged);
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < 9; ++i) {  // sum over ranks of (i + r) = 3i + 3
      EXPECT_EQ(gathered[i].item<float>(), static_cast<float>(3 * i + 3)) << i;
    }
    EXPECT_EQ(root.min().item<float>(), 42.0f);
    EXPECT_EQ(root.max().item<float>(), 42.0f);
  });
}

// On a GPU (scripts/gpu-check.sh): CUDA tensors are device buffers, and over loopback,
// which moves host memory only, they pass through pinned host memory and come back.
TEST(HostStaging, CudaTensorsOverAHostBackendAreStagedAndComeBack) {
  if (cudaDeviceCount() == 0) GTEST_SKIP() << "no GPU: " << torchDescription();
  const at::Device gpu(at::kCUDA, 0);
  EXPECT_EQ(bufferOf(at::zeros({4}, at::TensorOptions().device(gpu))).memory, MemoryKind::kCuda);
  std::mutex mu;
  runLoopback(2, [&](std::shared_ptr<Backend> backend) {
    useDevice(gpu);
    Communicator comm(backend, "loopback", Topology::singleNode(2));
    comm.addRule("ring", loadScheduler("ring"));
    for (int64_t n : {1, 1000, 1 << 20}) {
      at::Tensor x =
          at::full({n}, static_cast<float>(backend->rank() + 1), at::TensorOptions().device(gpu));
      CollectiveArgs args;
      args.data = bufferOf(x);
      const Provenance p = comm.run(args);
      const float low = x.min().item<float>(), high = x.max().item<float>();  // waits for it
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_TRUE(p.staged);
      EXPECT_EQ(low, 3.0f) << n;
      EXPECT_EQ(high, 3.0f) << n;
    }
  });
}

}  // namespace
}  // namespace collie
