// Verification kernel templates (layer 1 of kernels/cuda: launchers in verify.cu). The integer
// and fixed-point rules are shared with the CPU reference through kernels/ref/verify.h, so the
// kernels and the reference agree bit for bit. Include from .cu files only.
#pragma once

#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/ref/verify.h"

namespace specd::kernels {

constexpr unsigned kFullWarp = 0xffffffffu;
constexpr int kBallotWarpsPerBlock = 4;  // the study's Opt A block: 4 warps, 4 sequences
constexpr int kSerialThreads = 256;
constexpr int kFusedThreads = kMaxBlockThreads;  // 32 warps
constexpr int kScanThreads = kMaxBlockThreads;
constexpr int kStochasticThreads = kMaxBlockThreads;
constexpr int kPackTokenRowsPerBlock = 128;  // one thread per committed token
constexpr int kPackKvRowsPerBlock = 8;       // one warp per committed KV row
constexpr int kFusedMaxBatch = 1024;         // committed lengths kept in shared memory

// The device view of a DraftLayout (sizes already validated to fit int32).
struct LayoutView {
  const int32_t* cu_draft_lens;
  int max_draft_len;

  __device__ __forceinline__ int DraftStart(int i) const {
    return cu_draft_lens ? __ldg(cu_draft_lens + i) : i * max_draft_len;
  }
};

// ---- warp and block primitives -------------------------------------------------------------

__device__ __forceinline__ int LaneId() { return static_cast<int>(threadIdx.x) % kWarpSize; }
__device__ __forceinline__ int WarpId() { return static_cast<int>(threadIdx.x) / kWarpSize; }

template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T x) {
  const int lane = LaneId();
#pragma unroll
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const T y = __shfl_up_sync(kFullWarp, x, offset);
    if (lane >= offset) x += y;
  }
  return x;
}

template <typename T>
__device__ __forceinline__ T WarpSum(T x) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    x += __shfl_xor_sync(kFullWarp, x, offset);
  return x;
}

// Exclusive prefix sum of x over the block (blockDim.x a multiple of 32), and the block total,
// to every thread. scratch: [32] shared. Begins with a barrier, so back-to-back calls may reuse
// the scratch; every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T BlockExclusiveScan(T x, T* scratch, T* total) {
  const int lane = LaneId(), warp = WarpId();
  const int num_warps = static_cast<int>(blockDim.x) / kWarpSize;
  const T inclusive = WarpInclusiveScan(x);
  __syncthreads();  // earlier readers of scratch are done
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  __syncthreads();
  // Every warp scans the warp totals itself: no third barrier.
  const T warp_total = lane < num_warps ? scratch[lane] : T{0};
  const T warp_inclusive = WarpInclusiveScan(warp_total);
  const T before_warp = __shfl_sync(kFullWarp, warp_inclusive, warp > 0 ? warp - 1 : 0);
  *total = __shfl_sync(kFullWarp, warp_inclusive, num_warps - 1);
  return (warp > 0 ? before_warp : T{0}) + inclusive - x;
}

// Sum of x over the block, to every thread. Same contract as BlockExclusiveScan.
template <typename T>
__device__ __forceinline__ T BlockSum(T x, T* scratch) {
  const int lane = LaneId(), warp = WarpId();
  const int num_warps = static_cast<int>(blockDim.x) / kWarpSize;
  x = WarpSum(x);
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  return WarpSum(lane < num_warps ? scratch[lane] : T{0});
}

// ---- greedy acceptance ---------------------------------------------------------------------

struct GreedyResult {
  int accepted_len;
  int32_t next_token;
};

// Chunks of 32 positions whose loads one pass of WarpFirstMismatch issues before its ballots.
constexpr int kBallotChunksPerPass = 4;

