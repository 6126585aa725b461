// auto's decisions for other libraries (`collie run --emit-policy DIR`): the fastest measured
// scheduler per size range, as NCCL's tuner policy and as Open MPI's coll/tuned dynamic rules, each
// collie scheduler mapped to the Open MPI 4.1 algorithm that computes the same schedule (or to Open
// MPI's own decision where none does). Open MPI ignores a malformed rules file without a word, so
// the writer reads its own file back and refuses one that does not say what it meant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collie/rules.h"

namespace collie::bench {

// The Open MPI 4.1 algorithm of collective `collective` that runs the same schedule as
// `choice` (its coll_tuned_<collective>_algorithm number and name), or id 0 when none does.
struct OpenMpiAlgorithm {
  int id = 0;        // 0: Open MPI's own (fixed) decision
  std::string name;  // "ring", "recursive_doubling"; "" for 0
};
OpenMpiAlgorithm openMpiEquivalent(const std::string& collective, const RuleChoice& choice);

// One size range of the policy: from `min_bytes` (the message's bytes on one rank) up to the
// next range's, Open MPI runs `algorithm`; `scheduler` is the collie choice it stands for.
struct OpenMpiRange {
  uint64_t min_bytes = 0;
  OpenMpiAlgorithm algorithm;
  std::string scheduler;
};
struct OpenMpiPolicy {
  int collective_id = 0;  // Open MPI's COLLTYPE number (allreduce 2, allgather 0)
  int world_size = 0;     // the communicator size the ranges apply to; others: Open MPI's own
  std::vector<OpenMpiRange> ranges;  // ascending, the first from 0 bytes
};

// "from 0 B", "above 128 KiB": where a range starting at `min_bytes` begins.
std::string rangeText(uint64_t min_bytes);

// The policy of `rules` (bench's bestRules). Throws ConfigError for a collective Open MPI's
// rules cannot name or rules measured without a group size.
OpenMpiPolicy openMpiPolicy(const RulesFile& rules);

// The classic rules file of coll/tuned (what Open MPI 4.1 reads): numbers, '#' comments
// explaining each. `comment` heads the file.
std::string openMpiRulesText(const OpenMpiPolicy& policy, const std::string& comment);

// Reads a classic rules file as Open MPI 4.1 does, strictly (every count matched, the first
// message size 0, sizes ascending, nothing left over), and returns the rules it holds for
// communicators of `world_size` ranks (their `scheduler` names empty). Throws ConfigError
// naming what is malformed.
OpenMpiPolicy readOpenMpiRules(const std::string& text, int world_size);

// Writes the policy's rules file into `dir` after reading it back (InternalError when it does
// not hold the policy), and returns its path.
std::string writeOpenMpiRules(const std::string& dir, const OpenMpiPolicy& policy,
                              const std::string& comment);

// NCCL's side (tools/nccl_tuner: libnccl-tuner-collie.so reads the file): the NCCL
// algorithm ("ring", "tree") that runs `choice`'s schedule, or "" when none does.
std::string ncclEquivalent(const std::string& collective, const RuleChoice& choice);
// The tuner's policy of `rules`: one line "COLLECTIVE RANKS FROM_BYTES ALGORITHM" per size
// range ('-': NCCL decides), '#' comments.
std::string ncclPolicyText(const RulesFile& rules, const std::string& comment);
// Writes it as DIR/nccl-tuner.policy; returns the path.
std::string writeNcclPolicy(const std::string& dir, const RulesFile& rules,
                            const std::string& comment);

}  // namespace collie::bench
