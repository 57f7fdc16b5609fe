// Sampling kernel templates (layer 1; launchers in sampling.cu): row iteration, block reductions,
// radix selection of the top-k / top-p thresholds, the hierarchical draw, the processed
// probabilities, argmax, penalties and the row scatter (TopKRows' two stages: topk.cuh). The
// sampling definition is kernels/ref/sampling.h's. Include from .cu files only.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/ref/sampling.h"

namespace specd::kernels {

constexpr int kSampleThreads = 1024;  // the radix scans give each thread two of the 2048 bins
constexpr int kArgmaxThreads = 512;
constexpr int kPenaltyThreads = 256;
constexpr int kScatterThreads = 256;
constexpr int kRadixBins = 2048;  // 11-bit digits: bits [31:21], [20:10], [9:0] of p
constexpr int kRadixLevels = 3;
constexpr int kSaguaroThreads = 256;
constexpr int kRowUnroll = 4;  // independent loads in flight per thread
// Masses are summed in 2^-40 fixed point: integer sums are exact, so every pass and every level
// of the draw sees the same cumulative masses whatever the summation order, and a seeded draw is
// reproducible. p <= 1 and vocab <= 2^23 keep a row's mass below 2^63.
constexpr float kMassOne = 0x1.0p40f;
constexpr int32_t kMaxSampleVocab = 1 << 23;

__device__ __forceinline__ float NanAsNegInf(float v) { return isnan(v) ? -INFINITY : v; }

// Calls f(index, logit) for every element of the row, each exactly once, spread over the block:
// 16-byte loads when vec4 (row 16-byte aligned), kRowUnroll loads in flight per thread.
template <typename F>
__device__ __forceinline__ void ForEachLogit(const float* __restrict__ row, int vocab, bool vec4,
                                             F&& f) {
  const int step = kRowUnroll * static_cast<int>(blockDim.x);
  int scalar_begin = 0;
  if (vec4) {
    const int num_vec = vocab / 4;
    const float4* row4 = reinterpret_cast<const float4*>(row);
    for (int base = threadIdx.x; base < num_vec; base += step) {
      float4 v[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int j = base + u * static_cast<int>(blockDim.x);
        v[u] = j < num_vec ? row4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int j = base + u * static_cast<int>(blockDim.x);
        if (j < num_vec) {
          f(4 * j, v[u].x);
          f(4 * j + 1, v[u].y);
          f(4 * j + 2, v[u].z);
          f(4 * j + 3, v[u].w);
        }
      }
    }
    scalar_begin = num_vec * 4;
  }
  for (int base = scalar_begin + threadIdx.x; base < vocab; base += step) {
    float v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int j = base + u * static_cast<int>(blockDim.x);
      v[u] = j < vocab ? row[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int j = base + u * static_cast<int>(blockDim.x);
      if (j < vocab) f(j, v[u]);
    }
  }
}

// (value, index) with the larger value winning and the lower index breaking ties.
struct ArgmaxPair {
  float value;
  int index;

  __device__ __forceinline__ void Merge(float v, int i) {
    if (v > value || (v == value && i < index)) {
      value = v;
      index = i;
    }
  }
};

__device__ __forceinline__ ArgmaxPair WarpArgmax(ArgmaxPair a) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, a.value, offset);
    const int i = __shfl_xor_sync(0xffffffffu, a.index, offset);
    a.Merge(v, i);
  }
  return a;
}

