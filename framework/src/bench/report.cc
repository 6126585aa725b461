// Bench output: the nccl-tests style table with predictions, CSV, JSON and gnuplot plots.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "bench/bench.h"
#include "collie/cost_model_json.h"
#include "collie/error.h"
#include "collie/params.h"
#include "util/files.h"
#include "util/json_file.h"
#include "util/spawn.h"

namespace collie::bench {
namespace {

constexpr const char* kRowFormat =
    "  {:>12} {:>12} {:>6} {:>6} {:>16} {:>11} {:>11} {:>11} {:>9} {:>9} {:>7} {:>11} {:>7}\n";

std::string fixed(double value, int digits) {
  return std::isfinite(value) ? fmt::format("{:.{}f}", value, digits) : "-";
}

void header(std::ostream& out, const Row& first, const Result& result) {
  const bool barrier = first.collective == collectiveName(Collective::kBarrier);
  out << fmt::format("# collective {} on {} ranks, backend {}{}\n", first.collective, first.ranks,
                     result.facts.backend.empty() ? first.backend : result.facts.backend,
                     barrier ? "" : fmt::format(", {} {}", first.dtype, first.op));
  if (!result.facts.simulated.empty()) out << "# simulated: " << result.facts.simulated << "\n";
  for (const HostFacts& h : result.facts.hosts) {
    out << fmt::format("# host {}: {} rank(s), {} CPUs, load {} at start{}\n", h.name, h.ranks,
                       h.cpus, fixed(h.load, 2), h.link.empty() ? "" : ", link " + h.link);
  }
  if (!result.facts.cpu_model.empty()) out << "# cpu: " << result.facts.cpu_model << "\n";
  if (result.calibrated) {
    const CostModel& m = result.model;
    auto level = [](const std::string& name, const LinkCost& l, const LinkFit& fit) {
      return fmt::format(
          "{} alpha {:.2f} us{}, beta {:.3f} GB/s (fit over {} sizes, residual {:.0f}%)", name,
          l.alpha * 1e6,
          l.gap > 0 ? fmt::format(" (then {:.2f} us a message in a stream)", l.gap * 1e6) : "",
          l.beta > 0 ? 1e-9 / l.beta : INFINITY, fit.sizes, fit.residual * 100);
    };
    out << "# cost model (calibrated):";
    if (result.fit_intra.probed && m.intra.sharesCores()) {
      // The exchange's flows shared the node; a pair alone is priced apart.
      const LinkCost alone{m.intra.alpha_alone, m.intra.beta_alone};
      out << " "
          << level(fmt::format("inside a node, each of {} flows at once:", m.intra.flows), m.intra,
                   result.fit_intra)
          << ", " << level("a pair alone", alone, result.fit_intra_alone) << ";";
    } else if (result.fit_intra.probed) {
      out << " " << level("inside a node", m.intra, result.fit_intra) << ";";
    }
    if (result.fit_intra.probed && !m.intra.by_buffer.empty()) {
      // What forBuffer prices a size's buffers at inside a node, the line's at the largest.
      const bool alone = m.intra.sharesCores();
      std::vector<std::string> sizes;
      for (const BufferBeta& b : m.intra.by_buffer) {
        auto rate = [](double beta) { return beta > 0 ? 1e-9 / beta : INFINITY; };
        sizes.push_back(fmt::format("{} {:.2f}{}", formatBytes(static_cast<uint64_t>(b.bytes)),
                                    rate(b.beta),
                                    alone ? fmt::format("/{:.2f}", rate(b.beta_alone)) : ""));
      }
      out << fmt::format(" inside a node by buffer size, beta{} (GB/s): {};",
                         alone ? " each flow/a pair alone" : "", fmt::join(sizes, ", "));
    }
    if (result.fit_inter.probed) {
      out << " " << level("between nodes", m.inter, result.fit_inter);
      if (result.fit_inter_one_way.probed && m.inter.beta_one_way > 0)
        out << fmt::format(", one way {:.3f} GB/s (streamed, {} sizes)",
                           1e-9 / m.inter.beta_one_way, result.fit_inter_one_way.sizes);
      else if (result.fit_inter_one_way.probed)  // the larger message was not the slower
        out << fmt::format(
            ", one way not resolved (streamed, {} sizes: time did not grow with "
            "size), the exchange's beta used",
            result.fit_inter_one_way.sizes);
      if (result.fit_inter_bank.probed)
        out << (m.inter.bank > 0
                    ? fmt::format(", banks {:.0f} KB when idle (round trips after a pause)",
                                  m.inter.bank / 1e3)
                    : std::string(", banks nothing when idle"));
      out << ";";
    }
    out << fmt::format(" gamma {:.3f} GB/s\n", m.gamma > 0 ? 1e-9 / m.gamma : INFINITY);
  }
  int fewest = first.iters, most = first.iters;
  for (const Row& r : result.rows) {
    fewest = std::min(fewest, r.iters);
    most = std::max(most, r.iters);
  }
  const std::string calls =
      fewest == most ? fmt::format("{} calls", most) : fmt::format("{} to {} calls", fewest, most);
  out << fmt::format(
      "# time: median of {} repeat(s) of the slowest rank's mean per call ({} each); min, max: "
      "their spread\n",
      first.repeats, calls);
  out << "#\n";
  out << fmt::format(
      "#{}", fmt::format(kRowFormat, "size", "count", "type", "redop", "scheduler", "time", "min",
                         "max", "algbw", "busbw", "#wrong", "predicted", "error")
                 .substr(1));
  out << fmt::format("#{}", fmt::format(kRowFormat, "(B)", "(elements)", "", "", "", "(us)", "(us)",
                                        "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(%)")
                                .substr(1));
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// "tree -> ring between 128 KiB and 1 MiB"
std::string between(const Crossover& c) {
  return fmt::format("{} -> {} between {} and {}", c.from, c.to, formatBytes(c.below),
                     formatBytes(c.above));
}

// The predicted crossovers, each beside the measured one it should match: whether the two
// agree within the spread, where the measurement put it instead, or that it measured none;
// then the measured crossovers that no prediction has.
void predictedCrossovers(std::ostream& out, const std::vector<Row>& rows) {
  const CrossoverChecks checks = checkCrossovers(rows);
  out << "# Crossovers (predicted):" << (checks.predicted.empty() ? " none" : "") << "\n";
  for (const CrossoverCheck& c : checks.predicted) {
    out << "#   " << between(c.predicted) << ": ";
    if (c.agrees) {
      out << "as measured (" << formatBytes(c.measured->below) << " to "
          << formatBytes(c.measured->above) << ", ties within the spread included)\n";
    } else if (c.measured) {
      out << "measured between " << formatBytes(c.measured->below) << " and "
          << formatBytes(c.measured->above) << " instead\n";
    } else {
      out << "not measured (no such change where the ranges tell the two apart)\n";
    }
  }
  for (const Crossover& c : checks.unpredicted) out << "#   not predicted: " << between(c) << "\n";
}

// Which scheduler is fastest: crossovers between sizes where the fastest is distinguishable,
// and the sizes where it is not (measured ranges overlap). One size (a barrier): its verdict.
void fastest(std::ostream& out, const std::vector<Row>& rows) {
  for (bool predicted : {false, true}) {
    auto sizes = verdicts(rows, predicted);
    const char* what = predicted ? "predicted" : "measured";
    if (predicted && sizes.empty()) continue;            // no scheduler has a prediction
    if (sizes.size() == 1 && rows.size() < 2) continue;  // one row: nothing to compare
    if (sizes.size() == 1) {
      const auto& v = sizes.front();
      out << fmt::format("# Fastest ({}): {}\n", what,
                         v.distinguishable()
                             ? v.fastest
                             : "indistinguishable: " + joined(v.tied) + " (their ranges overlap)");
      continue;
    }
    if (predicted) {
      predictedCrossovers(out, rows);
      continue;
    }
    auto found = crossovers(rows, false);
    out << "# Crossovers (" << what << "):" << (found.empty() ? " none" : "") << "\n";
    for (const auto& c : found) out << "#   " << between(c) << "\n";
    std::string ties;
    for (const auto& v : sizes) {
      if (!v.tied.empty())
        ties += fmt::format("#   {}: {}\n", formatBytes(v.bytes), joined(v.tied));
    }
    if (!ties.empty()) out << "# Indistinguishable (min-max ranges overlap):\n" << ties;
  }
}

// What `auto` ran at each size and how far its median is from the fastest measured
// scheduler's, at the sizes where one is fastest (its range apart from every other's).
void autoAgainstFastest(std::ostream& out, const std::vector<Row>& rows) {
  const auto judged = autoVerdicts(rows);
  std::vector<std::pair<std::string, std::string>> entries;  // (run, label), in row order
  for (const AutoVerdict& v : judged) {
    if (std::find(entries.begin(), entries.end(), std::pair{v.run, v.label}) == entries.end())
      entries.emplace_back(v.run, v.label);
  }
  for (const auto& [run, label] : entries) {
    std::string sizes;
    int judged_sizes = 0, as_fast = 0, tied = 0;
    for (const AutoVerdict& v : judged) {
      if (v.run != run || v.label != label) continue;
      if (!v.judged()) {
        ++tied;
        continue;
      }
      ++judged_sizes;
      as_fast += v.asFast() ? 1 : 0;
      sizes += fmt::format("{}{} ran {} ({:+.0f}% against {}{})", sizes.empty() ? "" : ", ",
                           formatBytes(v.bytes), v.ran, v.off_percent, v.fastest,
                           v.off_percent > 5 && v.overlaps ? ", ranges overlap" : "");
    }
    if (judged_sizes == 0) {
      out << fmt::format(
          "# {} against the fastest: no size has one fastest scheduler ({} "
          "indistinguishable)\n",
          label, tied);
      continue;
    }
    out << fmt::format(
        "# {} against the fastest: {}; as fast (within 5%, or ranges overlap) at {} of {} "
        "size(s) where one is fastest{}\n",
        label, sizes, as_fast, judged_sizes,
        tied > 0 ? fmt::format(" ({} more indistinguishable)", tied) : "");
  }
}

void summary(std::ostream& out, const std::vector<Row>& rows, bool simulated) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, int>> busbw;
  for (const Row& r : rows) {
    if (!busbw.count(r.scheduler)) order.push_back(r.scheduler);
    busbw[r.scheduler].first += r.busbw;
    busbw[r.scheduler].second += 1;
  }
  out << "#\n";
  if (rows.front().collective != collectiveName(Collective::kBarrier)) {
    out << "# Avg bus bandwidth (GB/s):";
    for (const auto& s : order)
      out << fmt::format(" {} {:.3f}", s, busbw[s].first / busbw[s].second);
    out << "\n";
  }
  std::string errors;
  for (const auto& s : order) {
    double e = medianErrorPercent(rows, s);
    if (std::isfinite(e)) errors += fmt::format(" {} {:.0f}%", s, e);
  }
  if (!errors.empty()) out << "# Median prediction error:" << errors << "\n";
  autoAgainstFastest(out, rows);
  if (simulated) {
    out << "# Simulated time has no noise: one repeat is exact, and every difference counts\n";
  } else if (rows.front().repeats < 2) {
    out << "# 1 repeat: no spread was measured, so any difference counts (bench.repeats >= 3 "
           "tells noise from a real difference)\n";
  }
  fastest(out, rows);
}

std::ofstream openOutput(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw Error(ErrorKind::kInternal, "cannot write " + path);
  return out;
}

// `text` as a gnuplot string literal that holds data only: single-quoted (gnuplot expands
// nothing inside single quotes; a quote is written twice), every control character a space,
// so no text from a config or a matrix point can end the literal or the line.
std::string gnuplotString(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "''";
    } else {
      out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? ' ' : c;
    }
  }
  return out + "'";
}

