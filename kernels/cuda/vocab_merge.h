// The tensor-parallel vocabulary merge on the GPU (reference: kernels/ref/vocab_merge.h, which
// defines the pairs' layout). A greedy step under tensor parallelism moves each rank's k best
// (logit, id) per row instead of its [rows, vocab / world] logits: PackShardCandidates before the
// all-gather, ScatterShardCandidates after it. Any host thread; queued on `stream`;
// graph-capturable; cudaErrorInvalidValue for sizes they cannot run (nothing queued).
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

namespace specd::kernels {

// Pairs of each row from the shard's best ids (ArgmaxRows or TopKRows over the shard, best
// first): slot j < kept gets (logits[row, ids[row, j]] bits, id_base + ids[row, j]), slots
// kept..k-1 get (-inf, -1).
//   logits [num_rows, *] f32, device, in; row stride `stride`
//   ids    [num_rows, kept] int32, device, in (may be null when kept == 0)
//   pairs  [num_rows, k, 2] int32, device, out
// cudaErrorInvalidValue unless 1 <= k <= 64, 0 <= kept <= k and num_rows >= 0.
cudaError_t PackShardCandidates(const float* logits, int64_t stride, int32_t num_rows, int32_t k,
                                const int32_t* ids, int32_t kept, int32_t id_base, int32_t* pairs,
                                cudaStream_t stream);

// Every row of `out` becomes -inf except the candidates' ids, which get their logits. One block
// per row: the fill, then the world * k candidates.
//   pairs [world, num_rows, k, 2] int32, device, in (the all-gathered PackShardCandidates)
//   out   [num_rows, vocab] f32, device, out; row stride `stride`
// cudaErrorInvalidValue unless world >= 1, 1 <= k <= 64, 1 <= vocab <= stride, num_rows >= 0.
cudaError_t ScatterShardCandidates(const int32_t* pairs, int32_t world, int32_t num_rows, int32_t k,
                                   int32_t vocab, float* out, int64_t stride, cudaStream_t stream);

}  // namespace specd::kernels
