// Where a rank's tensors live (train.device) and how device memory meets backends: CUDA
// devices as LibTorch sees them, the stream order hooks for backends with streams of their
// own, tensor views as collie buffers, and host staging for backends that move host memory
// only. Device-generic: it builds against a CPU-only LibTorch too, and reaches CUDA through
// LibTorch's device interfaces when the LibTorch it runs with has them. Part of
// libcollie_torch.so (runtime/torch_runtime.h); its CUDA table is installed as that loads.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "collie/backend.h"
#include "collie/collective.h"
#include "runtime/staging.h"

namespace collie {

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

// Host staging (runtime/staging.h) with LibTorch's copies: pinned host buffers where CUDA is
// there, the copy back queued on the caller's stream and waited for only before its host
// buffer is reused. One per Communicator; not thread-safe.
std::unique_ptr<HostStaging> makeHostStaging();

}  // namespace collie
