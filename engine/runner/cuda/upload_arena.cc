#include "engine/runner/cuda/upload_arena.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "engine/base/status.h"

namespace specd::cuda {
namespace {

constexpr size_t kArenaAlign = 16;

}  // namespace

size_t UploadArena::Push(const void* data, size_t bytes) {
  const size_t offset = (host_.size() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  host_.resize(offset + bytes);
  if (bytes > 0) std::memcpy(host_.data() + offset, data, bytes);
  return offset;
}

absl::Status UploadArena::Upload(cudaStream_t stream) {
  const size_t bytes = host_.size();
  if (bytes == 0) return absl::OkStatus();
  if (pinned_.bytes() < bytes || device_.bytes() < bytes) {
    const size_t grown = std::max<size_t>(bytes * 2, 64 << 10);
    pinned_ = PinnedMemory();
    device_ = DeviceMemory();
    SPECD_ASSIGN_OR_RETURN(pinned_, PinnedMemory::Allocate(grown, "sampling inputs"));
    SPECD_ASSIGN_OR_RETURN(device_, DeviceMemory::Allocate(grown, "sampling inputs"));
  }
  std::memcpy(pinned_.as(), host_.data(), bytes);
  return Check(cudaMemcpyAsync(device_.as(), pinned_.as(), bytes, cudaMemcpyHostToDevice, stream),
               "upload of sampling inputs");
}

}  // namespace specd::cuda
