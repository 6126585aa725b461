// The checks a Chrome trace-event JSON must pass (the Trace Event Format's JSON object form,
// as chrome://tracing and ui.perfetto.dev read it): what each event phase requires.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace collie::testing {

// Every way `trace` departs from the format, one line each (empty: none).
inline std::vector<std::string> traceSchemaErrors(const nlohmann::json& trace) {
  std::vector<std::string> errors;
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    return {"not an object with a traceEvents array"};
  }
  if (trace.contains("displayTimeUnit") && trace["displayTimeUnit"] != "ms" &&
      trace["displayTimeUnit"] != "ns") {
    errors.push_back("displayTimeUnit is neither ms nor ns");
  }
  const std::set<std::string> metadata = {"process_name", "process_labels", "process_sort_index",
                                          "thread_name", "thread_sort_index"};
  const std::set<std::string> flows = {"s", "t", "f"};
  size_t k = 0;
  for (const auto& e : trace["traceEvents"]) {
    const std::string where = "event " + std::to_string(k++) + " " + e.dump() + ": ";
    if (!e.is_object()) {
      errors.push_back(where + "not an object");
      continue;
    }
    if (!e.contains("ph") || !e["ph"].is_string()) {
      errors.push_back(where + "no ph");
      continue;
    }
    const std::string ph = e["ph"];
    if (!e.contains("name") || !e["name"].is_string()) errors.push_back(where + "no name");
    if (!e.contains("pid") || !e["pid"].is_number_integer()) errors.push_back(where + "no pid");
    if (!e.contains("tid") || !e["tid"].is_number_integer()) errors.push_back(where + "no tid");
    if (e.contains("args") && !e["args"].is_object())
      errors.push_back(where + "args not an object");
    if (ph == "M") {
      if (!metadata.count(e.value("name", ""))) errors.push_back(where + "unknown metadata");
      if (!e.contains("args")) errors.push_back(where + "metadata without args");
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number() || e["ts"].get<double>() < 0)
      errors.push_back(where + "no ts (a non-negative number of microseconds)");
    if (ph == "X") {
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0)
        errors.push_back(where + "a complete event without a non-negative dur");
    } else if (flows.count(ph)) {
      if (!e.contains("id")) errors.push_back(where + "a flow event without id");
      if (!e.contains("cat") || !e["cat"].is_string())
        errors.push_back(where + "a flow event without cat");
      if (e.contains("bp") && e["bp"] != "e") errors.push_back(where + "bp other than e");
    } else if (ph != "B" && ph != "E" && ph != "i" && ph != "C") {
      errors.push_back(where + "phase " + ph + " is not one collie writes");
    }
  }
  return errors;
}

// What collie's job trace promises besides the format, for a job of `world` ranks: a named
// process per rank, the same collectives (by seq) on every rank, and per collective one flow
// that starts on one rank, steps through the others and finishes on the last, each of its
// events inside that rank's event of the collective.
inline std::vector<std::string> jobTraceErrors(const nlohmann::json& trace, int world) {
  std::vector<std::string> errors = traceSchemaErrors(trace);
  if (!errors.empty()) return errors;
  std::map<int, std::string> names;
  std::map<int, std::map<uint64_t, nlohmann::json>> collectives;  // pid -> seq -> event
  std::map<uint64_t, std::vector<nlohmann::json>> flow;           // id -> its events
  for (const auto& e : trace["traceEvents"]) {
    const int pid = e["pid"];
    if (pid < 0 || pid >= world) errors.push_back("pid out of range: " + e.dump());
    if (e["ph"] == "M" && e["name"] == "process_name") names[pid] = e["args"].value("name", "");
    if (e["ph"] == "X" && e.value("cat", "") == "collective") {
      const uint64_t seq = e["args"]["seq"];
      if (!collectives[pid].emplace(seq, e).second)
        errors.push_back("seq " + std::to_string(seq) + " twice on rank " + std::to_string(pid));
    }
    if (e["ph"] == "s" || e["ph"] == "t" || e["ph"] == "f")
      flow[e["id"].get<uint64_t>()].push_back(e);
  }
  for (int r = 0; r < world; ++r) {
    if (names[r].rfind("rank " + std::to_string(r) + " (", 0) != 0)
      errors.push_back("rank " + std::to_string(r) + " is not named: '" + names[r] + "'");
    if (collectives[r].size() != collectives[0].size())
      errors.push_back("rank " + std::to_string(r) + " has " +
                       std::to_string(collectives[r].size()) + " collectives, rank 0 " +
                       std::to_string(collectives[0].size()));
  }
  for (const auto& [seq, event] : collectives[0]) {
    const auto& events = flow[seq];
    std::map<std::string, int> phases;
    std::set<int> pids;
    for (const auto& f : events) {
      ++phases[f["ph"].get<std::string>()];
      const int pid = f["pid"];
      pids.insert(pid);
      const auto at = collectives[pid].find(seq);
      if (at == collectives[pid].end()) {
        errors.push_back("flow " + std::to_string(seq) + " on a rank without that collective");
        continue;
      }
      const auto& slice = at->second;
      const double ts = f["ts"], begin = slice["ts"], end = begin + slice["dur"].get<double>();
      if (f["tid"] != slice["tid"] || ts < begin || ts > end)
        errors.push_back("flow event " + f.dump() + " is not inside " + slice.dump());
    }
    if (phases["s"] != 1 || phases["f"] != 1 || phases["t"] != world - 2 ||
        static_cast<int>(pids.size()) != world) {
      errors.push_back("collective seq " + std::to_string(seq) + " is not joined across the " +
                       std::to_string(world) + " ranks by one flow");
    }
  }
  return errors;
}

}  // namespace collie::testing
