// The collective-algorithm contract: a scheduler is written once against the
// Backend interface and runs over every backend.
#pragma once

#include <cmath>

#include "collie/backend.h"
#include "collie/collective.h"
#include "collie/cost_model.h"
#include "collie/topology.h"

namespace collie {

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Cheap check, no communication: can this scheduler run `args` on this group shape?
  // A refusal names the reason ("tree: reduce_scatter is not implemented").
  virtual Decision accepts(const CollectiveArgs& args, const Topology& topology) const = 0;

  // Runs an accepted collective on `backend`'s group, whose shape is `topology` (the same
  // one accepts() saw). Every rank of the group calls it with the same collective, count,
  // dtype, op, root and seq. Throws CommError (naming the peer, the collective and seq) when
  // a transfer fails or times out; the buffers are then undefined.
  virtual void run(const CollectiveArgs& args, Backend& backend, const Topology& topology) = 0;

  // Predicted seconds for `args` on `topology` under `model` (documented in the plugin's
  // README), or kNoPrediction. Used by the bench's predicted column, the trainer's and
  // `auto`, each through predictCollective(), which hands it the model sized for the
  // collective's buffers; a scheduler that asks another for a part of its collective
  // (hierarchical) passes that model on as it got it (sizing it again changes nothing:
  // forBuffer() keeps no sizes to pick from).
  virtual double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                                const CostModel& model) const {
    (void)args, (void)topology, (void)model;
    return kNoPrediction;
  }

  // The run's calibrated model, handed over once the framework has one (the bench and the
  // trainer calibrate before their first collective), for schedulers that choose by
  // prediction (`auto`) and those that hold others (`hierarchical` passes it on). Called on
  // the thread that runs the scheduler, before the collectives it is meant for.
  virtual void useCostModel(const CostModel& model) { (void)model; }
};

// What `scheduler` predicts for `args`: its predictSeconds under `model` sized for the
// collective's buffers (CostModel::forBuffer at args.bufferBytes()), and, where the links
// between nodes bank (LinkCost::bank), less what the bank saves (bankedSeconds). The time
// the bytes between nodes take on the schedule's critical path is β times the prediction's
// slope in β: priced again with β a thousandth larger, the difference times a thousand (a
// larger step would find a longer path where a slower link makes another one critical).
// The one way the framework and `auto`
// ask, so that every caller prices a collective alike; a scheduler that asks another for a
// part of its collective calls predictSeconds.
inline double predictCollective(const Scheduler& scheduler, const CollectiveArgs& args,
                                const Topology& topology, const CostModel& model) {
  const CostModel sized = model.forBuffer(static_cast<double>(args.bufferBytes()));
  const double seconds = scheduler.predictSeconds(args, topology, sized);
  if (!(sized.inter.bank > 0) || topology.nodeCount() < 2 || !std::isfinite(seconds))
    return seconds;
  constexpr double kStep = 1e-3;
  CostModel slower = sized;
  slower.inter.beta *= 1 + kStep;
  slower.inter.beta_one_way *= 1 + kStep;
  const double link = (scheduler.predictSeconds(args, topology, slower) - seconds) / kStep;
  return bankedSeconds(seconds, link, sized.inter.bank * sized.inter.betaFor(false));
}

}  // namespace collie
