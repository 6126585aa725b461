// What training reports (train/report.h): the step log, the progress line, the cross-rank
// summary, the table with stragglers, all-reduce against its prediction, the weight-sync
// verdict and projections; and the JSON that carries a Result between processes.
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <ostream>
#include <set>
#include <sstream>
#include <type_traits>

#include "collie/error.h"
#include "collie/params.h"
#include "core/strings.h"
#include "train/memory_fit.h"
#include "train/report.h"
#include "util/files.h"
#include "util/json_file.h"

namespace collie::train {

using nlohmann::json;

void to_json(json& j, const SyncCheck& s) {
  j = json::object();
  forEachSyncField(s, [&](const char* key, const auto& value) { j[key] = value; });
}
void from_json(const json& j, SyncCheck& s) {
  forEachSyncField(s, [&](const char* key, auto& value) { j.at(key).get_to(value); });
}
void to_json(json& j, const StepMemory& m) {
  j = json::object();
  forEachStepMemoryField(m, [&](const char* key, const auto& value) { j[key] = value; });
}
void from_json(const json& j, StepMemory& m) {
  forEachStepMemoryField(m, [&](const char* key, auto& value) { j.at(key).get_to(value); });
}
void to_json(json& j, const Rebalance& c) {
  j = json::object();
  forEachRebalanceField(c, [&](const char* key, const auto& value) { j[key] = value; });
}
void from_json(const json& j, Rebalance& c) {
  forEachRebalanceField(c, [&](const char* key, auto& value) { j.at(key).get_to(value); });
}

namespace {

// Each rank's memory at its peak during the steps, by use; more than four ranks: the one
// with the largest resident peak (every rank's is in summary.json).
void printStepMemory(std::ostream& out, const std::string& tag, const Result& r) {
  if (r.step_memory.empty()) return;
  const auto mb = [](double bytes) { return fmt::format("{:.1f}", bytes / 1e6); };
  if (r.step_memory.front().tracked == 0) {
    out << "# " << tag
        << "memory by use: not measured (the tensors are not in LibTorch's CPU allocator on "
        << r.device
        << "); resident peak over the steps, rank 0: " << mb(r.step_memory.front().resident)
        << " MB\n";
    return;
  }
  std::vector<size_t> shown(r.step_memory.size());
  std::iota(shown.begin(), shown.end(), size_t{0});
  if (shown.size() > 4) {
    shown = {static_cast<size_t>(std::max_element(r.step_memory.begin(), r.step_memory.end(),
                                                  [](const StepMemory& a, const StepMemory& b) {
                                                    return a.resident < b.resident;
                                                  }) -
                                 r.step_memory.begin())};
  }
  for (size_t rank : shown) {
    const StepMemory& m = r.step_memory[rank];
    std::string uses;
    forEachStepMemoryField(m, [&](const char* key, auto value) {
      const std::string name = key;
      if (name.size() < 6 || name.substr(name.size() - 6) != "_bytes") return;
      // The uses only: not the totals, nor what the largest-model fit reads.
      for (const char* other :
           {"resident", "tracked", "forward_high", "file_backed", "set_up_peak", "limit"}) {
        if (name.rfind(other, 0) == 0) return;
      }
      if (value == 0) return;
      std::string use = name.substr(0, name.size() - 6);  // less "_bytes"
      std::replace(use.begin(), use.end(), '_', ' ');
      uses += fmt::format("{}{} {}", uses.empty() ? "" : " + ", use, mb(value));
    });
    // The resident set is a process's: it tells the rest apart only for a rank of its own.
    const std::string resident =
        m.process_ranks == 1
            ? fmt::format(
                  "resident {} when the steps began (the libraries, the set-up), peak "
                  "{}: +{} during the steps, of which LibTorch's blocks +{} and {:+.1f} "
                  "outside them (free memory malloc kept, transports, scratch)",
                  mb(m.resident_at_start), mb(m.resident), mb(m.resident - m.resident_at_start),
                  mb(m.tracked - m.tracked_at_start),
                  ((m.resident - m.resident_at_start) - (m.tracked - m.tracked_at_start)) / 1e6)
            : fmt::format(
                  "resident {} when the steps began, peak {}, of the process its {} "
                  "ranks share",
                  mb(m.resident_at_start), mb(m.resident), m.process_ranks);
    out << "# " << tag
        << fmt::format(
               "memory at rank {}'s peak during the steps (MB): LibTorch's blocks {} = "
               "{}; {}{}\n",
               rank, mb(m.tracked), uses, resident,
               shown.size() < r.step_memory.size()
                   ? " (the largest rank; every rank's in summary.json)"
                   : "");
  }
}

// The largest model of this run's shape that fits each rank's memory (train/memory_fit.h),
// for the rank it fits least: measured on ranks that are processes (a resident set of their
// own), with the model's units of equal size.
void printMemoryFit(std::ostream& out, const std::string& tag, const Result& r) {
  if (r.units <= 0 || r.unit_parameters <= 0 || r.unit_parameters * r.units > r.parameters ||
      r.step_memory.empty() || r.step_memory.front().tracked == 0)
    return;
  for (const StepMemory& m : r.step_memory) {
    if (m.process_ranks != 1 || m.limit <= 0) return;
  }
  MemoryFitShape shape{r.parameters, r.unit_parameters, r.units, r.sharding == "parameters"};
  shape.backward_is_every_gradient =
      !r.overlap && (r.sharding == "gradients" || r.sharding == "parameters");
  size_t tightest = 0;
  MemoryFit fit;
  for (size_t rank = 0; rank < r.step_memory.size(); ++rank) {
    const MemoryFit mine = fitMemory(r.step_memory[rank], shape, r.step_memory[rank].limit);
    if (rank == 0 || mine.largest_units < fit.largest_units) {
      fit = mine;
      tightest = rank;
    }
  }
  const StepMemory& m = r.step_memory[tightest];
  const auto mb = [](double bytes) { return fmt::format("{:.1f} MB", bytes / 1e6); };
  const std::string memory =
      m.limit_given ? fmt::format("{} (launch.memory_limit)", mb(m.limit))
                    : fmt::format(
                          "{} (its share of its host's memory; set launch.memory_limit "
                          "for another)",
                          mb(m.limit));
  out << "# " << tag
      << fmt::format(
             "largest model that fits: rank {}'s memory, {}, holds {} units of {} parameters "
             "({} parameters in all; this run: {}), counting as a memory cgroup does (the "
             "resident set less the libraries' pages). Measured here: {:.1f} B per parameter, "
             "{} of activations per unit, {} fixed; this run's peak {}, predicted "
             "{}\n",
             tightest, memory, fit.largest_units, detail::withCommas(r.unit_parameters),
             detail::withCommas(fit.largest_parameters), r.units, fit.bytes_per_parameter,
             mb(fit.bytes_per_unit), mb(fit.fixed_bytes), mb(fit.measured_peak),
             mb(predictedPeak(m, shape, r.units)));
}

json toJson(const Result& r) {
  json j = json::object();
  forEachField(r, [&](const char* key, const auto& value, auto&&...) { j[key] = value; });
  j["grad_weighting"] = r.tokens_weighting ? "tokens" : "uniform";
  j["predicted_comm_s"] =
      std::isnan(r.predicted_comm_seconds) ? json(nullptr) : json(r.predicted_comm_seconds);
  return j;
}

// Every row of the table is required: a result file comes from the collie that reads it.
Result fromJson(const json& j) {
  Result r;
  forEachField(r, [&](const char* key, auto& value, auto&&...) { j.at(key).get_to(value); });
  r.tokens_weighting = j.at("grad_weighting") == "tokens";
  const json& predicted = j.at("predicted_comm_s");
  r.predicted_comm_seconds = predicted.is_null() ? kNoPrediction : predicted.get<double>();
  r.weight_sample = j.value("weight_sample", std::vector<double>{});
  return r;
}

// The split of a step's all-reduce time (comm_explained.h), as one line.
std::string commExplained(const Result& r) {
  const CommExplained& e = r.comm_explained;
  const std::string busy = e.busy_probed
                               ? fmt::format(
                                     "; on the link probed while every rank kept a core busy they "
                                     "take {:.4f} s",
                                     e.link_busy)
                               : "";
  // What is left is negative where the buckets' own time (the last rank's) came in under
  // the calibrated link's prediction.
  const std::string rest =
      e.beyond > -5e-5
          ? fmt::format(
                "+ {:.4f} s beyond both (a link slower than calibrated, "
                "or cores shared with backward: ",
                std::max(0.0, e.beyond))
          : fmt::format("- {:.4f} s under the calibrated link's prediction (", -e.beyond);
  return fmt::format(
      "all-reduce explained, per step (mean over ranks): measured {:.4f} s = {:.4f} s on the "
      "calibrated link, idle ({:.4f} s of it per-message latency; {} of {} bucket(s) below the "
      "link's knee, where latency outweighs bytes) + {:.4f} s waiting for the last rank to "
      "arrive {}{:.4f} s of the all-reduces ran while backward computed{}). Exposed after "
      "backward: measured {:.4f} s, predicted {:.4f} s (each bucket from when backward's "
      "measured time readies it on the last rank to get there, {:.4f} s after the mean rank, "
      "on the {})",
      e.link + e.waiting + e.beyond, e.link, e.latency, e.below_knee, r.buckets, e.waiting, rest,
      e.during_backward, busy, e.exposed, e.predicted_exposed, e.late,
      e.busy_probed ? "link probed busy while a rank computes, the idle link after" : "idle link");
}

// What the prediction beside the float32 all-reduce's prices: a codec's collectives, the
// meetings of train.sync's local modes, or both (the codec's in the synchronous steps).
std::string predictedWays(const Result& r, bool coded) {
  const std::string codec =
      "train.compression " + r.compression +
      fmt::format("'s collectives and its arithmetic ({:.4f} s, timed on a rehearsal)",
                  r.predicted_codec_arithmetic_seconds);
  if (r.sync_mode == "every_step") return codec;
  const std::string sync =
      fmt::format("train.sync {} ({} synchronous steps, then a meeting every {})", r.sync_mode,
                  r.sync_warmup_steps, r.sync_every);
  return coded ? codec + " in the synchronous steps and " + sync : sync;
}

// "42 s", "3.5 min", "2.1 h", "4.0 d"
std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.1f} min", seconds / 60);
  if (seconds < 172800) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} d", seconds / 86400);
}

