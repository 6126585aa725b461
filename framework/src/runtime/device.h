// Where a rank's tensors live (train.device) and how device memory meets backends: CUDA
// devices as LibTorch sees them, the stream order hooks for backends with streams of their
// own, tensor views as collie buffers, and host staging for backends that move host memory
// only. Device-generic: it builds against a CPU-only LibTorch too, and reaches CUDA through
// LibTorch's device interfaces when the LibTorch it runs with has them.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/collective.h"

namespace collie {

// The process's device memory (collie/device_memory.h): CUDA through LibTorch, installed when
// the process starts, or the emulated device when `setting` (COLLIE_EMULATED_DEVICE) is "1".
// Throws ConfigError for any value but "", "0" and "1". Call before any device buffer exists.
void installDeviceMemory(const char* setting);
// True when the emulated device is installed: train.device: cuda then puts every tensor of
// the process in its memory, and a tensor's buffer is device memory.
bool emulatedDevice();

// CUDA devices LibTorch can use in this process: 0 with a LibTorch built without CUDA or
// with no GPU visible. Never throws.
int cudaDeviceCount();
// "LibTorch 1.13.1 (CPU only)" / "LibTorch 2.11.0 with CUDA, 1 device": for messages.
std::string torchDescription();

// The device of a rank for train.device ("cpu" or "cuda"): cuda:(local_rank % devices).
// Throws ConfigError naming what this LibTorch and machine have when `kind` is cuda and no
// CUDA device is usable. Makes that device the calling thread's current one. On the
// emulated device, cuda is the CPU device whose tensors the emulated device holds.
at::Device rankDevice(const std::string& kind, int local_rank);
// Makes `device` the calling thread's current CUDA device (every thread that queues work on
// it calls this once); nothing for the CPU.
void useDevice(const at::Device& device);

// Installs collie::DeviceStreamHooks that speak for LibTorch's current stream of the calling
// thread (once per process; later calls do nothing).
void installDeviceStreamHooks();

// A contiguous tensor's elements as a collective buffer: memory kind, device and dtype taken
// from the tensor (device memory for a tensor of the emulated device). Throws InternalError for a
// dtype collie has no name for.
Buffer bufferOf(const at::Tensor& t);

// Host staging (train.device: cuda over a backend without device memory): a collective's
// device buffers are copied into pinned host buffers, the collective runs on them, and the
// results are copied back. The copy out runs on the caller's current stream and is waited
// for; the copy back is queued on that stream and not waited for, so that it overlaps
// whatever the caller does next (the next bucket's collective); its host buffer is reused
// only once that copy has finished. One per Communicator; not thread-safe.
class HostStaging {
 public:
  HostStaging();
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Whether `args` must pass through host memory on a backend with `caps`: a buffer in
  // device memory that the backend cannot move. `force` stages host buffers too (tests: CPU
  // tensors standing in for device memory).
  static bool needed(const CollectiveArgs& args, const Capabilities& caps, bool force = false);
  // `args` as they will run once staged: every buffer in host memory (same pointers), for
  // a scheduler's accepts(), which may look at the memory kind.
  static CollectiveArgs asStaged(const CollectiveArgs& args);
  // Host copies of args' buffers (data and output), the input's bytes copied in.
  CollectiveArgs stageIn(const CollectiveArgs& args);
  // Copies the results (the buffer a collective writes) from `staged` back into `original`.
  void stageOut(const CollectiveArgs& original, const CollectiveArgs& staged);
  // Bytes of host memory it holds now.
  size_t heldBytes() const;

 private:
  struct Slot;
  // A host buffer of at least `bytes` whose last copy back has finished.
  Slot& acquire(size_t index, size_t bytes, const Buffer& like);
  std::vector<std::unique_ptr<Slot>> slots_;  // [0]: data, [1]: output
};

}  // namespace collie
