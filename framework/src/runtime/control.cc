// Control-plane exchanges: gather to rank 0, then rank 0 sends the table (or what it folded
// the values into) back.
#include "runtime/control.h"

#include <algorithm>

namespace collie {
namespace {
constexpr uint32_t kControlPhase = 0xF;  // tags no scheduler uses

Buffer view(double* data, size_t count) {
  Buffer b;
  b.data = data;
  b.count = count;
  b.dtype = DType::kF64;
  return b;
}
}  // namespace

void Control::barrier() { combine({}, Fold::kRoot); }

Tag Control::nextTag() { return makeTag(++seq_, kControlPhase, 0); }

std::vector<double> Control::max(const std::vector<double>& values) {
  return combine(values, Fold::kMax);
}
std::vector<double> Control::sum(const std::vector<double>& values) {
  return combine(values, Fold::kSum);
}
std::vector<double> Control::fromRoot(const std::vector<double>& values) {
  return combine(values, Fold::kRoot);
}

std::vector<double> Control::combine(const std::vector<double>& values, Fold fold) {
  const int n = backend_.size(), rank = backend_.rank();
  const Tag tag = nextTag();
  std::vector<double> result = values;
  if (rank == 0) {
    std::vector<double> theirs(values.size());
    for (int r = 1; r < n; ++r) {
      backend_.recv(r, view(theirs.data(), theirs.size()), tag);
      for (size_t i = 0; i < values.size() && fold != Fold::kRoot; ++i)
        result[i] = fold == Fold::kMax ? std::max(result[i], theirs[i]) : result[i] + theirs[i];
    }
    std::vector<std::unique_ptr<Request>> sends;
    for (int r = 1; r < n; ++r)
      sends.push_back(backend_.isend(r, view(result.data(), result.size()), tag));
    waitAll(sends, backend_.timeout());
  } else {
    backend_.send(0, view(const_cast<double*>(values.data()), values.size()), tag);
    backend_.recv(0, view(result.data(), result.size()), tag);
  }
  return result;
}

std::vector<std::vector<double>> Control::allGather(const std::vector<double>& values) {
  const int n = backend_.size(), rank = backend_.rank();
  const Tag tag = nextTag();
  std::vector<double> table(values.size() * n);
  std::copy(values.begin(), values.end(), table.begin() + rank * values.size());
  if (rank == 0) {
    for (int r = 1; r < n; ++r) {
      backend_.recv(r, view(table.data() + r * values.size(), values.size()), tag);
    }
    std::vector<std::unique_ptr<Request>> sends;
    for (int r = 1; r < n; ++r)
      sends.push_back(backend_.isend(r, view(table.data(), table.size()), tag));
    waitAll(sends, backend_.timeout());
  } else {
    backend_.send(0, view(const_cast<double*>(values.data()), values.size()), tag);
    backend_.recv(0, view(table.data(), table.size()), tag);
  }
  std::vector<std::vector<double>> out(n);
  for (int r = 0; r < n; ++r) {
    out[r].assign(table.begin() + r * values.size(), table.begin() + (r + 1) * values.size());
  }
  return out;
}

}  // namespace collie
