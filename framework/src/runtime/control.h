// A tiny control plane over any backend (barrier, gather of a few numbers to every rank),
// kept apart from the schedulers under test so that a broken scheduler cannot corrupt
// the measurements that judge it. Its messages travel in memory the backend moves
// (MessageWire): host memory, or a device buffer they are staged through.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collie/backend.h"
#include "runtime/progress.h"

namespace collie {

// The framework's own messages (host bytes) over a backend, in memory the backend moves:
// straight from host memory where it moves host memory, else through a device buffer of the
// wire's own on `device` (copied in before a send, out after a receive), so that a backend
// that moves device memory only (nccl) is never handed host memory. One transfer at a time
// per wire: every user that may run beside another (a Control, a Communicator's check) has
// its own. Sizes are whole multiples of 8 bytes (the messages are doubles and int64s).
class MessageWire {
 public:
  MessageWire(Backend& backend, int device);
  ~MessageWire();
  MessageWire(const MessageWire&) = delete;
  MessageWire& operator=(const MessageWire&) = delete;

  // Blocking, with the backend's timeout; throw CommError as the backend's send and recv do.
  void send(int peer, const void* data, size_t bytes, Tag tag);
  void recv(int peer, void* data, size_t bytes, Tag tag);
  // Sends the same bytes to every rank of `peers` at once, and waits for all of them.
  void sendToEach(const std::vector<int>& peers, const void* data, size_t bytes, Tag tag);
  // Whether messages pass through device memory.
  bool staged() const { return staged_; }

 private:
  // A view of `bytes` to hand the backend: the host bytes themselves, or the device buffer
  // (grown when it is too small), with `data` copied in when `fill`.
  Buffer wireView(const void* data, size_t bytes, bool fill);

  Backend& backend_;
  const bool staged_;
  const int device_;
  struct Staging;
  std::unique_ptr<Staging> staging_;
};

class Control {
 public:
  // `device`: the rank's device, where messages are staged when the backend moves no host
  // memory (deviceOfLocalRank of the rank's local rank).
  explicit Control(Backend& backend, int device = 0)
      : backend_(backend), wire_(backend, device), device_(device) {}
  // The rank's device (where measurement buffers go on a backend without host memory).
  int device() const { return device_; }
  // Every rank returns once every rank has called it.
  void barrier();
  // Every rank's `values` (the same length on every rank), indexed [rank][i], on every rank.
  // It builds a table of every rank's values on every rank: for what needs them all; a max,
  // a sum or rank 0's values cost less (below), which matters at thousands of simulated ranks.
  std::vector<std::vector<double>> allGather(const std::vector<double>& values);
  // The element-wise maximum, or sum, of every rank's `values`, on every rank.
  std::vector<double> max(const std::vector<double>& values);
  std::vector<double> sum(const std::vector<double>& values);
  // Rank 0's `values` on every rank (the same length on every rank).
  std::vector<double> fromRoot(const std::vector<double>& values);
  // A fresh control-plane tag, for probes that exchange their own messages (every rank
  // must draw the same number of tags).
  Tag nextTag();
  // Point-to-point of the framework's own bytes on the control plane's wire (clock offsets,
  // the trace gather), with a tag from nextTag().
  MessageWire& wire() { return wire_; }
  // Marks each exchange on this rank's progress board (null: none). Not owned.
  void setProgress(ProgressBoard* board) { progress_ = board; }

 private:
  enum class Fold { kMax, kSum, kRoot };
  // Rank 0 folds every rank's values as they arrive and sends the result back.
  std::vector<double> combine(const std::vector<double>& values, Fold fold);
  // Rank 0 hands every other rank's `mine` to take(rank, values) in rank order, then sends
  // `back` to every rank; the others send `mine` and receive `back` (its size on every rank).
  void gatherThenSend(const std::vector<double>& mine, std::vector<double>& back,
                      const std::function<void(int, const double*)>& take);

  Backend& backend_;
  MessageWire wire_;
  int device_;
  uint64_t seq_ = 0;
  ProgressBoard* progress_ = nullptr;
};

}  // namespace collie
