// accepts() and run() of a scheduler that implements one collective, or a few.
#pragma once

#include <initializer_list>
#include <string>

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

}  // namespace collie::schedules