// Opt A, called by all 32 lanes of a warp with warp-uniform arguments. Lane l of chunk c loads
// position j = 32c + l <= K (draft j when j < K, target j always) and votes "stop here" on a
// mismatch or at j == K; the first vote of the first chunk that has one is k, and the target
// token there comes from the voting lane's register: no dependent load after the ballots. A pass
// issues the loads of kBallotChunksPerPass chunks at once (one memory round trip for K < 128)
// and then ballots chunk by chunk: ceil((K + 1) / 32) ballots at most, none of them per lane.
__device__ __forceinline__ GreedyResult WarpFirstMismatch(const int32_t* drafts,
                                                          const int32_t* targets, int num_drafts) {
  const int lane = LaneId();
  for (int pass = 0; pass <= num_drafts; pass += kBallotChunksPerPass * kWarpSize) {
    int32_t target[kBallotChunksPerPass];
    bool stop[kBallotChunksPerPass];
#pragma unroll
    for (int c = 0; c < kBallotChunksPerPass; ++c) {
      const int j = pass + c * kWarpSize + lane;
      target[c] = 0;
      stop[c] = false;
      if (j <= num_drafts) {
        target[c] = __ldg(targets + j);
        stop[c] = j == num_drafts || __ldg(drafts + j) != target[c];
      }
    }
#pragma unroll
    for (int c = 0; c < kBallotChunksPerPass; ++c) {
      const unsigned votes = __ballot_sync(kFullWarp, stop[c]);
      if (votes != 0) {
        const int first = __ffs(static_cast<int>(votes)) - 1;
        return {pass + c * kWarpSize + first, __shfl_sync(kFullWarp, target[c], first)};
      }
    }
  }
  return {num_drafts, 0};  // unreachable: position K always votes
}

// One warp per sequence, kBallotWarpsPerBlock sequences per block.
__global__ void __launch_bounds__(kBallotWarpsPerBlock* kWarpSize)
    VerifyGreedyBallotKernel(LayoutView layout, int batch, const int32_t* __restrict__ drafts,
                             const int32_t* __restrict__ targets,
                             int32_t* __restrict__ accepted_lens,
                             int32_t* __restrict__ next_tokens) {
  const int seq = static_cast<int>(blockIdx.x) * kBallotWarpsPerBlock + WarpId();
  if (seq >= batch) return;  // warp-uniform
  const int start = layout.DraftStart(seq);
  const int num_drafts = layout.DraftStart(seq + 1) - start;
  const GreedyResult r = WarpFirstMismatch(drafts + start, targets + start + seq, num_drafts);
  if (LaneId() == 0) {
    accepted_lens[seq] = r.accepted_len;
    next_tokens[seq] = r.next_token;
  }
}

// The baseline: one thread per sequence, serial scan with early exit.
__global__ void __launch_bounds__(kSerialThreads)
    VerifyGreedySerialKernel(LayoutView layout, int batch, const int32_t* __restrict__ drafts,
                             const int32_t* __restrict__ targets,
                             int32_t* __restrict__ accepted_lens,
                             int32_t* __restrict__ next_tokens) {
  const int seq = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (seq >= batch) return;
  const int start = layout.DraftStart(seq);
  const int num_drafts = layout.DraftStart(seq + 1) - start;
  const int32_t* d = drafts + start;
  const int32_t* t = targets + start + seq;
  int k = 0;
  while (k < num_drafts && __ldg(d + k) == __ldg(t + k)) ++k;
  accepted_lens[seq] = k;
  next_tokens[seq] = __ldg(t + k);
}

// ---- packing -------------------------------------------------------------------------------

// The packing outputs in device form.
struct PackView {
  int32_t* cu_committed;
  int32_t* committed_tokens;
  const int32_t* slot_mapping;
  int32_t* committed_slots;
  const unsigned char* kv;
  unsigned char* packed_kv;
  int64_t kv_row_bytes;
};

// Copies one KV row with the lanes of a warp, in units of V (16, 4 or 1 bytes).
template <typename V>
__device__ __forceinline__ void WarpCopyRow(const PackView& pack, int64_t src_row,
                                            int64_t dst_row) {
  const int64_t n = pack.kv_row_bytes / static_cast<int64_t>(sizeof(V));
  const V* src = reinterpret_cast<const V*>(pack.kv + src_row * pack.kv_row_bytes);
  V* dst = reinterpret_cast<V*>(pack.packed_kv + dst_row * pack.kv_row_bytes);
#pragma unroll 2
  for (int64_t e = LaneId(); e < n; e += kWarpSize) dst[e] = src[e];
}