// One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break, with its
// quotes doubled.
std::string csvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

void printTable(std::ostream& out, const std::vector<Result>& results) {
  uint64_t wrong = 0;
  size_t unchecked = 0, rows_in_all = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& rows = results[i].rows;
    if (rows.empty()) continue;
    if (i > 0) out << "#\n";
    if (!rows.front().run.empty()) out << "# run: " << rows.front().run << "\n";
    header(out, rows.front(), results[i]);
    for (const Row& r : rows) {
      double error = (r.predicted_us - r.time_us) / r.time_us * 100;
      out << fmt::format(kRowFormat, r.bytes, r.count, r.dtype, r.op, r.scheduler,
                         fixed(r.time_us, 2), fixed(r.time_min_us, 2), fixed(r.time_max_us, 2),
                         fixed(r.algbw, 3), fixed(r.busbw, 3),
                         r.checked ? std::to_string(r.wrong) : std::string("N/A"),
                         fixed(r.predicted_us, 2), fixed(error, 0));
      wrong += r.wrong;
      unchecked += r.checked ? 0 : 1;
      ++rows_in_all;
    }
    summary(out, rows, !results[i].facts.simulated.empty());
  }
  if (unchecked == rows_in_all && rows_in_all > 0) {
    out << "# Wrong elements: not checked (bench.check: false, or a simulation without payload)\n";
    return;
  }
  out << "# Wrong elements: " << wrong
      << (wrong > 0        ? " (FAILED)"
          : unchecked == 0 ? " (all results correct)"
                           : fmt::format(" (in the {} checked rows)", rows_in_all - unchecked))
      << "\n";
}

