// MoveKvSlots (attention.h), the launcher of kv_move.cuh's kernel: validation, grid, launch.
#include <climits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_move.cuh"

namespace specd::kernels {

cudaError_t MoveKvSlots(const int64_t* from_slots, const int64_t* to_slots, int32_t num_moves,
                        __nv_bfloat16* kv, int32_t num_layers, int64_t layer_stride,
                        int64_t v_offset, const AttentionShape& shape, cudaStream_t stream) {
  const bool valid_shape = shape.num_kv_heads > 0 && shape.head_dim > 0 &&
                           shape.head_dim % kBf16PerVec16 == 0 && shape.block_size > 0;
  if (!valid_shape || num_moves < 0 || num_layers < 0 || kv == nullptr || !IsAligned(kv, 16) ||
      layer_stride % kBf16PerVec16 != 0 || v_offset % kBf16PerVec16 != 0 ||
      (num_moves > 0 && (from_slots == nullptr || to_slots == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (num_moves == 0 || num_layers == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  const int64_t total =
      int64_t{num_layers} * shape.num_kv_heads * 2 * (shape.head_dim / kBf16PerVec16);
  const int64_t blocks = CeilDiv(total, kThreads);
  if (blocks > INT_MAX) return cudaErrorInvalidValue;
  attention::MoveKvSlotsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      from_slots, to_slots, num_moves, kv, layer_stride, v_offset, shape.num_kv_heads,
      shape.block_size, shape.head_dim, total);
  return cudaGetLastError();
}

}  // namespace specd::kernels