// Writes committed row j of a sequence: draft j, or the next token at j == k, and its slot.
__device__ __forceinline__ void PackToken(const PackView& pack, const int32_t* drafts,
                                          int draft_start, int position, int k, int32_t next, int j,
                                          int out) {
  pack.committed_tokens[out] = j < k ? __ldg(drafts + draft_start + j) : next;
  if (pack.slot_mapping != nullptr)
    pack.committed_slots[out] = __ldg(pack.slot_mapping + position + j);
}

// Multi-block step 1: cu_committed = exclusive prefix sum of accepted_lens + 1, one block,
// chunks of blockDim with a running carry.
__global__ void __launch_bounds__(kScanThreads)
    CommittedPrefixSumKernel(int batch, const int32_t* __restrict__ accepted_lens,
                             int32_t* __restrict__ cu_committed) {
  __shared__ int scratch[kWarpSize];
  int carry = 0;
  for (int base = 0; base < batch; base += static_cast<int>(blockDim.x)) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int length = i < batch ? __ldg(accepted_lens + i) + 1 : 0;
    int chunk_total = 0;
    const int before = BlockExclusiveScan(length, scratch, &chunk_total);
    if (i < batch) cu_committed[i + 1] = carry + before + length;
    carry += chunk_total;
  }
  if (threadIdx.x == 0) cu_committed[0] = 0;
}

// Multi-block step 2: block (seq, y) packs committed rows y * rows_per_block ... of sequence seq,
// one thread per row without KV (V = void), one warp per row with KV.
template <typename V>
__global__ void PackCommittedKernel(LayoutView layout, const int32_t* __restrict__ drafts,
                                    const int32_t* __restrict__ accepted_lens,
                                    const int32_t* __restrict__ next_tokens, PackView pack) {
  constexpr bool kHasKv = !std::is_void_v<V>;
  constexpr int kThreadsPerRow = kHasKv ? kWarpSize : 1;
  constexpr int kRowsPerBlock = kHasKv ? kPackKvRowsPerBlock : kPackTokenRowsPerBlock;
  const int seq = static_cast<int>(blockIdx.x);
  const int j =
      static_cast<int>(blockIdx.y) * kRowsPerBlock + static_cast<int>(threadIdx.x) / kThreadsPerRow;
  const int k = __ldg(accepted_lens + seq);
  if (j > k) return;  // uniform per warp
  const int draft_start = layout.DraftStart(seq);
  const int position = draft_start + seq;
  const int out = __ldg(pack.cu_committed + seq) + j;
  if (threadIdx.x % kThreadsPerRow == 0) {
    PackToken(pack, drafts, draft_start, position, k, __ldg(next_tokens + seq), j, out);
  }
  if constexpr (kHasKv) WarpCopyRow<V>(pack, position + j, out);
}

// Fused verify-and-pack: one block of kFusedThreads for the whole batch (batch <=
// kMaxFusedVerifyBatch). Phase 1: warp w runs Opt A for sequences w, w + 32, ...; phase 2: one
// block scan of k_i + 1; phase 3: tokens and slots (a warp per sequence) and KV rows (a warp per
// row, the row's sequence found by binary search over the shared prefix sums). V as above.
template <typename V>
__global__ void __launch_bounds__(kFusedThreads)
    VerifyGreedyAndPackFusedKernel(LayoutView layout, int batch, const int32_t* __restrict__ drafts,
                                   const int32_t* __restrict__ targets,
                                   int32_t* __restrict__ accepted_lens,
                                   int32_t* __restrict__ next_tokens, PackView pack) {
  __shared__ int s_accepted[kFusedMaxBatch];
  __shared__ int32_t s_next[kFusedMaxBatch];
  __shared__ int s_draft_start[kFusedMaxBatch + 1];
  __shared__ int s_cu[kFusedMaxBatch + 1];
  __shared__ int scratch[kWarpSize];
  const int lane = LaneId(), warp = WarpId(), num_warps = kFusedThreads / kWarpSize;

  for (int seq = warp; seq < batch; seq += num_warps) {
    const int start = layout.DraftStart(seq);
    const int num_drafts = layout.DraftStart(seq + 1) - start;
    const GreedyResult r = WarpFirstMismatch(drafts + start, targets + start + seq, num_drafts);
    if (lane == 0) {
      s_accepted[seq] = r.accepted_len;
      s_next[seq] = r.next_token;
      s_draft_start[seq] = start;
      accepted_lens[seq] = r.accepted_len;
      next_tokens[seq] = r.next_token;
    }
  }
  __syncthreads();
  const int tid = static_cast<int>(threadIdx.x);
  int total = 0;
  const int mine = tid < batch ? s_accepted[tid] + 1 : 0;
  const int before = BlockExclusiveScan(mine, scratch, &total);
  if (tid < batch) {
    s_cu[tid + 1] = before + mine;
    pack.cu_committed[tid + 1] = before + mine;
  }
  if (tid == 0) {
    s_cu[0] = 0;
    pack.cu_committed[0] = 0;
  }
  __syncthreads();

  for (int seq = warp; seq < batch; seq += num_warps) {
    const int k = s_accepted[seq], start = s_draft_start[seq];
    for (int j = lane; j <= k; j += kWarpSize) {
      PackToken(pack, drafts, start, start + seq, k, s_next[seq], j, s_cu[seq] + j);
    }
  }
  if constexpr (!std::is_void_v<V>) {
    for (int row = warp; row < total; row += num_warps) {
      int lo = 0, hi = batch - 1;  // the last seq with s_cu[seq] <= row
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (s_cu[mid] <= row)
          lo = mid;
        else
          hi = mid - 1;
      }
      const int j = row - s_cu[lo];
      WarpCopyRow<V>(pack, s_draft_start[lo] + lo + j, row);
    }
  }
}

