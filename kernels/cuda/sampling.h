// Logits processing and sampling launchers for the CUDA backend (fp32 logits, one row per
// sequence). References: kernels/ref/sampling.h, which also spells out the exact sampling
// definition (filters, ties, the token-id-order draw). Any host thread; queued on `stream`, no
// allocation (scratch from the caller's workspace); graph-capturable. The order of operations is
// the CPU Sampler's (engine/sample/sampler.h, vLLM's): penalties, then temperature, then
// min-p / top-k / top-p on the tempered distribution, then the draw. Launchers return
// cudaErrorInvalidValue for sizes they cannot run (and queue nothing); they cannot check device
// contents (offsets, ids), which the caller guarantees.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstddef>
#include <cstdint>

namespace specd::kernels {

// Index of the largest logit of each row; ties go to the lowest index (as torch.argmax and the
// CPU sampler); NaN counts as -inf. One block per row, 16-byte loads when logits is 16-byte
// aligned and stride % 4 == 0.
//   logits  [num_rows, vocab] f32, device, in; row stride `stride` elements
//   out_ids [num_rows] int32, device, out
// cudaErrorInvalidValue unless 1 <= vocab <= stride and num_rows >= 0.
cudaError_t ArgmaxRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                       int32_t* out_ids, cudaStream_t stream);

// Ids of the k largest logits of each row, best first; ties go to the lower id and NaN counts as
// -inf (NaN and -inf entries rank last, among themselves by id): ref::TopKRows bit for bit. The
// draft's candidate tokens in speculative decoding, after every draft step (8-64 rows of a
// 128K-152K vocabulary). Each logit is ranked by one 64-bit key, its value's order-preserving
// bits (NaN as -inf, -0 as +0) over ~id, so a single unsigned compare also breaks ties.
// Algorithm, two launches: stage 1, one block per 4096-logit chunk of a row, reads each logit
// once into registers (16-byte loads when logits is 16-byte aligned and stride % 4 == 0) and
// takes the chunk's k best by k rounds of a block-wide max in which only the winning thread
// rescans its registers (for its best key below the winner: every larger key is already out);
// stage 2, one warp per row, merges the chunks' k-lists the same way. A row of one chunk (vocab
// <= 4096) skips stage 2 and needs no workspace.
//   logits    [num_rows, vocab] f32, device, in; row stride `stride` elements
//   out_ids   [num_rows, k] int32, device, out
//   workspace >= TopKWorkspaceBytes(num_rows, vocab, k) bytes, device, 8-byte aligned: the
//             [num_rows, ceil(vocab / 4096), k] uint64 chunk candidates; any contents; may be
//             null when TopKWorkspaceBytes is 0
// cudaErrorInvalidValue unless 1 <= k <= min(kMaxTopK, vocab), vocab <= stride, num_rows >= 0,
// the workspace is large enough and num_rows * ceil(vocab / 4096) < 2^31 (the grid).
inline constexpr int32_t kMaxTopK = 16;
size_t TopKWorkspaceBytes(int32_t num_rows, int32_t vocab, int32_t k);
cudaError_t TopKRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                     int32_t k, int32_t* out_ids, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream);

// The log-softmax of each row at k given ids (a token tree's children scores, engine/speculation/
// draft_tree.h): out[r, j] = logits[r, ids[r, j]] - log(sum_v exp(logits[r, v])), max-subtracted
// with fp32 sums; NaN counts as -inf; an id outside [0, vocab), or a row without a finite logit,
// gives -inf. One block per row.
//   logits  [num_rows, vocab] f32, device, in; row stride `stride` elements
//   ids     [num_rows, k] int32, device, in
//   out     [num_rows, k] f32, device, out
// cudaErrorInvalidValue unless 1 <= vocab <= stride, num_rows >= 0 and 1 <= k <= kMaxTopK.
cudaError_t LogSoftmaxAt(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                         const int32_t* ids, int32_t k, float* out, cudaStream_t stream);

