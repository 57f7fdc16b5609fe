// References for the speculative-decoding verification kernels (kernels/cuda/verify.h): greedy
// first-mismatch acceptance, packing of the committed tokens / KV slots / KV rows, stochastic
// acceptance (speculative sampling), and greedy and sampled acceptance of token trees. They define
// what the kernels compute, bit for bit: every output is an integer or a copied byte, and the few
// float operations on the way (one product and one difference per token) are shared with the
// kernels through the host/device helpers below. Pure functions, any thread.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECD_VERIFY_HOST_DEVICE __host__ __device__
#else
#define SPECD_VERIFY_HOST_DEVICE
#endif

namespace specd::kernels::ref {

// A ragged batch of drafts. Sequence i has K_i = cu_draft_lens[i + 1] - cu_draft_lens[i] drafts
// (0 <= K_i <= max_draft_len) at draft_tokens[cu_draft_lens[i] ...), and K_i + 1 verified
// positions: position j is the target's prediction after the sequence's committed tokens and
// drafts 0..j-1 (j = K_i is the bonus position). Every per-position array (target tokens,
// uniforms, target probabilities, KV slots and rows) holds sequence i's positions at rows
// PositionStart(i) = cu_draft_lens[i] + i onwards, so it has num_drafts + batch rows.
struct DraftLayout {
  const int32_t* cu_draft_lens = nullptr;  // [batch + 1] int32, host, in; nullptr: K_i = max
  int64_t batch = 0;
  int64_t max_draft_len = 0;

  int64_t DraftStart(int64_t i) const {
    return cu_draft_lens ? cu_draft_lens[i] : i * max_draft_len;
  }
  int64_t NumDrafts(int64_t i) const { return DraftStart(i + 1) - DraftStart(i); }
  int64_t PositionStart(int64_t i) const { return DraftStart(i) + i; }
  int64_t NumPositions() const { return DraftStart(batch) + batch; }
};

// Greedy acceptance (Leviathan et al. 2023 with temperature 0): k_i is the first j < K_i with
// draft_tokens[i, j] != target_tokens[i, j] (K_i when every draft matches), and the next token is
// the target's at position k_i: the correction, or the bonus token when all drafts match.
//   draft_tokens   [num_drafts] int32, host, in
//   target_tokens  [num_drafts + batch] int32, host, in: the target's argmax per position
//   accepted_lens  [batch] int32, host, out: k_i
//   next_tokens    [batch] int32, host, out: target_tokens[i, k_i]
void VerifyGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                  const int32_t* target_tokens, int32_t* accepted_lens, int32_t* next_tokens);

// Buffers of the packing step. Sequence i commits c_i = k_i + 1 tokens: its k_i accepted drafts
// and the next token. They are packed back to back in batch order at cu_committed[i]. The KV
// slot and row of verified position j hold the KV of that position's input token (the last
// committed token for j = 0, draft j - 1 after it), so the same c_i positions 0..k_i are the
// ones whose KV stays valid; positions k_i + 1.. are rolled back.
struct PackArgs {
  int32_t* cu_committed = nullptr;        // [batch + 1] int32, out: exclusive prefix sum of c_i
  int32_t* committed_tokens = nullptr;    // [>= num_drafts + batch] int32, out; rows past
                                          // cu_committed[batch] untouched
  const int32_t* slot_mapping = nullptr;  // [num_drafts + batch] int32, in, optional: the KV
                                          // slot each verified position was written to
  int32_t* committed_slots = nullptr;     // [>= num_drafts + batch] int32, out (with
                                          // slot_mapping): slot_mapping of committed positions
  const void* kv = nullptr;   // [num_drafts + batch, kv_row_bytes] any dtype, in, optional:
                              // a row per verified position (draft-position major)
  void* packed_kv = nullptr;  // [>= num_drafts + batch, kv_row_bytes], out (with kv)
  int64_t kv_row_bytes = 0;   // 0: no KV rows to move
};

// Prefix sum of committed lengths and compaction of the committed tokens, slots and KV rows:
// for sequence i and j <= k_i, packed row cu_committed[i] + j gets draft j (j < k_i) or the next
// token (j = k_i), slot_mapping and the KV row of position PositionStart(i) + j.
//   accepted_lens, next_tokens  [batch] int32, host, in (VerifyGreedy's or VerifyStochastic's)
void PackAccepted(const DraftLayout& layout, const int32_t* draft_tokens,
                  const int32_t* accepted_lens, const int32_t* next_tokens, const PackArgs& pack);

