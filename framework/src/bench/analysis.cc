// What the bench's numbers say: crossovers, best-scheduler rules, prediction error.
#include <algorithm>
#include <cmath>
#include <map>

#include "bench/bench.h"

namespace collie::bench {
namespace {

bool comparable(const Row& r) { return r.wrong == 0 && r.plugin != "auto" && r.plugin != "rules"; }

// Per run, per size (ascending): the fastest comparable row.
std::vector<std::vector<const Row*>> fastestPerSize(const std::vector<Row>& rows, bool predicted) {
  std::vector<std::vector<const Row*>> runs;
  std::map<std::string, std::map<uint64_t, const Row*>> best;
  std::vector<std::string> order;
  auto time = [&](const Row* r) { return predicted ? r->predicted_us : r->time_us; };
  for (const Row& r : rows) {
    if (!comparable(r) || !std::isfinite(time(&r))) continue;
    if (!best.count(r.run)) order.push_back(r.run);
    const Row*& slot = best[r.run][r.bytes];
    if (slot == nullptr || time(&r) < time(slot)) slot = &r;
  }
  for (const auto& run : order) {
    std::vector<const Row*> sizes;
    for (const auto& [bytes, row] : best[run]) sizes.push_back(row);
    runs.push_back(sizes);
  }
  return runs;
}

}  // namespace

std::vector<Crossover> crossovers(const std::vector<Row>& rows, bool predicted) {
  std::vector<Crossover> found;
  for (const auto& sizes : fastestPerSize(rows, predicted)) {
    for (size_t i = 1; i < sizes.size(); ++i) {
      if (sizes[i]->scheduler != sizes[i - 1]->scheduler) {
        found.push_back({sizes[i]->run, sizes[i - 1]->bytes, sizes[i]->bytes,
                         sizes[i - 1]->scheduler, sizes[i]->scheduler});
      }
    }
  }
  return found;
}

RulesFile bestRules(const std::vector<Row>& rows) {
  RulesFile file;
  auto runs = fastestPerSize(rows, false);
  if (runs.empty() || runs[0].empty()) return file;
  const auto& sizes = runs[0];
  file.collective = sizes[0]->collective;
  file.world_size = sizes[0]->ranks;
  file.backend = sizes[0]->backend;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool last = i + 1 == sizes.size();
    if (!last && sizes[i + 1]->plugin == sizes[i]->plugin) continue;
    file.rules.push_back({last ? 0 : sizes[i]->bytes, sizes[i]->plugin});
  }
  return file;
}

double medianErrorPercent(const std::vector<Row>& rows, const std::string& scheduler) {
  std::vector<double> errors;
  for (const Row& r : rows) {
    if (r.scheduler != scheduler || !std::isfinite(r.predicted_us) || r.time_us <= 0) continue;
    errors.push_back(std::fabs(r.predicted_us - r.time_us) / r.time_us * 100);
  }
  if (errors.empty()) return NAN;
  std::sort(errors.begin(), errors.end());
  const size_t mid = errors.size() / 2;
  return errors.size() % 2 ? errors[mid] : (errors[mid - 1] + errors[mid]) / 2;
}

}  // namespace collie::bench