// Repetition, presence and frequency penalties in place (vLLM's apply_penalties):
// for every token t that occurs in the row's prompt or output: repetition penalty r divides a
// positive logit by r and multiplies a negative one by r; for tokens in the output with count c:
// logit -= frequency * c + presence * (c > 0).
// Token lists are CSR: the row's prompt ids are prompt_ids[prompt_offsets[r] ...
// prompt_offsets[r+1]), its output ids output_ids[output_offsets[r] ... output_offsets[r+1]).
// Every distinct token gets the repetition penalty once, whatever its duplicates; ids outside
// [0, vocab) are ignored. Results equal the CPU Sampler's bit for bit.
//   logits    [num_rows, vocab] f32, device, in/out; row stride `stride`
//   prompt_ids / output_ids  int32, device, in; prompt_offsets / output_offsets [num_rows + 1]
//   penalties [num_rows, 3] f32, device, in: repetition, presence, frequency (1, 0, 0 = off)
//   workspace >= PenaltyWorkspaceBytes(num_rows, vocab) bytes, device, 4-byte aligned: a
//             [num_rows, vocab] uint32 count per token; any contents (only the listed tokens'
//             entries are used, and they are zeroed first)
// One block per row; work is O(prompt + output length), not O(vocab).
size_t PenaltyWorkspaceBytes(int32_t num_rows, int32_t vocab);
cudaError_t ApplyPenalties(float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                           const int32_t* prompt_ids, const int32_t* prompt_offsets,
                           const int32_t* output_ids, const int32_t* output_offsets,
                           const float* penalties, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream);

// Per-row sampling parameters, device-resident. temperature 0 means greedy (argmax; the other
// fields are ignored). top_k 0 = off, top_p 1 = off, min_p 0 = off.
struct SamplingRow {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  uint64_t seed;    // Philox4x32-10 key
  uint64_t offset;  // Philox counter: the caller passes the number of tokens drawn so far, so a
                    // seeded request is reproducible whatever batch it runs in
};

// Scratch bytes SampleRows needs for num_rows rows of vocab logits (0 today: all scratch is in
// shared memory; the workspace may then be null).
size_t SampleWorkspaceBytes(int32_t num_rows, int32_t vocab);

// Draws one token per row from softmax(logits / temperature) restricted by min-p, top-k and
// top-p (filters apply to the tempered distribution; a token survives top-p if the mass of
// strictly more probable tokens is < top_p; ties at a cut are kept), with a uniform from Philox
// (seed, offset). Writes the id and, when out_logprobs is not null, the log-probability of the
// drawn token under the unfiltered, untempered softmax of the (penalized) logits. The draw
// walks the kept tokens in ascending id order (kernels/ref/sampling.h, step 4). NaN logits count
// as -inf, so a token can be banned by writing 0xffffffff over it (cudaMemsetAsync).
// Algorithm: one block of 1024 threads per row, no sort. Pass 1 finds the max, the argmax and
// the raw softmax sum; the top-k threshold is a 3-pass radix select (11/11/10-bit digits of p's
// fp32 bits) over count histograms, the top-p threshold a 3-pass radix select over mass
// histograms; the draw is one pass of per-warp kept mass plus three short levels of a 32-way
// search. Masses are summed in 2^-40 fixed point, so results do not depend on summation order:
// a seeded row is reproducible bit for bit. Up to 8 passes over the row (2 without top-k/top-p).
// The uniform is ref::PhiloxUniform(seed, offset) (kernels/ref/sampling.h).
//   logits  [num_rows, vocab] f32, device, in (not modified); row stride `stride`
//   rows    [num_rows] SamplingRow, device, in
//   out_ids [num_rows] int32, device, out; out_logprobs [num_rows] f32, device, out or null
// cudaErrorInvalidValue unless 1 <= vocab <= min(stride, 2^23), num_rows >= 0 and the workspace
// is large enough.
cudaError_t SampleRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                       const SamplingRow* rows, int32_t* out_ids, float* out_logprobs,
                       void* workspace, size_t workspace_bytes, cudaStream_t stream);

// The uniform in [0, 1) SampleRows draws for each row (ref::PhiloxUniform(seed, offset)), for
// tests and for callers that accept or reject with the same stream of randomness.
//   rows [num_rows] SamplingRow, device, in;  out [num_rows] f64, device, out
cudaError_t SampleUniforms(const SamplingRow* rows, int32_t num_rows, double* out,
                           cudaStream_t stream);

