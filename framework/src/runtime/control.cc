// Control-plane exchanges: gather to rank 0, then rank 0 sends the table back.
#include "runtime/control.h"

namespace collie {
namespace {
constexpr uint32_t kControlPhase = 0xF;  // tags no scheduler uses
}

void Control::barrier() { allGather({}); }

Tag Control::nextTag() { return makeTag(++seq_, kControlPhase, 0); }

std::vector<std::vector<double>> Control::allGather(const std::vector<double>& values) {
  const int n = backend_.size(), rank = backend_.rank();
  const Tag tag = nextTag();
  std::vector<double> table(values.size() * n);
  std::copy(values.begin(), values.end(), table.begin() + rank * values.size());
  auto view = [&](double* data, size_t count) {
    Buffer b;
    b.data = data;
    b.count = count;
    b.dtype = DType::kF64;
    return b;
  };
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
