// Activation launchers (layer 2): pick the vector width, size the grid, launch, report.
#include <climits>

#include "kernels/cuda/activation.cuh"
#include "kernels/cuda/activation.h"

namespace specd::kernels {
namespace {

constexpr int64_t kMaxSiluAndMulWidth = int64_t{1} << 23;  // keeps the scalar grid's y under 65535

template <int kVec>
cudaError_t LaunchSiluAndMul(const __nv_bfloat16* gate_up, int64_t num_tokens, int64_t d,
                             __nv_bfloat16* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(CeilDiv(d, int64_t{kVec} * kElementwiseThreads)));
  return LaunchDependent(SiluAndMulKernel<kVec>, grid, kElementwiseThreads, 0, stream, gate_up, d,
                         out);
}

}  // namespace

cudaError_t SiluAndMul(const __nv_bfloat16* gate_up, int64_t num_tokens, int64_t d,
                       __nv_bfloat16* out, cudaStream_t stream) {
  if (d < 1 || d > kMaxSiluAndMulWidth || num_tokens < 0 || num_tokens > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  if (d % kBf16PerVec16 == 0 && IsAligned(gate_up, 16) && IsAligned(out, 16)) {
    return LaunchSiluAndMul<kBf16PerVec16>(gate_up, num_tokens, d, out, stream);
  }
  return LaunchSiluAndMul<1>(gate_up, num_tokens, d, out, stream);
}

}  // namespace specd::kernels
