// The nccl backend builds and loads here (CUDA 13 + NCCL from /usr/local/cuda); without a
// GPU it refuses to start with a clear error, and these tests say why they skip the rest.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collie/device_memory.h"
#include "collie/error.h"
#include "collie/plugin.h"
#include "expect.h"
#include "plugin/loader.h"
#include "runtime/tcp_store.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int gpuCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

collie::PluginLoader loader() { return collie::PluginLoader({COLLIE_TEST_PLUGIN_DIR}); }

// `count` floats of device memory on the calling thread's current device, freed with it.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t count) : count_(count) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(count, 1) * sizeof(float)), cudaSuccess);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  ~DeviceFloats() { cudaFree(data_); }

  void write(const std::vector<float>& host) {
    EXPECT_EQ(cudaMemcpy(data_, host.data(), count_ * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<float> read() const {
    std::vector<float> host(count_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, count_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }
  collie::Buffer buffer() const {
    collie::Buffer buf;
    buf.data = data_;
    buf.count = count_;
    buf.dtype = collie::DType::kF32;
    buf.memory = collie::MemoryKind::kCuda;
    return buf;
  }

 private:
  float* data_ = nullptr;
  size_t count_;
};

// A group of one over `store`, with a 20 s timeout.
std::shared_ptr<collie::Backend> oneRank(collie::TcpStore& store) {
  collie::Params params("backend 'nccl'");
  params.set("timeout", "20s");
  collie::BackendContext context;
  context.store = &store;
  return loader().createBackend("nccl", params, context);
}

collie::CollectiveArgs allReduce(const collie::Buffer& data, collie::ReduceOp op) {
  collie::CollectiveArgs args;
  args.coll = collie::Collective::kAllReduce;
  args.data = data;
  args.op = op;
  return args;
}

// Runs body(backend, rank) for both ranks of a 2-rank job, each rank a thread with device
// `rank` of its own (NCCL refuses two ranks on one GPU), joined through a TCP store on the
// loopback, with every rank on this host. body may reset the backend. Returns what each
// rank threw ("" for nothing).
std::vector<std::string> runTwoRanks(
    const std::string& timeout,
    const std::function<void(std::shared_ptr<collie::Backend>&, int rank)>& body) {
  collie::TcpStore server("127.0.0.1", 0, /*is_server=*/true, 30s);
  std::vector<std::string> failures(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        EXPECT_EQ(cudaSetDevice(rank), cudaSuccess);
        collie::TcpStore store("127.0.0.1", server.port(), /*is_server=*/false, 30s);
        collie::Params params("backend 'nccl'");
        params.set("timeout", timeout);
        collie::BackendContext context;
        context.rank = context.local_rank = rank;
        context.size = 2;
        context.store = &store;
        context.one_host = true;
        auto backend = loader().createBackend("nccl", params, context);
        EXPECT_EQ(backend->rank(), rank);
        body(backend, rank);
      } catch (const std::exception& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  return failures;
}

}  // namespace

TEST(Nccl, PluginLoadsAndDescribesItself) {
  auto library = loader().open(collie::PluginKind::kBackend, "nccl");
  const auto& info = collie::pluginInfo(*library);
  EXPECT_EQ(info.name, "nccl");
  EXPECT_FALSE(info.in_process);
}

// The descriptor says nccl moves device memory only, so that the launcher can refuse a run of
// host tensors over it before any rank starts.
TEST(Nccl, DescriptorSaysItMovesDeviceMemoryOnly) {
  auto library = loader().open(collie::PluginKind::kBackend, "nccl");
  EXPECT_TRUE(collie::pluginInfo(*library).device_memory_only);
}

// With the emulated device installed (host memory standing in for a GPU), nccl refuses to start.
TEST(Nccl, RefusesTheEmulatedDevice) {
  const collie::DeviceMemoryOps previous = collie::setDeviceMemoryOps(collie::emulatedDeviceOps());
  collie::Params params("backend 'nccl'");
  collie::BackendContext context;
  EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>(
      [&] { loader().createBackend("nccl", params, context); }, {"COLLIE_EMULATED_DEVICE"}))
      << "the nccl backend started on the emulated device";
  collie::setDeviceMemoryOps(previous);
}

TEST(Nccl, WithoutAGpuItRefusesToStartWithAReason) {
  if (gpuCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  collie::Params params("backend 'nccl'");
  collie::BackendContext context;
  EXPECT_TRUE(collie::testing::throwsWith<collie::PluginError>(
      [&] { loader().createBackend("nccl", params, context); }, {"no CUDA device is visible"}))
      << "the nccl backend started without a GPU";
}

// params.interface is checked before anything else, with or without a GPU.
TEST(Nccl, AnInterfaceThatDoesNotExistIsAConfigError) {
  collie::Params params("backend 'nccl'");
  params.set("interface", "nosuchnic9");
  collie::BackendContext context;
  EXPECT_TRUE(collie::testing::throwsWith<collie::ConfigError>(
      [&] { loader().createBackend("nccl", params, context); }, {"'nosuchnic9' does not exist"}))
      << "the nccl backend accepted interface nosuchnic9";
}

// One rank (NCCL refuses two ranks on one GPU, and a test machine may have one): init
// through the store, native collectives on device memory, split, teardown.
TEST(Nccl, OneRankRunsNativeCollectivesOnTheGpu) {
  if (gpuCount() == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount found none";
  collie::TcpStore store("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
  auto backend = oneRank(store);
  ASSERT_TRUE(backend->capabilities().cuda_memory);

  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 7);
  DeviceFloats device(host.size());
  device.write(host);
  for (auto op : {collie::ReduceOp::kSum, collie::ReduceOp::kAvg, collie::ReduceOp::kMax}) {
    EXPECT_TRUE(backend->runNative(allReduce(device.buffer(), op)).accepted);
  }
  EXPECT_EQ(device.read(), host);  // one rank: every reduction is the input itself

  // Host memory is refused with a hint, not sent.
  collie::CollectiveArgs host_args = allReduce(device.buffer(), collie::ReduceOp::kSum);
  host_args.data.memory = collie::MemoryKind::kHost;
  host_args.data.data = host.data();
  EXPECT_FALSE(backend->runNative(host_args).accepted);

  auto sub = backend->split({0});
  EXPECT_EQ(sub->size(), 1);
}

// On one rank every reduction is its input, so the test above cannot tell a right sum from
// none. What one rank can show: a send or receive to itself is refused, a call of the wrong
// shape is refused, and the out-of-place collectives move exactly the elements they are given
// (a wrong count or dtype handed to NCCL would copy more or fewer bytes past the guard).
TEST(Nccl, OneRankRefusesItselfAndWrongShapesAndCopiesExactly) {
  if (gpuCount() == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount found none";
  collie::TcpStore store("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
  auto backend = oneRank(store);
  DeviceFloats a(1000), b(1001);
  EXPECT_THROW(backend->isend(0, a.buffer(), collie::makeTag(1, 0, 0)), collie::CommError);
  EXPECT_THROW(backend->irecv(0, a.buffer(), collie::makeTag(1, 0, 0)), collie::CommError);

  std::vector<float> input(1000);
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i) * 0.5f + 1;
  for (auto coll : {collie::Collective::kAllGather, collie::Collective::kReduceScatter}) {
    a.write(input);
    b.write(std::vector<float>(1001, -7.0f));
    collie::CollectiveArgs args = allReduce(a.buffer(), collie::ReduceOp::kSum);
    args.coll = coll;
    args.output = b.buffer();
    args.output.count = 999;  // one short of what one rank's call needs
    EXPECT_THROW(backend->runNative(args), collie::CommError) << collie::collectiveName(coll);
    args.output.count = 1000;
    args.output.dtype = collie::DType::kF64;
    EXPECT_THROW(backend->runNative(args), collie::CommError) << collie::collectiveName(coll);
    args.output.dtype = collie::DType::kF32;
    ASSERT_TRUE(backend->runNative(args).accepted);
    std::vector<float> got = b.read();
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 1000), input)
        << collie::collectiveName(coll);
    EXPECT_EQ(got[1000], -7.0f) << collie::collectiveName(coll) << " wrote past its output";
  }
}

// An abort from another thread lands anywhere in a stream of native collectives (in an NCCL
// call, between polls, in the event wait): the caller ends in CommError with the reason, and
// nothing reaches NCCL afterwards.
TEST(Nccl, AnAbortFromAnotherThreadEndsTheWaitWithCommError) {
  if (gpuCount() == 0) GTEST_SKIP() << "no GPU: cudaGetDeviceCount found none";
  collie::TcpStore store("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(30));
  auto backend = oneRank(store);
  DeviceFloats device(1 << 20);
  const auto args = allReduce(device.buffer(), collie::ReduceOp::kSum);

  std::atomic<bool> running{false};
  std::thread aborter([&] {
    while (!running.load()) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);
    backend->abort("test abort");
  });
  std::string error;
  const auto give_up = Clock::now() + 60s;
  try {
    while (Clock::now() < give_up) {
      backend->runNative(args);
      running = true;
    }
  } catch (const collie::CommError& e) {
    error = e.what();
  }
  running = true;  // the first call may have thrown already
  aborter.join();
  EXPECT_TRUE(collie::testing::contains(error, {"aborted: test abort"})) << "error: " << error;
  EXPECT_THROW(backend->runNative(args), collie::CommError);
  EXPECT_THROW(backend->split({0}), collie::CommError);
  backend->abort("again");  // a second abort is a no-op
  backend.reset();          // tears down an aborted communicator: nothing left to free
}

// Two ranks, one GPU each: native all-reduce (sum and max, closed-form rank sums, odd and
// prime sizes) and point-to-point both ways, on the group and on a split of it; on one host
// without params.interface, NCCL's bootstrap is pointed at the loopback.
TEST(Nccl, TwoRanksRunNativeAllReduceAndPointToPoint) {
  if (gpuCount() < 2) {
    GTEST_SKIP() << "needs 2 GPUs (found " << gpuCount()
                 << "): NCCL refuses two ranks of one communicator on one GPU";
  }
  const char* user_interface = std::getenv("NCCL_SOCKET_IFNAME");
  const std::string expected_interface = user_interface != nullptr ? user_interface : "lo";
  auto failures = runTwoRanks("20s", [](std::shared_ptr<collie::Backend>& backend, int rank) {
    for (size_t count : {size_t{1}, size_t{13}, size_t{1000}, size_t{4099}}) {
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
      DeviceFloats data(count);
      data.write(mine);
      EXPECT_TRUE(backend->runNative(allReduce(data.buffer(), collie::ReduceOp::kSum)).accepted);
      auto sum = data.read();
      data.write(mine);
      EXPECT_TRUE(backend->runNative(allReduce(data.buffer(), collie::ReduceOp::kMax)).accepted);
      auto max = data.read();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(sum[i], 3.0f * static_cast<float>(i % 7 + 1)) << "count " << count << " i " << i;
        ASSERT_EQ(max[i], 2.0f * static_cast<float>(i % 7 + 1)) << "count " << count << " i " << i;
      }
    }
    auto exchange = [rank](collie::Backend& group, size_t count) {
      const int peer = 1 - rank;
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(1000 * rank + i);
      DeviceFloats out(count), in(count);
      out.write(mine);
      auto send = group.isend(peer, out.buffer(), collie::makeTag(1, 0, 0));
      auto recv = group.irecv(peer, in.buffer(), collie::makeTag(1, 0, 0));
      recv->wait(20s);
      send->wait(20s);
      auto got = in.read();
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], static_cast<float>(1000 * peer + i)) << "count " << count << " i " << i;
      }
    };
    for (size_t count : {size_t{1}, size_t{13}, size_t{1000}}) exchange(*backend, count);
    auto sub = backend->split({0, 1});
    EXPECT_EQ(sub->size(), 2);
    exchange(*sub, 31);
  });
  EXPECT_EQ(failures, std::vector<std::string>(2, ""));
  // Every rank on this host and no params.interface: the loopback, unless the user chose.
  const char* chosen = std::getenv("NCCL_SOCKET_IFNAME");
  EXPECT_EQ(chosen != nullptr ? std::string(chosen) : "(unset)", expected_interface);
}

