// Control-plane exchanges: gather to rank 0, then rank 0 sends the table (or what it folded
// the values into) back.
#include "runtime/control.h"

#include <algorithm>
#include <functional>

#include "collie/error.h"

namespace collie {
namespace {
constexpr uint32_t kControlPhase = 0xF;  // tags no scheduler uses
}  // namespace

struct MessageWire::Staging {
  std::unique_ptr<ScratchBuffer> device;  // int64 elements
};

MessageWire::MessageWire(Backend& backend, int device)
    : backend_(backend),
      staged_(!backend.capabilities().host_memory),
      device_(device),
      staging_(std::make_unique<Staging>()) {}

MessageWire::~MessageWire() = default;

Buffer MessageWire::wireView(const void* data, size_t bytes, bool fill) {
  COLLIE_CHECK(bytes % 8 == 0, "a control message of ", bytes, " bytes (not a multiple of 8)");
  Buffer host{const_cast<void*>(data), bytes / 8, DType::kI64};
  if (!staged_) return host;
  auto& device = staging_->device;
  if (!device || device->view().count < host.count) {
    Buffer like;
    like.dtype = DType::kI64;
    like.memory = MemoryKind::kCuda;
    like.device = device_;
    device = std::make_unique<ScratchBuffer>(like, std::max<size_t>(host.count, 64));
  }
  Buffer view = device->view().slice(0, host.count);
  if (fill) copyInto(view, host);
  return view;
}

void MessageWire::send(int peer, const void* data, size_t bytes, Tag tag) {
  backend_.send(peer, wireView(data, bytes, /*fill=*/true), tag);
}

void MessageWire::recv(int peer, void* data, size_t bytes, Tag tag) {
  const Buffer view = wireView(data, bytes, /*fill=*/false);
  backend_.recv(peer, view, tag);
  if (staged_) copyInto(Buffer{data, bytes / 8, DType::kI64}, view);
}

void MessageWire::sendToEach(const std::vector<int>& peers, const void* data, size_t bytes,
                             Tag tag) {
  const Buffer view = wireView(data, bytes, /*fill=*/true);
  std::vector<std::unique_ptr<Request>> sends;
  for (int peer : peers) sends.push_back(backend_.isend(peer, view, tag));
  waitAll(sends, backend_.timeout());
}

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
  const ProgressScope marked(progress_, {true, Collective::kBarrier, seq_, 0});
  const size_t mine_bytes = mine.size() * sizeof(double);
  const size_t back_bytes = back.size() * sizeof(double);
  if (backend_.rank() == 0) {
    std::vector<double> theirs(mine.size());
    std::vector<int> others;
    for (int r = 1; r < n; ++r) {
      wire_.recv(r, theirs.data(), mine_bytes, tag);
      take(r, theirs.data());
      others.push_back(r);
    }
    wire_.sendToEach(others, back.data(), back_bytes, tag);
  } else {
    wire_.send(0, mine.data(), mine_bytes, tag);
    wire_.recv(0, back.data(), back_bytes, tag);
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
