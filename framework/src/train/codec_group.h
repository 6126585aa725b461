// The group a codec plugin reaches the other ranks through (collie/codec.h's CodecGroup):
// a Communicator, so that a codec's collectives run through train.scheduler's rules like
// the float32 all-reduce they replace, each recorded for the step's figures.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "collie/codec.h"
#include "runtime/communicator.h"

namespace collie::train {

// What collie/codec.h asks of a codec's calls, checked alike for both groups below: a call
// that breaks it is the codec's error, a PluginError naming `codec`.
class CodecCallRules {
 public:
  CodecCallRules(std::string codec, const at::Device& device, int size)
      : codec_(std::move(codec)), device_(device), size_(size) {}
  // The buffer an all-reduce of `t` moves.
  Buffer allReduce(const at::Tensor& t, ReduceOp op) const;
  // The buffers an all-gather moves: one-byte elements as 4-byte words.
  std::pair<Buffer, Buffer> allGather(const at::Tensor& in, const at::Tensor& out) const;

 private:
  void check(const at::Tensor& t, const char* call) const;
  Buffer words(const at::Tensor& t) const;
  [[noreturn]] void refuse(const std::string& what) const;

  std::string codec_;
  at::Device device_;
  int size_;
};

class CommunicatorGroup final : public CodecGroup {
 public:
  // Tensors must lie on `device`. Every collective's provenance is appended to `record`.
  CommunicatorGroup(Communicator& comm, const std::string& codec, const at::Device& device,
                    std::vector<Provenance>* record);

  int rank() const override;
  int size() const override;
  void allReduce(const at::Tensor& t, ReduceOp op) override;
  void allGather(const at::Tensor& in, const at::Tensor& out) override;

 private:
  Communicator& comm_;
  CodecCallRules rules_;
  std::vector<Provenance>* record_;
};

// A codec's arithmetic without its communication, for train.compression: auto to time what
// each candidate computes between its collectives: every rank's part is taken to be this
// rank's, so an all-reduce leaves `t` as it is (a sum over one rank) and an all-gather copies
// `in` into every rank's place. Its results are no sum over the ranks; nothing synchronised
// on it reaches a step. Calls are checked as CommunicatorGroup's are.
class RehearsalGroup final : public CodecGroup {
 public:
  RehearsalGroup(int rank, int size, const std::string& codec, const at::Device& device);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allReduce(const at::Tensor& t, ReduceOp op) override;
  void allGather(const at::Tensor& in, const at::Tensor& out) override;

 private:
  int rank_, size_;
  CodecCallRules rules_;
};

}  // namespace collie::train