// ---- stochastic acceptance -----------------------------------------------------------------

// kVec consecutive f32 values (one 16-byte load for kVec = 4).
template <int kVec>
struct alignas(sizeof(float) * kVec) FloatVec {
  float v[kVec];
};

// The kVec draw weights at ids [base, base + kVec) (0 past the vocabulary).
template <int kVec>
__device__ __forceinline__ void DrawWeights(const float* p_row, const float* q_row, int32_t draft,
                                            bool residual, int vocab, int base, uint64_t* w) {
  if (base >= vocab) {
#pragma unroll
    for (int v = 0; v < kVec; ++v) w[v] = 0;
    return;
  }
  const FloatVec<kVec> p = *reinterpret_cast<const FloatVec<kVec>*>(p_row + base);
  FloatVec<kVec> q;
  if (residual && q_row != nullptr) {
    q = *reinterpret_cast<const FloatVec<kVec>*>(q_row + base);
  } else {
#pragma unroll
    for (int v = 0; v < kVec; ++v) q.v[v] = base + v == draft ? 1.0f : 0.0f;
  }
#pragma unroll
  for (int v = 0; v < kVec; ++v) w[v] = ref::ResidualWeight(p.v[v], q.v[v], residual);
}

// Block-wide passes over a row's fixed-point weights. `weights(base, w)` fills w[0, kVec) with
// the weights of ids [base, base + kVec) (0 past the vocabulary); every thread visits the bases
// threadIdx.x * kVec, + blockDim.x * kVec, ... in increasing order.

// Sum of the weights over the vocabulary (exact, uint64), to every thread. Every thread of the
// block must call it; scratch as BlockSum.
template <int kVec, typename Weights>
__device__ uint64_t BlockTotalWeight(const Weights& weights, int vocab, uint64_t* scratch) {
  const int stride = static_cast<int>(blockDim.x) * kVec;
  uint64_t w[kVec];
  uint64_t local = 0;
  for (int base = static_cast<int>(threadIdx.x) * kVec; base < vocab; base += stride) {
    weights(base, w);
#pragma unroll
    for (int v = 0; v < kVec; ++v) local += w[v];
  }
  return BlockSum(local, scratch);
}