std::string count(double value) {
  if (value >= 1e9) return fmt::format("{:.2f} G", value / 1e9);
  if (value >= 1e6) return fmt::format("{:.2f} M", value / 1e6);
  if (value >= 1e3) return fmt::format("{:.1f} k", value / 1e3);
  return fmt::format("{:.0f}", value);
}

// "grad_weighting=uniform, nproc_per_node=2" for "train.grad_weighting=uniform, launch...".
std::string shortRun(const std::string& run) {
  std::string out;
  size_t start = 0;
  while (start < run.size()) {
    size_t end = run.find(", ", start);
    if (end == std::string::npos) end = run.size();
    std::string part = run.substr(start, end - start);
    const size_t eq = part.find('='), dot = part.rfind('.', eq);
    if (dot != std::string::npos && eq != std::string::npos) part = part.substr(dot + 1);
    out += (out.empty() ? "" : ", ") + part;
    start = end + 2;
  }
  return out;
}

// The 1-rank run of the same model to compare against, or null.
const Result* soloRun(const std::vector<Result>& results, const Result& r) {
  for (const auto& other : results) {
    if (other.ranks == 1 && other.model == r.model && other.parameters == r.parameters)
      return &other;
  }
  return nullptr;
}

}  // namespace

WeightSpread weightSpread(const std::vector<Result>& results, const Result& r) {
  for (const auto& other : results) {
    if (!other.tokens_weighting || other.model != r.model || other.parameters != r.parameters ||
        other.steps != r.steps || other.world_batch_samples != r.world_batch_samples ||
        other.weight_sample.empty() || other.weight_sample.size() != r.weight_sample.size()) {
      continue;
    }
    WeightSpread out{&other, 0};
    for (size_t i = 0; i < r.weight_sample.size(); ++i)
      out.max_abs_diff =
          std::max(out.max_abs_diff, std::abs(r.weight_sample[i] - other.weight_sample[i]));
    return out;
  }
  return {};
}

