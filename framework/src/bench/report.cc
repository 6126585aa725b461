// Bench output: the nccl-tests style table, CSV and JSON.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "bench/bench.h"
#include "collie/error.h"

namespace collie::bench {
namespace {

void header(std::ostream& out, const Row& first) {
  out << fmt::format("# collective {} on {} ranks, backend {}, {} {}\n", first.collective,
                     first.ranks, first.backend, first.dtype, first.op);
  out << "#\n";
  out << fmt::format("# {:>12} {:>12} {:>6} {:>6} {:>16} {:>11} {:>9} {:>9} {:>7}\n", "size",
                     "count", "type", "redop", "scheduler", "time", "algbw", "busbw", "#wrong");
  out << fmt::format("# {:>12} {:>12} {:>6} {:>6} {:>16} {:>11} {:>9} {:>9} {:>7}\n", "(B)",
                     "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::ofstream openOutput(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw Error(ErrorKind::kInternal, "cannot write " + path);
  return out;
}

}  // namespace

void printTable(std::ostream& out, const std::vector<Row>& rows) {
  std::string run = "\x01";
  std::map<std::string, std::pair<double, int>> busbw;  // scheduler -> (sum, n)
  std::vector<std::string> order;
  uint64_t wrong = 0;
  for (const Row& r : rows) {
    if (r.run != run) {
      run = r.run;
      if (&r != &rows.front()) out << "#\n";
      if (!run.empty()) out << "# run: " << run << "\n";
      header(out, r);
    }
    out << fmt::format("  {:>12} {:>12} {:>6} {:>6} {:>16} {:>11.2f} {:>9.3f} {:>9.3f} {:>7}\n",
                       r.bytes, r.count, r.dtype, r.op, r.scheduler, r.time_us, r.algbw, r.busbw,
                       r.wrong);
    if (!busbw.count(r.scheduler)) order.push_back(r.scheduler);
    busbw[r.scheduler].first += r.busbw;
    busbw[r.scheduler].second += 1;
    wrong += r.wrong;
  }
  out << "#\n# Avg bus bandwidth (GB/s):";
  for (const auto& s : order) {
    out << fmt::format(" {} {:.3f}", s, busbw[s].first / busbw[s].second);
  }
  out << "\n# Wrong elements: " << wrong << (wrong == 0 ? " (all results correct)" : " (FAILED)")
      << "\n";
}

void writeCsv(const std::string& path, const std::vector<Row>& rows) {
  auto out = openOutput(path);
  out << "run,collective,backend,ranks,scheduler,bytes,count,dtype,op,time_us,algbw_gbps,"
         "busbw_gbps,wrong\n";
  for (const Row& r : rows) {
    out << fmt::format("\"{}\",{},{},{},{},{},{},{},{},{:.3f},{:.6f},{:.6f},{}\n", r.run,
                       r.collective, r.backend, r.ranks, r.scheduler, r.bytes, r.count, r.dtype,
                       r.op, r.time_us, r.algbw, r.busbw, r.wrong);
  }
}

void writeJson(const std::string& path, const std::vector<Row>& rows) {
  nlohmann::json doc = nlohmann::json::array();
  for (const Row& r : rows) {
    doc.push_back({{"run", r.run},
                   {"collective", r.collective},
                   {"backend", r.backend},
                   {"ranks", r.ranks},
                   {"scheduler", r.scheduler},
                   {"bytes", r.bytes},
                   {"count", r.count},
                   {"dtype", r.dtype},
                   {"op", r.op},
                   {"time_us", r.time_us},
                   {"algbw_gbps", r.algbw},
                   {"busbw_gbps", r.busbw},
                   {"wrong", r.wrong}});
  }
  openOutput(path) << doc.dump(2) << "\n";
}

}  // namespace collie::bench