// Inverse-CDF draw of u over the weights, whose exact sum is `total` (ref::VerifyStochastic's
// Draw): chunks of blockDim * kVec ids scanned until the chunk holding
// ref::DrawThreshold(total, u). Returns the id (-1 when total is zero) to every thread; every
// thread must call it with the same total. No thread may still be reading *s_found from an
// earlier call (a barrier must separate the calls).
template <int kVec, typename Weights>
__device__ int BlockInverseCdf(const Weights& weights, int vocab, uint64_t total, float u,
                               uint64_t* scratch, int* s_found) {
  if (total == 0) return -1;
  const int stride = static_cast<int>(blockDim.x) * kVec;
  const int first = static_cast<int>(threadIdx.x) * kVec;
  if (threadIdx.x == 0) *s_found = -1;  // the first scan's barriers publish it
  const uint64_t threshold = ref::DrawThreshold(total, ref::UniformToFixed(u));
  uint64_t w[kVec];
  uint64_t carry = 0;
  for (int chunk = 0; chunk < vocab; chunk += stride) {
    const int base = chunk + first;
    weights(base, w);
    uint64_t mine = 0;
#pragma unroll
    for (int v = 0; v < kVec; ++v) mine += w[v];
    uint64_t chunk_total = 0;
    uint64_t prefix = carry + BlockExclusiveScan(mine, scratch, &chunk_total);
    if (prefix <= threshold && threshold < prefix + mine) {  // exactly one thread overall
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        prefix += w[v];
        if (prefix > threshold) {
          *s_found = base + v;
          break;
        }
      }
    }
    carry += chunk_total;
    __syncthreads();
    const int found = *s_found;
    if (found >= 0) return found;  // block-uniform
  }
  return -1;  // unreachable: threshold < total
}

// Inverse-CDF draw over the row's weights by the whole block (ref::VerifyStochastic's Draw): a
// block sum, then BlockInverseCdf. Returns the id (-1 when the weights sum to zero) to every
// thread.
template <int kVec>
__device__ int BlockDraw(const float* p_row, const float* q_row, int32_t draft, bool residual,
                         int vocab, float u, uint64_t* scratch, int* s_found) {
  const auto weights = [=](int base, uint64_t* w) {
    DrawWeights<kVec>(p_row, q_row, draft, residual, vocab, base, w);
  };
  const uint64_t total = BlockTotalWeight<kVec>(weights, vocab, scratch);
  return BlockInverseCdf<kVec>(weights, vocab, total, u, scratch, s_found);
}

// One block per sequence: all draft tests at once (first rejection by a shared atomicMin), then
// the draw of the next token. Arguments as VerifyStochastic in verify.h.
template <int kVec>
__global__ void __launch_bounds__(kStochasticThreads)
    VerifyStochasticKernel(LayoutView layout, const int32_t* __restrict__ drafts,
                           const float* __restrict__ draft_probs,
                           const float* __restrict__ target_probs, int vocab,
                           const float* __restrict__ uniforms, int32_t* __restrict__ accepted_lens,
                           int32_t* __restrict__ next_tokens) {
  __shared__ uint64_t scratch[kWarpSize];
  __shared__ int s_first_rejected;
  __shared__ int s_found;
  const int seq = static_cast<int>(blockIdx.x);
  const int draft_start = layout.DraftStart(seq);
  const int num_drafts = layout.DraftStart(seq + 1) - draft_start;
  const int position = draft_start + seq;
  if (threadIdx.x == 0) s_first_rejected = num_drafts;
  __syncthreads();
  for (int j = static_cast<int>(threadIdx.x); j < num_drafts; j += static_cast<int>(blockDim.x)) {
    const int32_t d = __ldg(drafts + draft_start + j);
    bool accept = false;
    if (d >= 0 && d < vocab) {
      const float p = __ldg(target_probs + static_cast<int64_t>(position + j) * vocab + d);
      const float q = draft_probs != nullptr
                          ? __ldg(draft_probs + static_cast<int64_t>(draft_start + j) * vocab + d)
                          : 1.0f;
      accept = ref::AcceptDraft(__ldg(uniforms + position + j), p, q);
    }
    if (!accept) atomicMin(&s_first_rejected, j);
  }
  __syncthreads();
  const int k = s_first_rejected;
  const float* p_row = target_probs + static_cast<int64_t>(position + k) * vocab;
  const float u = __ldg(uniforms + position + num_drafts);
  int next = -1;
  if (k < num_drafts) {
    const float* q_row = draft_probs != nullptr
                             ? draft_probs + static_cast<int64_t>(draft_start + k) * vocab
                             : nullptr;
    next = BlockDraw<kVec>(p_row, q_row, __ldg(drafts + draft_start + k), /*residual=*/true, vocab,
                           u, scratch, &s_found);
  }
  if (next < 0) {
    next = BlockDraw<kVec>(p_row, nullptr, -1, /*residual=*/false, vocab, u, scratch, &s_found);
  }
  if (threadIdx.x == 0) {
    accepted_lens[seq] = k;
    next_tokens[seq] = next;
  }
}

