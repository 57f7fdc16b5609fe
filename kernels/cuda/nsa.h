// Native Sparse Attention (NSA) launchers for the CUDA backend, with SSV grouped verification
// (sparse speculative verification: ../shared/papers, the SSV review). The semantics are
// engine/model/nsa_attention.h's (fp32 CPU oracle); the references are kernels/ref/nsa.h. A layer's
// NSA attention is three steps, each a launcher below:
//   NsaCompress  the mean key and value of every block a pass completes, into the compressed cache;
//   NsaSelect    the compressed branch (o_cmp) and each (token, kv head)'s own block selection;
//   NsaAttend    the selected and window branches over the selections the caller passes (own,
//                kept from a refresh layer, or shared per group), merged and gated with o_cmp;
//                with NsaLoadCount, it also counts what SSV verification groups read (the
//                server's SSV metrics, as the CPU counts them).
// Any host thread; work is queued on `stream`, nothing allocates (scratch comes from the
// caller's workspace), and positions, groups, tables and selections are read on the device, so
// the launches replay from CUDA graphs. Split counts are host plans (Nsa*Splits), chosen once per
// batch-size bucket.
//
// Storage (bf16, per layer):
//   k_cache, v_cache  [num_pages, num_kv_heads, page_size, head_dim]: attention.h's paged "HND"
//                     cache; position j of a sequence is page table[j / page_size], row
//                     j % page_size
//   cmp_k, cmp_v      [num_pages, num_kv_heads, entries_per_page, head_dim], entries_per_page =
//                     NsaEntriesPerPage(shape) = max(1, page_size / block_size): NSA block c's
//                     means live in the page holding the block's last position e = (c + 1) * B - 1,
//                     row (e % page_size) / B, so they travel with that page (prefix caching,
//                     preemption) as engine/kv's CPU entries do
//                     (KvCacheSpec::compressed_per_block).
// Tokens: a pass's tokens are rows of q and out; positions[t] is token t's position in its
// sequence token_seqs[t] (< 0: padding, skipped). Groups (NsaGroups) are runs of up to
// kNsaMaxGroupSize consecutive tokens of one sequence at ascending positions; every non-padding
// token must be in exactly one group of a NsaSelect / NsaAttend call (output rows of tokens in no
// group are unspecified).
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstddef>
#include <cstdint>

struct __nv_bfloat16;

