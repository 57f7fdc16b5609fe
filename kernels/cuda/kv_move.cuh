// KV slot moves over the paged cache (layer 1; launcher and contract: MoveKvSlots in
// attention.h, kv_move.cu): after tree verification the accepted path's K and V move to the
// slots right after the committed prefix. Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace specd::kernels::attention {

// Moves whose sources one thread loads before it stores any of them.
constexpr int kKvMoveBatch = 8;

// One thread per 16-byte column of one (layer, kv head, K or V) of the cache: thread i owns
// column i % chunks of cache (i / chunks), cache c = (layer * num_kv_heads + kv_head) * 2 + (V),
// and copies that column from slot from_slots[m] to slot to_slots[m] for every move m in order.
// No other thread touches the column, so a move sees what earlier moves wrote by program order
// alone (plain coherent loads, not the read-only path, which may miss this kernel's writes). To
// keep the moves' load latencies from adding up, a batch of kKvMoveBatch moves loads all its
// sources, then stores: a source an earlier move of the batch wrote is taken from that move's
// registers instead. Moves with a negative slot (and from == to) are skipped.
//   from_slots, to_slots  [num_moves] int64, device, in
//   kv                    every layer's K and V caches (attention.h, MoveKvSlots), device, in/out
//   total                 num_layers * num_kv_heads * 2 * (head_dim / 8) columns
__global__ void MoveKvSlotsKernel(const int64_t* __restrict__ from_slots,
                                  const int64_t* __restrict__ to_slots, int num_moves,
                                  __nv_bfloat16* kv, int64_t layer_stride, int64_t v_offset,
                                  int num_kv_heads, int block_size, int head_dim, int64_t total) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int chunks = head_dim / kBf16PerVec16;
  const int chunk = static_cast<int>(index % chunks);
  int64_t cache = index / chunks;
  const bool is_value = cache % 2 == 1;
  cache /= 2;
  const int kv_head = static_cast<int>(cache % num_kv_heads);
  const int64_t layer = cache / num_kv_heads;
  __nv_bfloat16* base = kv + layer * layer_stride + (is_value ? v_offset : 0) +
                        static_cast<int64_t>(kv_head) * block_size * head_dim +
                        chunk * kBf16PerVec16;
  // Slot s's 16 bytes of this column: block s / block_size, row s % block_size.
  const int64_t block_stride = static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
  auto column = [&](int64_t slot) {
    return reinterpret_cast<uint4*>(base + (slot / block_size) * block_stride +
                                    (slot % block_size) * head_dim);
  };
  for (int m0 = 0; m0 < num_moves; m0 += kKvMoveBatch) {
    int64_t from[kKvMoveBatch], to[kKvMoveBatch];
    bool live[kKvMoveBatch];
    uint4 data[kKvMoveBatch];
#pragma unroll
    for (int j = 0; j < kKvMoveBatch; ++j) {
      const bool in_range = m0 + j < num_moves;
      from[j] = in_range ? from_slots[m0 + j] : -1;
      to[j] = in_range ? to_slots[m0 + j] : -1;
      live[j] = from[j] >= 0 && to[j] >= 0 && from[j] != to[j];
      data[j] = live[j] ? *column(from[j]) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 1; j < kKvMoveBatch; ++j) {
#pragma unroll
      for (int i = 0; i < j; ++i) {  // the latest earlier writer of move j's source wins
        if (live[i] && to[i] == from[j]) data[j] = data[i];
      }
    }
#pragma unroll
    for (int j = 0; j < kKvMoveBatch; ++j) {
      if (live[j]) *column(to[j]) = data[j];
    }
  }
}

}  // namespace specd::kernels::attention
