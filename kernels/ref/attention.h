// References for the paged attention kernels (kernels/cuda/attention.h): the KV-cache write,
// decode attention and ragged causal attention (prefill chunks, verification) over the paged
// "HND" cache. They define what the kernels compute; tests run them in fp64 (the truth) and in
// fp32 (the same-precision baseline). Plain two-pass softmax, no tiling. Pure functions, any
// thread.
//
// Cache layout, per layer (as kernels/cuda/attention.h):
//   k_cache, v_cache  [num_blocks, num_kv_heads, block_size, head_dim] T
// Token `pos` of a sequence lives in block block_table[pos / block_size], row pos % block_size;
// a slot is block_id * block_size + row. q head h reads kv head h / (num_q_heads / num_kv_heads).
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// As kernels::AttentionShape (which host-only code without CUDA headers cannot name).
struct AttentionShape {
  int64_t num_q_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  double scale = 0;
  int64_t sliding_window = 0;  // > 0: a query at position p sees keys in (p - window, p]; 0: all
};

// How the softmax probabilities enter the P.V product. kExact keeps them in T. kBf16 rounds each
// probability to bf16 first while the normaliser sums the unrounded values: what a tensor-core
// kernel does (bf16 operands, fp32 accumulation), so the fp32 run with kBf16 is the
// same-precision baseline of such a kernel (flash-attention's test baseline likewise casts P to
// the input dtype before P.V).
enum class ProbRounding { kExact, kBf16 };

// Token-tree mask (speculative tree verification), as kernels::AttentionTreeMask with host
// arrays: sequence s's keys at slots >= tree_starts[s] are visible to query token t only where
// bit (key - start) % 64 of word (key - start) / 64 of masks[t * mask_words ...] is set; bits
// past mask_words * 64 are invalid keys. Keys before the start keep the causal rule, and no
// query sees a key after its own slot. tree_starts[s] >= seq_lens[s]: no tree (its mask rows are
// not read); a negative start counts as 0.
struct AttentionTreeMask {
  const int32_t* tree_starts = nullptr;  // [num_seqs] int32
  const uint64_t* masks = nullptr;       // [num_tokens, mask_words] uint64
  int64_t mask_words = 0;
};

// Copies each token's K and V rows to its slot; a negative slot skips the token.
//   key, value   [num_tokens, num_kv_heads, head_dim] T, in; row strides key_stride, value_stride
//   slot_mapping [num_tokens] int64, in
//   k_cache, v_cache  the layout above, in/out (other slots untouched)
template <typename T>
void WriteKvCache(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                  const int64_t* slot_mapping, int64_t num_tokens, const AttentionShape& shape,
                  T* k_cache, T* v_cache);

// One query per sequence at position seq_lens[s] - 1, attending to the sequence's cached keys
// (its own included, inside the sliding window).
//   q             [num_seqs, num_q_heads, head_dim] T, in; row stride q_stride
//   block_tables  [num_seqs, max_blocks_per_seq] int32, in
//   seq_lens      [num_seqs] int32, in: context length including the query token (>= 1)
//   out           [num_seqs, num_q_heads, head_dim] T, out; row stride out_stride
template <typename T>
void PagedDecodeAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                          const int32_t* block_tables, int64_t max_blocks_per_seq,
                          const int32_t* seq_lens, int64_t num_seqs, const AttentionShape& shape,
                          T* out, int64_t out_stride, ProbRounding rounding = ProbRounding::kExact);

// Ragged causal attention: sequence s has q_len = cu_q_lens[s+1] - cu_q_lens[s] queries at
// positions seq_lens[s] - q_len ... seq_lens[s] - 1 (rows cu_q_lens[s] ... of q and out); query
// at position p sees cached keys at positions <= p, inside the sliding window, and with a tree
// mask only the tree keys its mask row sets (a query seeing no key gets zeros).
//   q             [num_tokens, num_q_heads, head_dim] T, in; row stride q_stride
//   cu_q_lens     [num_seqs + 1] int32, in
//   seq_lens      [num_seqs] int32, in: context length after this step (>= q_len)
//   out           [num_tokens, num_q_heads, head_dim] T, out; row stride out_stride
//   tree          the token-tree mask above, or null (causal only)
template <typename T>
void PagedPrefillAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                           const int32_t* block_tables, int64_t max_blocks_per_seq,
                           const int32_t* cu_q_lens, const int32_t* seq_lens, int64_t num_seqs,
                           const AttentionShape& shape, T* out, int64_t out_stride,
                           ProbRounding rounding = ProbRounding::kExact,
                           const AttentionTreeMask* tree = nullptr);

// Moves KV rows between slots of every layer's paged cache (kernels::MoveKvSlots): for each move
// i in order, slot to_slots[i] of every kv head gets the K and V of slot from_slots[i] (later
// moves see earlier moves' writes); a move with a negative slot is skipped. Layer l's K cache
// starts at kv + l * layer_stride, its V cache at kv + l * layer_stride + v_offset (elements),
// each in the layout above. T = uint16_t moves bf16 bits.
//   from_slots, to_slots  [num_moves] int64, in
template <typename T>
void MoveKvSlots(const int64_t* from_slots, const int64_t* to_slots, int64_t num_moves, T* kv,
                 int64_t num_layers, int64_t layer_stride, int64_t v_offset,
                 const AttentionShape& shape);

extern template void WriteKvCache<float>(const float*, int64_t, const float*, int64_t,
                                         const int64_t*, int64_t, const AttentionShape&, float*,
                                         float*);
extern template void WriteKvCache<double>(const double*, int64_t, const double*, int64_t,
                                          const int64_t*, int64_t, const AttentionShape&, double*,
                                          double*);
extern template void PagedDecodeAttention<float>(const float*, int64_t, const float*, const float*,
                                                 const int32_t*, int64_t, const int32_t*, int64_t,
                                                 const AttentionShape&, float*, int64_t,
                                                 ProbRounding);
extern template void PagedDecodeAttention<double>(const double*, int64_t, const double*,
                                                  const double*, const int32_t*, int64_t,
                                                  const int32_t*, int64_t, const AttentionShape&,
                                                  double*, int64_t, ProbRounding);
extern template void PagedPrefillAttention<float>(const float*, int64_t, const float*, const float*,
                                                  const int32_t*, int64_t, const int32_t*,
                                                  const int32_t*, int64_t, const AttentionShape&,
                                                  float*, int64_t, ProbRounding,
                                                  const AttentionTreeMask*);
extern template void PagedPrefillAttention<double>(const double*, int64_t, const double*,
                                                   const double*, const int32_t*, int64_t,
                                                   const int32_t*, const int32_t*, int64_t,
                                                   const AttentionShape&, double*, int64_t,
                                                   ProbRounding, const AttentionTreeMask*);
extern template void MoveKvSlots<float>(const int64_t*, const int64_t*, int64_t, float*, int64_t,
                                        int64_t, int64_t, const AttentionShape&);
extern template void MoveKvSlots<double>(const int64_t*, const int64_t*, int64_t, double*, int64_t,
                                         int64_t, int64_t, const AttentionShape&);
extern template void MoveKvSlots<uint16_t>(const int64_t*, const int64_t*, int64_t, uint16_t*,
                                           int64_t, int64_t, int64_t, const AttentionShape&);

}  // namespace specd::kernels::ref
