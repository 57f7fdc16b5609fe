// One-shot all-reduce launchers (layer 2): check the group, pick the access width and the world
// size instantiation, launch, report the error.
#include <climits>

#include "kernels/cuda/allreduce_oneshot.cuh"
#include "kernels/cuda/allreduce_oneshot.h"

namespace specd::kernels {
namespace {

template <typename T, int kVec, int kWorld>
cudaError_t LaunchWorld(T* data, int64_t count, const OneShotGroup& group, cudaStream_t stream) {
  return LaunchDependent(OneShotAllReduceKernel<T, kVec, kWorld>, kOneShotBlocks, kOneShotThreads,
                         0, stream, data, count / kVec, group);
}

template <typename T, int kVec>
cudaError_t LaunchVec(T* data, int64_t count, const OneShotGroup& group, cudaStream_t stream) {
  switch (group.world_size) {
    case 2:
      return LaunchWorld<T, kVec, 2>(data, count, group, stream);
    case 3:
      return LaunchWorld<T, kVec, 3>(data, count, group, stream);
    case 4:
      return LaunchWorld<T, kVec, 4>(data, count, group, stream);
    case 5:
      return LaunchWorld<T, kVec, 5>(data, count, group, stream);
    case 6:
      return LaunchWorld<T, kVec, 6>(data, count, group, stream);
    case 7:
      return LaunchWorld<T, kVec, 7>(data, count, group, stream);
    case 8:
      return LaunchWorld<T, kVec, 8>(data, count, group, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

bool ValidGroup(const OneShotGroup& group) {
  if (group.world_size < 2 || group.world_size > kOneShotMaxRanks) return false;
  if (group.rank < 0 || group.rank >= group.world_size || group.slot_bytes % 16 != 0) return false;
  for (int r = 0; r < group.world_size; ++r) {
    if (group.buffers[r] == nullptr || !IsAligned(group.buffers[r], 16)) return false;
  }
  return true;
}

template <int kWorld>
cudaError_t LaunchNormWorld(__nv_bfloat16* data, __nv_bfloat16* residual,
                            const __nv_bfloat16* weight, int rows, int hidden, float eps,
                            const OneShotGroup& group, cudaStream_t stream) {
  const int packs_per_thread = static_cast<int>(CeilDiv(hidden / 8, kOneShotThreads));
  const auto launch = [&](auto kernel) {
    return LaunchDependent(kernel, kOneShotBlocks, kOneShotThreads, 0, stream, data, residual,
                           weight, rows, hidden, eps, group);
  };
  if (packs_per_thread <= 1) return launch(OneShotAllReduceAddRmsNormKernel<kWorld, 1>);
  if (packs_per_thread <= 2) return launch(OneShotAllReduceAddRmsNormKernel<kWorld, 2>);
  return launch(OneShotAllReduceAddRmsNormKernel<kWorld, 4>);
}

template <typename T>
cudaError_t Dispatch(T* data, int64_t count, const OneShotGroup& group, cudaStream_t stream) {
  if (!ValidGroup(group) || count < 0 || data == nullptr) return cudaErrorInvalidValue;
  const size_t bytes = static_cast<size_t>(count) * sizeof(T);
  if (bytes > group.slot_bytes) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  if (bytes % 16 == 0 && IsAligned(data, 16)) return LaunchVec<T, kVec>(data, count, group, stream);
  return LaunchVec<T, 1>(data, count, group, stream);
}

}  // namespace

cudaError_t OneShotAllReduce(__nv_bfloat16* data, int64_t count, const OneShotGroup& group,
                             cudaStream_t stream) {
  return Dispatch(data, count, group, stream);
}

cudaError_t OneShotAllReduce(float* data, int64_t count, const OneShotGroup& group,
                             cudaStream_t stream) {
  return Dispatch(data, count, group, stream);
}

cudaError_t OneShotAllReduceAddRmsNorm(__nv_bfloat16* data, __nv_bfloat16* residual,
                                       const __nv_bfloat16* weight, int64_t rows, int64_t hidden,
                                       float eps, const OneShotGroup& group, cudaStream_t stream) {
  if (!ValidGroup(group) || rows > INT_MAX ||
      !OneShotFusesNorm(group.world_size, rows, hidden, group.slot_bytes) || data == nullptr ||
      residual == nullptr || weight == nullptr || !IsAligned(data, 16) ||
      !IsAligned(residual, 16) || !IsAligned(weight, 16)) {
    return cudaErrorInvalidValue;
  }
  if (rows == 0) return cudaSuccess;
  const auto r = static_cast<int>(rows);
  const auto h = static_cast<int>(hidden);
  switch (group.world_size) {
    case 2:
      return LaunchNormWorld<2>(data, residual, weight, r, h, eps, group, stream);
    case 4:
      return LaunchNormWorld<4>(data, residual, weight, r, h, eps, group, stream);
    case 8:
      return LaunchNormWorld<8>(data, residual, weight, r, h, eps, group, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace specd::kernels
