// Running an experiment file on the lab (launch.lab): one `collie launch` per emulated host,
// inside it, with the master address of host 0 and each host's own interface.
#pragma once

#include <filesystem>
#include <vector>

#include "config/experiment.h"
#include "runtime/run.h"

namespace collie::lab {

// Whether this process should set the lab up and start the hosts' launchers: the file asks
// for a lab and this process is not already one of its hosts' launchers.
bool wantsLab(const std::vector<config::Experiment>& runs);

// Sets the lab up (or reuses it), runs every run of the file across its hosts and returns
// the exit code of the job (node 0's report, or the first host's failure). `out` is the
// output folder node 0 writes.
int runOnLab(const RunRequest& request, const std::vector<config::Experiment>& runs,
             const std::filesystem::path& out);

}  // namespace collie::lab
