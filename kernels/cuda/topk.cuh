// TopKRows' kernel templates (layer 1; launcher in sampling.cu): rank keys that order logits as
// the reference does, stage 1 (the k best of each 4096-logit chunk of a row) and stage 2 (one
// warp merges a row's chunk candidates). Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.cuh"  // NanAsNegInf

namespace specd::kernels {

constexpr int kTopKThreads = 256;
constexpr int kTopKWarps = kTopKThreads / kWarpSize;
constexpr int kTopKPerThread = 16;                         // four 16-byte loads per thread
constexpr int kTopKChunk = kTopKThreads * kTopKPerThread;  // logits per stage-1 block
// Stage 2 stages a row's candidates in shared memory up to this many (64 chunks at k = 16, a
// 262144 vocabulary); beyond, it reads them from the workspace.
constexpr int kTopKMergeKeys = 1024;

// A logit's rank key: larger keys rank first. The high word orders values as floats compare (NaN
// as -inf, -0 as +0, as the reference's > and ==), the low word is ~id, so one unsigned compare
// ranks equal values by ascending id. Logits have high words >= 0x007fffff (-inf); positions
// past the vocabulary get 0, below every logit, so they never reach a row's k best (k <= vocab).
__device__ __forceinline__ uint32_t RankBits(float logit) {
  const float v = NanAsNegInf(logit);
  const uint32_t bits = v == 0.0f ? 0u : __float_as_uint(v);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ uint64_t RankKey(uint32_t rank_bits, uint32_t id) {
  return (static_cast<uint64_t>(rank_bits) << 32) | ~id;
}

__device__ __forceinline__ int32_t RankKeyId(uint64_t key) {
  return static_cast<int32_t>(~static_cast<uint32_t>(key));
}

__device__ __forceinline__ uint64_t MaxKey(uint64_t a, uint64_t b) { return a > b ? a : b; }

// Largest key of the warp, returned to every lane (every lane must call it): the largest high
// word, then the largest low word among the lanes holding it; two redux.sync (sm_80+) instead of
// a 64-bit shuffle tree, since the k rounds are latency-bound.
__device__ __forceinline__ uint64_t WarpMaxKey(uint64_t key) {
  const uint32_t hi = static_cast<uint32_t>(key >> 32);
  const uint32_t max_hi = __reduce_max_sync(0xffffffffu, hi);
  const uint32_t max_lo =
      __reduce_max_sync(0xffffffffu, hi == max_hi ? static_cast<uint32_t>(key) : 0u);
  return (static_cast<uint64_t>(max_hi) << 32) | max_lo;
}

// Offset in its chunk of a stage-1 thread's logit j: with 16-byte loads, element j % 4 of vector
// threadIdx.x + (j / 4) * kTopKThreads; else logit threadIdx.x + j * kTopKThreads. Consecutive
// threads read consecutive vectors or logits (coalesced); compile-time in j, so the registers
// holding the logits are never indexed dynamically.
template <bool kVec4>
__device__ __forceinline__ uint32_t TopKOffset(int j) {
  if constexpr (kVec4) {
    return 4 * (threadIdx.x + static_cast<uint32_t>(j / 4) * kTopKThreads) + j % 4;
  } else {
    return threadIdx.x + static_cast<uint32_t>(j) * kTopKThreads;
  }
}

// The thread's rank bits of chunk [begin, begin + kTopKChunk) of the row, 0 past the vocabulary.
// Every load is issued before the first use.
template <bool kVec4>
__device__ __forceinline__ void LoadChunkRanks(const float* __restrict__ row, uint32_t begin,
                                               uint32_t vocab, uint32_t (&rank)[kTopKPerThread]) {
  const bool full = begin + kTopKChunk <= vocab;  // uniform: no bounds checks on the loads
  float v[kTopKPerThread];
  if constexpr (kVec4) {
#pragma unroll
    for (int q = 0; q < kTopKPerThread / 4; ++q) {
      const uint32_t i = begin + TopKOffset<true>(4 * q);
      float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (full || i + 3 < vocab) {
        f = *reinterpret_cast<const float4*>(row + i);
      } else {
        if (i < vocab) f.x = row[i];
        if (i + 1 < vocab) f.y = row[i + 1];
        if (i + 2 < vocab) f.z = row[i + 2];
      }
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTopKPerThread; ++j) {
      const uint32_t i = begin + TopKOffset<false>(j);
      v[j] = full || i < vocab ? row[i] : 0.0f;
    }
  }
#pragma unroll
  for (int j = 0; j < kTopKPerThread; ++j) {
    rank[j] = full || begin + TopKOffset<kVec4>(j) < vocab ? RankBits(v[j]) : 0u;
  }
}

// The thread's largest key below `bound` (0 when none): four independent max chains, then their
// max, so the rescan on each round's critical path is 6 compares deep.
template <bool kVec4>
__device__ __forceinline__ uint64_t ThreadBestBelow(const uint32_t (&rank)[kTopKPerThread],
                                                    uint32_t begin, uint64_t bound) {
  uint64_t best[4] = {0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < kTopKPerThread; ++j) {
    const uint64_t key = RankKey(rank[j], begin + TopKOffset<kVec4>(j));
    if (key < bound) best[j % 4] = MaxKey(best[j % 4], key);
  }
  return MaxKey(MaxKey(best[0], best[1]), MaxKey(best[2], best[3]));
}

// Stage 1 of TopKRows: block blockIdx.x takes chunk blockIdx.x % num_chunks of row
// blockIdx.x / num_chunks. Each thread keeps its logits' rank bits in registers and its best key;
// each round every warp reads the warps' bests and takes their max (the winner), then only the
// winner's warp changes: its winning thread rescans for its best key below the winner (every
// larger key of the chunk is already out) and the warp re-reduces. One barrier per round: the
// warps' bests are double-buffered by round parity. Writes the chunk's k best keys, best first,
// to candidates[blockIdx.x * k ...], or, for a row of one chunk, their ids to out_ids.
template <bool kVec4>
__global__ void __launch_bounds__(kTopKThreads)
    TopKChunksKernel(const float* __restrict__ logits, int64_t stride, int vocab, int num_chunks,
                     int k, uint64_t* __restrict__ candidates, int32_t* __restrict__ out_ids) {
  __shared__ uint64_t warp_best[2][kTopKWarps];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int row_index = blockIdx.x / num_chunks;
  const uint32_t begin = static_cast<uint32_t>(blockIdx.x % num_chunks) * kTopKChunk;
  const float* row = logits + static_cast<int64_t>(row_index) * stride;

  uint32_t rank[kTopKPerThread];
  LoadChunkRanks<kVec4>(row, begin, static_cast<uint32_t>(vocab), rank);
  uint64_t mine = ThreadBestBelow<kVec4>(rank, begin, ~0ull);
  uint64_t warp_max = WarpMaxKey(mine);
  for (int j = 0; j < k; ++j) {
    // Round j reads buffer j % 2 after the barrier; round j + 1 writes the other one, and round
    // j + 2 rewrites this one only after the next barrier, which every reader has passed.
    if (lane == 0) warp_best[j % 2][warp] = warp_max;
    __syncthreads();
    const uint64_t winner = WarpMaxKey(lane < kTopKWarps ? warp_best[j % 2][lane] : 0);
    if (threadIdx.x == 0) {
      if (num_chunks == 1) {
        out_ids[static_cast<int64_t>(row_index) * k + j] = RankKeyId(winner);
      } else {
        candidates[static_cast<int64_t>(blockIdx.x) * k + j] = winner;
      }
    }
    if (warp_max == winner && j + 1 < k) {  // uniform over the warp; keys are distinct
      if (mine == winner) mine = ThreadBestBelow<kVec4>(rank, begin, winner);
      warp_max = WarpMaxKey(mine);
    }
  }
}

// The lane's largest key below `bound` among keys[lane], keys[lane + 32], ... (0 when none).
__device__ __forceinline__ uint64_t LaneBestBelow(const uint64_t* keys, int num_keys,
                                                  uint64_t bound) {
  uint64_t best = 0;
#pragma unroll 4
  for (int i = threadIdx.x % kWarpSize; i < num_keys; i += kWarpSize) {
    const uint64_t key = keys[i];
    if (key < bound) best = MaxKey(best, key);
  }
  return best;
}

// Stage 2 of TopKRows: one warp per row merges the row's num_keys = num_chunks * k candidate
// keys (staged in shared memory when they fit) by k rounds of warp max, the winning lane
// rescanning its keys below the winner as in stage 1.
__global__ void __launch_bounds__(kWarpSize)
    TopKMergeKernel(const uint64_t* __restrict__ candidates, int num_keys, int k,
                    int32_t* __restrict__ out_ids) {
  __shared__ uint64_t staged[kTopKMergeKeys];
  const uint64_t* keys = candidates + static_cast<int64_t>(blockIdx.x) * num_keys;
  if (num_keys <= kTopKMergeKeys) {
    for (int i = threadIdx.x; i < num_keys; i += kWarpSize) staged[i] = keys[i];
    __syncwarp();
    keys = staged;
  }
  uint64_t mine = LaneBestBelow(keys, num_keys, ~0ull);
  for (int j = 0; j < k; ++j) {
    const uint64_t winner = WarpMaxKey(mine);
    if (threadIdx.x == 0) out_ids[static_cast<int64_t>(blockIdx.x) * k + j] = RankKeyId(winner);
    if (mine == winner) mine = LaneBestBelow(keys, num_keys, winner);
  }
}

}  // namespace specd::kernels