// Block-wide argmax, returned to every thread. Every thread must call it; ends with a barrier
// so it may be called again.
__device__ __forceinline__ ArgmaxPair BlockArgmax(ArgmaxPair a) {
  __shared__ float values[kMaxBlockThreads / kWarpSize];
  __shared__ int indices[kMaxBlockThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  a = WarpArgmax(a);
  if (lane == 0) {
    values[warp] = a.value;
    indices[warp] = a.index;
  }
  __syncthreads();
  ArgmaxPair b{-INFINITY, INT32_MAX};
  if (lane < num_warps) b = ArgmaxPair{values[lane], indices[lane]};
  b = WarpArgmax(b);
  __syncthreads();
  return b;
}

// z * exp(from - to), 0 when from is -inf (an empty partial sum).
__device__ __forceinline__ float Rescale(float z, float from, float to) {
  if (from == to) return z;
  return from == -INFINITY ? 0.0f : z * expf(from - to);
}

// Online softmax state (Milakov & Gimelshein 2018): max and sum of exp(l - max).
struct SoftmaxPair {
  float max;
  float sum;

  __device__ __forceinline__ void Add(float v) {
    if (v > max) {
      sum = Rescale(sum, max, v) + 1.0f;
      max = v;
    } else if (v != -INFINITY) {
      sum += expf(v - max);
    }
  }
  __device__ __forceinline__ void Merge(SoftmaxPair o) {
    const float m = fmaxf(max, o.max);
    sum = Rescale(sum, max, m) + Rescale(o.sum, o.max, m);
    max = m;
  }
};

__device__ __forceinline__ SoftmaxPair BlockSoftmax(SoftmaxPair s) {
  __shared__ SoftmaxPair partials[kMaxBlockThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    s.Merge(SoftmaxPair{__shfl_xor_sync(0xffffffffu, s.max, offset),
                        __shfl_xor_sync(0xffffffffu, s.sum, offset)});
  }
  if (lane == 0) partials[warp] = s;
  __syncthreads();
  SoftmaxPair t{-INFINITY, 0.0f};
  if (lane < num_warps) t = partials[lane];
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    t.Merge(SoftmaxPair{__shfl_xor_sync(0xffffffffu, t.max, offset),
                        __shfl_xor_sync(0xffffffffu, t.sum, offset)});
  }
  __syncthreads();
  return t;
}

__device__ __forceinline__ uint64_t WarpSumU64(uint64_t x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

// Block-wide sum, returned to every thread. Every thread must call it; `scratch` holds one value
// per warp; ends with a barrier so scratch may be reused.
__device__ __forceinline__ uint64_t BlockSumU64(uint64_t v, uint64_t* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = WarpSumU64(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const uint64_t total = WarpSumU64(lane < num_warps ? scratch[lane] : 0);
  __syncthreads();
  return total;
}

// Exclusive prefix sum over the block in thread order, and the block total. Every thread must
// call it; `scratch` holds one value per warp; ends with a barrier so scratch may be reused.
__device__ __forceinline__ uint64_t BlockExclusiveScan(uint64_t v, uint64_t* scratch,
                                                       uint64_t* total) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  uint64_t inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const uint64_t other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    uint64_t w = lane < num_warps ? scratch[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < kWarpSize; offset *= 2) {
      const uint64_t other = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += other;
    }
    scratch[lane] = w;  // inclusive scan of the warp totals
  }
  __syncthreads();
  const uint64_t before = warp == 0 ? 0 : scratch[warp - 1];
  *total = scratch[num_warps - 1];
  __syncthreads();
  return before + inclusive - v;
}

// Tempered probability relative to the row's most probable token (p = 1 there).
__device__ __forceinline__ float Prob(float logit, float max, float temperature) {
  const float l = NanAsNegInf(logit);
  return l == -INFINITY ? 0.0f : expf((l - max) / temperature);
}

__device__ __forceinline__ uint64_t FixedMass(float p) { return __float2ull_rn(p * kMassOne); }

__device__ __forceinline__ int DigitShift(int level) {
  return level == 0 ? 21 : (level == 1 ? 10 : 0);
}

// p's bits (non-negative floats order like their bit patterns) for the radix selections.
struct RowView {
  const float* row;
  int vocab;
  bool vec4;
  float max;
  float temperature;
};

// Shared state of one SampleRows block.
struct SampleShared {
  uint64_t hist[kRadixBins];
  uint64_t scratch[kWarpSize];
  uint64_t above;   // count or mass above the selected bin
  uint64_t target;  // draw: remaining target within the selected range
  int selected;     // selected bin or warp
};

// Zeroes the histogram; the caller's next barrier publishes it.
__device__ __forceinline__ void ClearHistogram(SampleShared& s) {
  for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) s.hist[b] = 0;
}