namespace {

// With unequal micro-batches: how much one sample of each rank counts in the update,
// against one process on the concatenated batch (1.00x).
void printWeighting(std::ostream& out, const std::string& tag, const Result& r) {
  const auto [low, high] = std::minmax_element(r.micro_batch.begin(), r.micro_batch.end());
  if (*low == *high) return;
  const int64_t per_step = r.world_batch_samples;
  if (r.tokens_weighting) {
    out << "# " << tag << "gradient weighting tokens: every sample counts 1/" << per_step
        << " of the step, as one process on the concatenated " << per_step << " samples\n";
    return;
  }
  const double per_micro = std::accumulate(r.micro_batch.begin(), r.micro_batch.end(), 0.0);
  std::vector<std::string> counts;
  for (size_t i = 0; i < r.micro_batch.size(); ++i) {
    const double factor = per_micro / (static_cast<double>(r.ranks) * r.micro_batch[i]);
    counts.push_back(fmt::format("rank {} ({}) {:.2f}x", i, r.micro_batch[i], factor));
  }
  out << "# " << tag << "gradient weighting uniform (DDP's 1/world mean): a sample counts "
      << detail::join(counts, ", ") << " of its weight in one process on the same batch\n";
}

void printDetails(std::ostream& out, const Result& r) {
  const std::string tag = r.run.empty() ? "" : "[" + shortRun(r.run) + "] ";
  if (r.device != "cpu") {
    out << "# " << tag << "device " << r.device << "; gradients reach " << r.backend << " in "
        << r.comm_memory
        << (r.comm_memory == "host-staged"
                ? " (device buckets copied to pinned host buffers and back: " + r.backend +
                      " moves host memory only)"
                : std::string())
        << "\n";
  }
  if (r.ranks > 1) {
    std::vector<std::string> per_rank;
    int slowest = 0;
    for (size_t i = 0; i < r.compute_seconds.size(); ++i) {
      per_rank.push_back(fmt::format("r{} {:.3f}", i, r.compute_seconds[i]));
      if (r.compute_seconds[i] > r.compute_seconds[slowest]) slowest = static_cast<int>(i);
    }
    out << "# " << tag << "compute per step (s): " << detail::join(per_rank, ", ")
        << "; slowest rank " << slowest << ", "
        << fmt::format("{:.0f}", 100 * r.compute_seconds[slowest] / r.step_seconds) << "% of the "
        << fmt::format("{:.3f}", r.step_seconds) << " s step\n";
    if (!r.straggler_score.empty()) {
      std::vector<std::string> score, wait, last;
      for (size_t i = 0; i < r.straggler_score.size(); ++i) {
        score.push_back(fmt::format("r{} {:.2f}", i, r.straggler_score[i]));
        wait.push_back(fmt::format("r{} {:.4f} s", i, r.straggler_wait_seconds[i]));
        last.push_back(fmt::format("r{} {:.0f}%", i, 100 * r.arrived_last[i]));
      }
      out << "# " << tag << "stragglers over " << r.straggler_steps
          << " steps: score (the fastest rank's compute time / the rank's) "
          << detail::join(score, ", ") << "; waiting for the others per step "
          << detail::join(wait, ", ") << "; arrived last at a collective "
          << detail::join(last, ", ")
          << fmt::format("; at the fastest rank's speed a step would take {:.3f} s",
                         r.step_at_fastest_seconds)
          << "\n";
    }
    if (!r.rebalances.empty()) {
      std::vector<std::string> changes;
      for (const auto& c : r.rebalances)
        changes.push_back(
            fmt::format("after step {} [{}]", c.after_step, fmt::join(c.micro_batch, ", ")));
      out << "# " << tag << "micro_batch auto rebalanced " << r.rebalances.size()
          << " time(s): " << detail::join(changes, ", ") << "\n";
    }
    if (!r.compression_choice.empty())
      out << "# " << tag << "train.compression auto " << r.compression_choice << "\n";
    const bool sharded = r.sharding != "none";
    const bool coded = r.compression != "none";
    const double gradient_mb = static_cast<double>(r.allreduce_bytes) / 1e6;
    // What a rank sends of the float32 all-reduce on a ring: 2(n-1)/n of the gradient bytes.
    const double float32_sent =
        2.0 * static_cast<double>(r.allreduce_bytes) * (r.ranks - 1) / std::max(1, r.ranks);
    const std::string what = coded     ? "gradient synchronisation"
                             : sharded ? "reduce-scatter + all-gather"
                                       : "all-reduce";
    out << "# " << tag << what << " per step: " << fmt::format("{:.2f} MB", gradient_mb)
        << (coded ? fmt::format(" of float32 gradients, synchronised by train.compression {}: a "
                                "rank sent {:.2f} MB a step, where the float32 all-reduce sends "
                                "{:.2f} MB ({:.1f}x fewer bytes; bandwidth-optimal schedules)",
                                r.compression, r.sent_bytes_per_step / 1e6, float32_sent / 1e6,
                                float32_sent / std::max(1.0, r.sent_bytes_per_step))
                  : std::string())
        << " in " << r.buckets << " bucket(s)"
        << (r.schedulers_ran.empty() ? std::string() : " (" + r.schedulers_ran + ")")
        << ": measured " << fmt::format("{:.4f}", r.comm_seconds) << " s ("
        << fmt::format("{:.4f}", r.exposed_seconds) << " s exposed)"
        << (sharded ? fmt::format(": reduce-scatter {:.4f} s ({:.4f} s exposed), all-gather "
                                  "{:.4f} s ({:.4f} s exposed)",
                                  r.comm_seconds - r.gather_seconds,
                                  r.exposed_seconds - r.gather_exposed_seconds, r.gather_seconds,
                                  r.gather_exposed_seconds)
                    : std::string())
        << ", predicted "
        << (std::isnan(r.predicted_comm_seconds) ? std::string("-")
                                                 : fmt::format("{:.4f}", r.predicted_comm_seconds))
        << " s from the measured link " << (r.between_nodes ? "between nodes" : "inside a node")
        << (coded ? " and the codec's timed arithmetic" : "") << " (alpha "
        << fmt::format("{:.1f}", r.link_alpha * 1e6) << " us"
        << (r.link_gap > 0 ? fmt::format(" then {:.1f} us a message in a stream", r.link_gap * 1e6)
                           : "")
        << ", " << (r.link_beta > 0 ? fmt::format("{:.3f}", 1e-9 / r.link_beta) : "-") << " GB/s"
        << (r.link_bank > 0 ? fmt::format(", banks {:.0f} KB when idle", r.link_bank / 1e3) : "")
        << ")\n";
    if (r.predicted_float32_comm_seconds > 0 && !std::isnan(r.predicted_comm_seconds)) {
      const double saved = r.predicted_float32_comm_seconds - r.predicted_comm_seconds;
      out << "# " << tag
          << fmt::format(
                 "predicted from the calibrated link: the float32 all-reduce of a "
                 "step's gradients {:.4f} s, {} {:.4f} s a step: {:.4f} s less a step "
                 "(this run's step: {:.3f} s)\n",
                 r.predicted_float32_comm_seconds, predictedWays(r, coded),
                 r.predicted_comm_seconds, saved, r.step_seconds);
    }
    const double bound = float32_sent;
    out << "# " << tag
        << (coded     ? "float32 all-reduce (without the codec)"
            : sharded ? "reduce-scatter + all-gather"
                      : "all-reduce")
        << " bandwidth bound: 2(n-1)/n x "
        << fmt::format("{:.2f} MB = {:.2f} MB per rank per step over that link: {} s", gradient_mb,
                       bound / 1e6,
                       r.link_beta > 0 ? fmt::format("{:.4f}", bound * r.link_beta) : "-")
        << ", measured " << fmt::format("{:.4f}", r.comm_seconds) << " s\n";
    if (r.comm_explained.explained) out << "# " << tag << commExplained(r) << "\n";
  }
  if (r.interface_hosts > 0) {
    out << "# " << tag
        << fmt::format(
               "the lab hosts' interfaces counted {:.3f} MB sent per host per step (bytes that "
               "crossed a link, every header included; a host's own ranks talk over loopback), "
               "{:.2f} MB per host before the first step (calibration and the parameters' "
               "broadcast); collie counted {:.3f} MB a rank sent per "
               "step, to every peer\n",
               r.interface_sent_bytes_per_step / 1e6, r.interface_startup_sent_bytes / 1e6,
               r.sent_bytes_per_step / 1e6);
  }
  if (r.target_loss > 0 && !r.loss_curve.empty()) {  // a run resumed after its last step: none
    const size_t window = std::min<size_t>(kTargetWindow, r.loss_curve.size());
    const std::string since = r.loss_curve_first_step > 1
                                  ? fmt::format(
                                        "step {} began (where this run resumed; the "
                                        "steps before it are not counted)",
                                        r.loss_curve_first_step)
                                  : std::string("the first step began");
    out << "# " << tag
        << (r.steps_to_target > 0
                ? fmt::format("train.target_loss {:g}: reached after step {}, {:.1f} s after {} "
                              "(the job's loss, a mean over {} steps)",
                              r.target_loss, r.steps_to_target, r.seconds_to_target, since, window)
                : fmt::format("train.target_loss {:g}: not reached in {} steps (the job's loss, a "
                              "mean over {} steps)",
                              r.target_loss, r.loss_curve.size(), window))
        << "\n";
  }
  if (r.sync_mode != "every_step") {
    const double meeting = static_cast<double>(r.parameter_bytes);
    out << "# " << tag
        << fmt::format(
               "train.sync {}: the ranks' models met every {} steps after {} synchronous "
               "step(s), each meeting an all-reduce of {:.2f} MB of parameters; a rank "
               "sent {:.2f} MB a step on average, where every_step sends {:.2f} MB "
               "(bandwidth-optimal schedules); the weights were compared after every "
               "meeting\n",
               r.sync_mode, r.sync_every, r.sync_warmup_steps, meeting / 1e6,
               r.sent_bytes_per_step / 1e6,
               2.0 * meeting * (r.ranks - 1) / std::max(1, r.ranks) / 1e6);
  }
  {
    const auto mb = [](uint64_t bytes) { return static_cast<double>(bytes) / 1e6; };
    out << "# " << tag
        << fmt::format(
               "state per rank (train.sharding: {}): parameters {:.2f} MB, gradients "
               "{:.2f} MB, optimizer {:.2f} MB, {:.2f} MB in all between steps\n",
               r.sharding, mb(r.parameter_bytes), mb(r.gradient_bytes), mb(r.optimizer_bytes),
               mb(r.parameter_bytes + r.gradient_bytes + r.optimizer_bytes));
    if (r.sharding == "parameters") {
      out << "# " << tag
          << fmt::format(
                 "parameters gathered during a step: at most {:.2f} MB at once (of "
                 "{:.2f} MB in all)\n",
                 mb(r.gathered_peak_bytes), mb(r.parameter_bytes * r.ranks));
    }
    if (r.pooled_bytes > 0) {
      out << "# " << tag
          << fmt::format(
                 "buffers the buckets borrow (full gradients in flight{}): {:.2f} MB, kept "
                 "between steps for the next\n",
                 r.sharding == "parameters" ? ", gathered values" : "", mb(r.pooled_bytes));
    }
    printStepMemory(out, tag, r);
    printMemoryFit(out, tag, r);
  }
  const double achieved = r.flops_per_token * r.tokens_per_second / r.ranks;
  out << "# " << tag << "model FLOP/s per rank: " << fmt::format("{:.3g}", achieved);
  if (r.peak_flops > 0) {
    out << ", MFU " << fmt::format("{:.1f}%", 100 * achieved / r.peak_flops) << " of a "
        << fmt::format("{:.3g}", r.peak_flops) << " FLOP/s peak";
  } else {
    out << " (set train.peak_flops for MFU)";
  }
  out << "\n";
  printWeighting(out, tag, r);
  out << "# " << tag << r.sync.describe(r.ranks) << "\n";
  std::vector<std::string> budgets = {"20 x params (" + count(20.0 * r.parameters) + " tokens): " +
                                      duration(20.0 * r.parameters / r.tokens_per_second)};
  for (double b : r.token_budgets) {
    budgets.push_back(count(b) + " tokens: " + duration(b / r.tokens_per_second));
  }
  out << "# " << tag << "time to token budget at "
      << detail::withCommas(std::llround(r.tokens_per_second))
      << " tokens/s: " << detail::join(budgets, "; ") << "\n";
}

}  // namespace

