// Small CUDA runtime helpers shared by the GPU runner (engine/runner/cuda) and the NCCL
// communicators (engine/distributed): cudaError_t -> absl::Status, graph capture, owned device and
// pinned host allocations whose failure is a ResourceExhausted naming the bytes asked for and
// free. Plain C++ over the CUDA runtime API (no nvcc). Functions any thread; an allocation belongs
// to one thread at a time (the runner's: the engine thread).
#pragma once

#include <driver_types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd::cuda {

// OK, or Internal("what: cudaErrorName (description)"). Clears a non-sticky error.
absl::Status Check(cudaError_t error, std::string_view what);

// Captures what `enqueue` queues on `stream` (thread-local capture mode) and instantiates it:
// enqueue's error first, then the capture's; ResourceExhausted naming `what` when instantiation
// runs out of device memory, Internal for other failures.
absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue,
                                             std::string_view what);

// Visible CUDA devices; 0 when there is none or no driver.
int32_t DeviceCount();

// "1.50 GiB", "12.0 MiB", "512 B".
std::string FormatBytes(int64_t bytes);

// Free and total bytes of the current device.
struct MemoryInfo {
  int64_t free = 0;
  int64_t total = 0;
  int64_t used() const { return total - free; }
};
absl::StatusOr<MemoryInfo> GetMemoryInfo();

// cudaMalloc'd bytes, freed on destruction. Move-only.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  // ResourceExhausted("<what>: cannot allocate N on the GPU (M free)") when the device is full.
  static absl::StatusOr<DeviceMemory> Allocate(size_t bytes, std::string_view what);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  template <typename T = void>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// cudaHostAlloc'd (pinned) bytes, freed on destruction. Move-only.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  static absl::StatusOr<PinnedMemory> Allocate(size_t bytes, std::string_view what);
  ~PinnedMemory();
  PinnedMemory(PinnedMemory&& other) noexcept;
  PinnedMemory& operator=(PinnedMemory&& other) noexcept;
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  template <typename T = void>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace specd::cuda