// Bits of the k-th largest nonzero p of the row (radix select over count histograms), or 0 when
// fewer than k tokens have p > 0 (every token is then within top-k).
__device__ uint32_t TopKThreshold(const RowView& r, uint64_t k, SampleShared& s) {
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t rank = k;  // 1-based rank from the top within the current prefix
  for (int level = 0; level < kRadixLevels; ++level) {
    const int shift = DigitShift(level);
    const uint32_t digit_mask = level == kRadixLevels - 1 ? 0x3ffu : 0x7ffu;
    ClearHistogram(s);
    __syncthreads();
    ForEachLogit(r.row, r.vocab, r.vec4, [&](int, float logit) {
      const uint32_t key = __float_as_uint(Prob(logit, r.max, r.temperature));
      if (key != 0 && (key & prefix_mask) == prefix) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[(key >> shift) & digit_mask]),
                  1ull);
      }
    });
    __syncthreads();
    // Thread t owns bins hi = kRadixBins - 1 - 2t and hi - 1, so the exclusive scan in thread
    // order is the count of the bins above them.
    const int hi = kRadixBins - 1 - 2 * static_cast<int>(threadIdx.x);
    uint64_t total;
    const uint64_t above_hi = BlockExclusiveScan(s.hist[hi] + s.hist[hi - 1], s.scratch, &total);
    if (level == 0 && total < rank) return 0;  // uniform: every thread sees the same total
    const uint64_t above_lo = above_hi + s.hist[hi];
    if (above_hi < rank && rank <= above_lo) {
      s.selected = hi;
      s.above = above_hi;
    } else if (above_lo < rank && rank <= above_lo + s.hist[hi - 1]) {
      s.selected = hi - 1;
      s.above = above_lo;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.selected) << shift;
    prefix_mask |= digit_mask << shift;
    rank -= s.above;
    __syncthreads();  // s.selected and s.above are rewritten next (here or by TopPThreshold)
  }
  return prefix;
}

// Bits of the smallest p kept by top-p among the tokens with p bits >= lo (the survivors S of
// min-p and top-k): the lowest value whose strictly-more-probable S mass G is < top_p * M or is
// 0. Radix select over fixed-point mass histograms; tokens of zero fixed mass are ignored (they
// cannot be drawn).
__device__ uint32_t TopPThreshold(const RowView& r, uint32_t lo, float top_p, SampleShared& s) {
  uint32_t prefix = 0, prefix_mask = 0;
  uint64_t above = 0;  // S mass above the current prefix's range
  double limit = 0;    // top_p * M
  for (int level = 0; level < kRadixLevels; ++level) {
    const int shift = DigitShift(level);
    const uint32_t digit_mask = level == kRadixLevels - 1 ? 0x3ffu : 0x7ffu;
    ClearHistogram(s);
    if (threadIdx.x == 0) s.selected = INT32_MAX;
    __syncthreads();
    ForEachLogit(r.row, r.vocab, r.vec4, [&](int, float logit) {
      const float p = Prob(logit, r.max, r.temperature);
      const uint32_t key = __float_as_uint(p);
      const uint64_t mass = FixedMass(p);
      if (key >= lo && (key & prefix_mask) == prefix && mass != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist[(key >> shift) & digit_mask]),
                  static_cast<unsigned long long>(mass));
      }
    });
    __syncthreads();
    const int hi = kRadixBins - 1 - 2 * static_cast<int>(threadIdx.x);
    uint64_t total;
    const uint64_t scan = BlockExclusiveScan(s.hist[hi] + s.hist[hi - 1], s.scratch, &total);
    if (level == 0) limit = static_cast<double>(top_p) * static_cast<double>(total);
    const uint64_t g_hi = above + scan, g_lo = g_hi + s.hist[hi];
    auto keeps = [&](uint64_t g) { return g == 0 || static_cast<double>(g) < limit; };
    // The lowest non-empty bin whose mass above qualifies; the top non-empty bin always does.
    if (s.hist[hi - 1] != 0 && keeps(g_lo)) {
      atomicMin(&s.selected, hi - 1);
    } else if (s.hist[hi] != 0 && keeps(g_hi)) {
      atomicMin(&s.selected, hi);
    }
    __syncthreads();
    const int selected = s.selected;
    if (selected == hi) s.above = g_hi;
    if (selected == hi - 1) s.above = g_lo;
    __syncthreads();
    prefix |= static_cast<uint32_t>(selected) << shift;
    prefix_mask |= digit_mask << shift;
    above = s.above;
    __syncthreads();  // s.above and s.selected are rewritten by the next level
  }
  return prefix;
}

