// The cost model as JSON, its one format on disk: the bench's calibration.json (its
// "intra", "inter" and "gamma") and the "model" of a rank's result file, written and read by
// the framework, and read by `auto` (params.calibration). Header-only, for a plugin that
// reads a saved calibration too; it needs nlohmann/json.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collie/cost_model.h"

namespace collie {

// A level: its fields by name, by_buffer as [bytes, beta, beta_alone] triples.
inline nlohmann::json linkCostJson(const LinkCost& link) {
  nlohmann::json by_buffer = nlohmann::json::array();
  for (const BufferBeta& b : link.by_buffer) by_buffer.push_back({b.bytes, b.beta, b.beta_alone});
  return {{"alpha", link.alpha},
          {"beta", link.beta},
          {"beta_one_way", link.beta_one_way},
          {"alpha_alone", link.alpha_alone},
          {"beta_alone", link.beta_alone},
          {"flows", link.flows},
          {"gap", link.gap},
          {"by_buffer", by_buffer},
          {"bank", link.bank}};
}

// A level from linkCostJson's object. α and β are required; the fields measured later are
// absent from a file an older collie wrote (a node of a cluster that runs another build)
// and read as not measured: the one-way β as β, no sharing of cores, every message of a
// stream paying α, the line's β at every size, no bank. Throws std::invalid_argument naming what is
// wrong: a field of the wrong type, a negative or infinite value, by_buffer out of order
// (byBufferProblem).
inline LinkCost linkCostFromJson(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("a level is not an object");
  auto number = [&](const char* key, bool required) {
    if (!j.contains(key)) {
      if (required) throw std::invalid_argument(std::string("no '") + key + "'");
      return 0.0;
    }
    const nlohmann::json& v = j.at(key);
    if (!v.is_number()) throw std::invalid_argument(std::string("'") + key + "' is not a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0)
      throw std::invalid_argument(std::string("'") + key + "' is " + v.dump() +
                                  ": negative or infinite");
    return x;
  };
  LinkCost link;
  link.alpha = number("alpha", true);
  link.beta = number("beta", true);
  link.beta_one_way = number("beta_one_way", false);
  link.alpha_alone = number("alpha_alone", false);
  link.beta_alone = number("beta_alone", false);
  const double flows = number("flows", false);
  if (flows != std::floor(flows) || flows > 1e6)
    throw std::invalid_argument("'flows' is " + j.at("flows").dump() +
                                ", not a count of flows (a whole number up to 1000000)");
  link.flows = static_cast<int>(flows);
  link.gap = number("gap", false);
  link.bank = number("bank", false);
  if (j.contains("by_buffer")) {
    const nlohmann::json& sizes = j.at("by_buffer");
    if (!sizes.is_array()) throw std::invalid_argument("'by_buffer' is not a list");
    for (const nlohmann::json& b : sizes) {
      if (!b.is_array() || b.size() != 3 || !b.at(0).is_number() || !b.at(1).is_number() ||
          !b.at(2).is_number())
        throw std::invalid_argument("an entry of 'by_buffer' is not [bytes, beta, beta_alone]");
      link.by_buffer.push_back(
          {b.at(0).get<double>(), b.at(1).get<double>(), b.at(2).get<double>()});
    }
    const std::string problem = byBufferProblem(link.by_buffer);
    if (!problem.empty()) throw std::invalid_argument(problem);
  }
  return link;
}

// The model: {"intra": level, "inter": level, "gamma": seconds per byte}.
inline nlohmann::json costModelJson(const CostModel& model) {
  return {{"intra", linkCostJson(model.intra)},
          {"inter", linkCostJson(model.inter)},
          {"gamma", model.gamma}};
}

// The model in `doc`'s "intra", "inter" and "gamma" (other keys are the caller's). Throws
// std::invalid_argument as linkCostFromJson does, naming the level.
inline CostModel costModelFromJson(const nlohmann::json& doc) {
  if (!doc.is_object()) throw std::invalid_argument("the model is not an object");
  CostModel model;
  for (const char* level : {"intra", "inter"}) {
    if (!doc.contains(level)) throw std::invalid_argument(std::string("no '") + level + "'");
    try {
      (std::string(level) == "intra" ? model.intra : model.inter) = linkCostFromJson(doc.at(level));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(level) + ": " + e.what());
    }
  }
  if (!doc.contains("gamma") || !doc.at("gamma").is_number())
    throw std::invalid_argument("no number 'gamma'");
  model.gamma = doc.at("gamma").get<double>();
  if (!std::isfinite(model.gamma) || model.gamma < 0)
    throw std::invalid_argument("'gamma' is " + doc.at("gamma").dump() + ": negative or infinite");
  return model;
}

}  // namespace collie