namespace {

// A field's value as its column writes it.
template <typename T>
std::string cell(const T& value, Style style) {
  if constexpr (std::is_arithmetic_v<T>) {
    switch (style) {
      case Style::kFixed3:
        return fmt::format("{:.3f}", static_cast<double>(value));
      case Style::kFixed4:
        return fmt::format("{:.4f}", static_cast<double>(value));
      case Style::kThousands:
      case Style::kList:
        break;
    }
    return detail::withCommas(std::llround(static_cast<double>(value)));
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    return fmt::format("[{}]", fmt::join(value, ","));
  } else {
    static_assert(std::is_arithmetic_v<T>, "a column for a field of this type: add its Style");
    return "";
  }
}

// What the derived columns read besides a run's own fields: the other runs.
struct Runs {
  const std::vector<Result>& all;
  std::vector<WeightSpread> spreads;   // per run: max |w - w_ref| against its reference
  std::set<const Result*> referenced;  // reference runs another run is compared with
  bool any_sharded = false, any_scored = false;
};

// A column made from several fields or from other runs, printed after the field column
// named `after` (null: after every field column). Shown when `shown` says so (null: always);
// `text` writes a run's cell.
struct DerivedColumn {
  const char* after;
  const char* header;
  int width;
  bool (*shown)(const Runs&);
  std::string (*text)(const Result&, size_t index, const Runs&);
};

// Speed-up and efficiency are against the 1-rank run of the same model in the file.
double speedup(const Result& r, const Runs& runs) {
  const Result* solo = soloRun(runs.all, r);
  return solo ? r.tokens_per_second / solo->tokens_per_second : NAN;
}

const DerivedColumn kDerivedColumns[] = {
    {"tokens_per_s", "speed-up", 9, nullptr,
     [](const Result& r, size_t, const Runs& runs) {
       const double x = speedup(r, runs);
       return std::isnan(x) ? std::string("-") : fmt::format("{:.2f}", x);
     }},
    {"tokens_per_s", "efficiency", 11, nullptr,
     [](const Result& r, size_t, const Runs& runs) {
       const double x = speedup(r, runs);
       return std::isnan(x) ? std::string("-") : fmt::format("{:.1f}%", 100 * x / r.ranks);
     }},
    {nullptr, "loss first->last", 19, nullptr,
     [](const Result& r, size_t, const Runs&) {
       return fmt::format("{:.3f} -> {:.3f}", r.first_loss, r.last_loss);
     }},
    // The state each rank holds (parameters + gradients + optimizer), when some run shards it.
    {nullptr, "state/rank (MB)", 17, [](const Runs& runs) { return runs.any_sharded; },
     [](const Result& r, size_t, const Runs&) {
       const uint64_t state = r.parameter_bytes + r.gradient_bytes + r.optimizer_bytes;
       return fmt::format("{:.2f}", static_cast<double>(state) / 1e6);
     }},
    {nullptr, "20 tok/param", 15, nullptr,
     [](const Result& r, size_t, const Runs&) {
       return duration(20.0 * r.parameters / r.tokens_per_second);
     }},
    // max |w - w_ref| at the end against the first run that took the exact same steps, when
    // some run has another run to compare with.
    {nullptr, "|dw| vs ref", 14, [](const Runs& runs) { return !runs.referenced.empty(); },
     [](const Result& r, size_t i, const Runs& runs) {
       const WeightSpread& spread = runs.spreads[i];
       if (spread.reference == &r) return std::string(runs.referenced.count(&r) ? "ref" : "-");
       if (spread.reference == nullptr) return std::string("-");
       return spread.max_abs_diff == 0 ? std::string("0")
                                       : fmt::format("{:.2e}", spread.max_abs_diff);
     }},
};

}  // namespace