// The p bits SampleRows keeps at (a token is kept when its p bits are >= the result): min-p, then
// the top-k and top-p radix selections. Every thread must call it; the result is uniform.
__device__ uint32_t KeepCut(const RowView& r, const SamplingRow& params, SampleShared& s) {
  uint32_t cut = params.min_p > 0.0f ? __float_as_uint(fminf(params.min_p, 1.0f)) : 0u;
  if (params.top_k > 0 && params.top_k < r.vocab) {
    cut = max(cut, TopKThreshold(r, static_cast<uint64_t>(params.top_k), s));
  }
  if (params.top_p < 1.0f) cut = TopPThreshold(r, cut, params.top_p, s);
  return cut;
}

// Fixed-point mass of token `logit` when kept (p bits >= cut), else 0.
__device__ __forceinline__ uint64_t KeptMass(const RowView& r, float logit, uint32_t cut) {
  const float p = Prob(logit, r.max, r.temperature);
  return __float_as_uint(p) >= cut ? FixedMass(p) : 0;
}

// The first token (ascending id) whose cumulative kept mass exceeds floor(u * total): each level
// splits the current range among the 32 warps, sums each part, and descends into the part where
// the cumulative mass crosses the target (vocab 151936: 4748, 149, 5, 1 elements per part).
__device__ int DrawToken(const RowView& r, uint32_t cut, double u, SampleShared& s) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int begin = 0, len = r.vocab;
  bool first_level = true;
  while (len > 1) {
    const int part = (len + kWarpSize - 1) / kWarpSize;
    const int part_begin = begin + warp * part;
    const int part_end = min(part_begin + part, begin + len);
    uint64_t sum = 0;
    for (int i = part_begin + lane; i < part_end; i += kRowUnroll * kWarpSize) {
      float v[kRowUnroll];
#pragma unroll
      for (int u_idx = 0; u_idx < kRowUnroll; ++u_idx) {
        const int j = i + u_idx * kWarpSize;
        v[u_idx] = j < part_end ? r.row[j] : -INFINITY;
      }
#pragma unroll
      for (int u_idx = 0; u_idx < kRowUnroll; ++u_idx) sum += KeptMass(r, v[u_idx], cut);
    }
    sum = WarpSumU64(sum);
    if (lane == 0) s.scratch[warp] = sum;
    __syncthreads();
    if (warp == 0) {
      const uint64_t mine = s.scratch[lane];
      uint64_t inclusive = mine;
#pragma unroll
      for (int offset = 1; offset < kWarpSize; offset *= 2) {
        const uint64_t other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      uint64_t target;
      if (first_level) {
        const uint64_t total = __shfl_sync(0xffffffffu, inclusive, kWarpSize - 1);
        target = static_cast<uint64_t>(u * static_cast<double>(total));
        if (target >= total) target = total - 1;  // total >= 2^40: the top token has p = 1
      } else {
        target = s.target;
      }
      const unsigned crossed = __ballot_sync(0xffffffffu, inclusive > target);
      const int selected = __ffs(crossed) - 1;
      const uint64_t before = __shfl_sync(0xffffffffu, inclusive - mine, selected);
      if (lane == 0) {
        s.selected = selected;
        s.target = target - before;
      }
    }
    __syncthreads();
    const int selected = s.selected;
    const int end = begin + len;
    begin += selected * part;
    len = min(part, end - begin);
    first_level = false;
    __syncthreads();  // s.selected / s.target / s.scratch are rewritten by the next level
  }
  return begin;
}