void writeCsv(const std::string& path, const std::vector<Row>& rows) {
  auto out = openOutput(path);
  out << "run,collective,backend,ranks,scheduler,plugin,ran,bytes,count,dtype,op,repeats,iters,"
         "time_us,time_min_us,time_max_us,algbw_gbps,busbw_gbps,wrong,predicted_us\n";
  for (const Row& r : rows) {
    out << fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3f},{:.3f},{:.3f},{:.6f},{:.6f},{},{}\n",
        csvField(r.run), csvField(r.collective), csvField(r.backend), r.ranks,
        csvField(r.scheduler), csvField(r.plugin), csvField(r.ran), r.bytes, r.count,
        csvField(r.dtype), csvField(r.op), r.repeats, r.iters, r.time_us, r.time_min_us,
        r.time_max_us, r.algbw, r.busbw, r.checked ? std::to_string(r.wrong) : "",
        std::isfinite(r.predicted_us) ? fmt::format("{:.3f}", r.predicted_us) : "");
  }
}

namespace {

nlohmann::json rowsJson(const std::vector<Row>& rows) {
  nlohmann::json doc = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json row = {{"run", r.run},
                          {"collective", r.collective},
                          {"backend", r.backend},
                          {"ranks", r.ranks},
                          {"scheduler", r.scheduler},
                          {"plugin", r.plugin},
                          {"ran", r.ran},
                          {"bytes", r.bytes},
                          {"count", r.count},
                          {"dtype", r.dtype},
                          {"op", r.op},
                          {"repeats", r.repeats},
                          {"iters", r.iters},
                          {"time_us", r.time_us},
                          {"time_min_us", r.time_min_us},
                          {"time_max_us", r.time_max_us},
                          {"algbw_gbps", r.algbw},
                          {"busbw_gbps", r.busbw},
                          {"wrong", r.checked ? nlohmann::json(r.wrong) : nullptr}};
    row["predicted_us"] = std::isfinite(r.predicted_us) ? nlohmann::json(r.predicted_us) : nullptr;
    doc.push_back(row);
  }
  return doc;
}

