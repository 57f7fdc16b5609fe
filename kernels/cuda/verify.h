// Speculative-decoding verification launchers for the CUDA backend: greedy acceptance (a
// warp-ballot scan and the per-thread serial scan it replaces), packing of what each sequence
// commits (tokens, KV slots, KV rows), a fused verify-and-pack kernel with a multi-block
// fallback, stochastic acceptance (speculative sampling), and greedy and sampled acceptance of
// token trees (SpecInfer, Miao et al. 2024). Algorithms from the batched-verification study
// (Kolawole 2026, "Batched Speculative Decoding Verification Kernels": Opt A, fused
// verify-and-pack). References: kernels/ref/verify.h, which also defines the ragged layout. Any
// host thread; work is queued on `stream`, nothing is allocated and no device value is read
// back, so every launch can be captured in a CUDA graph.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

namespace specd::kernels {

// A ragged batch of drafts, as ref::DraftLayout: sequence i has
// K_i = cu_draft_lens[i + 1] - cu_draft_lens[i] <= max_draft_len drafts and K_i + 1 verified
// positions at rows cu_draft_lens[i] + i ... of every per-position array (num_drafts + batch
// rows). The device offsets are trusted (not read on the host): non-decreasing, from 0.
struct DraftLayout {
  const int32_t* cu_draft_lens = nullptr;  // [batch + 1] int32, device, in; nullptr: K_i = max
  int64_t batch = 0;
  int64_t max_draft_len = 0;
};

// Limits the launchers check: batch * (max_draft_len + 1) < 2^31 (int32 rows); the fused kernel
// keeps one committed length per sequence in shared memory.
constexpr int64_t kMaxFusedVerifyBatch = 1024;
constexpr int64_t kMaxVerifyVocab = int64_t{1} << 23;  // fixed-point draw weights fit uint64

// Greedy acceptance, one warp per sequence (Opt A): lane l compares position c + l of chunk c,
// one __ballot_sync per 32 positions gives the mismatch mask and __ffs its first bit; every lane
// runs the same ceil(K_i / 32) ballots at most, so acceptance length causes no divergence.
//   draft_tokens   [num_drafts] int32, device, in
//   target_tokens  [num_drafts + batch] int32, device, in: the target's argmax per position
//   accepted_lens  [batch] int32, device, out: k_i, first mismatch (K_i if none)
//   next_tokens    [batch] int32, device, out: target_tokens[i, k_i]
// cudaErrorInvalidValue for negative sizes, batch * (max_draft_len + 1) >= 2^31 or a null
// pointer (cu_draft_lens may be null); batch == 0 launches nothing.
cudaError_t VerifyGreedyBallot(const DraftLayout& layout, const int32_t* draft_tokens,
                               const int32_t* target_tokens, int32_t* accepted_lens,
                               int32_t* next_tokens, cudaStream_t stream);

// The same result from one thread per sequence scanning serially: the baseline the ballot scan
// is measured against (its warps wait for their longest scan). Arguments as VerifyGreedyBallot.
cudaError_t VerifyGreedySerial(const DraftLayout& layout, const int32_t* draft_tokens,
                               const int32_t* target_tokens, int32_t* accepted_lens,
                               int32_t* next_tokens, cudaStream_t stream);

// Output buffers of the packing step (see ref::PackArgs for the row mapping). Optional inputs
// are null / 0 when unused. All device memory.
struct PackArgs {
  int32_t* cu_committed = nullptr;        // [batch + 1] int32, out: prefix sum of k_i + 1
  int32_t* committed_tokens = nullptr;    // [>= num_drafts + batch] int32, out
  const int32_t* slot_mapping = nullptr;  // [num_drafts + batch] int32, in, optional
  int32_t* committed_slots = nullptr;     // [>= num_drafts + batch] int32, out (with slots)
  const void* kv = nullptr;               // [num_drafts + batch, kv_row_bytes], in, optional
  void* packed_kv = nullptr;              // [>= num_drafts + batch, kv_row_bytes], out
  int64_t kv_row_bytes = 0;               // 0: no KV rows; 16-byte copies when a multiple of 16
                                          // and both pointers are 16-byte aligned
};

// Multi-block packing from given acceptance results (the stochastic kernel's, or the ballot
// scan's on the multi-block path): a one-block prefix sum of k_i + 1 (warp shuffles), then a
// grid of (sequence, committed rows) copying tokens, slots and KV rows. Two launches.
//   draft_tokens                [num_drafts] int32, device, in
//   accepted_lens, next_tokens  [batch] int32, device, in
// cudaErrorInvalidValue as VerifyGreedyBallot, or for kv_row_bytes < 0, a slot/KV output
// missing for its input; batch == 0 launches nothing (cu_committed is not written).
cudaError_t PackAccepted(const DraftLayout& layout, const int32_t* draft_tokens,
                         const int32_t* accepted_lens, const int32_t* next_tokens,
                         const PackArgs& pack, cudaStream_t stream);

// Which kernels VerifyGreedyAndPack runs.
enum class VerifyPackPath {
  kAuto,        // PreferFusedVerifyPack decides
  kFused,       // one block, one launch; cudaErrorInvalidValue when batch > kMaxFusedVerifyBatch
  kMultiBlock,  // VerifyGreedyBallot + PackAccepted: three launches over the whole GPU
};

// The fused kernel runs on one SM: it wins while launch overhead dominates and loses once the
// KV rows it copies need more than one SM's bandwidth (the study's crossover: ~4 MB of rows on
// an L40S; on an H100 we measured it near 128 KiB: docs/benchmarks.md; recalibrate per GPU with
// tools/gpu/verify_bench). Decides on upper bounds, since the accepted lengths are unknown on
// the host: batch <= 128 and batch * (max_draft_len + 1) * kv_row_bytes <= 128 KiB.
bool PreferFusedVerifyPack(const DraftLayout& layout, int64_t kv_row_bytes);

// Greedy acceptance and packing. The fused path runs in ONE launch: warps run the ballot scan of
// one sequence at a time, the block scans the committed lengths in shared memory, then the block
// packs tokens and slots (one warp per sequence) and KV rows (one warp per row, balanced over the
// batch). Results equal VerifyGreedyBallot followed by PackAccepted on either path.
// Arguments as VerifyGreedyBallot and PackAccepted.
cudaError_t VerifyGreedyAndPack(const DraftLayout& layout, const int32_t* draft_tokens,
                                const int32_t* target_tokens, int32_t* accepted_lens,
                                int32_t* next_tokens, const PackArgs& pack, VerifyPackPath path,
                                cudaStream_t stream);

// Stochastic acceptance (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023), one
// 1024-thread block per sequence: the block tests all drafts at once (accept when
// u * q(d) < p(d)) and takes the first rejection k; then two passes over the vocabulary draw the
// next token from norm(max(0, p_k - q_k)) (or from p_k after full acceptance, or when the
// residual is empty): a block reduction of fixed-point weights, then a chunked block-wide prefix
// scan that stops at the chunk holding the draw. Exactly ref::VerifyStochastic, whose comment
// defines the rule and the uniforms' layout.
//   draft_tokens  [num_drafts] int32, device, in
//   draft_probs   [num_drafts, vocab] f32, device, in; nullptr for deterministic drafts
//   target_probs  [num_drafts + batch, vocab] f32, device, in
//   uniforms      [num_drafts + batch] f32 in [0, 1), device, in (e.g. from Philox)
//   accepted_lens, next_tokens  [batch] int32, device, out
// 16-byte loads when vocab % 4 == 0 and both prob pointers are 16-byte aligned.
// cudaErrorInvalidValue as VerifyGreedyBallot, or unless 1 <= vocab <= kMaxVerifyVocab and
// (num_drafts + batch) * vocab < 2^62.
cudaError_t VerifyStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                             const float* draft_probs, const float* target_probs, int64_t vocab,
                             const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens,
                             cudaStream_t stream);

