#include "engine/base/cuda/cuda_util.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/base/status.h"

namespace specd::cuda {
namespace {

// The allocation failure, with the device's free memory for context.
absl::Status OutOfMemory(std::string_view what, size_t bytes, std::string_view where) {
  cudaGetLastError();  // out-of-memory is not sticky: clear it
  size_t free = 0, total = 0;
  std::string context;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    context = absl::StrCat(" (", FormatBytes(static_cast<int64_t>(free)), " free of ",
                           FormatBytes(static_cast<int64_t>(total)), ")");
  }
  cudaGetLastError();
  return absl::ResourceExhaustedError(absl::StrCat(std::string(what), ": cannot allocate ",
                                                   FormatBytes(static_cast<int64_t>(bytes)), " ",
                                                   std::string(where), context));
}

}  // namespace

absl::Status Check(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat(std::string(what), ": ", cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")"));
}

absl::StatusOr<cudaGraphExec_t> CaptureGraph(cudaStream_t stream,
                                             const std::function<absl::Status()>& enqueue,
                                             std::string_view what) {
  SPECD_RETURN_IF_ERROR(Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              absl::StrCat(std::string(what), ": capture")));
  const absl::Status body = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!body.ok() || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    SPECD_RETURN_IF_ERROR(body);
    return Check(end, absl::StrCat(std::string(what), ": capture"));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("out of GPU memory instantiating the ", std::string(what),
                     "; lower gpu_memory_utilization or use enforce_eager"));
  }
  SPECD_RETURN_IF_ERROR(Check(inst, absl::StrCat(std::string(what), ": cudaGraphInstantiate")));
  return exec;
}

int32_t DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / double(1 << 30));
  if (bytes >= (int64_t{1} << 20)) return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
  if (bytes >= (int64_t{1} << 10)) return absl::StrFormat("%.1f KiB", bytes / double(1 << 10));
  return absl::StrCat(bytes, " B");
}

absl::StatusOr<MemoryInfo> GetMemoryInfo() {
  size_t free = 0, total = 0;
  SPECD_RETURN_IF_ERROR(Check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo"));
  return MemoryInfo{static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

absl::StatusOr<DeviceMemory> DeviceMemory::Allocate(size_t bytes, std::string_view what) {
  DeviceMemory m;
  if (bytes == 0) return m;
  const cudaError_t e = cudaMalloc(&m.data_, bytes);
  if (e == cudaErrorMemoryAllocation) return OutOfMemory(what, bytes, "on the GPU");
  SPECD_RETURN_IF_ERROR(Check(e, absl::StrCat(std::string(what), ": cudaMalloc")));
  m.bytes_ = bytes;
  return m;
}

DeviceMemory::~DeviceMemory() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<PinnedMemory> PinnedMemory::Allocate(size_t bytes, std::string_view what) {
  PinnedMemory m;
  if (bytes == 0) return m;
  const cudaError_t e = cudaHostAlloc(&m.data_, bytes, cudaHostAllocDefault);
  if (e == cudaErrorMemoryAllocation) return OutOfMemory(what, bytes, "in pinned host memory");
  SPECD_RETURN_IF_ERROR(Check(e, absl::StrCat(std::string(what), ": cudaHostAlloc")));
  m.bytes_ = bytes;
  return m;
}

PinnedMemory::~PinnedMemory() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

PinnedMemory::PinnedMemory(PinnedMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedMemory& PinnedMemory::operator=(PinnedMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

}  // namespace specd::cuda