namespace specd::kernels {

// The most tokens per group (the union's per-block query masks are 32 bits; SSV's C <= 16).
inline constexpr int32_t kNsaMaxGroupSize = 16;
// The most blocks a selection holds (S).
inline constexpr int32_t kNsaMaxBlockCounts = 64;

struct NsaShape {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;      // 32, 64 or 128
  int32_t page_size = 0;     // tokens per KV page: 16, 32 or 64
  int32_t block_size = 0;    // B: NSA block (compression = selection block): 16, 32, 64 or 128
  int32_t block_counts = 0;  // S: blocks selected per query and kv head, 1 .. kNsaMaxBlockCounts
  int32_t window_size = 0;   // W >= 1: the window branch sees positions p - W + 1 .. p
  float scale = 0;           // softmax scale of every branch, head_dim^-1/2
};

// Compressed entries per page: max(1, page_size / block_size).
int32_t NsaEntriesPerPage(const NsaShape& shape);

// The tokens of a pass.
struct NsaTokens {
  const int32_t* positions = nullptr;   // [num_tokens] int32, device
  const int32_t* token_seqs = nullptr;  // [num_tokens] int32, device: sequence (table row); < 0 pad
  int64_t num_tokens = 0;
  // SSV reuse schedules (lossy): token t takes a new selection only at layers where
  // layer % refresh_every[t] == 0 (NsaSelect writes its rows there); at the others its rows keep
  // the selection of its last refresh layer, so the caller keeps the selections buffer across a
  // pass's layers. Null: every layer selects. Values < 1 count as 1.
  const int32_t* refresh_every = nullptr;  // [num_tokens] int32, device
  int32_t layer = 0;                       // host: the layer this call runs
};

// Runs of consecutive tokens of one sequence: group g is tokens groups[2 g] ..
// groups[2 g] + groups[2 g + 1] - 1 (count 0: an empty group, e.g. graph padding).
struct NsaGroups {
  const int32_t* groups = nullptr;  // [num_groups, 2] int32, device: first token, count
  int32_t num_groups = 0;
  int32_t max_group_size = 0;  // host: >= every count (counts past it are cut), 1 .. 16
  // Per group SSV bits (kNsaGroup*; null: none): kNsaGroupShared, mode shared (lossy): the
  // group's tokens attend its first token's selection in NsaAttend (as shared_selection does for
  // every group); kNsaGroupCounted: an SSV verification chunk's group, whose reads NsaAttend
  // counts (NsaLoadCount).
  const uint8_t* flags = nullptr;  // [num_groups] uint8, device
};
inline constexpr uint8_t kNsaGroupShared = 1;
inline constexpr uint8_t kNsaGroupCounted = 2;

// What the counted groups read (engine/base/ssv.h's SsvLoadStats, whose definitions these
// follow: per token x layer x kv head, a token's keys are its attended blocks' keys up to its
// position and its window; a group's the union of its tokens'), as running totals on the device.
// Integer fields are exact. overlap_sum adds, per token of a counted group whose sequence's
// previous token is in the pass, |own(t) n own(t - 1)| / |own(t)| of the two tokens' own
// selections (computed as a double per pair, as on the CPU), by a double atomicAdd: the sum is
// the CPU's up to the order of the additions (relative error about 1e-16 per addition).
struct NsaLoadCounters {
  uint64_t queries = 0;
  uint64_t per_query_keys = 0;
  uint64_t grouped_keys = 0;
  uint64_t per_query_blocks = 0;
  uint64_t grouped_blocks = 0;
  uint64_t overlap_pairs = 0;
  double overlap_sum = 0;
};

// SSV load counting, optional for NsaSelect and NsaAttend (the runner passes it at every layer;
// only the groups flagged kNsaGroupCounted add anything).
struct NsaLoadCount {
  // [num_tokens, num_kv_heads, S] int32, device: a refresh token's own selection at the layer, a
  // reuse token's row all -1 (NsaSelect writes it, NsaAttend reads it for the overlap of adjacent
  // tokens: on refresh layers only, as the CPU counts it).
  int32_t* own_selections = nullptr;
  NsaLoadCounters* counters = nullptr;  // device, in/out: NsaAttend adds to it (atomics)
};

// Paged storage of one layer (the layout above) and the block tables.
struct NsaCache {
  const __nv_bfloat16* k_cache = nullptr;
  const __nv_bfloat16* v_cache = nullptr;
  __nv_bfloat16* cmp_k = nullptr;  // written by NsaCompress only
  __nv_bfloat16* cmp_v = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq] int32, device
  int32_t max_blocks_per_seq = 0;         // pages per table row
};

// ---------------------------------------------------------------------------------------------
// Compress. For each token t whose position p completes an NSA block ((p + 1) % B == 0; padding
// skipped), block c = p / B's mean key and mean value per kv head -- the fp32 sum of the block's
// B bf16 rows in position order, divided by B, rounded to bf16 once -- into the block's entry of
// cmp_k / cmp_v. Run after WriteKvCache wrote the pass's K/V. One CTA per token (kernel:
// nsa_kernels.cuh, NsaCompressKernel).
// cudaErrorInvalidValue for an unsupported shape or a null pointer; no tokens launch nothing.
cudaError_t NsaCompress(const NsaCache& cache, const NsaTokens& tokens, const NsaShape& shape,
                        cudaStream_t stream);