// Stochastic acceptance, speculative sampling (Leviathan et al. 2023, Chen et al. 2023). For
// j = 0, 1, ...: draft d_j is accepted when u_j * q_j(d_j) < p_j(d_j) (probability
// min(1, p/q); q = 0 < p accepts). At the first rejection k the next token is drawn from
// norm(max(0, p_k - q_k)), or from p_k when that residual has no mass left at 2^-40 resolution;
// when every draft is accepted the bonus token is drawn from p_K. Draws are inverse-CDF over
// token ids in order with weights ProbToFixed(.) summed exactly in uint64, so the result does not
// depend on summation order (GPU = CPU bit for bit).
//   draft_probs   [num_drafts, vocab] f32, host, in: q rows, the distribution each draft was
//                 drawn from; nullptr for deterministic drafts (n-gram): q = one-hot at d_j
//   target_probs  [num_drafts + batch, vocab] f32, host, in: p rows, one per position
//   uniforms      [num_drafts + batch] f32 in [0, 1), host, in: at sequence i's position j < K_i
//                 the test of draft j, at position K_i the draw of the next token (a uniform of
//                 its own: reusing a rejected test's u would bias the draw). Callers take them
//                 from Philox (kernels/cuda/sampling.h) or any generator; passing them in keeps
//                 the kernel free of RNG state and the CPU reference exact.
//   accepted_lens, next_tokens  [batch] int32, host, out; next token -1 when the drawn row
//                 has no mass (not a distribution)
// A draft id outside [0, vocab) is rejected.
void VerifyStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                      const float* draft_probs, const float* target_probs, int64_t vocab,
                      const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens);

// Greedy acceptance of token trees (tree verification, SpecInfer, Miao et al. 2024, with
// temperature 0; the CPU oracle is Acceptor::VerifyTree in engine/sample/acceptance.cc).
// Sequence i's K_i drafts form a tree: draft j's parent is parents[j], -1 for the root (the
// sequence's last committed token) or an earlier draft of the same sequence; siblings are ordered
// best first (increasing index). The node of draft j is verified position j + 1 (position 0 the
// root). From the root, descend to the first child (lowest index) whose token equals the target's
// token at the current node, until no child does. A draft whose parent is neither -1 nor in
// [0, j) is nobody's child: never visited. A chain is parents {-1, 0, 1, ...}: VerifyGreedy.
//   draft_tokens   [num_drafts] int32, host, in
//   parents        [num_drafts] int32, host, in: row-local draft indices, -1 the root
//   target_tokens  [num_drafts + batch] int32, host, in: the target's argmax per position
//   accepted_lens  [batch] int32, host, out: k_i, the accepted path's length
//   next_tokens    [batch] int32, host, out: the target's token at the path's last node (the
//                  correction, or the bonus token at a leaf)
//   paths          [num_drafts] int32, host, out: sequence i's accepted drafts (row-local
//                  indices, root side first) at paths[DraftStart(i) + t], t < k_i; the other
//                  entries untouched
void VerifyTreeGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                      const int32_t* parents, const int32_t* target_tokens, int32_t* accepted_lens,
                      int32_t* next_tokens, int32_t* paths);

