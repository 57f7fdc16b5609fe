// Paged attention launchers for the CUDA backend (bf16 storage, fp32 math): the KV-cache write,
// decode attention with split-KV (flash-decoding) and ragged causal attention over the paged
// cache for prefill chunks and multi-token verification. References: kernels/ref/attention.h.
// Any host thread; work is queued on `stream` and never allocates (scratch comes from the
// caller's workspace), and no launch reads a host value that changes between steps, so a decode
// step captured in a CUDA graph replays correctly with new sequence lengths and block tables.
//
// KV cache layout, per layer ("HND" as FlashInfer calls it; each head of a block is one
// contiguous block_size x head_dim tile, so a CTA streams whole tiles):
//   k_cache, v_cache  [num_blocks, num_kv_heads, block_size, head_dim] bf16
// Token `pos` of a sequence lives in block block_table[pos / block_size], row pos % block_size.
// A slot is block_id * block_size + row.
// Vector access: q, out, key, value, the caches and the decode workspace are 16-byte aligned and
// their row strides multiples of 8 elements (WriteKvCache falls back to scalar copies otherwise;
// the attention launchers return cudaErrorInvalidValue). Kernels: attention.cuh.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstddef>
#include <cstdint>

struct __nv_bfloat16;  // cuda_bf16.h, which host-only callers need not include