void printSummary(std::ostream& out, const std::vector<Result>& results) {
  if (results.empty()) return;
  const Result& first = results.front();
  out << "# Training: " << first.name << ", model " << first.model << " ("
      << detail::withCommas(first.parameters) << " parameters, "
      << fmt::format("{:.3g}", first.flops_per_token) << " FLOP/token), " << first.scheduler
      << " over " << first.backend << "\n";
  Runs runs{results, {}, {}, false, false};
  for (const auto& r : results) {
    runs.spreads.push_back(weightSpread(results, r));
    if (runs.spreads.back().reference != nullptr && runs.spreads.back().reference != &r)
      runs.referenced.insert(runs.spreads.back().reference);
    runs.any_sharded = runs.any_sharded || r.sharding != "none";
    runs.any_scored = runs.any_scored || !r.straggler_score.empty();
  }
  std::vector<const DerivedColumn*> derived;
  for (const auto& d : kDerivedColumns) {
    if (d.shown == nullptr || d.shown(runs)) derived.push_back(&d);
  }
  // The header, then a row per run: its label, the fields' columns, the derived ones, and
  // the straggler scores (a list as long as the run's ranks) last.
  std::ostringstream table;
  auto put = [&table](int width, const std::string& text) {
    table << std::right << std::setw(width) << text;
  };
  table << std::left << std::setw(28) << "# run";
  // The derived columns that follow field `key` (null: the last ones), through `write`.
  auto derivedAfter = [&derived](const char* key, auto&& write) {
    for (const auto* d : derived) {
      if (key == nullptr ? d->after == nullptr : d->after != nullptr && !std::strcmp(d->after, key))
        write(*d);
    }
  };
  forEachField(first, [&](const char* key, const auto&, auto&&... column) {
    (put(column.width, column.header), ...);
    derivedAfter(key, [&](const DerivedColumn& d) { put(d.width, d.header); });
  });
  derivedAfter(nullptr, [&](const DerivedColumn& d) { put(d.width, d.header); });
  if (runs.any_scored) table << "  straggler score per rank";
  table << "\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::string label = r.run.empty() ? r.name : shortRun(r.run);
    if (label.size() > 26) label = label.substr(0, 25) + "~";
    table << std::left << std::setw(28) << ("  " + label);
    auto derivedCell = [&](const DerivedColumn& d) { put(d.width, d.text(r, i, runs)); };
    forEachField(r, [&](const char* key, const auto& value, auto&&... column) {
      (put(column.width, cell(value, column.style)), ...);
      derivedAfter(key, derivedCell);
    });
    derivedAfter(nullptr, derivedCell);
    if (runs.any_scored && !r.straggler_score.empty())
      table << "  " << fmt::format("{:.2f}", fmt::join(r.straggler_score, " "));
    table << "\n";
  }
  out << table.str();
  for (const auto& r : results) printDetails(out, r);
}

