// Host staging (train.device: cuda over a backend without device memory): a collective's
// device buffers are copied into host buffers, the collective runs on them, and the results
// are copied back. Which collectives need it and how they look once staged is decided here;
// the copies are LibTorch's (runtime/device.cc, in the LibTorch runtime of
// runtime/torch_runtime.h), pinned and overlapped with the caller's stream on a GPU.
#pragma once

#include <cstddef>

#include "collie/backend.h"
#include "collie/collective.h"

namespace collie {

class HostStaging {
 public:
  virtual ~HostStaging() = default;

  // Whether `args` must pass through host memory on a backend with `caps`: a buffer in
  // device memory that the backend cannot move. `force` stages host buffers too (tests: CPU
  // tensors standing in for device memory).
  static bool needed(const CollectiveArgs& args, const Capabilities& caps, bool force = false);
  // `args` as they will run once staged: every buffer in host memory (same pointers), for
  // a scheduler's accepts(), which may look at the memory kind.
  static CollectiveArgs asStaged(const CollectiveArgs& args);

  // Host copies of args' buffers (data and output), the input's bytes copied in; blocking
  // (the host reads them next).
  virtual CollectiveArgs stageIn(const CollectiveArgs& args) = 0;
  // Copies the results (the buffer a collective writes) from `staged` back into `original`.
  // To a GPU the copy is queued on the caller's current stream and not waited for, so that
  // it overlaps whatever the caller does next; its host buffer is reused only once that copy
  // has finished.
  virtual void stageOut(const CollectiveArgs& original, const CollectiveArgs& staged) = 0;
  // Bytes of host memory it holds now.
  virtual size_t heldBytes() const = 0;
};

}  // namespace collie
