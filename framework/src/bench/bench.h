// The bench experiment (DESIGN §6): one collective swept over message sizes, every listed
// scheduler on the same ranks in the same run, interleaved; nccl-tests style results.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "config/experiment.h"
#include "plugin/loader.h"

namespace collie::bench {

// One (size, scheduler) measurement, aggregated over ranks.
struct Row {
  std::string run;  // the matrix point, "" without a matrix
  std::string scheduler;
  std::string backend;
  std::string collective;
  int ranks = 0;
  uint64_t bytes = 0;
  uint64_t count = 0;  // elements
  std::string dtype;
  std::string op;
  double time_us = 0;  // slowest rank's mean time per collective
  double algbw = 0;    // GB/s: bytes / time
  double busbw = 0;    // GB/s: algbw times the collective's bus factor
  uint64_t wrong = 0;  // elements that differ from the closed form, summed over ranks
};

// The message sizes of a sweep: min, min*factor, ... up to max.
std::vector<uint64_t> sweepSizes(uint64_t min_bytes, uint64_t max_bytes, int factor);

// nccl-tests' bus bandwidth factor for `coll` on n ranks.
double busFactor(Collective coll, int n);

// Runs the experiment's bench with its ranks as threads of this process.
std::vector<Row> run(const PluginLoader& loader, const config::Experiment& experiment);

// The table, one block per matrix point, then the average bus bandwidth per scheduler.
void printTable(std::ostream& out, const std::vector<Row>& rows);
void writeCsv(const std::string& path, const std::vector<Row>& rows);
void writeJson(const std::string& path, const std::vector<Row>& rows);

}  // namespace collie::bench
