// Control-plane exchanges: gather to rank 0, then rank 0 sends the table (or what it folded
// the values into) back.
#include "runtime/control.h"

#include <algorithm>
#include <functional>

namespace collie {
namespace {
constexpr uint32_t kControlPhase = 0xF;  // tags no scheduler uses

// A host view of `count` doubles.
Buffer view(double* data, size_t count) { return Buffer{data, count, DType::kF64}; }
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

void Control::gatherThenSend(const std::vector<double>& mine, std::vector<double>& back,
                             const std::function<void(int, const double*)>& take) {
  const int n = backend_.size();
  const Tag tag = nextTag();
  if (backend_.rank() == 0) {
    std::vector<double> theirs(mine.size());
    for (int r = 1; r < n; ++r) {
      backend_.recv(r, view(theirs.data(), theirs.size()), tag);
      take(r, theirs.data());
    }
    std::vector<std::unique_ptr<Request>> sends;
    for (int r = 1; r < n; ++r)
      sends.push_back(backend_.isend(r, view(back.data(), back.size()), tag));
    waitAll(sends, backend_.timeout());
  } else {
    backend_.send(0, view(const_cast<double*>(mine.data()), mine.size()), tag);
    backend_.recv(0, view(back.data(), back.size()), tag);
  }
}

std::vector<double> Control::combine(const std::vector<double>& values, Fold fold) {
  std::vector<double> result = values;
  gatherThenSend(values, result, [&](int, const double* theirs) {
    for (size_t i = 0; i < values.size() && fold != Fold::kRoot; ++i)
      result[i] = fold == Fold::kMax ? std::max(result[i], theirs[i]) : result[i] + theirs[i];
  });
  return result;
}

std::vector<std::vector<double>> Control::allGather(const std::vector<double>& values) {
  const int n = backend_.size();
  const size_t k = values.size();
  std::vector<double> table(k * n);
  std::copy(values.begin(), values.end(), table.begin() + backend_.rank() * k);
  gatherThenSend(values, table, [&](int r, const double* theirs) {
    std::copy(theirs, theirs + k, table.begin() + r * k);
  });
  std::vector<std::vector<double>> out(n);
  for (int r = 0; r < n; ++r) {
    out[r].assign(table.begin() + r * k, table.begin() + (r + 1) * k);
  }
  return out;
}

}  // namespace collie
