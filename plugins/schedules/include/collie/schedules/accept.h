// accepts(), run() and predictSeconds() of a scheduler that implements one collective, or a
// few.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "collie/plugin.h"

namespace collie::schedules {

// Yes for `implemented`; for any other collective a refusal naming the scheduler and what it
// does ("swing: broadcast is not implemented (allreduce is)"), with `hint` after the
// collective's name ("; ring does reduce_scatter and allgather").
inline Decision acceptOnly(const char* scheduler, Collective implemented,
                           const CollectiveArgs& args, const char* hint = "") {
  if (args.coll == implemented) return Decision::yes();
  return Decision::no(std::string(scheduler) + ": " + collectiveName(args.coll) +
                      " is not implemented (" + collectiveName(implemented) + " is" + hint + ")");
}

// The same for a scheduler that implements several: "tree: allgather is not implemented
// (allreduce, broadcast, barrier are)".
inline Decision acceptOnly(const char* scheduler, std::initializer_list<Collective> implemented,
                           const CollectiveArgs& args) {
  for (Collective c : implemented) {
    if (c == args.coll) return Decision::yes();  // before any string: accepts() is on the hot path
  }
  std::string names;
  for (Collective c : implemented)
    names += (names.empty() ? "" : ", ") + std::string(collectiveName(c));
  return Decision::no(std::string(scheduler) + ": " + collectiveName(args.coll) +
                      " is not implemented (" + names +
                      (implemented.size() == 1 ? " is)" : " are)"));
}

// For run(): the framework runs only what accepts() took, so anything else is collie's bug.
inline void requireOnly(const char* scheduler, Collective implemented, const CollectiveArgs& args) {
  if (args.coll != implemented) {
    throw InternalError(std::string(scheduler) + ": run() called for a collective it declined");
  }
}

// For predictSeconds(): kNoPrediction for a collective that is not `implemented`, nothing to
// do on one rank, else `seconds(n)` on the world's n ranks.
template <typename Seconds>
double predictOnly(std::initializer_list<Collective> implemented, const CollectiveArgs& args,
                   const Topology& topology, Seconds&& seconds) {
  bool found = false;
  for (Collective c : implemented) found = found || c == args.coll;
  if (!found) return kNoPrediction;
  if (topology.world_size == 1) return 0;
  return seconds(topology.world_size);
}
template <typename Seconds>
double predictOnly(Collective implemented, const CollectiveArgs& args, const Topology& topology,
                   Seconds&& seconds) {
  return predictOnly({implemented}, args, topology, std::forward<Seconds>(seconds));
}

// A scheduler that implements one collective: accepts() takes it and refuses the others by
// name (with `hint`, as acceptOnly), run() hands it to runOne(), and predictSeconds() asks
// predictOne() for it on more than one rank.
class OneCollectiveScheduler : public Scheduler {
 public:
  OneCollectiveScheduler(const char* name, Collective implemented, const char* hint = "")
      : name_(name), implemented_(implemented), hint_(hint) {}

  Decision accepts(const CollectiveArgs& args, const Topology&) const override {
    return acceptOnly(name_, implemented_, args, hint_);
  }
  void run(const CollectiveArgs& args, Backend& backend, const Topology& topology) final {
    requireOnly(name_, implemented_, args);
    runOne(args, backend, topology);
  }
  double predictSeconds(const CollectiveArgs& args, const Topology& topology,
                        const CostModel& model) const final {
    return predictOnly(implemented_, args, topology,
                       [&](int n) { return predictOne(n, args, topology, model); });
  }

 protected:
  // run() of collie/scheduler.h for the one collective, on any group (one rank included),
  // and predictSeconds() for it on n > 1 ranks.
  virtual void runOne(const CollectiveArgs& args, Backend& backend, const Topology& topology) = 0;
  virtual double predictOne(int n, const CollectiveArgs& args, const Topology& topology,
                            const CostModel& model) const = 0;

 private:
  const char* name_;
  Collective implemented_;
  const char* hint_;
};

}  // namespace collie::schedules
