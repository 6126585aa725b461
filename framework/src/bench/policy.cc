// Open MPI's coll/tuned dynamic rules from the bench's fastest-per-size rules, and a strict
// reader of the classic format that checks what was written.
#include "bench/policy.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <optional>

#include "collie/error.h"
#include "collie/params.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace collie::bench {
namespace {

// Open MPI's COLLTYPE numbers (ompi/mca/coll/base/coll_base_functions.h) of the collectives
// whose algorithms collie has equivalents for.
struct CollectiveIds {
  const char* collie;
  int open_mpi;
};
constexpr CollectiveIds kCollectiveIds[] = {{"allreduce", 2}, {"allgather", 0}};

// collie scheduler -> the coll_tuned algorithm that sends the same messages in the same
// order (Open MPI 4.1: `ompi_info --param coll tuned --level 9` lists them). collie's ring
// cuts a block into chunks it sends one after another, which changes no message's path or
// order of reduction.
struct Equivalent {
  const char* collective;
  const char* scheduler;
  int id;
  const char* name;
};
// halving_doubling is not Open MPI's rabenseifner: collie halves with the farthest partner
// first and folds whole messages, Open MPI doubles its distance from the nearest and swaps
// halves in its fold, so the messages cross different links.
constexpr Equivalent kEquivalents[] = {
    {"allreduce", "ring", 4, "ring"},
    {"allreduce", "recursive_doubling", 3, "recursive_doubling"},
    {"allgather", "ring", 4, "ring"},
    {"allgather", "bruck", 2, "bruck"},
};

// The plugin's name without its folder and file decoration (a rule may name a path).
std::string pluginName(const std::string& plugin) {
  std::string name = fs::path(plugin).filename().string();
  for (const char* prefix : {"libcollie_scheduler_"}) {
    if (name.rfind(prefix, 0) == 0) name = name.substr(std::string(prefix).size());
  }
  const size_t dot = name.find('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// The numbers of a classic rules file, comments ('#' to the end of the line) skipped.
class Numbers {
 public:
  explicit Numbers(const std::string& text) : text_(text) {}

  long next(const char* what) {
    skip();
    if (at_ == text_.size()) throw malformed(fmt::format("it ends where {} should be", what));
    if (!std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      throw malformed(
          fmt::format("'{}' where {} should be (a number of 0 or more)", text_[at_], what));
    }
    long value = 0;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      if (value > (1L << 50)) throw malformed(fmt::format("{} is too large", what));
      value = value * 10 + (text_[at_++] - '0');
    }
    return value;
  }
  bool done() {
    skip();
    return at_ == text_.size();
  }
  ConfigError malformed(const std::string& why) const {
    return ConfigError(fmt::format("Open MPI rules, line {}: {}", line_, why));
  }

 private:
  void skip() {
    while (at_ < text_.size()) {
      const char c = text_[at_];
      if (c == '#') {
        while (at_ < text_.size() && text_[at_] != '\n') ++at_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        if (c == '\n') ++line_;
        ++at_;
      } else {
        return;
      }
    }
  }

  const std::string& text_;
  size_t at_ = 0;
  int line_ = 1;
};

// Calls visit(first byte, choice) for each rule's size range: a rule covers the sizes above
// the previous rule's max_bytes, the last one every larger size.
// Rules whose sizes do not ascend, or "any size" (0) before the last, are refused; after a
// last rule that ends at a size, larger sizes get no choice (visit(from, nullopt)).
template <typename Visit>
void forEachRange(const RulesFile& rules, Visit&& visit) {
  uint64_t from = 0;
  for (size_t i = 0; i < rules.rules.size(); ++i) {
    const auto& rule = rules.rules[i];
    const bool last = i + 1 == rules.rules.size();
    if ((rule.max_bytes == 0 && !last) || (rule.max_bytes != 0 && rule.max_bytes < from) ||
        rule.max_bytes == UINT64_MAX) {
      throw InternalError("--emit-policy: the rules' sizes do not ascend to a last 'any size'");
    }
    visit(from, std::optional<RuleChoice>(rule.choice));
    if (rule.max_bytes == 0) return;
    from = rule.max_bytes + 1;
  }
  visit(from, std::optional<RuleChoice>());
}

// `text` on one line: a file name in a comment must not end it.
std::string oneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// collie scheduler -> the NCCL algorithm that runs its schedule: NCCL's ring is collie's
// ring, and NCCL's tree is the double binary tree collie's double_binary_tree builds between
// nodes (inside a node NCCL chains the ranks: the two match with one rank per node).
constexpr Equivalent kNcclEquivalents[] = {
    {"allreduce", "ring", 1, "ring"},
    {"allreduce", "double_binary_tree", 0, "tree"},
    {"allgather", "ring", 1, "ring"},
};

}  // namespace

std::string rangeText(uint64_t min_bytes) {
  return min_bytes == 0 ? std::string("from 0 B") : "above " + formatBytes(min_bytes - 1);
}

namespace {}  // namespace

OpenMpiAlgorithm openMpiEquivalent(const std::string& collective, const RuleChoice& choice) {
  const std::string name = pluginName(choice.plugin);
  for (const auto& e : kEquivalents) {
    if (collective == e.collective && name == e.scheduler) return {e.id, e.name};
  }
  return {};
}

OpenMpiPolicy openMpiPolicy(const RulesFile& rules) {
  OpenMpiPolicy policy;
  const CollectiveIds* ids = nullptr;
  for (const auto& c : kCollectiveIds) {
    if (rules.collective == c.collie) ids = &c;
  }
  if (ids == nullptr) {
    throw ConfigError(fmt::format(
        "--emit-policy: collie has no Open MPI equivalent for any {} scheduler; the policy "
        "covers allreduce and allgather. HINT: sweep one of those",
        rules.collective));
  }
  if (rules.world_size < 1 || rules.rules.empty()) {
    throw ConfigError("--emit-policy: the rules name no group size or no size range");
  }
  policy.collective_id = ids->open_mpi;
  policy.world_size = rules.world_size;
  forEachRange(rules, [&](uint64_t from, const std::optional<RuleChoice>& choice) {
    policy.ranges.push_back(
        {from, choice ? openMpiEquivalent(rules.collective, *choice) : OpenMpiAlgorithm{},
         choice ? oneLine(choice->name()) : "not measured"});
  });
  return policy;
}

std::string openMpiRulesText(const OpenMpiPolicy& policy, const std::string& comment) {
  const int world = policy.world_size;
  std::string text = "# " + oneLine(comment) + "\n";
  text += fmt::format(
      "# Use: mpirun --mca coll_tuned_use_dynamic_rules 1 "
      "--mca coll_tuned_dynamic_rules_filename THIS_FILE\n"
      "# Communicators of the measured size use the measured ranges; others, and ranges with\n"
      "# algorithm 0 (no Open MPI algorithm runs the collie scheduler's schedule), keep Open\n"
      "# MPI's own decision.\n");
  text += "1  # collectives\n";
  text += fmt::format("{}  # collective (coll_base_functions.h COLLTYPE)\n", policy.collective_id);
  text += "3  # communicator sizes\n";
  text += "0  # fewer ranks than measured\n1  # size range\n0 0 0 0  # Open MPI decides\n";
  text += fmt::format("{}  # ranks: the measured group\n", world);
  text += fmt::format("{}  # size ranges\n", policy.ranges.size());
  for (const auto& r : policy.ranges) {
    text +=
        fmt::format("{} {} 0 0  # {}: {}\n", r.min_bytes, r.algorithm.id, rangeText(r.min_bytes),
                    r.algorithm.id == 0 ? r.scheduler + ", no equivalent: Open MPI decides"
                                        : r.scheduler + " as Open MPI's " + r.algorithm.name);
  }
  text += fmt::format(
      "{}  # more ranks than measured\n1  # size range\n0 0 0 0  # Open MPI decides\n", world + 1);
  return text;
}

OpenMpiPolicy readOpenMpiRules(const std::string& text, int world_size) {
  Numbers in(text);
  const long collectives = in.next("the number of collectives");
  if (collectives < 1) throw in.malformed("no collective");
  std::optional<OpenMpiPolicy> first;
  for (long c = 0; c < collectives; ++c) {
    OpenMpiPolicy policy;
    policy.collective_id = static_cast<int>(in.next("a collective's number"));
    policy.world_size = world_size;
    const long communicators = in.next("the number of communicator sizes");
    long last_size = -1;
    for (long k = 0; k < communicators; ++k) {
      const long size = in.next("a communicator size");
      if (size <= last_size) throw in.malformed("communicator sizes must ascend");
      last_size = size;
      const long ranges = in.next("the number of message sizes");
      if (ranges < 1) throw in.malformed("a communicator size without a message size");
      std::vector<OpenMpiRange> found;
      for (long m = 0; m < ranges; ++m) {
        const long bytes = in.next("a message size");
        const long algorithm = in.next("an algorithm");
        in.next("a fan-in/out");
        in.next("a segment size");
        if (m == 0 && bytes != 0) throw in.malformed("the first message size must be 0");
        if (m > 0 && static_cast<uint64_t>(bytes) <= found.back().min_bytes)
          throw in.malformed("message sizes must ascend");
        found.push_back({static_cast<uint64_t>(bytes), {static_cast<int>(algorithm), ""}, ""});
      }
      // Open MPI 4.1 takes the rules of the largest communicator size not above the group's.
      if (size <= world_size) policy.ranges = std::move(found);
    }
    if (!first) first = std::move(policy);
  }
  if (!in.done()) throw in.malformed("numbers after the last rule");
  return *first;
}

std::string writeOpenMpiRules(const std::string& dir, const OpenMpiPolicy& policy,
                              const std::string& comment) {
  const std::string text = openMpiRulesText(policy, comment);
  // What Open MPI will read: the measured group gets the ranges, one rank more or fewer
  // gets Open MPI's own decision.
  auto sameRanges = [](const OpenMpiPolicy& a, const OpenMpiPolicy& b) {
    if (a.collective_id != b.collective_id || a.ranges.size() != b.ranges.size()) return false;
    for (size_t i = 0; i < a.ranges.size(); ++i) {
      if (a.ranges[i].min_bytes != b.ranges[i].min_bytes ||
          a.ranges[i].algorithm.id != b.ranges[i].algorithm.id)
        return false;
    }
    return true;
  };
  OpenMpiPolicy own_decision{policy.collective_id, 0, {{0, {}, ""}}};
  const int world = policy.world_size;
  if (!sameRanges(readOpenMpiRules(text, world), policy) ||
      !sameRanges(readOpenMpiRules(text, world + 1), own_decision) ||
      (world > 1 && !sameRanges(readOpenMpiRules(text, world - 1), own_decision))) {
    throw InternalError("--emit-policy: the Open MPI rules file does not read back as written");
  }
  const std::string path = (fs::path(dir) / "openmpi-coll-tuned.rules").string();
  detail::writeFileAtomically(path, text);
  return path;
}

std::string ncclEquivalent(const std::string& collective, const RuleChoice& choice) {
  const std::string name = pluginName(choice.plugin);
  for (const auto& e : kNcclEquivalents) {
    if (collective == e.collective && name == e.scheduler) return e.name;
  }
  return "";
}

std::string ncclPolicyText(const RulesFile& rules, const std::string& comment) {
  std::string text = "# " + oneLine(comment) + "\n";
  text +=
      "# Use: NCCL_TUNER_PLUGIN=/path/to/libnccl-tuner-collie.so COLLIE_NCCL_POLICY=THIS_FILE\n"
      "# COLLECTIVE RANKS FROM_BYTES ALGORITHM: NCCL runs ALGORITHM from FROM_BYTES on for\n"
      "# communicators of RANKS ranks; '-' (no NCCL algorithm runs the collie scheduler's\n"
      "# schedule) and other sizes leave NCCL's own choice.\n";
  forEachRange(rules, [&](uint64_t from, const std::optional<RuleChoice>& choice) {
    const std::string algorithm = choice ? ncclEquivalent(rules.collective, *choice) : "";
    text += fmt::format("{} {} {} {}  # {}: {}\n", rules.collective, rules.world_size, from,
                        algorithm.empty() ? "-" : algorithm, rangeText(from),
                        choice ? oneLine(choice->name()) : "not measured");
  });
  return text;
}

std::string writeNcclPolicy(const std::string& dir, const RulesFile& rules,
                            const std::string& comment) {
  const std::string path = (fs::path(dir) / "nccl-tuner.policy").string();
  detail::writeFileAtomically(path, ncclPolicyText(rules, comment));
  return path;
}

}  // namespace collie::bench