// ---------------------------------------------------------------------------------------------
// Select. For every token of the groups: the compressed branch over the visible entries
// c < (p + 1) / B of its sequence (softmax of scale q.k_c over them; zeros while none is), per q
// head, and, per kv head, its own selection: the block scores are the compressed probabilities
// summed over the kv head's q heads (zero for c >= (p + 1) / B), blocks {0, i - 1, i} (i = p / B)
// forced to score `group`, the top S of the candidates c <= i by score (ties to the lower index;
// all of them when i + 1 <= S), ascending, -1 padded.
// Three kernels: the verification mainloop over the compressed cache (NsaCompressedVariant of
// attention_verify.cuh; rows = a group's tokens x q heads, 1 to 8 warps, so a group's queries
// share each tile of entries; split over the entries; raw logits kept in the workspace), the
// decode combine (o_cmp, bf16), and one CTA per (token, kv head) normalising each head's logits
// over all its entries and radix-selecting the top S (nsa_kernels.cuh; up to 4096 candidates).
// The block scores are fp32 (exp2 of the log2-domain logits), so near-ties may order differently
// from the fp32 CPU oracle. A verification pass gives NsaSelect one group per sequence (its K + 1
// queries); a prefill chunk groups of up to 16 consecutive tokens.
//   q          [num_tokens, num_q_heads, head_dim] bf16, device, in; row stride q_stride (RoPE'd)
//   o_cmp      [num_tokens, num_q_heads, head_dim] bf16, device, out; row stride o_cmp_stride
//   selections [num_tokens, num_kv_heads, S] int32, device, out (padding tokens: all -1); a
//              token that reuses at tokens.layer (tokens.refresh_every) keeps its rows
//   count      optional: a refresh token's own selection also into count->own_selections, a
//              reuse token's row all -1 (its top-S is still skipped: SsvLoadStats' overlap is
//              counted on refresh layers only, on the CPU too)
//   max_context  host: >= every position + 1 of the call (sizes the logits workspace)
//   workspace  >= NsaSelectWorkspaceBytes(num_tokens, num_splits, max_context, shape), 16-aligned
// cudaErrorInvalidValue for an unsupported shape, a misaligned pointer or stride, num_splits
// outside [1, 64], max_context / B > 4096, max_group_size outside [1, 16], a workspace too small;
// no tokens or no groups launch nothing.
size_t NsaSelectWorkspaceBytes(int64_t num_tokens, int32_t num_splits, int32_t max_context,
                               const NsaShape& shape);
// Splits of the compressed entries: one wave (about 8 warps per SM) over (group, kv head, row
// tile) CTAs, each split at least 64 entries of max_context / B, at most 64. Pure host arithmetic.
int32_t NsaSelectSplits(int32_t num_groups, int32_t max_group_size, int32_t max_context,
                        int32_t num_sms, const NsaShape& shape);
cudaError_t NsaSelect(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
                      const NsaTokens& tokens, const NsaGroups& groups, const NsaShape& shape,
                      int32_t max_context, int32_t num_splits, __nv_bfloat16* o_cmp,
                      int64_t o_cmp_stride, int32_t* selections, void* workspace,
                      size_t workspace_bytes, cudaStream_t stream,
                      const NsaLoadCount* count = nullptr);