namespace specd::kernels {

// Shapes shared by the attention launchers. head_dim is 64, 128 or 256 (what Llama, Qwen and
// Mistral use), or 16 or 32 (tiny test models); num_q_heads a multiple of num_kv_heads (GQA; MQA
// and MHA included).
struct AttentionShape {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;      // tokens per KV block: 16 (the engine's default), 32 or 64
  float scale = 0;             // softmax scale, 1/sqrt(head_dim) unless the model says otherwise
  int32_t sliding_window = 0;  // > 0: a query at position p sees keys in (p - window, p]; 0: all
};

// Writes the new tokens' K and V into the cache (vLLM reshape_and_cache_flash).
//   key, value   [num_tokens, num_kv_heads, head_dim] bf16, device, in; row strides key_stride,
//                value_stride elements (so they can point into the fused qkv projection output)
//   slot_mapping [num_tokens] int64, device, in: the slot of each token; < 0 skips the token
//   k_cache, v_cache  see the layout above, device, out
cudaError_t WriteKvCache(const __nv_bfloat16* key, int64_t key_stride, const __nv_bfloat16* value,
                         int64_t value_stride, const int64_t* slot_mapping, int64_t num_tokens,
                         const AttentionShape& shape, __nv_bfloat16* k_cache,
                         __nv_bfloat16* v_cache, cudaStream_t stream);

// Bytes of workspace PagedDecodeAttention needs for up to max_num_seqs sequences with
// num_splits KV splits each (partial outputs and log-sum-exps in fp32); 0 for one split, which
// writes `out` directly.
size_t PagedDecodeWorkspaceBytes(int32_t max_num_seqs, int32_t num_splits,
                                 const AttentionShape& shape);

// Split count a decode launch should use for num_seqs sequences of up to max_seq_len tokens on a
// GPU with num_sms multiprocessors: enough CTAs to fill the chip, no split shorter than a block.
// The CUDA-graph runner calls it once per batch-size bucket with the model's max_model_len.
// Policy: one CTA per (sequence, kv head, split) (two or more for GQA groups over 16 q heads);
// splits = the CTAs one wave of the chip holds at the kernel's occupancy / CTAs per split, or,
// where it is at least half of that, the largest count whose CTAs are a whole number per SM;
// capped so a split spans at least max(64 tokens, a block) of max_seq_len (or of the sliding
// window), at most 256, at least 1; then lowered to the fewest splits whose longest warp streams
// as many tiles (a CTA's warps share its split's tiles round-robin). Pure host arithmetic; no
// CUDA call.
int32_t ChooseDecodeSplits(int32_t num_seqs, int32_t max_seq_len, int32_t num_sms,
                           const AttentionShape& shape);

// One query token per sequence attends to the sequence's whole cached context (its own K/V
// already written by WriteKvCache), split over `num_splits` CTAs along the context, then merged
// by a second kernel through the log-sum-exps (flash-decoding; the merge kernel is a programmatic
// dependent launch on sm_90, so it overlaps the first kernel's tail). A split whose part of the
// context is empty writes an empty partial (lse = -inf); lengths come from the device, so one
// graph serves every length up to max_blocks_per_seq * block_size (longer lengths are clipped to
// it). A sequence with seq_len 0 (graph padding) gets a zero output.
//   q             [num_seqs, num_q_heads, head_dim] bf16, device, in; row stride q_stride
//   k_cache, v_cache  device, in
//   block_tables  [num_seqs, max_blocks_per_seq] int32, device, in
//   seq_lens      [num_seqs] int32, device, in: context length including the query token (>= 1)
//   out           [num_seqs, num_q_heads, head_dim] bf16, device, out; row stride out_stride
//   workspace     >= PagedDecodeWorkspaceBytes(num_seqs, num_splits, shape) bytes, device
// cudaErrorInvalidValue for an unsupported head_dim / block_size, a head count that is not a
// multiple, num_splits < 1 or > 256, a misaligned pointer or stride, or a workspace too small
// (ignored, may be null, with one split); num_seqs == 0 launches nothing.
cudaError_t PagedDecodeAttention(const __nv_bfloat16* q, int64_t q_stride,
                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                 const int32_t* block_tables, int32_t max_blocks_per_seq,
                                 const int32_t* seq_lens, int32_t num_seqs, int32_t num_splits,
                                 const AttentionShape& shape, __nv_bfloat16* out,
                                 int64_t out_stride, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream);

// Token-tree masks (speculative tree verification; engine/model/token_tree.h) for
// PagedPrefillAttention and PagedVerifyAttention. Sequence s's keys at slots >= tree_starts[s]
// are visible to query token t only where bit (key - tree_starts[s]) of its mask row is set
// (word (key - start) / 64, bit (key - start) % 64 of masks[t * mask_words ...]); keys before the
// start keep the causal rule (and every query still sees no key after its own slot). A sequence
// without a tree has tree_starts[s] >= its seq_len (e.g. INT32_MAX); its mask rows are not read.
// Bits past mask_words * 64 are invalid keys; a negative start counts as 0. The starts and masks
// are read on the device during the run, so a captured graph replays with new trees written to
// the same buffers.
struct AttentionTreeMask {
  const int32_t* tree_starts = nullptr;  // [num_seqs] int32, device
  const uint64_t* masks = nullptr;       // [num_tokens, mask_words] uint64, device
  int32_t mask_words = 0;                // 1 .. kMaxTreeMaskWords
};
inline constexpr int32_t kMaxTreeMaskWords = 16;  // trees of up to 1024 slots

// Longest query run (max_q_len) PagedPrefillAttention sends to the split-KV verification kernel
// (PagedVerifyAttention); longer runs take the prefill kernel.
inline constexpr int32_t kMaxVerifyQueryLen = 16;

// Bytes of workspace PagedPrefillAttention needs for up to max_num_tokens query tokens of up to
// max_num_seqs sequences: the largest PagedVerifyWorkspaceBytes of the split counts
// ChooseVerifySplits picks for runs of up to kMaxVerifyQueryLen queries, on the current device
// (0 where its multiprocessor count cannot be read). The prefill kernel needs none.
size_t PagedPrefillWorkspaceBytes(int64_t max_num_tokens, int32_t max_num_seqs,
                                  const AttentionShape& shape);

// Ragged causal attention over the paged cache: sequence s has q_lens[s] = cu_q_lens[s+1] -
// cu_q_lens[s] new query tokens at positions seq_lens[s] - q_len[s] ... seq_lens[s] - 1 (their
// K/V already written), and query i sees every cached key at a position <= its own (and inside
// the sliding window). Covers a whole prompt, a chunk of a long prompt after earlier chunks, and
// K+1 verification queries. Tensor cores (bf16 mma, fp32 accumulation), flash-attention-2 style
// online softmax over KV tiles.
//   q             [num_tokens, num_q_heads, head_dim] bf16, device, in; row stride q_stride
//   cu_q_lens     [num_seqs + 1] int32, device, in: prefix sums of query counts, cu_q_lens[0] = 0
//   seq_lens      [num_seqs] int32, device, in: context length after this step
//   block_tables  [num_seqs, max_blocks_per_seq] int32, device, in
//   max_q_len     the largest q_len (host; sizes the grid); queries past it are not computed
//                 (with max_q_len <= kMaxVerifyQueryLen their output rows are unspecified)
//   out           [num_tokens, num_q_heads, head_dim] bf16, device, out; row stride out_stride
//   workspace     device scratch of workspace_bytes (may be null with 0 bytes)
// max_q_len <= kMaxVerifyQueryLen and head_dim <= 128 (verification, decode through prefill):
// PagedVerifyAttention with ChooseVerifySplits' split count for the current device and a context of
// max_blocks_per_seq * block_size, lowered until PagedVerifyWorkspaceBytes fits the workspace
// (one split, which needs none, at worst). num_tokens must then equal cu_q_lens[num_seqs].
// Longer runs: grid (ceil(max_q_len / 64), num_q_heads, num_seqs); each CTA reads only the keys
// its 64 queries can see (causal tiles past the last query and tiles before the window are
// skipped); the workspace is unused.
//   tree          host pointer to a token-tree mask (above), or null: the causal mask alone.
//                 Both kernels honour it (the dispatch is the same); their tree variants mask
//                 the tiles that reach a tree, the dense ones run as without the argument.
// cudaErrorInvalidValue for an unsupported shape, a misaligned pointer or stride, or
// num_seqs / num_q_heads > 65535, and for a tree with a null pointer, masks not 8-byte aligned,
// mask_words outside [1, kMaxTreeMaskWords], or a sliding_window > 0; nothing to do (no tokens,
// sequences or queries) launches nothing.
cudaError_t PagedPrefillAttention(const __nv_bfloat16* q, int64_t q_stride,
                                  const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                  const int32_t* block_tables, int32_t max_blocks_per_seq,
                                  const int32_t* cu_q_lens, const int32_t* seq_lens,
                                  int32_t num_seqs, int64_t num_tokens, int32_t max_q_len,
                                  const AttentionShape& shape, __nv_bfloat16* out,
                                  int64_t out_stride, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream, const AttentionTreeMask* tree = nullptr);

// Bytes of workspace PagedVerifyAttention needs for num_tokens query tokens with num_splits KV
// splits (partial outputs and log-sum-exps in fp32); 0 for one split, which writes `out` directly.
size_t PagedVerifyWorkspaceBytes(int64_t num_tokens, int32_t num_splits,
                                 const AttentionShape& shape);

// Split count for a PagedVerifyAttention launch over num_seqs sequences of up to max_q_len
// queries and max_seq_len tokens on a GPU with num_sms multiprocessors: one wave of CTAs (4 per
// SM) over (sequence, kv head, row tile) CTAs per split, even where SMs then hold different
// numbers of CTAs; capped so a split spans at least 256 tokens of max_seq_len (or of the sliding
// window plus the run), at most 64, at least 1. Pure host arithmetic; no CUDA call.
int32_t ChooseVerifySplits(int32_t num_seqs, int32_t max_q_len, int32_t max_seq_len,
                           int32_t num_sms, const AttentionShape& shape);

// PagedPrefillAttention's contract (arguments, layouts, masking) for runs of up to
// kMaxVerifyQueryLen queries, split over the KV (flash-decoding): one CTA per (sequence, kv head,
// row tile, split) holds the run's queries times the kv head's q-head group as rows (16 per warp,
// up to 32 per CTA: more rows take more row tiles), so each CTA reads its share of the kv head's
// keys once for all of them; each row has its own causal limit. With num_splits > 1 the combine
// kernel of PagedDecodeAttention merges the splits per (token, q head) (a programmatic dependent
// launch on sm_90). Lengths come from the device; the grid depends only on num_seqs, max_q_len and
// num_splits.
//   workspace     >= PagedVerifyWorkspaceBytes(num_tokens, num_splits, shape) bytes, device,
//                 16-byte aligned (ignored, may be null, with one split)
// head_dim 16 to 128 (the head_dim 256 variants spilled registers: PagedPrefillAttention takes
// those to the prefill kernel). `tree` as for PagedPrefillAttention (a row's mask row is its
// query token's). cudaErrorInvalidValue as PagedPrefillAttention, and for head_dim 256,
// max_q_len > kMaxVerifyQueryLen, num_splits < 1 or > 256, or a workspace too small.
cudaError_t PagedVerifyAttention(const __nv_bfloat16* q, int64_t q_stride,
                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                 const int32_t* block_tables, int32_t max_blocks_per_seq,
                                 const int32_t* cu_q_lens, const int32_t* seq_lens,
                                 int32_t num_seqs, int64_t num_tokens, int32_t max_q_len,
                                 int32_t num_splits, const AttentionShape& shape,
                                 __nv_bfloat16* out, int64_t out_stride, void* workspace,
                                 size_t workspace_bytes, cudaStream_t stream,
                                 const AttentionTreeMask* tree = nullptr);

// Moves KV rows between slots of the paged cache, every layer and kv head: for each move i in
// order, slot to_slots[i] gets the K and V of slot from_slots[i] (later moves see earlier moves'
// writes, as the CPU's CpuKvCache::MoveSlots does). One allocation holds every layer:
// layer l's K cache at kv + l * layer_stride, its V cache at kv + l * layer_stride + v_offset
// (elements), each [num_blocks, num_kv_heads, block_size, head_dim] bf16 (the layout above).
//   from_slots, to_slots [num_moves] int64, device
// After tree verification, the accepted path's nodes move to the slots right after the prefix.
// A move with a negative slot is skipped; slots are the caller's to keep inside the cache. One
// launch of num_layers * num_kv_heads * 2 * head_dim / 8 threads, each owning one 16-byte
// column of one (layer, kv head, K or V) and copying it for every move in order, so a move sees
// earlier moves' writes without a barrier; graph-capturable, no allocation (kv_move.cuh).
// cudaErrorInvalidValue for an unsupported shape, num_moves or num_layers < 0, a null or
// misaligned (16-byte) kv, null slot arrays with moves, or a layer_stride / v_offset that is not
// a multiple of 8 elements; num_moves == 0 or num_layers == 0 launches nothing.
cudaError_t MoveKvSlots(const int64_t* from_slots, const int64_t* to_slots, int32_t num_moves,
                        __nv_bfloat16* kv, int32_t num_layers, int64_t layer_stride,
                        int64_t v_offset, const AttentionShape& shape, cudaStream_t stream);

}  // namespace specd::kernels
