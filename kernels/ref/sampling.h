// References for the logits-processing and sampling kernels (kernels/cuda/sampling.h): argmax,
// top-k ids, penalties, the min-p / top-k / top-p filters, the draw, raw logprobs, and the
// Philox4x32-10 generator the kernels draw their uniforms from. They define what the kernels
// compute; tests run them in fp64 (the truth) and fp32 (the same-precision baseline).
//
// Sampling definition (shared with the CUDA kernel, which must agree except within rounding of a
// threshold or a CDF boundary):
//   1. m = max logit; p_i = exp((l_i - m) / temperature), so the most probable token has p = 1.
//   2. min-p keeps p_i >= min(min_p, 1); top-k keeps p_i >= the k-th largest p (ties at the cut
//      are kept); both on the whole row, so their order does not matter.
//   3. top-p, on the survivors S with mass M: keeps token i when the mass of strictly more
//      probable survivors G(p_i) is < top_p * M, or is 0 (the most probable tokens always stay).
//   4. The draw: with u uniform in [0, 1) and C_i the cumulative kept mass in ascending token id
//      order, the token is the first i with C_i > u * (total kept mass). Token-id order (not
//      descending probability) lets the kernel find it by a hierarchical prefix search without
//      sorting.
// NaN logits count as -inf. temperature <= 0 (or NaN), or a row without a finite maximum, is
// greedy: the argmax, lowest id on ties.
// The processed distribution (ProcessedProbs) is what step 4 draws from, normalized: kept p_i / M
// (M the total kept mass) for a sampled row; one-hot at the argmax for a greedy row; all zeros
// for a row whose logits are all -inf / NaN.
// Pure functions, any thread; the Philox functions also compile for the device under nvcc.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define SPECD_HOST_DEVICE __host__ __device__
#else
#define SPECD_HOST_DEVICE
#endif

namespace specd::kernels::ref {

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC11), as
// Random123's philox4x32 with 10 rounds; checked against Random123's kat_vectors.

struct Philox4x32Block {
  uint32_t v[4];
};