// One block of kSampleThreads per row. Pass 1: max, argmax and the raw softmax sum (logprob);
// then, for sampled rows, the top-k threshold (3 passes), the top-p threshold (3 passes) and
// the draw (1 pass plus 3 short levels). Every branch below is uniform across the block.
__global__ void __launch_bounds__(kSampleThreads, 1)
    SampleRowsKernel(const float* __restrict__ logits, int64_t stride, int vocab, bool vec4,
                     const SamplingRow* __restrict__ rows, int32_t* __restrict__ out_ids,
                     float* __restrict__ out_logprobs) {
  __shared__ SampleShared shared;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  const SamplingRow params = rows[blockIdx.x];

  ArgmaxPair best{-INFINITY, INT32_MAX};
  SoftmaxPair softmax{-INFINITY, 0.0f};
  ForEachLogit(row, vocab, vec4, [&](int i, float logit) {
    const float v = NanAsNegInf(logit);
    best.Merge(v, i);
    softmax.Add(v);
  });
  best = BlockArgmax(best);
  softmax = BlockSoftmax(softmax);

  int id = best.index;
  if (params.temperature > 0.0f && isfinite(best.value)) {
    const RowView view{row, vocab, vec4, best.value, params.temperature};
    const uint32_t cut = KeepCut(view, params, shared);
    id = DrawToken(view, cut, ref::PhiloxUniform(params.seed, params.offset), shared);
  }
  if (threadIdx.x == 0) {
    out_ids[blockIdx.x] = id;
    if (out_logprobs != nullptr) {
      out_logprobs[blockIdx.x] = NanAsNegInf(row[id]) - softmax.max - logf(softmax.sum);
    }
  }
}

// out[i] = f(i, row[i]) for every element of the row, spread over the block, kRowUnroll loads in
// flight per thread (scalar: out's alignment may differ from row's). Each element is read and
// written by the same thread, and neither pointer is __restrict__, so out may be row itself.
template <typename F>
__device__ __forceinline__ void MapRow(const float* row, float* out, int vocab, F&& f) {
  const int step = kRowUnroll * static_cast<int>(blockDim.x);
  for (int base = threadIdx.x; base < vocab; base += step) {
    float v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int j = base + u * static_cast<int>(blockDim.x);
      v[u] = j < vocab ? row[j] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int j = base + u * static_cast<int>(blockDim.x);
      if (j < vocab) out[j] = f(j, v[u]);
    }
  }
}

// One block of kSampleThreads per row: SampleRowsKernel's max pass and thresholds, one pass
// summing the kept fixed mass, one write pass. logits and out carry no __restrict__: they may be
// the same rows (in place). Every read of the row by another thread precedes the barrier that
// ends BlockArgmax (greedy rows) or BlockSumU64 (sampled rows), and the write pass reads each
// element in the thread that then writes it. Every branch below is uniform across the block.
__global__ void __launch_bounds__(kSampleThreads, 1)
    ProcessedProbsKernel(const float* logits, int64_t stride, int vocab, bool vec4,
                         const SamplingRow* __restrict__ rows, float* out, int64_t out_stride) {
  __shared__ SampleShared shared;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  float* out_row = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  const SamplingRow params = rows[blockIdx.x];

  ArgmaxPair best{-INFINITY, INT32_MAX};
  ForEachLogit(row, vocab, vec4, [&](int i, float logit) { best.Merge(NanAsNegInf(logit), i); });
  best = BlockArgmax(best);
  if (!(params.temperature > 0.0f) || !isfinite(best.value)) {
    const int hot = best.value == -INFINITY ? -1 : best.index;  // no token at all: zeros
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) out_row[i] = i == hot ? 1.0f : 0.0f;
    return;
  }
  const RowView view{row, vocab, vec4, best.value, params.temperature};
  const uint32_t cut = KeepCut(view, params, shared);
  uint64_t mass = 0;
  ForEachLogit(row, vocab, vec4, [&](int, float logit) { mass += KeptMass(view, logit, cut); });
  // >= 2^40 (the top token has p = 1); exact in fp64 up to 2^53, rounded once above.
  const double total = static_cast<double>(BlockSumU64(mass, shared.scratch));
  MapRow(row, out_row, vocab, [&](int, float logit) {
    return static_cast<float>(static_cast<double>(KeptMass(view, logit, cut)) / total);
  });
}