// ---- token trees ---------------------------------------------------------------------------

constexpr int kTreeGreedyWarpsPerBlock = 4;  // one warp per sequence
constexpr int kTreeStochasticThreads = kMaxBlockThreads;
constexpr int kTreeMaxDrafts = 1024;  // shared lists of a node's rejected tokens

// Greedy tree walk, one warp per sequence (ref::VerifyTreeGreedy's single scan, 32 drafts per
// ballot): lane l tests draft base + l for "child of the current node whose token is the
// target's there"; the first vote is the next node, and the scan goes on after it (a node's
// children have larger indices). ceil(K / 32) + depth ballots at most; warp-uniform control.
__global__ void __launch_bounds__(kTreeGreedyWarpsPerBlock* kWarpSize)
    VerifyTreeGreedyKernel(LayoutView layout, int batch, const int32_t* __restrict__ drafts,
                           const int32_t* __restrict__ parents, const int32_t* __restrict__ targets,
                           int32_t* __restrict__ accepted_lens, int32_t* __restrict__ next_tokens,
                           int32_t* __restrict__ paths) {
  const int seq = static_cast<int>(blockIdx.x) * kTreeGreedyWarpsPerBlock + WarpId();
  if (seq >= batch) return;  // warp-uniform
  const int lane = LaneId();
  const int start = layout.DraftStart(seq);
  const int num_drafts = layout.DraftStart(seq + 1) - start;
  const int32_t* d = drafts + start;
  const int32_t* par = parents + start;
  const int32_t* t = targets + start + seq;
  int node = -1, k = 0;
  int32_t target = __ldg(t);
  for (int base = 0; base < num_drafts;) {
    const int j = base + lane;
    const bool hit = j < num_drafts && __ldg(par + j) == node && __ldg(d + j) == target;
    const unsigned votes = __ballot_sync(kFullWarp, hit);
    if (votes == 0) {
      base += kWarpSize;
      continue;
    }
    node = base + __ffs(static_cast<int>(votes)) - 1;
    if (lane == 0) paths[start + k] = node;
    ++k;
    target = __ldg(t + node + 1);
    base = node + 1;
  }
  if (lane == 0) {
    accepted_lens[seq] = k;
    next_tokens[seq] = target;
  }
}

// The weights of a tree node's row for the block passes: ProbToFixed(p(x)), 0 for the ids in
// excluded[0, num_excluded) (shared, sorted ascending, distinct: the node's rejected tokens).
template <int kVec>
struct TreeRowWeights {
  const float* p_row;
  const int32_t* excluded;
  int num_excluded;
  int vocab;

  __device__ __forceinline__ void operator()(int base, uint64_t* w) const {
    if (base >= vocab) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = 0;
      return;
    }
    const FloatVec<kVec> p = *reinterpret_cast<const FloatVec<kVec>*>(p_row + base);
#pragma unroll
    for (int v = 0; v < kVec; ++v) w[v] = ref::ProbToFixed(p.v[v]);
    if (num_excluded == 0) return;
    int lo = 0, hi = num_excluded;  // the first excluded id >= base
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (excluded[mid] < base)
        lo = mid + 1;
      else
        hi = mid;
    }
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      if (lo < num_excluded && excluded[lo] == base + v) {
        w[v] = 0;
        ++lo;
      }
    }
  }
};

