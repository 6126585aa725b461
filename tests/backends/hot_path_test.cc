// The small-message hot path allocates nothing once warm: request memory is reused
// (collie/request_pool.h), and a collective through the Communicator, its scheduler and the
// ucx backend makes no heap allocation; over gloo collie adds none to Gloo's own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "count_allocations.h"
#include "forked_job.h"
#include "host_view.h"
#include "runtime/communicator.h"

namespace collie {
namespace {

using namespace std::chrono_literals;
using testing::allocations;
using testing::threadAllocations;

TEST(RequestPool, ADroppedRequestsMemoryGoesToTheNextRequest) {
  auto first = std::make_unique<CompletedRequest>();
  const void* where = first.get();
  first.reset();
  const uint64_t before = allocations();
  std::unique_ptr<Request> second = std::make_unique<CompletedRequest>();
  EXPECT_EQ(allocations() - before, 0u);
  EXPECT_EQ(second.get(), where);
}

// A subclass of a pooled type that is larger than it gets its memory from the heap, and
// gives it back there: the pool's blocks are of the pooled type's size.
class LargerRequest : public CompletedRequest {
 public:
  char more[64] = {};
};

TEST(RequestPool, ALargerSubclassUsesTheHeap) {
  const size_t pooled = CompletedRequest::pooledBlocks();
  const uint64_t before = allocations();
  std::unique_ptr<Request> larger = std::make_unique<LargerRequest>();
  EXPECT_EQ(allocations() - before, 1u);
  larger.reset();
  EXPECT_EQ(CompletedRequest::pooledBlocks(), pooled);
}

TEST(RequestPool, TheListKeepsABoundedNumberOfBlocks) {
  std::vector<std::unique_ptr<Request>> many;
  for (size_t i = 0; i < detail::BlockPool::kMaxFree + 50; ++i)
    many.push_back(std::make_unique<CompletedRequest>());
  many.clear();
  EXPECT_EQ(CompletedRequest::pooledBlocks(), detail::BlockPool::kMaxFree);
}

Buffer floats(std::vector<float>& v) { return testing::hostView(v); }

// Runs 10 collectives of `coll` (4 KiB per rank) through a Communicator with `scheduler`,
// then `counted` more; `made` receives the allocations this thread made in those.
void countCollectives(const std::shared_ptr<Backend>& backend, const Topology& topology,
                      const std::string& scheduler, Collective coll, int counted, uint64_t* made) {
  const size_t n = 1024;
  const size_t size = static_cast<size_t>(backend->size());
  std::vector<float> data(coll == Collective::kReduceScatter ? n * size : n, 1.0f);
  std::vector<float> output(coll == Collective::kAllGather ? n * size : n, 0.0f);
  Communicator comm(backend, "test", topology);
  comm.addRule(scheduler, testing::loadScheduler(scheduler));
  // As in a run: the rank's progress board marks every collective (its file is written by
  // another thread, whose allocations are not this one's).
  CommDebug debug;
  debug.progress.dir = ::testing::TempDir() + "/hot-path-progress-" + std::to_string(::getpid());
  comm.setDebug(debug);
  CollectiveArgs args;
  args.coll = coll;
  args.op = ReduceOp::kMax;  // stays 1 however often it runs
  args.data = floats(data);
  if (coll == Collective::kAllGather || coll == Collective::kReduceScatter)
    args.output = floats(output);
  for (int i = 0; i < 10; ++i) comm.run(args);
  const uint64_t before = threadAllocations();
  for (int i = 0; i < counted; ++i) comm.run(args);
  *made = threadAllocations() - before;
}

struct HotPathCase {
  std::string scheduler;
  Collective coll;
  int ranks;
  unsigned most_per_collective = 0;  // allocations allowed
};

std::string caseName(const ::testing::TestParamInfo<HotPathCase>& info) {
  return info.param.scheduler + "_" + collectiveName(info.param.coll) + "_" +
         std::to_string(info.param.ranks) + "ranks";
}

class UcxHotPath : public ::testing::TestWithParam<HotPathCase> {};

TEST_P(UcxHotPath, SteadyCollectivesAllocateNothing) {
  const HotPathCase c = GetParam();
  auto codes = testing::runJobWith(
      "ucx",
      [&](ProcessJob& job, config::PluginRef ref) {
        // Shared memory, the transport of the small-message comparison: UCX's TCP transport
        // grows its receive pools now and then.
        ref.params.set("transports", "sysv,cma", "test");
        WorkerRank w = createBackend(job, testing::buildTreeLoader(), ref, "hot/", 20s);
        uint64_t made = 0;
        countCollectives(w.backend, w.topology, c.scheduler, c.coll, 50, &made);
        // Every rank counted before any leaves: a peer that goes makes UCX allocate, and a
        // broadcast's root would leave before its last message arrived.
        job.allGather("hot/counted", "");
        if (made <= 50u * c.most_per_collective) return true;
        std::fprintf(stderr, "rank %d: 50 %s of 4 KiB with %s made %llu heap allocations\n",
                     w.backend->rank(), collectiveName(c.coll), c.scheduler.c_str(),
                     static_cast<unsigned long long>(made));
        return false;
      },
      c.ranks);
  EXPECT_EQ(codes, std::vector<int>(c.ranks, 0));
}

std::vector<HotPathCase> hotPathCases() {
  std::vector<HotPathCase> cases;
  for (int ranks : {2, 3, 4}) {
    for (const char* s : {"ring", "tree", "recursive_doubling", "halving_doubling",
                          "double_binary_tree", "bidirectional_ring", "knomial", "swing"})
      cases.push_back({s, Collective::kAllReduce, ranks});
    // auto remembers its choice per shape; its Decision names the choice, a string that
    // outgrows the small-string buffer for most names.
    cases.push_back({"auto", Collective::kAllReduce, ranks, 1});
    for (const char* s : {"ring", "bruck", "halving_doubling"})
      cases.push_back({s, Collective::kAllGather, ranks});
    cases.push_back({"ring", Collective::kReduceScatter, ranks});
    // Off powers of two halving_doubling's reduce_scatter folds a whole input (3 x 4 KiB) into
    // its partner, above UCX's rendezvous threshold on shared memory: UCX grows its request
    // pool when the announcement comes before the receive (ucp_tag_rndv_process_rts): once in
    // 50 collectives in 5 of 29 runs on a 2-core VM. Not collie's allocation, but not none.
    if (ranks != 3) cases.push_back({"halving_doubling", Collective::kReduceScatter, ranks});
    for (const char* s : {"tree", "knomial"}) cases.push_back({s, Collective::kBroadcast, ranks});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Schedulers, UcxHotPath, ::testing::ValuesIn(hotPathCases()), caseName);

// Over gloo the transport allocates for its own bookkeeping (about 6 allocations per 4 KiB
// exchange through Gloo's unbound buffers, 1 in 16 or so on collie's eager path): collie's
// requests, counts and registrations must add none, so that far fewer than one allocation
// per message is made.
TEST(GlooHotPath, AMessageAllocatesFarLessThanOnce) {
  auto codes = testing::runJob("gloo", [](Backend& b) {
    std::vector<float> out(1024, 1.0f), in(1024, 0.0f);
    const int peer = 1 - b.rank();
    auto exchange = [&](uint64_t seq) {
      auto recv = b.irecv(peer, floats(in), makeTag(seq, 1, 0));
      auto send = b.isend(peer, floats(out), makeTag(seq, 1, 0));
      send->wait(b.timeout());
      recv->wait(b.timeout());
    };
    for (uint64_t seq = 1; seq <= 20; ++seq) exchange(seq);
    const int counted = 400;
    const uint64_t before = allocations();
    for (uint64_t seq = 21; seq < 21 + counted; ++seq) exchange(seq);
    const uint64_t made = allocations() - before;
    // Two messages per exchange: one allocation per message would be 2 * counted.
    if (made * 4 < static_cast<uint64_t>(counted)) return true;
    std::fprintf(stderr, "rank %d: %d exchanges of 4 KiB made %llu heap allocations\n", b.rank(),
                 counted, static_cast<unsigned long long>(made));
    return false;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace collie