// Sampled acceptance of token trees with deterministic (one-hot) drafts: recursive rejection
// over siblings (SpecInfer's multi-draft rule, Miao et al. 2024; Acceptor::VerifyTree is the CPU
// oracle). Tree layout as VerifyTreeGreedy. At a node whose position has the target row p, with
// fixed-point weights w(x) = ProbToFixed(p(x)), `left` starts as the row's total sum_x w(x); the
// node's children are tried best first: child c with token x and effective weight w_c (w(x), or
// 0 when x is out of [0, vocab) or an earlier sibling with the same token was rejected, its
// mass already gone) is kept when AcceptTreeChild(u_c, left, w_c) (probability w_c / left up to
// 2^-32); a rejected child removes w_c from `left` and x from the row. A kept child becomes the
// node. When every child of the node is rejected, the next token is drawn from what is left of p
// (the residual: p with the rejected tokens zeroed, total `left`), or from p itself when the
// residual has no mass (in this exact arithmetic only when p has none: a child holding all the
// mass left is always kept); at a kept node without children the bonus token is drawn from its p.
// Draws as VerifyStochastic's: inverse-CDF over token ids in order, fixed-point weights summed
// exactly in uint64 (GPU = CPU bit for bit).
// A chain of drafts (parents {-1, 0, 1, ...}) gives VerifyStochastic's result with draft_probs ==
// nullptr (its rule u * 1 < p(d)) whenever every tested row's fixed-point total is exactly 2^40,
// every tested u a multiple of 2^-32 (each float u >= 2^-8 is) and every tested p(d) a multiple
// of 2^-40 (each float p >= 2^-17 is): then floor(2^40 floor(u 2^32) / 2^32) = u 2^40 and
// w(d) = p(d) 2^40, so the test is u < p(d). Otherwise the two can differ only for u within
// about p(d) |2^40 / total - 1| + 2^-32 of p(d): this rule divides by the row's actual total,
// the chain's by 1. The residual and fallback draws are the same (p without the draft's token).
//   draft_tokens   [num_drafts] int32, host, in
//   parents        [num_drafts] int32, host, in: as VerifyTreeGreedy
//   target_probs   [num_drafts + batch, vocab] f32, host, in: the processed p per position
//   uniforms       [num_drafts + batch] f32 in [0, 1), host, in: at sequence i's index
//                  PositionStart(i) + j (j < K_i) the test of draft j, at PositionStart(i) + K_i
//                  the final draw (a uniform of its own)
//   accepted_lens, next_tokens, paths: as VerifyTreeGreedy; next token -1 when the drawn row
//                  has no mass
void VerifyTreeStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                          const int32_t* parents, const float* target_probs, int64_t vocab,
                          const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens,
                          int32_t* paths);

// Fixed-point weights of the draws: 40 fractional bits, so a row of up to kMaxVerifyVocab
// weights sums below 2^63.
constexpr int kProbFixedBits = 40;
constexpr int64_t kMaxVerifyVocab = int64_t{1} << 23;

// The rule shared with the kernels (one product, exactly rounded on CPU and GPU).
SPECD_VERIFY_HOST_DEVICE inline bool AcceptDraft(float u, float p, float q) { return u * q < p; }

// floor(p * 2^40) for p in [0, 1]; 0 for p <= 0 or NaN, 2^40 for p >= 1.
SPECD_VERIFY_HOST_DEVICE inline uint64_t ProbToFixed(float p) {
  if (!(p > 0.0f)) return 0;
  if (p >= 1.0f) return uint64_t{1} << kProbFixedBits;
  return static_cast<uint64_t>(p * 0x1p40f);
}

// floor(u * 2^32) for u in [0, 1), clamped to [0, 2^32).
SPECD_VERIFY_HOST_DEVICE inline uint32_t UniformToFixed(float u) {
  if (!(u > 0.0f)) return 0;
  if (u >= 1.0f) return 0xffffffffu;
  return static_cast<uint32_t>(u * 0x1p32f);
}

// floor(total * u_fixed / 2^32) without 128-bit arithmetic: < total when total > 0. The drawn id
// is the first whose inclusive prefix sum of weights exceeds it.
SPECD_VERIFY_HOST_DEVICE inline uint64_t DrawThreshold(uint64_t total, uint32_t u_fixed) {
  const uint64_t hi = total >> 32, lo = total & 0xffffffffull;
  return hi * u_fixed + ((lo * u_fixed) >> 32);
}

// Weight of id x in the draw after a rejection of `draft` (residual) or of the bonus token.
// q_x: the draft's probability of x (ignored unless residual).
SPECD_VERIFY_HOST_DEVICE inline uint64_t ResidualWeight(float p_x, float q_x, bool residual) {
  return ProbToFixed(residual ? p_x - q_x : p_x);
}

// The tree's accept test (VerifyTreeStochastic), shared with the kernel: a child of effective
// weight w against the remaining mass `left` (both fixed-point, w <= left) is kept when the
// inverse-CDF draw of u from the remaining row, with the child's token placed first, lands on it:
// floor(left * floor(u 2^32) / 2^32) < w. Exact integer arithmetic; w == 0 never keeps.
SPECD_VERIFY_HOST_DEVICE inline bool AcceptTreeChild(float u, uint64_t left, uint64_t w) {
  return DrawThreshold(left, UniformToFixed(u)) < w;
}

}  // namespace specd::kernels::ref