// Sampled tree walk (ref::VerifyTreeStochastic), one block of kTreeStochasticThreads per
// sequence. Per node on the path: a block sum of the row's weights (`total`); then the children
// are tested all at once, blockDim drafts per round: thread t takes draft j = node + 1 + t, and a
// child's effective weight w_j (0 for an invalid id or a token an earlier sibling had) enters a
// block exclusive scan, so left_j = total - (sum of the earlier siblings' w) is the mass left
// when j is tried, every earlier sibling rejected; the kept child is the first j with
// AcceptTreeChild(u_j, left_j, w_j) (shared atomicMin). Without one, the node's counted tokens
// are gathered in shared memory, sorted by rank, and one block-wide inverse-CDF pass draws the
// next token from the residual (total `left`) or from p. Arguments as VerifyTreeStochastic in
// verify.h; K_i <= kTreeMaxDrafts (checked by the launcher against max_draft_len).
template <int kVec>
__global__ void __launch_bounds__(kTreeStochasticThreads, 1)
    VerifyTreeStochasticKernel(LayoutView layout, const int32_t* __restrict__ drafts,
                               const int32_t* __restrict__ parents,
                               const float* __restrict__ target_probs, int vocab,
                               const float* __restrict__ uniforms,
                               int32_t* __restrict__ accepted_lens,
                               int32_t* __restrict__ next_tokens, int32_t* __restrict__ paths) {
  __shared__ uint64_t scratch[kWarpSize];
  __shared__ int int_scratch[kWarpSize];
  __shared__ int s_found;
  __shared__ int s_kept;
  __shared__ int32_t s_rejected[kTreeMaxDrafts];  // the node's counted tokens, sibling order
  __shared__ int32_t s_excluded[kTreeMaxDrafts];  // the same, sorted
  const int seq = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int start = layout.DraftStart(seq);
  const int num_drafts = layout.DraftStart(seq + 1) - start;
  const int position = start + seq;
  const int32_t* d = drafts + start;
  const int32_t* par = parents + start;
  int node = -1, k = 0, num_rejected = 0;
  const float* p_row = nullptr;
  uint64_t total = 0, left = 0;
  for (;;) {
    p_row = target_probs + static_cast<int64_t>(position + node + 1) * vocab;
    total = BlockTotalWeight<kVec>(TreeRowWeights<kVec>{p_row, nullptr, 0, vocab}, vocab, scratch);
    if (tid == 0) s_kept = INT_MAX;  // published by the scans' barriers below
    uint64_t carry = 0;
    num_rejected = 0;
    int kept = INT_MAX;
    for (int base = node + 1; base < num_drafts; base += threads) {
      const int j = base + tid;
      bool child = false, counted = false;
      int32_t x = -1;
      uint64_t w = 0;
      if (j < num_drafts && __ldg(par + j) == node) {
        child = true;
        x = __ldg(d + j);
        counted = x >= 0 && x < vocab;
        // An earlier sibling with the same token took its mass when it was rejected.
        for (int e = node + 1; counted && e < j; ++e) {
          if (__ldg(par + e) == node && __ldg(d + e) == x) counted = false;
        }
        if (counted) w = ref::ProbToFixed(__ldg(p_row + x));
      }
      uint64_t round_w = 0;
      const uint64_t before = carry + BlockExclusiveScan(w, scratch, &round_w);
      if (child && ref::AcceptTreeChild(__ldg(uniforms + position + j), total - before, w)) {
        atomicMin(&s_kept, j);
      }
      int round_count = 0;
      const int slot =
          num_rejected + BlockExclusiveScan(counted ? 1 : 0, int_scratch, &round_count);
      if (counted && slot < kTreeMaxDrafts) s_rejected[slot] = x;
      __syncthreads();
      kept = s_kept;
      if (kept != INT_MAX) break;  // block-uniform
      carry += round_w;
      num_rejected += round_count;
    }
    if (kept == INT_MAX) {
      left = total - carry;
      break;
    }
    if (tid == 0) paths[start + k] = kept;
    ++k;
    node = kept;
  }
  // Sort the rejected tokens (distinct) by rank for the draw's binary searches.
  num_rejected = min(num_rejected, kTreeMaxDrafts);
  for (int e = tid; e < num_rejected; e += threads) {
    const int32_t x = s_rejected[e];
    int rank = 0;
    for (int f = 0; f < num_rejected; ++f) rank += s_rejected[f] < x ? 1 : 0;
    s_excluded[rank] = x;
  }
  __syncthreads();
  const float u = __ldg(uniforms + position + num_drafts);
  int next = -1;
  if (left > 0) {
    next = BlockInverseCdf<kVec>(TreeRowWeights<kVec>{p_row, s_excluded, num_rejected, vocab},
                                 vocab, left, u, scratch, &s_found);
  } else {
    next = BlockInverseCdf<kVec>(TreeRowWeights<kVec>{p_row, nullptr, 0, vocab}, vocab, total, u,
                                 scratch, &s_found);
  }
  if (tid == 0) {
    accepted_lens[seq] = k;
    next_tokens[seq] = next;
  }
}

}  // namespace specd::kernels
