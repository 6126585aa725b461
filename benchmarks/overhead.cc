// Where a small all-reduce's time goes: the layers between a transport and collie's
// Communicator, each timed on its own for one exchange of 4 KiB between 2 processes (Google
// Benchmark). Layer by layer, for ucx (shared memory: sysv, cma) and gloo (TCP):
//
//   raw        the transport's own API: UCP tag send/recv on its own worker; a Gloo pair
//              through its UnboundBuffer, the buffer registered once
//   backend    collie's Backend: isend + irecv + wait on both
//   scheduler  a scheduler's run(): recursive_doubling on 2 ranks is that one exchange, its
//              scratch buffer and the reduction
//   dispatch   Communicator::run(): rule selection, sequence number, provenance, then the
//              scheduler
//   traced     dispatch recording every collective into a trace (train.trace)
//   attribution  the straggler attribution's all-gather of 10 steps' samples (every 10 steps)
//   trace/span (no communication) one compute span recorded (forward, backward, ...)
//   reduce     (no communication) reduceInto of 1024 floats, and the same through ATen (the
//              path host memory took before, and device memory still takes); reduceInto of
//              1024 float16, and the loop through c10::Half's software conversions
//
// The difference between two adjacent layers is what the upper one adds. One process
// forks two ranks; both run the same benchmarks with a fixed iteration count, so they stay
// in step (every exchange synchronises them), and rank 0 reports.
//
//   overhead [--bytes N] [--iterations N] [google benchmark flags, e.g.
//            --benchmark_repetitions=5 --benchmark_format=csv]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collie/plugin.h"
#include "count_allocations.h"
#include "plugin/loader.h"
#include "runtime/communicator.h"
#include "runtime/control.h"
#include "runtime/job.h"
#include "runtime/launcher.h"
#include "runtime/trace.h"
#include "train/stragglers.h"

namespace {

using namespace std::chrono_literals;

// Reports the allocations a benchmark's loop made, per iteration, as the counter "allocs".
class CountAllocations {
 public:
  explicit CountAllocations(benchmark::State& state)
      : state_(state), start_(collie::testing::allocations()) {}
  ~CountAllocations() {
    const double made = static_cast<double>(collie::testing::allocations() - start_);
    state_.counters["allocs"] = benchmark::Counter(made, benchmark::Counter::kAvgIterations);
  }

 private:
  benchmark::State& state_;
  uint64_t start_;
};
using collie::Buffer;

size_t g_bytes = 4096;
int64_t g_iterations = 20000;

Buffer floats(std::vector<float>& v) {
  Buffer b;
  b.data = v.data();
  b.count = v.size();
  b.dtype = collie::DType::kF32;
  return b;
}

// ---- raw UCP: its own context and worker, addresses through the job's store ----------
struct RawUcx {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;

  RawUcx(collie::ProcessJob& job, const char* transports) {
    ucp_config_t* config = nullptr;
    ucp_config_read(nullptr, nullptr, &config);
    ucp_config_modify(config, "TLS", transports);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    if (ucp_init(&params, config, &context) != UCS_OK) throw std::runtime_error("ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context, &wp, &worker) != UCS_OK) throw std::runtime_error("worker");
    ucp_address_t* address = nullptr;
    size_t length = 0;
    ucp_worker_get_address(worker, &address, &length);
    auto all = job.allGather("raw-ucx", std::string(reinterpret_cast<char*>(address), length));
    ucp_worker_release_address(worker, address);
    const std::string& peer = all[1 - job.rank()];
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(peer.data());
    if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) throw std::runtime_error("ep");
  }

  void waitFor(ucs_status_ptr_t request) {
    if (request == nullptr) return;
    if (UCS_PTR_IS_ERR(request)) throw std::runtime_error("ucx request failed");
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }

