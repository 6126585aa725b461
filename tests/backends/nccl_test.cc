// The nccl backend builds and loads here (CUDA 13 + NCCL from /usr/local/cuda); without a
// GPU it refuses to start with a clear error, and these tests say why they skip the rest.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "collie/error.h"
#include "collie/plugin.h"
#include "plugin/loader.h"
#include "runtime/tcp_store.h"

namespace {

int gpuCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

collie::PluginLoader loader() { return collie::PluginLoader({COLLIE_TEST_PLUGIN_DIR}); }

}  // namespace

TEST(Nccl, PluginLoadsAndDescribesItself) {
  auto library = loader().open(collie::PluginKind::kBackend, "nccl");
  const auto& info = collie::pluginInfo(*library);
  EXPECT_EQ(info.name, "nccl");
  EXPECT_FALSE(info.in_process);
}

TEST(Nccl, WithoutAGpuItRefusesToStartWithAReason) {
  if (gpuCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  collie::Params params("backend 'nccl'");
  collie::BackendContext context;
  try {
    loader().createBackend("nccl", params, context);
    FAIL() << "the nccl backend started without a GPU";
  } catch (const collie::PluginError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device is visible"), std::string::npos)
        << e.what();
  }
}

// One rank (NCCL refuses two ranks on one GPU, and a test machine may have one): init
// through the store, native collectives on device memory, split.
TEST(Nccl, OneRankRunsNativeCollectivesOnTheGpu) {
  if (gpuCount() == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount found none";
  collie::TcpStore store("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
  collie::Params params("backend 'nccl'");
  params.set("timeout", "20s");
  collie::BackendContext context;
  context.store = &store;
  auto backend = loader().createBackend("nccl", params, context);
  ASSERT_TRUE(backend->capabilities().cuda_memory);

  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 7);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  collie::CollectiveArgs args;
  args.data.data = device;
  args.data.count = host.size();
  args.data.dtype = collie::DType::kF32;
  args.data.memory = collie::MemoryKind::kCuda;
  for (auto op : {collie::ReduceOp::kSum, collie::ReduceOp::kAvg, collie::ReduceOp::kMax}) {
    args.op = op;
    EXPECT_TRUE(backend->runNative(args).accepted);
  }
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), device, back.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);  // one rank: every reduction is the input itself

  // Host memory is refused with a hint, not sent.
  collie::Buffer on_host = args.data;
  on_host.memory = collie::MemoryKind::kHost;
  on_host.data = host.data();
  collie::CollectiveArgs host_args = args;
  host_args.data = on_host;
  EXPECT_FALSE(backend->runNative(host_args).accepted);

  auto sub = backend->split({0});
  EXPECT_EQ(sub->size(), 1);
  cudaFree(device);
}
