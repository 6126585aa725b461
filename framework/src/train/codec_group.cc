// A codec's collectives through the Communicator, checked against collie/codec.h.
#include "train/codec_group.h"

#include <fmt/format.h>

#include <tuple>

#include "collie/error.h"
#include "runtime/device.h"

namespace collie::train {

Buffer CodecCallRules::allReduce(const at::Tensor& t, ReduceOp op) const {
  check(t, "allReduce");
  const at::ScalarType type = t.scalar_type();
  if (type != at::kFloat && type != at::kHalf && type != at::kBFloat16 && type != at::kInt &&
      type != at::kLong) {
    refuse(
        fmt::format("allReduce of a {} tensor: reductions take float32, float16, bfloat16, "
                    "int32 or int64",
                    c10::toString(type)));
  }
  if (op != ReduceOp::kSum && op != ReduceOp::kMax && op != ReduceOp::kMin) {
    refuse("allReduce with an operation other than sum, max or min");
  }
  return bufferOf(t);
}

std::pair<Buffer, Buffer> CodecCallRules::allGather(const at::Tensor& in,
                                                    const at::Tensor& out) const {
  check(in, "allGather");
  check(out, "allGather");
  if (out.scalar_type() != in.scalar_type() || out.numel() != in.numel() * size_) {
    refuse(fmt::format("allGather into {} elements of {} from {} of {}: expected {} of {}",
                       out.numel(), c10::toString(out.scalar_type()), in.numel(),
                       c10::toString(in.scalar_type()), in.numel() * size_,
                       c10::toString(in.scalar_type())));
  }
  return {words(in), words(out)};
}

void CodecCallRules::check(const at::Tensor& t, const char* call) const {
  if (t.defined() && t.is_contiguous() && t.device() == device_) return;
  refuse(fmt::format("{} of a tensor that is {}: expected a contiguous tensor on {}", call,
                     !t.defined()         ? std::string("undefined")
                     : !t.is_contiguous() ? std::string("not contiguous")
                                          : "on " + t.device().str(),
                     device_.str()));
}

Buffer CodecCallRules::words(const at::Tensor& t) const {
  const at::ScalarType type = t.scalar_type();
  if (t.element_size() != 1) {
    if (type != at::kFloat && type != at::kDouble && type != at::kHalf && type != at::kBFloat16 &&
        type != at::kInt && type != at::kLong) {
      refuse(
          fmt::format("allGather of a {} tensor: expected float32, float64, float16, "
                      "bfloat16, int32, int64 or one-byte elements",
                      c10::toString(type)));
    }
    return bufferOf(t);
  }
  if (t.numel() % 4 != 0 || t.storage_offset() % 4 != 0) {
    refuse(
        fmt::format("allGather of {} one-byte elements at offset {}: they travel as 4-byte "
                    "words, so both must be multiples of 4",
                    t.numel(), t.storage_offset()));
  }
  return bufferOf(t.reshape({-1}).view(at::kInt));
}

void CodecCallRules::refuse(const std::string& what) const {
  throw PluginError("codec '" + codec_ + "': " + what + " (collie/codec.h, CodecGroup)");
}

CommunicatorGroup::CommunicatorGroup(Communicator& comm, const std::string& codec,
                                     const at::Device& device, std::vector<Provenance>* record)
    : comm_(comm), rules_(codec, device, comm.backend().size()), record_(record) {}

int CommunicatorGroup::rank() const { return comm_.backend().rank(); }
int CommunicatorGroup::size() const { return comm_.backend().size(); }

void CommunicatorGroup::allReduce(const at::Tensor& t, ReduceOp op) {
  CollectiveArgs args;
  args.coll = Collective::kAllReduce;
  args.op = op;
  args.data = rules_.allReduce(t, op);
  record_->push_back(comm_.run(args));
}

void CommunicatorGroup::allGather(const at::Tensor& in, const at::Tensor& out) {
  CollectiveArgs args;
  args.coll = Collective::kAllGather;
  std::tie(args.data, args.output) = rules_.allGather(in, out);
  record_->push_back(comm_.run(args));
}

RehearsalGroup::RehearsalGroup(int rank, int size, const std::string& codec,
                               const at::Device& device)
    : rank_(rank), size_(size), rules_(codec, device, size) {}

void RehearsalGroup::allReduce(const at::Tensor& t, ReduceOp op) { rules_.allReduce(t, op); }

void RehearsalGroup::allGather(const at::Tensor& in, const at::Tensor& out) {
  rules_.allGather(in, out);
  const at::Tensor flat = in.reshape({-1});
  for (int r = 0; r < size_; ++r) out.view({-1}).narrow(0, r * in.numel(), in.numel()).copy_(flat);
}

}  // namespace collie::train
