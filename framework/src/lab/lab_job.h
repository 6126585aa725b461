// Running an experiment file on the lab (launch.lab): one `collie launch` per emulated host,
// inside it, with the master address of host 0 and each host's own interface.
#pragma once

#include <filesystem>
#include <vector>

#include "config/experiment.h"
#include "runtime/run.h"

namespace collie::lab {

// Whether this process should run `e` on the lab: the run asks for one and this process is
// not already the launcher of one of its hosts.
bool wantsLab(const config::Experiment& e);

// Sets the lab up as run `index` asks (or keeps it), then runs that run across the lab's
// hosts: a `collie launch --only-run index` inside each. Returns once node 0 has left the
// run's result in `out`; throws CommError (ConfigError for bad input, Interrupted for a
// signal) naming the first host that failed.
void runOnLab(const RunRequest& request, const config::Experiment& e, size_t index,
              const std::filesystem::path& out);

}  // namespace collie::lab