// Row blockIdx.x of src to row dst_rows[blockIdx.x] of dst; the row's elements (float4 when
// Vec4) are spread over the gridDim.y blocks of the row.
template <bool Vec4>
__global__ void __launch_bounds__(kScatterThreads)
    ScatterRowsKernel(const float* __restrict__ src, int64_t src_stride, int cols,
                      const int32_t* __restrict__ dst_rows, float* __restrict__ dst,
                      int64_t dst_stride) {
  const float* from = src + static_cast<int64_t>(blockIdx.x) * src_stride;
  float* to = dst + static_cast<int64_t>(dst_rows[blockIdx.x]) * dst_stride;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.x;
  int64_t scalar_begin = 0;
  if constexpr (Vec4) {
    const int64_t num_vec = cols / 4;
    const float4* from4 = reinterpret_cast<const float4*>(from);
    float4* to4 = reinterpret_cast<float4*>(to);
    for (int64_t j = first; j < num_vec; j += step) to4[j] = from4[j];
    scalar_begin = 4 * num_vec;
  }
  for (int64_t j = scalar_begin + first; j < cols; j += step) to[j] = from[j];
}

// One block per row: ForEachLogit + block argmax.
__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxRowsKernel(const float* __restrict__ logits, int64_t stride, int vocab, bool vec4,
                     int32_t* __restrict__ out_ids) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  ArgmaxPair best{-INFINITY, INT32_MAX};
  ForEachLogit(row, vocab, vec4, [&](int i, float logit) { best.Merge(NanAsNegInf(logit), i); });
  best = BlockArgmax(best);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = best.index;
}

// One block per row: the row's max, the sum of exp(logit - max), then k gathered values.
__global__ void __launch_bounds__(kArgmaxThreads)
    LogSoftmaxAtKernel(const float* __restrict__ logits, int64_t stride, int vocab, bool vec4,
                       const int32_t* __restrict__ ids, int k, float* __restrict__ out) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * stride;
  ArgmaxPair best{-INFINITY, INT32_MAX};
  ForEachLogit(row, vocab, vec4, [&](int i, float logit) { best.Merge(NanAsNegInf(logit), i); });
  const float max = BlockArgmax(best).value;
  float sum = 0.0f;
  if (max > -INFINITY) {
    ForEachLogit(row, vocab, vec4, [&](int, float logit) {
      const float v = NanAsNegInf(logit);
      sum += v > -INFINITY ? __expf(v - max) : 0.0f;
    });
  }
  const float lse = max + __logf(BlockReduceSum(sum));
  if (static_cast<int>(threadIdx.x) < k) {
    const int64_t at = static_cast<int64_t>(blockIdx.x) * k + threadIdx.x;
    const int32_t id = ids[at];
    const float v = id >= 0 && id < vocab ? NanAsNegInf(row[id]) : -INFINITY;
    out[at] = max > -INFINITY && v > -INFINITY ? v - lse : -INFINITY;
  }
}

constexpr uint32_t kClaimedBit = 0x80000000u;

// One block per row. counts is the row's [vocab] uint32 slice of the workspace; only the entries
// of listed tokens are touched: zeroed, then incremented once per output occurrence, then
// claimed (high bit) by exactly one thread per distinct token, which applies the penalties with
// the final count. __f*_rn keep nvcc from fusing, so results equal the CPU Sampler's bit for bit.
__global__ void __launch_bounds__(kPenaltyThreads)
    ApplyPenaltiesKernel(float* __restrict__ logits, int64_t stride, int vocab,
                         const int32_t* __restrict__ prompt_ids,
                         const int32_t* __restrict__ prompt_offsets,
                         const int32_t* __restrict__ output_ids,
                         const int32_t* __restrict__ output_offsets,
                         const float* __restrict__ penalties, uint32_t* __restrict__ counts) {
  const int r = blockIdx.x;
  const float repetition = penalties[3 * r], presence = penalties[3 * r + 1],
              frequency = penalties[3 * r + 2];
  if (repetition == 1.0f && presence == 0.0f && frequency == 0.0f) return;  // uniform
  float* row = logits + static_cast<int64_t>(r) * stride;
  uint32_t* count = counts + static_cast<int64_t>(r) * vocab;
  const int prompt_begin = prompt_offsets[r], prompt_end = prompt_offsets[r + 1];
  const int output_begin = output_offsets[r], output_end = output_offsets[r + 1];
  auto in_range = [vocab](int32_t id) { return id >= 0 && id < vocab; };

  for (int j = prompt_begin + threadIdx.x; j < prompt_end; j += blockDim.x) {
    if (in_range(prompt_ids[j])) count[prompt_ids[j]] = 0;
  }
  for (int j = output_begin + threadIdx.x; j < output_end; j += blockDim.x) {
    if (in_range(output_ids[j])) count[output_ids[j]] = 0;
  }
  __syncthreads();
  for (int j = output_begin + threadIdx.x; j < output_end; j += blockDim.x) {
    if (in_range(output_ids[j])) atomicAdd(&count[output_ids[j]], 1u);
  }
  __syncthreads();
  auto claim_and_penalize = [&](int32_t id) {
    if (!in_range(id)) return;
    const uint32_t old = atomicOr(&count[id], kClaimedBit);
    if ((old & kClaimedBit) != 0) return;
    float v = row[id];
    v = v > 0.0f ? __fdiv_rn(v, repetition) : __fmul_rn(v, repetition);
    if (old > 0) {
      v = __fsub_rn(v, __fadd_rn(__fmul_rn(frequency, static_cast<float>(old)), presence));
    }
    row[id] = v;
  };
  for (int j = prompt_begin + threadIdx.x; j < prompt_end; j += blockDim.x) {
    claim_and_penalize(prompt_ids[j]);
  }
  for (int j = output_begin + threadIdx.x; j < output_end; j += blockDim.x) {
    claim_and_penalize(output_ids[j]);
  }
}