void writeSummaryJson(const std::string& path, const std::vector<Result>& results) {
  json all = json::array();
  for (const auto& r : results) {
    json j = toJson(r);
    const WeightSpread spread = weightSpread(results, r);
    if (spread.reference != nullptr) {
      j["weights_vs"] = {{"run", spread.reference->run},
                         {"max_abs_diff", spread.max_abs_diff},
                         {"sampled", r.weight_sample.size()}};
    }
    all.push_back(std::move(j));
  }
  std::ofstream out(path);
  out << all.dump(2) << "\n";
  if (!out) throw InternalError("cannot write " + path);
}

void saveResult(const std::string& path, const Result& result) {
  json j = toJson(result);
  j["weight_sample"] = result.weight_sample;
  detail::writeFileAtomically(path, j.dump() + "\n");
}

Result loadResult(const std::string& path) {
  return detail::readRankFile(path, "training result", [](const json& j) { return fromJson(j); });
}

StepLog::StepLog(const std::string& out_dir, int rank, int run, bool append)
    : rank_(rank),
      path_(run < 0 ? fmt::format("{}/rank-{}.jsonl", out_dir, rank)
                    : fmt::format("{}/run-{}-rank-{}.jsonl", out_dir, run, rank)),
      out_(path_, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw ConfigError("cannot write per-step metrics to " + path_);
}