// Most drafts per sequence VerifyTreeStochastic takes (its shared lists of a node's rejected
// tokens); VerifyTreeGreedy has no such limit.
constexpr int64_t kMaxTreeVerifyDrafts = 1024;

// Greedy acceptance of token trees (SpecInfer tree verification at temperature 0), one warp per
// sequence: from the root, descend to the first child (lowest index) whose token equals the
// target's argmax at the current node, until no child does. One scan over the drafts with a
// ballot per 32 (a node's children follow it), restarted after each descent: ceil(K_i / 32) +
// depth ballots. Exactly ref::VerifyTreeGreedy, whose comment defines the tree layout.
//   draft_tokens   [num_drafts] int32, device, in
//   parents        [num_drafts] int32, device, in: row-local parent indices, -1 the root; a
//                  draft whose parent is neither -1 nor an earlier draft is never visited
//   target_tokens  [num_drafts + batch] int32, device, in: the target's argmax per position
//                  (position 0 of a sequence the root, position j + 1 draft j)
//   accepted_lens  [batch] int32, device, out: k_i, the accepted path's length
//   next_tokens    [batch] int32, device, out: the target's token at the path's last node
//   paths          [num_drafts] int32, device, out: sequence i's accepted draft indices
//                  (row-local, root side first) at paths[cu_draft_lens[i] + t] (i *
//                  max_draft_len + t without offsets), t < k_i; the other entries untouched
// cudaErrorInvalidValue as VerifyGreedyBallot, or for a null parents or paths; batch == 0
// launches nothing.
cudaError_t VerifyTreeGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                             const int32_t* parents, const int32_t* target_tokens,
                             int32_t* accepted_lens, int32_t* next_tokens, int32_t* paths,
                             cudaStream_t stream);

// Sampled acceptance of token trees with deterministic (one-hot) drafts: recursive rejection over
// siblings (SpecInfer's multi-draft rule), one 1024-thread block per sequence. Per node on the
// path: a block sum of the row's fixed-point weights, then all children tested at once (a block
// exclusive scan of their weights gives each child the mass left when it is tried, the first
// child passing ref::AcceptTreeChild is kept); at the last node one block-wide inverse-CDF pass
// draws the next token from the residual (the rejected children's tokens excluded) or from p.
// depth + 2 passes over the vocabulary at most. Exactly ref::VerifyTreeStochastic, whose comment
// defines the rule and the uniforms' layout.
//   draft_tokens   [num_drafts] int32, device, in
//   parents        [num_drafts] int32, device, in: as VerifyTreeGreedy
//   target_probs   [num_drafts + batch, vocab] f32, device, in: processed p per position
//   uniforms       [num_drafts + batch] f32 in [0, 1), device, in: at sequence i's row
//                  cu_draft_lens[i] + i + j the test of draft j (j < K_i), at + K_i the final draw
//   accepted_lens, next_tokens, paths: as VerifyTreeGreedy; next token -1 when the drawn row has
//                  no mass
// 16-byte loads when vocab % 4 == 0 and target_probs is 16-byte aligned.
// cudaErrorInvalidValue as VerifyStochastic (draft_probs aside), or for a null parents or paths,
// or max_draft_len > kMaxTreeVerifyDrafts.
cudaError_t VerifyTreeStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                                 const int32_t* parents, const float* target_probs, int64_t vocab,
                                 const float* uniforms, int32_t* accepted_lens,
                                 int32_t* next_tokens, int32_t* paths, cudaStream_t stream);

}  // namespace specd::kernels
