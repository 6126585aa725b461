// The soak every backend's tests run: thousands of collectives of mixed kinds and sizes
// through a Communicator, with the process's resident memory, file descriptors and threads
// read at the 2,000th collective, half-way through the rest and at the last. Not a timing
// test: nothing here measures speed.
#pragma once

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "loopback_job.h"
#include "runtime/communicator.h"

namespace collie::testing {

// What this process holds: resident memory, open file descriptors (sockets among them) and
// threads.
struct Usage {
  long rss_kb = 0;
  int fds = 0, sockets = 0, threads = 0;
};

inline Usage usageNow() {
  // Free memory the allocator still holds goes back first: what is left resident is what is
  // in use (a leak stays; the allocator's caching of the last 1 MiB buffers does not).
  ::malloc_trim(0);
  Usage u;
  long pages = 0, resident = 0;
  std::ifstream("/proc/self/statm") >> pages >> resident;
  u.rss_kb = resident * (::sysconf(_SC_PAGESIZE) / 1024);
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      ++u.fds;
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + entry->d_name;
      if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
          std::string(target).rfind("socket:", 0) == 0)
        ++u.sockets;
    }
    ::closedir(dir);
  }
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) u.threads = std::stoi(line.substr(8));
  }
  return u;
}

// Element counts (i32) the soak cycles through: nothing, one, odd primes, 1 MiB.
inline const std::vector<size_t>& soakCounts() {
  static const std::vector<size_t> counts{0, 1, 3, 13, 251, 4093, 262144};
  return counts;
}

// Runs `total` collectives on this rank: all-reduces through ring, tree and
// halving_doubling, broadcasts from every root, all-gathers, and a barrier every 100th, with
// the counts above; checks every result. `usage` (when not null) receives the usage at the
// 2,000th collective, half-way from there to the end, and at the end. False (with a line on
// stderr) when a result is wrong.
inline bool soak(std::shared_ptr<Backend> backend, int total, std::vector<Usage>* usage) {
  const int n = backend->size(), rank = backend->rank();
  // One Communicator numbers every collective, whichever scheduler runs it.
  Communicator comm(backend, "soak", Topology::singleNode(n));
  const std::vector<Communicator::Rule> ring{{0, {"ring", loadScheduler("ring")}}};
  const std::vector<Communicator::Rule> tree{{0, {"tree", loadScheduler("tree")}}};
  const std::vector<Communicator::Rule> hd{
      {0, {"halving_doubling", loadScheduler("halving_doubling")}}};
  std::vector<int32_t> data, output;
  for (int i = 0; i < total; ++i) {
    if ((i == 2000 || i == (2000 + total) / 2) && usage != nullptr) usage->push_back(usageNow());
    const size_t count = soakCounts()[(i / 5) % soakCounts().size()];
    CollectiveArgs args;
    const int kind = i % 5;
    data.assign(count, rank + 1);
    args.data.data = data.data();
    args.data.count = count;
    args.data.dtype = DType::kI32;
    int32_t expected = 0;
    const std::vector<Communicator::Rule>* rules = &ring;
    switch (kind) {
      case 0:
      case 1:
        args.coll = Collective::kAllReduce;
        expected = n * (n + 1) / 2;
        rules = kind == 0 ? &ring : &tree;
        break;
      case 2:
        args.coll = Collective::kBroadcast;
        args.root = i % n;
        expected = args.root + 1;
        rules = &tree;
        break;
      case 3:
        args.coll = Collective::kAllGather;
        output.assign(count * n, -1);
        args.output.data = output.data();
        args.output.count = output.size();
        args.output.dtype = DType::kI32;
        break;
      default:
        if (i % 100 == 4) {
          args = CollectiveArgs();
          args.coll = Collective::kBarrier;
          rules = &tree;
        } else {
          args.coll = Collective::kAllReduce;
          expected = n * (n + 1) / 2;
          rules = &hd;
        }
        break;
    }
    comm.run(args, *rules);
    bool right = true;
    if (args.coll != Collective::kAllGather && args.coll != Collective::kBarrier && count > 0)
      right = data.front() == expected && data.back() == expected;
    if (kind == 3 && count > 0) right = output.front() == 1 && output.back() == n;
    if (!right) {
      std::fprintf(stderr, "rank %d: collective %d (%s of %zu) gave a wrong result\n", rank, i,
                   collectiveName(args.coll), count);
      return false;
    }
  }
  if (usage != nullptr) usage->push_back(usageNow());
  // No rank leaves before every rank has read its usage: ranks that are threads of one
  // process would otherwise count one thread fewer.
  CollectiveArgs barrier;
  barrier.coll = Collective::kBarrier;
  comm.run(barrier, tree);
  return true;
}

// Whether readings of the usage agree: the same descriptors and threads in every reading,
// and (with `memory`) resident memory that does not keep growing. Two readings: within 2 %.
// Three (the soak's): one of the two intervals grew less than 1 %, and the whole less than
// 2 % plus 1 MiB. A leak grows with every collective, so it moves both intervals alike; an
// allocator's or a transport's pool that settles once (UCX's grows by about 0.7 MB at some
// moment after the 2,000th collective of a soak) moves only one, and by a bounded step.
// Prints the readings, under the names of the moments they were read.
inline bool flat(const std::vector<Usage>& usage, const std::string& what,
                 const char* first = "the 2,000th collective", const char* last = "the last",
                 bool memory = true) {
  if (usage.size() != 2 && usage.size() != 3) return false;
  const Usage &a = usage.front(), &b = usage.back();
  const auto growth = [](const Usage& from, const Usage& to) {
    return 100.0 * (to.rss_kb - from.rss_kb) / from.rss_kb;
  };
  std::string between;
  if (usage.size() == 3) {
    char mid[64];
    std::snprintf(mid, sizeof(mid), ", %.1f MB half-way", usage[1].rss_kb / 1024.0);
    between = mid;
  }
  std::fprintf(stderr,
               "%s: rss %.1f MB at %s%s, %.1f MB at %s (%+.2f %%); fds %d -> %d (sockets %d -> "
               "%d); threads %d -> %d\n",
               what.c_str(), a.rss_kb / 1024.0, first, between.c_str(), b.rss_kb / 1024.0, last,
               growth(a, b), a.fds, b.fds, a.sockets, b.sockets, a.threads, b.threads);
  bool same = true;
  for (const Usage& u : usage)
    same = same && u.fds == a.fds && u.sockets == a.sockets && u.threads == a.threads;
  bool steady = growth(a, b) < 2.0;
  if (usage.size() == 3) {
    const double step_kb = 0.02 * static_cast<double>(a.rss_kb) + 1024;
    steady = std::min(growth(a, usage[1]), growth(usage[1], b)) < 1.0 &&
             static_cast<double>(b.rss_kb - a.rss_kb) < step_kb;
  }
  return (!memory || steady) && same;
}

}  // namespace collie::testing
