// Gloo's own all-reduce algorithms, called directly (not through collie): the peer that
// collie's schedulers over the gloo backend are compared against. One process per rank,
// rendezvous through a shared folder (Gloo's FileStore).
//
//   gloo_allreduce RANK SIZE STORE_DIR ALGORITHM MIN_BYTES MAX_BYTES ITERS [LOOP_THREAD]
//
// LOOP_THREAD is `batch` (the default) or `normal`: the scheduling policy of Gloo's event-loop
// thread, as collie's gloo backend sets it (its `loop_thread` param, same default), so the two
// are compared with the same treatment of Gloo's spinning loop thread (pytorch/gloo#246).
// Prints CSV rows: peer,algorithm,ranks,bytes,time_us,busbw_gbps (the slowest rank's mean).
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

std::unique_ptr<gloo::Algorithm> make(const std::string& name,
                                      const std::shared_ptr<gloo::Context>& context, float* data,
                                      int count) {
  std::vector<float*> ptrs{data};
  if (name == "ring") return std::make_unique<gloo::AllreduceRing<float>>(context, ptrs, count);
  if (name == "ring_chunked")
    return std::make_unique<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
  if (name == "halving_doubling")
    return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
  if (name == "bcube") return std::make_unique<gloo::AllreduceBcube<float>>(context, ptrs, count);
  std::fprintf(stderr, "unknown algorithm %s\n", name.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::fprintf(stderr,
                 "usage: %s RANK SIZE STORE_DIR ALGORITHM MIN_BYTES MAX_BYTES ITERS "
                 "[batch|normal]\n",
                 argv[0]);
    return 2;
  }
  const std::string loop_thread = argc == 9 ? argv[8] : "batch";
  if (loop_thread != "batch" && loop_thread != "normal") {
    std::fprintf(stderr, "LOOP_THREAD is batch or normal, not %s\n", loop_thread.c_str());
    return 2;
  }
  const int rank = std::atoi(argv[1]), size = std::atoi(argv[2]);
  const std::string algorithm = argv[4];
  const size_t min_bytes = std::strtoull(argv[5], nullptr, 10);
  const size_t max_bytes = std::strtoull(argv[6], nullptr, 10);
  const int iters = std::atoi(argv[7]);

  gloo::rendezvous::FileStore store(argv[3]);
  gloo::transport::tcp::attr attr;
  // The device's loop thread starts inside CreateDevice and inherits this thread's policy,
  // which is then put back.
  sched_param saved{};
  const bool batch = loop_thread == "batch" && sched_getparam(0, &saved) == 0 &&
                     sched_setscheduler(0, SCHED_BATCH, &saved) == 0;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  if (batch && sched_setscheduler(0, SCHED_OTHER, &saved) != 0) {
    std::perror("gloo_allreduce: restoring the scheduling policy");
    return 1;
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::seconds(120));
  context->connectFullMesh(store, device);
  gloo::BarrierAllToOne barrier(context);

  std::vector<float> data(max_bytes / sizeof(float), 1.0f);
  double slowest = 0;
  auto max_time = make("ring", context, reinterpret_cast<float*>(&slowest), 2);  // 1 double
  (void)max_time;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / sizeof(float));
    auto op = make(algorithm, context, data.data(), count);
    op->run();  // warm-up: connections, buffers
    op->run();
    barrier.run();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op->run();
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    // The slowest rank's time, as collie reports it: every rank shares its time.
    std::vector<double> times(size, 0.0);
    times[rank] = seconds;
    gloo::AllreduceRing<double> gather(context, {times.data()}, size);
    gather.run();
    double worst = 0;
    for (double t : times) worst = t > worst ? t : worst;
    if (rank == 0) {
      double busbw = bytes / worst / 1e9 * 2.0 * (size - 1) / size;
      std::printf("gloo,%s,%d,%zu,%.2f,%.4f\n", algorithm.c_str(), size, bytes, worst * 1e6, busbw);
      std::fflush(stdout);
    }
  }
  return 0;
}
