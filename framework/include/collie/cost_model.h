// The α-β-γ cost model (Hockney, extended with a reduction term) that schedulers use to
// predict their time, calibrated by the bench on the actual backend.
#pragma once

#include <cmath>
#include <limits>

namespace collie {

// One level of the network: α seconds per message, β seconds per byte on the wire.
struct LinkCost {
  double alpha = 0;
  double beta = 0;
  // Time of one message of `bytes`.
  double message(double bytes) const { return alpha + beta * bytes; }
};

struct CostModel {
  LinkCost intra;    // between ranks of one node
  LinkCost inter;    // between nodes (equal to intra on one node)
  double gamma = 0;  // seconds per byte reduced locally
};

// What a scheduler without a model returns.
constexpr double kNoPrediction = std::numeric_limits<double>::quiet_NaN();

}  // namespace collie