nlohmann::json fitJson(const LinkFit& fit) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& [bytes, seconds] : fit.points) points.push_back({bytes, seconds});
  return {
      {"probed", fit.probed}, {"sizes", fit.sizes}, {"residual", fit.residual}, {"points", points}};
}

LinkFit fitOf(const nlohmann::json& j) {
  LinkFit fit{
      j.at("probed").get<bool>(), j.at("sizes").get<int>(), j.at("residual").get<double>(), {}};
  if (j.contains("points")) {
    for (const auto& p : j.at("points"))
      fit.points.emplace_back(p.at(0).get<double>(), p.at(1).get<double>());
  }
  return fit;
}

nlohmann::json fitsJson(const Result& result) {
  return {{"intra", fitJson(result.fit_intra)},
          {"inter", fitJson(result.fit_inter)},
          {"inter_one_way", fitJson(result.fit_inter_one_way)},
          {"inter_bank", fitJson(result.fit_inter_bank)},
          {"intra_alone", fitJson(result.fit_intra_alone)}};
}

}  // namespace

void writeJson(const std::string& path, const std::vector<Row>& rows) {
  openOutput(path) << rowsJson(rows).dump(2) << "\n";
}

void writeCalibration(const std::string& path, const Result& result) {
  const std::string backend = result.rows.empty() ? "" : result.rows.front().backend;
  nlohmann::json doc = costModelJson(result.model);
  doc["backend"] = backend;
  doc["ranks"] = result.rows.empty() ? 0 : result.rows.front().ranks;
  doc["fits"] = fitsJson(result);
  detail::writeFileAtomically(path, doc.dump(2) + "\n");
}