  void exchange(void* out, void* in, size_t bytes) {
    ucp_request_param_t param{};
    ucs_status_ptr_t recv = ucp_tag_recv_nbx(worker, in, bytes, 7, ~0ull, &param);
    ucs_status_ptr_t send = ucp_tag_send_nbx(ep, out, bytes, 7, &param);
    waitFor(send);
    waitFor(recv);
  }
};

// ---- raw Gloo: a full mesh through a file store, buffers registered once -------------
struct RawGloo {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::unique_ptr<gloo::transport::UnboundBuffer> out, in;

  RawGloo(int rank, const std::string& dir, void* send, void* recv, size_t bytes) {
    gloo::rendezvous::FileStore store(dir);
    gloo::transport::tcp::attr attr("127.0.0.1");
    context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
    context->setTimeout(std::chrono::seconds(60));
    device = gloo::transport::tcp::CreateDevice(attr);
    context->connectFullMesh(store, device);
    out = context->createUnboundBuffer(send, bytes);
    in = context->createUnboundBuffer(recv, bytes);
  }

  void exchange(int peer) {
    in->recv(peer, 7);
    out->send(peer, 7);
    out->waitSend();
    in->waitRecv();
  }
};

// What one rank holds for the benchmarks; built once per process.
struct Rank {
  int rank = 0;
  std::vector<float> send, recv;
  std::unique_ptr<RawUcx> raw_ucx;
  std::unique_ptr<RawGloo> raw_gloo;
  collie::WorkerRank ucx, gloo;
  std::shared_ptr<collie::Scheduler> scheduler;
  std::unique_ptr<collie::Communicator> ucx_comm, gloo_comm;
};
Rank* g_rank = nullptr;

void exchangeOver(collie::Backend& b, benchmark::State& state) {
  Buffer out = floats(g_rank->send), in = floats(g_rank->recv);
  const int peer = 1 - b.rank();
  CountAllocations count(state);
  for (auto _ : state) {
    auto recv = b.irecv(peer, in, collie::makeTag(1, 1, 0));
    auto send = b.isend(peer, out, collie::makeTag(1, 1, 0));
    send->wait(b.timeout());
    recv->wait(b.timeout());
  }
}

collie::CollectiveArgs allreduceArgs() {
  collie::CollectiveArgs args;
  args.data = floats(g_rank->send);
  return args;
}

void schedulerOver(collie::WorkerRank& w, benchmark::State& state) {
  collie::CollectiveArgs args = allreduceArgs();
  uint64_t seq = 1;
  CountAllocations count(state);
  for (auto _ : state) {
    args.seq = seq++;
    g_rank->scheduler->run(args, *w.backend, w.topology);
  }
}

void dispatchOver(collie::Communicator& comm, benchmark::State& state) {
  collie::CollectiveArgs args = allreduceArgs();
  CountAllocations count(state);
  for (auto _ : state) comm.run(args);
}

// Communicator::run() recording into a trace (train.trace, bench.trace): the same loop
// as dispatch, plus two clock reads and an event appended under the tracer's lock.
void tracedOver(collie::Communicator& comm, benchmark::State& state) {
  collie::CollectiveArgs args = allreduceArgs();
  collie::Tracer tracer({}, static_cast<size_t>(state.max_iterations) + 1);
  comm.setTracer(&tracer);
  {
    CountAllocations count(state);
    for (auto _ : state) comm.run(args);
  }
  comm.setTracer(nullptr);
}

// The straggler attribution's gathering every straggler_every (10) steps: each rank's
// samples of 10 steps with 6 collectives each, all-gathered over the control plane.
void attributionOver(collie::Backend& b, benchmark::State& state) {
  collie::Control control(b);
  std::vector<collie::train::StragglerSample> samples(10,
                                                      {0.1, 0.08, std::vector<double>(6, 0.01)});
  CountAllocations count(state);
  for (auto _ : state) {
    auto gathered = control.allGather(collie::train::packSamples(samples));
    benchmark::DoNotOptimize(gathered);
  }
}

void BM_trace_span(benchmark::State& s) {
  collie::Tracer tracer({}, static_cast<size_t>(s.max_iterations) + 1);
  CountAllocations count(s);
  for (auto _ : s) collie::TraceSpan span(&tracer, "forward", 0);
}

void BM_ucx_raw(benchmark::State& s) {
  CountAllocations count(s);
  for (auto _ : s) g_rank->raw_ucx->exchange(g_rank->send.data(), g_rank->recv.data(), g_bytes);
}
void BM_gloo_raw(benchmark::State& s) {
  CountAllocations count(s);
  for (auto _ : s) g_rank->raw_gloo->exchange(1 - g_rank->rank);
}

// Registers `fn` to run g_iterations times, timed in microseconds.
void registerTimed(const std::string& name, std::function<void(benchmark::State&)> fn) {
  benchmark::RegisterBenchmark(name.c_str(), std::move(fn))
      ->Iterations(g_iterations)
      ->Unit(benchmark::kMicrosecond);
}

// The layers above the raw exchange, over one backend: collie's backend, a scheduler over
// it, the Communicator's dispatch, the same traced, and the attribution of a wait.
void registerLayers(const std::string& backend, collie::WorkerRank* w, collie::Communicator* comm) {
  using Layer = std::function<void(benchmark::State&)>;
  for (const auto& [name, layer] : std::vector<std::pair<const char*, Layer>>{
           {"2_backend", [w](benchmark::State& s) { exchangeOver(*w->backend, s); }},
           {"3_scheduler", [w](benchmark::State& s) { schedulerOver(*w, s); }},
           {"4_dispatch", [comm](benchmark::State& s) { dispatchOver(*comm, s); }},
           {"5_traced", [comm](benchmark::State& s) { tracedOver(*comm, s); }},
           {"6_attribution", [w](benchmark::State& s) { attributionOver(*w->backend, s); }}}) {
    registerTimed(backend + "/" + name, layer);
  }
}

void BM_reduce_reduceInto(benchmark::State& s) {
  Buffer dst = floats(g_rank->send), src = floats(g_rank->recv);
  CountAllocations count(s);
  for (auto _ : s) collie::reduceInto(dst, src, collie::ReduceOp::kSum);
}
void BM_reduce_aten(benchmark::State& s) {
  const int64_t n = static_cast<int64_t>(g_rank->send.size());
  CountAllocations count(s);
  for (auto _ : s) {
    at::Tensor d = at::from_blob(g_rank->send.data(), {n}, at::kFloat);
    at::Tensor r = at::from_blob(g_rank->recv.data(), {n}, at::kFloat);
    d.add_(r);
  }
}

// float16, as the fp16 codec sums it: reduceInto (F16C where the CPU has it), and the loop
// through c10::Half's conversions, which run in software (host memory's path before).
struct HalfPair {
  std::vector<c10::Half> dst, src;
  HalfPair() {
    for (int i = 0; i < 1024; ++i) {
      dst.emplace_back(0.001f * static_cast<float>(i));
      src.emplace_back(0.0f);  // the sums stay where they are however many iterations run
    }
  }
};
void BM_reduce_f16_reduceInto(benchmark::State& s) {
  HalfPair p;
  const Buffer dst{p.dst.data(), p.dst.size(), collie::DType::kF16};
  const Buffer src{p.src.data(), p.src.size(), collie::DType::kF16};
  for (auto _ : s) collie::reduceInto(dst, src, collie::ReduceOp::kSum);
}
void BM_reduce_f16_c10(benchmark::State& s) {
  HalfPair p;
  for (auto _ : s) {
    for (size_t i = 0; i < p.dst.size(); ++i) {
      p.dst[i] = c10::Half(float(p.dst[i]) + float(p.src[i]));
    }
    benchmark::DoNotOptimize(p.dst.data());
  }
}

collie::config::PluginRef backendRef(const std::string& plugin) {
  collie::config::PluginRef ref;
  ref.plugin = ref.label = plugin;
  ref.params = collie::Params("backend '" + plugin + "'");
  ref.params.set("timeout", "60s");
  if (plugin == "ucx") ref.params.set("transports", "sysv,cma");
  return ref;
}

int runRank(int rank, uint16_t port, const std::string& gloo_dir, int argc, char** argv) {
  collie::WorkerEnv env;
  env.present = true;
  env.source = "overhead";
  env.rank = env.local_rank = rank;
  env.world = env.local_world = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  collie::ProcessJob job(env, "127.0.0.1", port, 60s);
  const collie::PluginLoader loader({COLLIE_BENCH_PLUGIN_DIR});
  Rank r;
  r.rank = rank;
  r.send.assign(g_bytes / sizeof(float), 1.0f + rank);
  r.recv.assign(g_bytes / sizeof(float), 0.0f);
  r.raw_ucx = std::make_unique<RawUcx>(job, "sysv,cma");
  r.raw_gloo = std::make_unique<RawGloo>(rank, gloo_dir, r.send.data(), r.recv.data(), g_bytes);
  r.ucx = collie::createBackend(job, loader, backendRef("ucx"), "ucx/", 60s);
  r.gloo = collie::createBackend(job, loader, backendRef("gloo"), "gloo/", 60s);
  collie::Params none("scheduler 'recursive_doubling'");
  r.scheduler = loader.createScheduler("recursive_doubling", none);
  r.ucx_comm = std::make_unique<collie::Communicator>(r.ucx.backend, "ucx", r.ucx.topology);
  r.ucx_comm->addRule("recursive_doubling", r.scheduler);
  r.gloo_comm = std::make_unique<collie::Communicator>(r.gloo.backend, "gloo", r.gloo.topology);
  r.gloo_comm->addRule("recursive_doubling", r.scheduler);
  g_rank = &r;

  registerTimed("ucx/1_raw", BM_ucx_raw);
  registerLayers("ucx", &r.ucx, r.ucx_comm.get());
  registerTimed("gloo/1_raw", BM_gloo_raw);
  registerLayers("gloo", &r.gloo, r.gloo_comm.get());
  for (auto [name, fn] : std::vector<std::pair<const char*, void (*)(benchmark::State&)>>{
           {"trace/span", BM_trace_span},
           {"reduce/reduceInto", BM_reduce_reduceInto},
           {"reduce/aten", BM_reduce_aten},
           {"reduce/f16_reduceInto", BM_reduce_f16_reduceInto},
           {"reduce/f16_c10", BM_reduce_f16_c10}}) {
    registerTimed(name, fn);
  }
  benchmark::Initialize(&argc, argv);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    // The partner runs the same loops in step, and says nothing.
    struct Silent : benchmark::BenchmarkReporter {
      bool ReportContext(const Context&) override { return true; }
      void ReportRuns(const std::vector<Run>&) override {}
    } silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--bytes") && i + 1 < argc) {
      g_bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--iterations") && i + 1 < argc) {
      g_iterations = std::strtoll(argv[++i], nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (g_bytes < sizeof(float) || g_bytes % sizeof(float) != 0 || g_iterations < 1) {
    std::fprintf(stderr, "overhead: --bytes must be a positive multiple of 4, --iterations >= 1\n");
    return 2;
  }
  char dir_template[] = "/tmp/collie-overhead-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) {
    std::perror("overhead: mkdtemp");
    return 1;
  }
  const std::string gloo_dir = dir_template;
  const uint16_t port = collie::pickFreePort("127.0.0.1");
  std::vector<pid_t> children;
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 1;
      try {
        int child_argc = static_cast<int>(rest.size());
        code = runRank(rank, port, gloo_dir, child_argc, rest.data());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "overhead: rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  int worst = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    worst = std::max(worst, code);
  }
  std::filesystem::remove_all(gloo_dir);
  return worst;
}
