// Names of dtypes, reduce ops, collectives and tags, both ways where parsing is needed.
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "collie/backend.h"
#include "collie/buffer.h"
#include "collie/collective.h"

namespace collie {
namespace {

constexpr const char* kDTypeNames[] = {"f32", "f64", "f16", "bf16", "i32", "i64"};
constexpr size_t kDTypeSizes[] = {4, 8, 2, 2, 4, 8};
constexpr const char* kOpNames[] = {"sum", "avg", "min", "max", "prod"};
constexpr const char* kCollectiveNames[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                            "barrier"};

template <typename Enum, size_t N>
bool parseName(const char* const (&names)[N], const std::string& text, Enum* out) {
  for (size_t i = 0; i < N; ++i) {
    if (text == names[i]) {
      *out = static_cast<Enum>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

size_t dtypeSize(DType dtype) { return kDTypeSizes[static_cast<size_t>(dtype)]; }
const char* dtypeName(DType dtype) { return kDTypeNames[static_cast<size_t>(dtype)]; }
const char* reduceOpName(ReduceOp op) { return kOpNames[static_cast<size_t>(op)]; }
const char* collectiveName(Collective coll) { return kCollectiveNames[static_cast<size_t>(coll)]; }
bool parseDType(const std::string& name, DType* out) { return parseName(kDTypeNames, name, out); }
bool parseReduceOp(const std::string& name, ReduceOp* out) {
  return parseName(kOpNames, name, out);
}
bool parseCollective(const std::string& name, Collective* out) {
  return parseName(kCollectiveNames, name, out);
}

std::string describeTag(Tag tag) {
  return fmt::format("tag {} (seq {}, phase {}, step {})", tag, tag >> 24, (tag >> 20) & 0xF,
                     tag & 0xFFFFF);
}

}  // namespace collie
