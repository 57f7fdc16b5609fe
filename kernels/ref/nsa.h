// References for the NSA kernels (kernels/cuda/nsa.h): block compression into the compressed
// cache, the compressed branch with each query's own block selection, and the selected + window
// branches of SSV groups with the gates. The semantics are engine/model/nsa_attention.h's (the
// CPU oracle of the model family; kernels/ may not include it, so the rules are restated here).
// Plain loops over the paged "HND" cache of kernels/ref/attention.h and the compressed cache of
// nsa.h (entry c of a sequence in page table[e / page_size], row (e % page_size) / block_size, e
// = (c + 1) * block_size - 1); fp64 (the truth) and fp32 (the same-precision baseline). Pure
// functions, any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ref/attention.h"

namespace specd::kernels::ref {

// As kernels::NsaShape.
struct NsaShape {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t page_size = 0;
  int64_t block_size = 0;    // B
  int64_t block_counts = 0;  // S
  int64_t window_size = 0;   // W
  double scale = 0;
};

// Compressed entries per page: max(1, page_size / block_size).
int64_t NsaEntriesPerPage(const NsaShape& shape);
// Element offset of block c's entry (kv head `kv_head`) in cmp_k / cmp_v.
int64_t NsaEntryOffset(const int32_t* block_table, int64_t c, int64_t kv_head,
                       const NsaShape& shape);

// The blocks a query in `own_block` selects from `scores` ([own_block + 1]: the summed
// compressed probabilities, zero where a block is not complete) with `group` q heads per kv
// head: {0, own_block - 1, own_block} forced to score `group` (written into scores), then the
// top `count` by score, ties to the lower index (all of them while own_block < count), ascending.
template <typename T>
std::vector<int32_t> NsaTopBlocks(T* scores, int64_t own_block, int64_t group, int64_t count);

// For each token t (token_seqs[t] >= 0) whose position p ends a block ((p + 1) % B == 0): block
// c = p / B's mean key and value per kv head -- the sum of its B rows in position order (in T),
// divided by B -- into its entry of cmp_k / cmp_v (unrounded; a bf16 cache keeps RoundToBf16).
//   k_cache, v_cache  [num_pages, num_kv_heads, page_size, head_dim] T
//   cmp_k, cmp_v      [num_pages, num_kv_heads, entries_per_page, head_dim] T, in/out
template <typename T>
void NsaCompress(const T* k_cache, const T* v_cache, const int32_t* block_tables,
                 int64_t max_blocks_per_seq, const int32_t* positions, const int32_t* token_seqs,
                 int64_t num_tokens, const NsaShape& shape, T* cmp_k, T* cmp_v);

// For each token t (token_seqs[t] >= 0) at position p, every q head: o_cmp = softmax over the
// entries c < (p + 1) / B of scale q.k_c, times v_c (zeros while none is visible); per kv head
// its selection (NsaTopBlocks of the probabilities summed over the kv head's q heads in head
// order), -1 padded to S. Padding tokens: selections all -1, o_cmp untouched.
//   q            [num_tokens, num_q_heads, head_dim] T; row stride q_stride
//   o_cmp        [num_tokens, num_q_heads, head_dim] T, out; row stride o_cmp_stride
//   selections   [num_tokens, num_kv_heads, S] int32, out
//   block_scores null, or [num_tokens, num_kv_heads, score_stride] T, out: each token's scores
//                (forced entries included) for blocks 0 .. p / B (for near-tie checks)
template <typename T>
void NsaSelect(const T* q, int64_t q_stride, const T* cmp_k, const T* cmp_v,
               const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* positions,
               const int32_t* token_seqs, int64_t num_tokens, const NsaShape& shape, T* o_cmp,
               int64_t o_cmp_stride, int32_t* selections, T* block_scores, int64_t score_stride,
               ProbRounding rounding = ProbRounding::kExact);

// For each token t of each group (groups [num_groups, 2]: first token, count; padding tokens and
// empty groups skipped), q head h: o_slc over the keys j <= p of the blocks of its attended
// selection (selections[t], or selections[first token of the group] with shared_selection;
// entries < 0 ignored, duplicates once), o_swa over max(0, p - W + 1) .. p, and out =
// sigmoid(g[3h + 1]) o_slc + sigmoid(g[3h]) o_cmp + sigmoid(g[3h + 2]) o_swa.
//   gate_logits  [num_tokens, gate_stride] T
//   out          [num_tokens, num_q_heads, head_dim] T, out; row stride out_stride
template <typename T>
void NsaAttend(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
               const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* positions,
               const int32_t* token_seqs, const int32_t* groups, int64_t num_groups,
               const int32_t* selections, bool shared_selection, const T* o_cmp,
               int64_t o_cmp_stride, const T* gate_logits, int64_t gate_stride,
               const NsaShape& shape, T* out, int64_t out_stride,
               ProbRounding rounding = ProbRounding::kExact);

}  // namespace specd::kernels::ref