void saveResult(const std::string& path, const Result& result) {
  nlohmann::json hosts = nlohmann::json::array();
  for (const HostFacts& h : result.facts.hosts) {
    hosts.push_back({{"name", h.name},
                     {"ranks", h.ranks},
                     {"cpus", h.cpus},
                     {"load", std::isfinite(h.load) ? nlohmann::json(h.load) : nullptr},
                     {"link", h.link}});
  }
  nlohmann::json doc = {{"facts",
                         {{"cpu_model", result.facts.cpu_model},
                          {"backend", result.facts.backend},
                          {"simulated", result.facts.simulated},
                          {"hosts", hosts}}},
                        {"rows", rowsJson(result.rows)},
                        {"calibrated", result.calibrated},
                        {"fits", fitsJson(result)},
                        {"model", costModelJson(result.model)}};
  detail::writeFileAtomically(path, doc.dump() + "\n");
}

Result loadResult(const std::string& path) {
  return detail::readRankFile(path, "results", [](const nlohmann::json& doc) {
    Result result;
    result.calibrated = doc.at("calibrated").get<bool>();
    const auto& facts = doc.at("facts");
    result.facts.cpu_model = facts.at("cpu_model").get<std::string>();
    result.facts.backend = facts.at("backend").get<std::string>();
    result.facts.simulated = facts.value("simulated", "");
    for (const auto& h : facts.at("hosts")) {
      result.facts.hosts.push_back({h.at("name").get<std::string>(), h.at("ranks").get<int>(),
                                    h.at("cpus").get<int>(),
                                    h.at("load").is_null() ? NAN : h.at("load").get<double>(),
                                    h.at("link").get<std::string>()});
    }
    result.fit_intra = fitOf(doc.at("fits").at("intra"));
    result.fit_inter = fitOf(doc.at("fits").at("inter"));
    result.fit_inter_one_way = fitOf(doc.at("fits").at("inter_one_way"));
    if (doc.at("fits").contains("inter_bank"))
      result.fit_inter_bank = fitOf(doc.at("fits").at("inter_bank"));
    if (doc.at("fits").contains("intra_alone"))
      result.fit_intra_alone = fitOf(doc.at("fits").at("intra_alone"));
    result.model = costModelFromJson(doc.at("model"));
    for (const auto& j : doc.at("rows")) {
      Row r;
      r.run = j.at("run").get<std::string>();
      r.collective = j.at("collective").get<std::string>();
      r.backend = j.at("backend").get<std::string>();
      r.ranks = j.at("ranks").get<int>();
      r.scheduler = j.at("scheduler").get<std::string>();
      r.plugin = j.at("plugin").get<std::string>();
      r.ran = j.at("ran").get<std::string>();
      r.bytes = j.at("bytes").get<uint64_t>();
      r.count = j.at("count").get<uint64_t>();
      r.dtype = j.at("dtype").get<std::string>();
      r.op = j.at("op").get<std::string>();
      r.repeats = j.at("repeats").get<int>();
      r.iters = j.value("iters", 0);
      r.time_us = j.at("time_us").get<double>();
      r.time_min_us = j.at("time_min_us").get<double>();
      r.time_max_us = j.at("time_max_us").get<double>();
      r.algbw = j.at("algbw_gbps").get<double>();
      r.busbw = j.at("busbw_gbps").get<double>();
      r.checked = !j.at("wrong").is_null();
      r.wrong = r.checked ? j.at("wrong").get<uint64_t>() : 0;
      r.predicted_us =
          j.at("predicted_us").is_null() ? kNoPrediction : j.at("predicted_us").get<double>();
      result.rows.push_back(r);
    }
    return result;
  });
}