// A request that outlives its backend object still owns its communicator: its wait ends in
// CommError (here the peer never sends) instead of touching freed memory. An abort from
// another thread ends a wait that would otherwise last 20 s, with the abort's reason.
TEST(Nccl, RequestsOutlivingTheirBackendOrAbortedEndInCommError) {
  if (gpuCount() < 2) {
    GTEST_SKIP() << "needs 2 GPUs (found " << gpuCount()
                 << "): a request needs a peer, and NCCL refuses two ranks on one GPU";
  }
  auto outliving = runTwoRanks("2s", [](std::shared_ptr<collie::Backend>& backend, int rank) {
    DeviceFloats in(64);
    auto recv = backend->irecv(1 - rank, in.buffer(), collie::makeTag(1, 0, 0));
    backend.reset();  // the backend object is gone; the request is not
    EXPECT_TRUE(
        collie::testing::throwsWith<collie::CommError>([&] { recv->wait(2s); }, {"timed out"}))
        << "rank " << rank << ": a receive nobody sent completed";
    EXPECT_FALSE(recv->test());
  });
  EXPECT_EQ(outliving, std::vector<std::string>(2, ""));

  auto aborted = runTwoRanks("20s", [](std::shared_ptr<collie::Backend>& backend, int rank) {
    DeviceFloats in(64);
    auto recv = backend->irecv(1 - rank, in.buffer(), collie::makeTag(1, 0, 0));
    std::thread aborter([&] {
      std::this_thread::sleep_for(300ms);
      backend->abort("test abort");
    });
    const auto start = Clock::now();
    EXPECT_TRUE(collie::testing::throwsWith<collie::CommError>([&] { recv->wait(20s); },
                                                               {"aborted: test abort"}))
        << "rank " << rank << ": a receive nobody sent completed";
    aborter.join();
    EXPECT_LT(Clock::now() - start, 10s);
    EXPECT_THROW(backend->isend(1 - rank, in.buffer(), collie::makeTag(2, 0, 0)),
                 collie::CommError);
  });
  EXPECT_EQ(aborted, std::vector<std::string>(2, ""));
}
