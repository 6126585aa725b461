// Calibrates the α-β-γ cost model on the actual backend before a sweep: a point-to-point
// ping-pong of every rank pair at once gives α (smallest message) and β (largest), a
// ping-pong between nodes (when there are several) gives their α and β, and timing local
// reductions on every rank at once gives γ.
#pragma once

#include "collie/backend.h"
#include "collie/cost_model.h"
#include "collie/topology.h"
#include "runtime/control.h"

namespace collie::bench {

// Collective over the group: every rank calls it and gets rank 0's model.
CostModel calibrate(Backend& backend, Control& control, const Topology& topology, DType dtype);

}  // namespace collie::bench