namespace {

// One pair of plots (busbw and time against size, a line per run and scheduler) of `rows`,
// as busbw<suffix>.png/.svg and time<suffix>.png/.svg, from plot-data<suffix>.txt and
// plot<suffix>.gp in `dir`. False, with why, when gnuplot fails.
bool plotPair(const std::string& dir, const std::string& suffix, const std::vector<Row>& rows,
              std::string* why) {
  namespace fs = std::filesystem;
  // One data block per line (run + scheduler), separated by two blank lines for `index`.
  std::vector<std::string> lines;
  std::map<std::string, std::vector<const Row*>> series;
  const bool one_run = std::all_of(rows.begin(), rows.end(),
                                   [&](const Row& r) { return r.run == rows.front().run; });
  for (const Row& r : rows) {
    std::string name = one_run ? r.scheduler : r.scheduler + " (" + r.run + ")";
    if (!series.count(name)) lines.push_back(name);
    series[name].push_back(&r);
  }
  const std::string data_file = "plot-data" + suffix + ".txt";
  {
    auto out = openOutput((fs::path(dir) / data_file).string());
    for (const auto& name : lines) {
      out << "# " << gnuplotString(name) << "\n";
      for (const Row* r : series[name])
        out << r->bytes << " " << r->busbw << " " << r->time_us << "\n";
      out << "\n\n";
    }
  }
  const std::string script = "plot" + suffix + ".gp";
  {
    auto out = openOutput((fs::path(dir) / script).string());
    const Row& first = rows.front();
    std::string title = fmt::format("{} on {} ranks, {} ({} {})", first.collective, first.ranks,
                                    first.backend, first.dtype, first.op);
    out << "set logscale x 2\nset grid\nset key left top\nset xlabel 'message size (bytes)'\n"
        << "set format x '%.0b %BB'\n";
    for (const auto& [what, column, logy] :
         {std::tuple{"busbw", 2, false}, std::tuple{"time", 3, true}}) {
      out << "set title " << gnuplotString(title) << "\n"
          << "set ylabel '" << (column == 2 ? "bus bandwidth (GB/s)" : "time (us)") << "'\n"
          << (logy ? "set logscale y 10\n" : "unset logscale y\n");
      for (const auto& [terminal, ext] : {std::pair{"pngcairo noenhanced size 1000,600", "png"},
                                          std::pair{"svg noenhanced size 1000,600", "svg"}}) {
        out << "set terminal " << terminal << "\nset output '" << what << suffix << "." << ext
            << "'\nplot ";
        for (size_t i = 0; i < lines.size(); ++i) {
          out << (i ? ", " : "") << "'" << data_file << "' index " << i << " using 1:" << column
              << " with linespoints title " << gnuplotString(lines[i]);
        }
        out << "\n";
      }
    }
  }
  // gnuplot itself, no shell: the folder's name is a path, never a command.
  const std::string log = (fs::path(dir) / ("gnuplot" + suffix + ".log")).string();
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    *why = "cannot write " + log + ": " + std::strerror(errno);
    return false;
  }
  detail::SpawnOptions gnuplot;
  gnuplot.argv = {"gnuplot", script};
  gnuplot.working_directory = dir;
  gnuplot.stderr_fd = log_fd;
  int code = 127;
  try {
    code = detail::exitCodeOf(detail::waitFor(detail::spawn(gnuplot)));
  } catch (const Error& x) {
    *why = std::string("gnuplot could not be started: ") + x.what();
  }
  ::close(log_fd);
  if (code != 0 && why->empty()) *why = "gnuplot failed; see " + log;
  return code == 0;
}

}  // namespace

std::vector<std::string> writePlots(const std::string& dir, const std::vector<Row>& rows,
                                    std::string* why) {
  if (detail::findProgram("gnuplot").empty()) {
    *why = "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)";
    return {};
  }
  // Runs of several world sizes (a matrix over launch.nproc_per_node) get a pair of plots per
  // world size, as nccl-tests users compare them; otherwise one pair holds every run.
  std::map<int, std::vector<Row>> by_ranks;
  for (const Row& r : rows) by_ranks[r.ranks].push_back(r);
  std::vector<std::string> suffixes;
  if (by_ranks.size() == 1) {
    if (!plotPair(dir, "", rows, why)) return {};
    suffixes.push_back("");
  } else {
    for (const auto& [ranks, of_size] : by_ranks) {
      const std::string suffix = fmt::format("-{}ranks", ranks);
      if (!plotPair(dir, suffix, of_size, why)) return {};
      suffixes.push_back(suffix);
    }
  }
  return suffixes;
}

}  // namespace collie::bench
