// The CUDA runner's per-step upload arena: small host arrays packed into one pinned buffer and
// copied to the device in one transfer (a step's sampling, verification, token-tree and EAGLE-3
// head inputs). Plain C++ over the CUDA runtime API (no nvcc). Engine thread (the runner's
// owner) only.
#pragma once

#include <driver_types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/base/cuda/cuda_util.h"

namespace specd::cuda {

// Packs small per-step arrays into one host buffer and uploads them with one copy; each array's
// device address is resolved after Upload (the device buffer grows when needed, which is only
// safe while no work on it is queued: callers synchronise at the end of every step).
class UploadArena {
 public:
  void Reset() { host_.clear(); }
  // Appends `bytes` bytes (16-byte aligned); returns their byte offset.
  size_t Push(const void* data, size_t bytes);
  template <typename T>
  size_t Push(const std::vector<T>& v) {
    return Push(v.data(), v.size() * sizeof(T));
  }
  size_t size() const { return host_.size(); }
  // Copies everything pushed since Reset to the device, asynchronously on `stream`.
  absl::Status Upload(cudaStream_t stream);
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(device_.as<uint8_t>() + offset);
  }

 private:
  std::vector<uint8_t> host_;
  PinnedMemory pinned_;
  DeviceMemory device_;
};

}  // namespace specd::cuda
