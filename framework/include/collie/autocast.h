// LibTorch's autocast state of one device type, read and set the same way against every
// LibTorch collie builds with: 1.13 (Debian) names it per device (set_cpu_enabled,
// set_autocast_gpu_dtype, ...), 2.4 and later take the device type as an argument and
// deprecate the old names. For the trainer and for models that replay a forward
// (activation checkpointing).
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace collie::autocast {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define COLLIE_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define COLLIE_AUTOCAST_BY_DEVICE_TYPE 0
#endif

// Whether autocast is on for `type` (kCPU or kCUDA) on this thread.
inline bool enabled(at::DeviceType type) {
#if COLLIE_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::is_autocast_enabled(type);
#else
  return type == at::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}

// The type autocast computes in for `type`.
inline at::ScalarType dtype(at::DeviceType type) {
#if COLLIE_AUTOCAST_BY_DEVICE_TYPE
  return at::autocast::get_autocast_dtype(type);
#else
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                           : at::autocast::get_autocast_cpu_dtype();
#endif
}

// Turns autocast for `type` on or off, computing in `compute`.
inline void set(at::DeviceType type, bool on, at::ScalarType compute) {
#if COLLIE_AUTOCAST_BY_DEVICE_TYPE
  at::autocast::set_autocast_dtype(type, compute);
  at::autocast::set_autocast_enabled(type, on);
#else
  if (type == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(compute);
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_autocast_cpu_dtype(compute);
    at::autocast::set_cpu_enabled(on);
  }
#endif
}

}  // namespace collie::autocast