// ---------------------------------------------------------------------------------------------
// Attend (SSV grouped; a group of one token is the per-query kernel). For each token t of group
// g and q head h: o_slc = softmax attention over the keys j <= p of the blocks of t's attended
// selection, o_swa = over the keys max(0, p - W + 1) .. p, and
//   out = sigmoid(gate[3h + 1]) o_slc + sigmoid(gate[3h]) o_cmp + sigmoid(gate[3h + 2]) o_swa.
// t's attended selection (per kv head) is selections[t] (mode exact, and reuse layers passing the
// selections kept from their refresh layer) or, with shared_selection, selections[first token of
// g] (SSV mode shared, for every group, or for the groups groups.flags marks kNsaGroupShared;
// engine/base/ssv.h forms a sequence's groups as chunks of C from its first verification token,
// and the caller's groups must match). Entries < 0 or past i are ignored; duplicates count once.
// Each (group, kv head) reads the UNION of its tokens' keys once: a plan kernel (NsaUnionKernel)
// merges the group's attended blocks and window blocks into an ascending block list with one bit
// per token (which tokens attend the block) and the block's physical pages; the verification
// mainloop (NsaSparseVariant of attention_verify.cuh) copies its split's entries into shared
// memory, then streams the list's keys through it, rows = (token, branch, q head) --
// 2 to 8 warps of 16 rows, so at nsa-8b shapes (16 q heads per kv head) one CTA holds 4 tokens'
// selected and window rows and loads each tile once for all of them -- each row with its own mask
// and online softmax, a warp skipping the tiles none of its rows sees; the list is split over
// CTAs (num_splits) for parallelism at batch 1; a combine kernel merges the splits by
// log-sum-exp and applies the gates. DRAM traffic is the union's keys (NsaProblem::AttendBytes in
// kernels/check/nsa_problem.h counts them), the math each token's own keys.
//   q            as NsaSelect
//   selections   [num_tokens, num_kv_heads, S] int32, device, in: each token's own selection
//   o_cmp        [num_tokens, num_q_heads, head_dim] bf16, device, in (NsaSelect's)
//   gate_logits  [num_tokens, gate_stride] bf16, device, in: column 3 h + j, j 0 compressed,
//                1 selected, 2 window, before the sigmoid
//   out          [num_tokens, num_q_heads, head_dim] bf16, device, out; row stride out_stride
//   max_context  host: >= every position + 1 of the call
//   workspace    >= NsaAttendWorkspaceBytes(num_tokens, groups.num_groups, groups.max_group_size,
//                num_splits, max_context, shape) bytes, device, 16-byte aligned
//   count        optional (both pointers set): the plan kernel adds the loads of the groups
//                flagged kNsaGroupCounted to count->counters (NsaLoadCounters), the overlap from
//                count->own_selections as NsaSelect wrote them for this layer
// Group positions must be consecutive (a group's union is sized for that: NsaMaxUnionBlocks).
// cudaErrorInvalidValue for an unsupported shape, a misaligned pointer or stride, num_splits
// outside [1, 64], max_context / B > 4096, max_group_size outside [1, 16], a workspace too small;
// no tokens or no groups launch nothing.
size_t NsaAttendWorkspaceBytes(int64_t num_tokens, int32_t num_groups, int32_t max_group_size,
                               int32_t num_splits, int32_t max_context, const NsaShape& shape);
// The most union blocks a group can read: min(blocks of max_context, C S + (W + C) / B + 2).
int32_t NsaMaxUnionBlocks(int32_t max_group_size, int32_t max_context, const NsaShape& shape);
// Splits of each group's union: one wave (about 8 warps per SM) over (group, kv head, row tile)
// CTAs, each split at least 128 keys of the largest union, at most 64. Pure host arithmetic.
int32_t NsaAttendSplits(int32_t num_groups, int32_t max_group_size, int32_t max_context,
                        int32_t num_sms, const NsaShape& shape);
cudaError_t NsaAttend(const __nv_bfloat16* q, int64_t q_stride, const NsaCache& cache,
                      const NsaTokens& tokens, const NsaGroups& groups, const int32_t* selections,
                      bool shared_selection, const __nv_bfloat16* o_cmp, int64_t o_cmp_stride,
                      const __nv_bfloat16* gate_logits, int64_t gate_stride, const NsaShape& shape,
                      int32_t max_context, int32_t num_splits, __nv_bfloat16* out,
                      int64_t out_stride, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream, const NsaLoadCount* count = nullptr);

}  // namespace specd::kernels