void StepLog::write(int64_t step, int64_t samples, int64_t tokens, const StepStats& st) {
  json line = {
      {"step", step + 1},
      {"rank", rank_},
      {"step_s", st.step},
      {"forward_s", st.forward},
      {"backward_s", st.backward},
      {"comm_s", st.sync.comm_seconds},
      {"exposed_comm_s", st.sync.exposed_seconds},
      {"allgather_s", st.sync.gather_seconds},
      {"exposed_allgather_s", st.sync.gather_exposed_seconds},
      {"optimizer_s", st.optimizer},
      {"samples", samples},
      {"tokens", tokens},
      {"tokens_per_s", st.step > 0 ? tokens / st.step : 0.0},
      {"loss", st.loss},
      {"lr", st.lr},
      {"grad_norm", st.grad_norm},
      {"buckets", st.sync.buckets},
      {"buckets_launched_in_backward", st.sync.launched_in_backward},
  };
  json collectives = json::array();
  for (const auto& p : st.sync.collectives) {
    collectives.push_back({{"scheduler", p.scheduler},
                           {"ran", p.ran},
                           {"backend", p.backend},
                           {"bytes", p.bytes},
                           {"seq", p.seq},
                           {"seconds", p.seconds}});
  }
  line["collectives"] = collectives;
  out_ << line.dump() << '\n';
  out_.flush();
}