__global__ void SampleUniformsKernel(const SamplingRow* __restrict__ rows, int num_rows,
                                     double* __restrict__ out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < num_rows) out[r] = ref::PhiloxUniform(rows[r].seed, rows[r].offset);
}

// SaguaroDownweightRows (sampling.h): one block per row. Thread 0 gathers the row's distinct
// cached ids and their mass; every thread sums the row in fp64; a second pass scales it and
// thread 0 writes the cached entries from their saved values.
__global__ void __launch_bounds__(kSaguaroThreads)
    SaguaroDownweightKernel(float* probs, int64_t stride, int32_t vocab, const int32_t* ids,
                            int32_t ids_stride, const int32_t* fan_out, const float* c) {
  __shared__ int32_t cached[kMaxTopK];
  __shared__ float kept[kMaxTopK];
  __shared__ int32_t num_cached;
  __shared__ double warp_sums[kSaguaroThreads / kWarpSize];
  const int32_t r = static_cast<int32_t>(blockIdx.x);
  const float down = c[r];
  const int32_t f = min(min(fan_out[r], ids_stride), kMaxTopK);
  if (f <= 0 || isnan(down) || down >= 1.0f) return;  // uniform over the block
  const double cr = fmax(0.0, static_cast<double>(down));
  float* row = probs + r * stride;
  double cached_mass = 0;
  if (threadIdx.x == 0) {
    int32_t n = 0;
    for (int32_t j = 0; j < f; ++j) {
      const int32_t id = ids[int64_t{r} * ids_stride + j];
      bool seen = id < 0 || id >= vocab;
      for (int32_t i = 0; i < n && !seen; ++i) seen = cached[i] == id;
      if (seen) continue;
      cached[n] = id;
      kept[n] = row[id];
      cached_mass += kept[n];
      ++n;
    }
    num_cached = n;
  }
  double sum = 0;
  for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += row[v];
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  if (threadIdx.x % kWarpSize == 0) warp_sums[threadIdx.x / kWarpSize] = sum;
  __syncthreads();
  __shared__ double total_shared;
  if (threadIdx.x == 0) {
    double all = 0;
    for (int w = 0; w < kSaguaroThreads / kWarpSize; ++w) all += warp_sums[w];
    total_shared = cr * cached_mass + (all - cached_mass);
  }
  __syncthreads();
  const double total = total_shared;
  if (!(total > 0)) return;
  const double scale = 1.0 / total;
  for (int32_t v = threadIdx.x; v < vocab; v += blockDim.x) {
    row[v] = static_cast<float>(row[v] * scale);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int32_t i = 0; i < num_cached; ++i) {
      row[cached[i]] = static_cast<float>(cr * kept[i] * scale);
    }
  }
}

}  // namespace specd::kernels
