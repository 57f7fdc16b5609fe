// RMSNorm launchers (layer 2): pick the vector width, size the block, launch, report the error.
#include <algorithm>
#include <climits>
#include <initializer_list>

#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace specd::kernels {
namespace {

template <int kVec, bool kAddResidual>
cudaError_t Launch(const __nv_bfloat16* input, __nv_bfloat16* residual, const __nv_bfloat16* weight,
                   int64_t num_tokens, int64_t hidden, float eps, __nv_bfloat16* out,
                   cudaStream_t stream) {
  // Enough 32-multiple threads that one vector each covers the row, capped at a full block;
  // with the cap, kMaxRmsNormHidden guarantees the per-thread register chunks cover the rest.
  const int64_t vectors = CeilDiv(hidden, kVec);
  const int threads = static_cast<int>(
      std::min<int64_t>(kMaxBlockThreads, CeilDiv(vectors, kWarpSize) * kWarpSize));
  return LaunchDependent(RmsNormKernel<kVec, kAddResidual>, static_cast<unsigned>(num_tokens),
                         threads, 0, stream, input, residual, weight, static_cast<int>(hidden), eps,
                         out);
}

bool ValidSizes(int64_t num_tokens, int64_t hidden) {
  return hidden >= 1 && hidden <= kMaxRmsNormHidden && num_tokens >= 0 && num_tokens <= INT_MAX;
}

bool CanVectorize(int64_t hidden, std::initializer_list<const void*> ptrs) {
  if (hidden % kBf16PerVec16 != 0) return false;
  return std::all_of(ptrs.begin(), ptrs.end(), [](const void* p) { return IsAligned(p, 16); });
}

}  // namespace

cudaError_t RmsNorm(const __nv_bfloat16* input, const __nv_bfloat16* weight, int64_t num_tokens,
                    int64_t hidden, float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (!ValidSizes(num_tokens, hidden)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (CanVectorize(hidden, {input, weight, out})) {
    return Launch<kBf16PerVec16, false>(input, nullptr, weight, num_tokens, hidden, eps, out,
                                        stream);
  }
  return Launch<1, false>(input, nullptr, weight, num_tokens, hidden, eps, out, stream);
}

cudaError_t FusedAddRmsNorm(const __nv_bfloat16* input, __nv_bfloat16* residual,
                            const __nv_bfloat16* weight, int64_t num_tokens, int64_t hidden,
                            float eps, __nv_bfloat16* out, cudaStream_t stream) {
  if (!ValidSizes(num_tokens, hidden)) return cudaErrorInvalidValue;
  if (num_tokens == 0) return cudaSuccess;
  if (CanVectorize(hidden, {input, residual, weight, out})) {
    return Launch<kBf16PerVec16, true>(input, residual, weight, num_tokens, hidden, eps, out,
                                       stream);
  }
  return Launch<1, true>(input, residual, weight, num_tokens, hidden, eps, out, stream);
}

}  // namespace specd::kernels