std::string progressLine(int64_t step, int64_t steps, double loss, const StepStats& last,
                         double world_tokens, double seconds_per_step) {
  return fmt::format(
      "step {}/{}  loss {:.4f}  lr {:.2e}  {} tok/s  step {:.3f} s (comm {:.3f}, exposed {:.3f})  "
      "ETA {:.0f} s",
      step, steps, loss, last.lr,
      detail::withCommas(static_cast<int64_t>(world_tokens / last.step)), last.step,
      last.sync.comm_seconds, last.sync.exposed_seconds,
      seconds_per_step * static_cast<double>(steps - step));
}

std::vector<double> RankSummary::pack() const {
  std::vector<double> values;
  forEachValue(*this, [&](const auto& value) { values.push_back(static_cast<double>(value)); });
  return values;
}

RankSummary RankSummary::unpack(const std::vector<double>& values) {
  RankSummary s;
  const size_t expected = s.pack().size();
  COLLIE_CHECK(values.size() == expected, "a rank summary has ", expected, " values, found ",
               values.size());
  size_t i = 0;
  forEachValue(s, [&](auto& value) {
    value = static_cast<std::remove_reference_t<decltype(value)>>(values[i++]);
  });
  return s;
}

RankSummary summariseSteps(const std::vector<StepStats>& stats) {
  RankSummary s;
  if (stats.empty()) return s;  // resumed after the last step: nothing ran
  const size_t first = stats.size() > 1 ? 1 : 0;
  for (size_t i = first; i < stats.size(); ++i) {
    s.step += stats[i].step;
    s.compute += stats[i].forward + stats[i].backward;
    s.comm += stats[i].sync.comm_seconds;
    s.exposed += stats[i].sync.exposed_seconds;
    s.gather += stats[i].sync.gather_seconds;
    s.gather_exposed += stats[i].sync.gather_exposed_seconds;
  }
  s.timed_steps = static_cast<int64_t>(stats.size() - first);
  s.steps_run = static_cast<int64_t>(stats.size());
  const double n = static_cast<double>(s.timed_steps);
  s.step /= n;
  s.compute /= n;
  s.comm /= n;
  s.exposed /= n;
  s.gather /= n;
  s.gather_exposed /= n;
  s.first_loss_sum = stats.front().loss * stats.front().micro_batch;
  s.last_loss_sum = stats.back().loss * stats.back().micro_batch;
  return s;
}

void combineRanks(const std::vector<RankSummary>& ranks, int64_t world_micro_batch, Result* r) {
  const double world = static_cast<double>(ranks.size());
  const double per_micro = static_cast<double>(world_micro_batch);
  r->timed_steps = ranks.empty() ? 0 : ranks.front().timed_steps;
  for (const auto& rank : ranks) {
    r->step_seconds = std::max(r->step_seconds, rank.step);
    r->compute_seconds.push_back(rank.compute);
    r->comm_seconds += rank.comm / world;
    r->exposed_seconds += rank.exposed / world;
    r->gather_seconds += rank.gather / world;
    r->gather_exposed_seconds += rank.gather_exposed / world;
    r->first_loss += rank.first_loss_sum / per_micro;
    r->last_loss += rank.last_loss_sum / per_micro;
    if (rank.interface_steps_sent >= 0 && rank.interface_startup_sent >= 0) {
      ++r->interface_hosts;  // the first rank of a host on the lab
      r->interface_startup_sent_bytes += rank.interface_startup_sent;
      r->interface_sent_bytes_per_step +=
          rank.interface_steps_sent / std::max<double>(1.0, static_cast<double>(rank.steps_run));
    }
  }
  if (r->interface_hosts > 0) {
    r->interface_startup_sent_bytes /= r->interface_hosts;
    r->interface_sent_bytes_per_step /= r->interface_hosts;
  }
  r->tokens_per_second = r->step_seconds > 0 ? r->world_batch_tokens / r->step_seconds : 0;
}

}  // namespace collie::train
