// What the bench's numbers say: crossovers, best-scheduler rules, prediction error.
#include <algorithm>
#include <cmath>
#include <map>

#include "bench/bench.h"

namespace collie::bench {
namespace {

bool comparable(const Row& r) { return r.wrong == 0 && r.plugin != "auto" && r.plugin != "rules"; }

// A row's time as a range: min–max over repeats (measured), or the prediction as a point.
struct Range {
  double median = NAN, low = NAN, high = NAN;
};

Range rangeOf(const Row& r, bool predicted) {
  if (predicted) return {r.predicted_us, r.predicted_us, r.predicted_us};
  return {r.time_us, std::min(r.time_min_us, r.time_us), std::max(r.time_max_us, r.time_us)};
}

// Per run (in order of first appearance), per size (ascending): the comparable rows.
std::vector<std::map<uint64_t, std::vector<const Row*>>> comparableBySize(
    const std::vector<Row>& rows, bool predicted) {
  std::vector<std::string> order;
  std::map<std::string, std::map<uint64_t, std::vector<const Row*>>> by_run;
  for (const Row& r : rows) {
    if (!comparable(r) || !std::isfinite(rangeOf(r, predicted).median)) continue;
    if (!by_run.count(r.run)) order.push_back(r.run);
    by_run[r.run][r.bytes].push_back(&r);
  }
  std::vector<std::map<uint64_t, std::vector<const Row*>>> runs;
  for (const auto& run : order) runs.push_back(std::move(by_run[run]));
  return runs;
}

// Per run, per size (ascending): the comparable row with the lowest median.
std::vector<std::vector<const Row*>> fastestPerSize(const std::vector<Row>& rows, bool predicted) {
  std::vector<std::vector<const Row*>> runs;
  for (const auto& sizes : comparableBySize(rows, predicted)) {
    std::vector<const Row*> fastest;
    for (const auto& [bytes, candidates] : sizes) {
      fastest.push_back(
          *std::min_element(candidates.begin(), candidates.end(), [&](const Row* a, const Row* b) {
            return rangeOf(*a, predicted).median < rangeOf(*b, predicted).median;
          }));
    }
    runs.push_back(std::move(fastest));
  }
  return runs;
}

}  // namespace

std::vector<SizeVerdict> verdicts(const std::vector<Row>& rows, bool predicted) {
  std::vector<SizeVerdict> found;
  auto sizes_of_runs = comparableBySize(rows, predicted);
  auto fastest_of_runs = fastestPerSize(rows, predicted);
  for (size_t run = 0; run < sizes_of_runs.size(); ++run) {
    size_t i = 0;
    for (const auto& [bytes, candidates] : sizes_of_runs[run]) {
      const Row* best = fastest_of_runs[run][i++];
      SizeVerdict v{best->run, bytes, best->scheduler, {}};
      const Range fast = rangeOf(*best, predicted);
      for (const Row* r : candidates) {
        // Ranges that touch or overlap cannot be told apart.
        if (r != best && rangeOf(*r, predicted).low <= fast.high) v.tied.push_back(r->scheduler);
      }
      if (!v.tied.empty()) v.tied.insert(v.tied.begin(), best->scheduler);
      found.push_back(std::move(v));
    }
  }
  return found;
}

std::vector<Crossover> crossovers(const std::vector<Row>& rows, bool predicted) {
  std::vector<Crossover> found;
  const SizeVerdict* last = nullptr;  // the last distinguishable size of the current run
  for (const auto& v : verdicts(rows, predicted)) {
    if (last != nullptr && last->run != v.run) last = nullptr;
    if (!v.distinguishable()) continue;
    if (last != nullptr && last->fastest != v.fastest)
      found.push_back({v.run, last->bytes, v.bytes, last->fastest, v.fastest});
    last = &v;
  }
  return found;
}

CrossoverChecks checkCrossovers(const std::vector<Row>& rows) {
  const std::vector<Crossover> measured = crossovers(rows, false);
  std::vector<bool> matched(measured.size(), false);
  CrossoverChecks checks;
  for (const Crossover& p : crossovers(rows, true)) {
    CrossoverCheck check{p, std::nullopt, false};
    size_t kept = measured.size();  // the measured crossover set beside this one
    for (size_t i = 0; i < measured.size(); ++i) {
      const Crossover& m = measured[i];
      // One predicted crossover to one measured: one already set beside another is not.
      if (matched[i] || m.run != p.run || m.from != p.from || m.to != p.to) continue;
      // The change lies strictly between `below` (the old winner's) and `above` (the new
      // one's): the two agree when some point lies between both pairs.
      const bool overlaps = p.below < m.above && m.below < p.above;
      // The first of the pair in size order, unless a later one agrees.
      if (!check.measured || (overlaps && !check.agrees)) {
        check.measured = m;
        check.agrees = overlaps;
        kept = i;
      }
    }
    if (kept < measured.size()) matched[kept] = true;
    checks.predicted.push_back(std::move(check));
  }
  for (size_t i = 0; i < measured.size(); ++i) {
    if (!matched[i]) checks.unpredicted.push_back(measured[i]);
  }
  return checks;
}

std::vector<AutoVerdict> autoVerdicts(const std::vector<Row>& rows) {
  std::vector<AutoVerdict> found;
  const auto judged = verdicts(rows, false);
  for (const Row& r : rows) {
    if (r.plugin != "auto" || r.wrong != 0) continue;
    const auto v = std::find_if(judged.begin(), judged.end(), [&](const SizeVerdict& v) {
      return v.run == r.run && v.bytes == r.bytes;
    });
    if (v == judged.end()) continue;
    AutoVerdict a;
    a.run = r.run;
    a.label = r.scheduler;
    a.bytes = r.bytes;
    a.ran = r.ran;
    const auto best = std::find_if(rows.begin(), rows.end(), [&](const Row& b) {
      return comparable(b) && b.run == r.run && b.bytes == r.bytes && b.scheduler == v->fastest;
    });
    if (v->distinguishable() && best != rows.end() && best->time_us > 0) {
      const Range mine = rangeOf(r, false), fast = rangeOf(*best, false);
      a.fastest = v->fastest;
      a.off_percent = (r.time_us / best->time_us - 1) * 100;
      a.overlaps = mine.low <= fast.high && fast.low <= mine.high;
    }
    found.push_back(std::move(a));
  }
  return found;
}

RulesFile bestRules(const std::vector<Row>& rows,
                    const std::vector<config::PluginRef>& schedulers) {
  RulesFile file;
  auto runs = fastestPerSize(rows, false);
  if (runs.empty() || runs[0].empty()) return file;
  const auto& sizes = runs[0];
  file.collective = sizes[0]->collective;
  file.world_size = sizes[0]->ranks;
  file.backend = sizes[0]->backend;
  // Per size the fastest; where it cannot be told from the previous size's choice (their
  // ranges overlap), the previous choice stays, so that noise does not split a range.
  std::vector<std::string> chosen;
  const auto judged = verdicts(rows, false);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string pick = sizes[i]->scheduler;
    const auto& tied = judged[i].tied;
    if (i > 0 && std::find(tied.begin(), tied.end(), chosen.back()) != tied.end())
      pick = chosen.back();
    chosen.push_back(pick);
  }
  // The scheduler as the config gave it: its plugin and params.
  auto choiceOf = [&](const std::string& label) {
    for (const auto& ref : schedulers) {
      if (ref.label == label) return RuleChoice{ref.plugin, ref.params.values()};
    }
    for (const Row* row : sizes) {
      if (row->scheduler == label) return RuleChoice{row->plugin, {}};
    }
    return RuleChoice{label, {}};
  };
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool last = i + 1 == sizes.size();
    if (!last && chosen[i + 1] == chosen[i]) continue;
    // A rule's max_bytes 0 means "any size": a measured 0-byte size (a minimum below one
    // element) ends no range but the last, or every larger size would get its choice.
    if (!last && sizes[i]->bytes == 0) continue;
    file.rules.push_back({last ? 0 : sizes[i]->bytes, choiceOf(chosen[i])});
  }
  return file;
}

double medianErrorPercent(const std::vector<Row>& rows, const std::string& scheduler) {
  std::vector<double> errors;
  for (const Row& r : rows) {
    if (r.scheduler != scheduler || !std::isfinite(r.predicted_us) || r.time_us <= 0) continue;
    errors.push_back(std::fabs(r.predicted_us - r.time_us) / r.time_us * 100);
  }
  return median(std::move(errors));
}

}  // namespace collie::bench