// The processed distribution SampleRows draws from, written out as probabilities (speculative
// sampling needs the target's p and the draft's q rows on the device; kernels/ref/sampling.h
// ProcessedProbs). Per row: temperature <= 0 / NaN, or no finite logit maximum with temperature
// > 0, is greedy: a one-hot row at the argmax (lowest id on ties), except that a row whose logits
// are all -inf / NaN is all zeros. Otherwise the tokens SampleRows keeps (min-p, top-k, top-p:
// the same thresholds and the same 2^-40 fixed-point masses) get
// out[i] = FixedMass(p_i) / (total kept fixed mass), divided in fp64 from the exact integer sums
// and rounded to fp32; every other token gets 0. A kept row sums to 1 within fp32 rounding.
// Algorithm: SampleRows' passes (max, top-k and top-p radix selections), then one pass summing
// the kept fixed mass (block reduction) and one write pass: up to 9 passes over the row.
//   logits [num_rows, vocab] f32, device, in; row stride `stride`
//   rows   [num_rows] SamplingRow, device, in (seed and offset unused)
//   out    [num_rows, vocab] f32, device, out; row stride `out_stride`. May be logits itself
//          (in place, out_stride == stride): a block reads all of its row before the barrier
//          that precedes the write pass, which reads and writes each element from one thread.
//          Any other overlap is not allowed.
// cudaErrorInvalidValue unless 1 <= vocab <= min(stride, out_stride, 2^23) and num_rows >= 0.
cudaError_t ProcessedProbs(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                           const SamplingRow* rows, float* out, int64_t out_stride,
                           cudaStream_t stream);

// Saguaro sampling's down-weighting (SSD's speculation cache; engine/speculation/saguaro/saguaro.h)
// of processed probability rows, in place: row r's entries at the distinct in-range ids among
// ids[r, 0 .. fan_out[r]) (its cached ids, TopKRows over the row) are multiplied by C = c[r] and
// the row is divided by total = C * (cached mass) + (the rest's mass); a row is left unchanged
// when fan_out[r] <= 0, C is NaN or >= 1, or total is not > 0 (C below 0 counts as 0):
// kernels/ref/sampling.h SaguaroDownweightRows, whose fp64 sums run in id order (here fp64 sums
// in block order: equal within fp32 rounding). One block per row: a summing pass and a write pass.
//   probs   [num_rows, vocab] f32, device, in/out; row stride `stride`
//   ids     [num_rows, ids_stride] int32, device, in
//   fan_out [num_rows] int32, c [num_rows] f32, device, in
// cudaErrorInvalidValue unless 1 <= vocab <= stride, num_rows >= 0 and
// 0 <= fan_out[r] <= min(ids_stride, kMaxTopK) (fan_out is read on the device: larger values are
// clamped there).
cudaError_t SaguaroDownweightRows(float* probs, int64_t stride, int32_t num_rows, int32_t vocab,
                                  const int32_t* ids, int32_t ids_stride, const int32_t* fan_out,
                                  const float* c, cudaStream_t stream);

// dst[dst_rows[i], :cols] = src[i, :cols] for every i < num_rows: scatters per-sequence rows
// (e.g. ProcessedProbs output) into their slots of a larger table. 16-byte accesses when both
// pointers are 16-byte aligned and both strides % 4 == 0.
//   src      [num_rows, cols] f32, device, in; row stride `src_stride`
//   dst_rows [num_rows] int32, device, in: distinct rows of dst (caller's promise, unchecked)
//   dst      [*, cols] f32, device, out; row stride `dst_stride`; must not overlap src
// cudaErrorInvalidValue unless cols >= 1, src_stride >= cols, dst_stride >= cols and
// num_rows >= 0.
cudaError_t ScatterRows(const float* src, int64_t src_stride, int32_t num_rows, int32_t cols,
                        const int32_t* dst_rows, float* dst, int64_t dst_stride,
                        cudaStream_t stream);

}  // namespace specd::kernels