SPECD_HOST_DEVICE inline Philox4x32Block Philox4x32_10(Philox4x32Block ctr, uint32_t key0,
                                                       uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = Philox4x32Block{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

// The uniform in [0, 1) that SampleRows draws for a row: counter (offset lo, offset hi, 0, 0),
// key (seed lo, seed hi); the top 53 bits of v[0]:v[1] scaled by 2^-53. Counter words 2 and 3 are
// left for future draws of the same step (e.g. speculative positions).
SPECD_HOST_DEVICE inline double PhiloxUniform(uint64_t seed, uint64_t offset) {
  const Philox4x32Block out = Philox4x32_10(
      Philox4x32Block{{static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), 0u, 0u}},
      static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (static_cast<uint64_t>(out.v[0]) << 32) | out.v[1];
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// ---------------------------------------------------------------------------------------------

// Index of the largest logit of each row, lowest index on ties (NaN counts as -inf).
//   logits  [num_rows, vocab] T, host, in; row stride `stride`
//   out_ids [num_rows] int32, host, out
template <typename T>
void ArgmaxRows(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab, int32_t* out_ids);

// Ids of the k largest logits of each row, best first; ties go to the lower id and NaN counts
// as -inf, so NaN and -inf entries rank last, among themselves by id. The draft model's
// candidates in speculative decoding (kernels/cuda/sampling.h TopKRows).
//   logits  [num_rows, vocab] T, host, in; row stride `stride`
//   out_ids [num_rows, k] int32, host, out
// Requires 1 <= k <= vocab.
template <typename T>
void TopKRows(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab, int32_t k,
              int32_t* out_ids);

// The log-softmax of each row at k given ids (kernels/cuda/sampling.h LogSoftmaxAt): out[r, j] =
// logits[r, ids[r, j]] - log(sum_v exp(logits[r, v])), max-subtracted; NaN counts as -inf; an
// id outside [0, vocab), or a row without a finite logit, gives -inf.
//   logits [num_rows, vocab] T, host, in; row stride `stride`
//   ids    [num_rows, k] int32, host, in;   out [num_rows, k] T, host, out
template <typename T>
void LogSoftmaxAt(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                  const int32_t* ids, int32_t k, T* out);

// Repetition, presence and frequency penalties in place (vLLM's apply_penalties, the CPU
// Sampler's order): every distinct in-range token of the row's prompt or output once gets
// v = v > 0 ? v / repetition : v * repetition; then a token with c > 0 output occurrences gets
// v -= frequency * c + presence. Ids outside [0, vocab) are ignored. CSR lists as in
// kernels/cuda/sampling.h; penalties [num_rows, 3] (repetition, presence, frequency).
template <typename T>
void ApplyPenalties(T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                    const int32_t* prompt_ids, const int32_t* prompt_offsets,
                    const int32_t* output_ids, const int32_t* output_offsets,
                    const float* penalties);

// One row's sampling parameters (kernels/cuda/sampling.h SamplingRow without the seed).
struct SampleParams {
  float temperature = 1.0f;
  int32_t top_k = 0;   // 0 (or >= vocab) = off
  float top_p = 1.0f;  // >= 1 = off
  float min_p = 0.0f;  // <= 0 = off
};

// The filtered, unnormalized distribution of a sampled row (steps 1-3 above).
template <typename T>
struct FilteredRow {
  std::vector<T> kept;  // [vocab] p_i where token i survives every filter, else 0
  T kept_mass = 0;      // sum of kept
  // Smallest relative distance of any filter decision from its threshold: min-p and top-k
  // |p_i / threshold - 1| over tokens not tied with it, top-p |G(v) - top_p M| / M over
  // distinct values v. Below ~1e-5 an fp32 implementation may decide differently.
  double filter_margin = 1.0;
};

// Steps 1-3 for a non-greedy row (temperature > 0, finite max).
template <typename T>
FilteredRow<T> FilterRow(const T* logits, int32_t vocab, const SampleParams& params);

// Step 4 on any non-negative weights (a FilteredRow's kept, a ProcessedProbs row): the first i in
// token-id order whose cumulative weight C_i exceeds u * (sum of the weights); the last positive
// weight when rounding puts u * sum at or above the final C_i; -1 when every weight is 0.
template <typename T>
int32_t InverseCdf(const T* weights, int32_t vocab, double u);

// The drawn token for uniform u (step 4), or the argmax for a greedy row.
template <typename T>
int32_t SampleRow(const T* logits, int32_t vocab, const SampleParams& params, double u);

// The processed distribution of each row (see the definition above; kernels/cuda/sampling.h
// ProcessedProbs): drawing from it with InverseCdf and the same u gives SampleRow's token except
// within rounding of a CDF boundary. out may be logits itself (out_stride == stride).
//   logits [num_rows, vocab] T, host, in; row stride `stride`
//   params [num_rows] SampleParams, host, in
//   out    [num_rows, vocab] T, host, out; row stride `out_stride`
template <typename T>
void ProcessedProbs(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                    const SampleParams* params, T* out, int64_t out_stride);

// dst[dst_rows[i], :cols] = src[i, :cols] (kernels/cuda/sampling.h ScatterRows).
template <typename T>
void ScatterRows(const T* src, int64_t src_stride, int32_t num_rows, int32_t cols,
                 const int32_t* dst_rows, T* dst, int64_t dst_stride);

// Saguaro sampling's down-weighting (SSD, engine/speculation/saguaro/saguaro.h) of each row of
// probabilities (kernels/cuda/sampling.h SaguaroDownweightRows): row r's entries at the distinct
// in-range ids among ids[r, 0 .. fan_out[r]) (the row's cached ids; TopKRows' output) are
// multiplied by C = c[r] and the row is renormalised: entry / total with
// total = C * (cached mass) + (the rest's mass), fp64 sums in id order. A row is left unchanged
// when fan_out[r] <= 0, C is NaN or >= 1, or total is not > 0 (C = 0 with all mass on cached
// ids, or an all-zero row: no draft could be drawn from the result, and the row itself is its
// limit as C -> 0). C below 0 counts as 0.
//   probs   [num_rows, vocab] f32, host, in/out; row stride `stride`
//   ids     [num_rows, ids_stride] int32, host, in
//   fan_out [num_rows] int32, c [num_rows] f32, host, in
void SaguaroDownweightRows(float* probs, int64_t stride, int32_t num_rows, int32_t vocab,
                           const int32_t* ids, int32_t ids_stride, const int32_t* fan_out,
                           const float* c);

// log softmax(logits)[id] of the raw (untempered, unfiltered) row.
template <typename T>
T RawLogprob(const T* logits, int32_t vocab, int32_t id);

#define SPECD_SAMPLING_REF_EXTERN(T)                                                               \
  extern template void ArgmaxRows<T>(const T*, int64_t, int32_t, int32_t, int32_t*);               \
  extern template void TopKRows<T>(const T*, int64_t, int32_t, int32_t, int32_t, int32_t*);        \
  extern template void LogSoftmaxAt<T>(const T*, int64_t, int32_t, int32_t, const int32_t*,        \
                                       int32_t, T*);                                               \
  extern template void ApplyPenalties<T>(T*, int64_t, int32_t, int32_t, const int32_t*,            \
                                         const int32_t*, const int32_t*, const int32_t*,           \
                                         const float*);                                            \
  extern template FilteredRow<T> FilterRow<T>(const T*, int32_t, const SampleParams&);             \
  extern template int32_t InverseCdf<T>(const T*, int32_t, double);                                \
  extern template int32_t SampleRow<T>(const T*, int32_t, const SampleParams&, double);            \
  extern template void ProcessedProbs<T>(const T*, int64_t, int32_t, int32_t, const SampleParams*, \
                                         T*, int64_t);                                             \
  extern template void ScatterRows<T>(const T*, int64_t, int32_t, int32_t, const int32_t*, T*,     \
                                      int64_t);                                                    \
  extern template T RawLogprob<T>(const T*, int32_t, int32_t);
SPECD_SAMPLING_REF_EXTERN(float)
SPECD_SAMPLING_REF_EXTERN(double)
#undef SPECD_SAMPLING_REF_EXTERN

}  // namespace specd::kernels::ref
