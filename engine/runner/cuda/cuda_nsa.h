// The NSA family's attention on the CUDA backend (Native Sparse Attention, fla's NSAForCausalLM;
// semantics: engine/model/nsa_attention.h, the CPU oracle). CudaForward runs the family's layers
// as the dense ones (norms, one projection GEMM whose rows are q, k, v and the gate logits, RoPE
// and the KV write, o_proj, the MLP) and hands the attention to this class: per layer
//   kernels::NsaCompress  the blocks the step completes, averaged into the compressed cache;
//   kernels::NsaSelect    the compressed branch and each query's own block selection;
//   kernels::NsaAttend    the selected and window branches over the union of each group's
//                         blocks (SSV's grouped kernel, exact mode), gated.
// It owns the compressed cache (bf16 means beside the paged K/V, in the page holding each block's
// last position: kernels/cuda/nsa.h), the compressed branch's rows, the selections and the
// kernels' workspace. The runner lays out each step's token -> sequence map and its groups
// (ForwardArgs::nsa); every launch reads them from device memory, so steps replay from CUDA
// graphs. What the groups of SSV verification chunks read is counted on the device by every
// layer's NsaAttend into one fixed counter buffer (graph replays keep counting) and read back only
// when asked (LoadStats). Engine thread only.
#pragma once

#include <driver_types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/base/ssv.h"
#include "engine/model/model_config.h"
#include "kernels/cuda/nsa.h"

struct __nv_bfloat16;

namespace specd {

// One step's NSA inputs (device pointers; the runner's step layout).
struct ForwardNsa {
  const int32_t* token_seqs = nullptr;  // [num_tokens] each token's table row; < 0: padding
  const int32_t* groups = nullptr;      // [num_groups, 2] first token, count (kernels::NsaGroups)
  // SSV: each token's reuse schedule (kernels::NsaTokens::refresh_every; 1: every layer selects)
  // and each group's bits (kernels::NsaGroups::flags: shared mode; counted, a group of a chunk
  // with a strategy, whose loads ssv_load_stats reports); null: none.
  const int32_t* refresh_every = nullptr;  // [num_tokens]
  const uint8_t* group_flags = nullptr;    // [num_groups]
  int32_t num_groups = 0;
  int32_t max_group_size = 1;  // host: >= every group's count, <= kNsaMaxGroupSize
  int32_t max_context = 0;     // host: >= every position + 1 (max_model_len inside graphs)
};

class CudaNsaAttention {
 public:
  // Buffers for steps of up to max_tokens tokens in up to max_groups groups (the runner's
  // limits) and contexts of up to max_model_len, on the current device. InvalidArgument for a
  // shape the kernels cannot run.
  static absl::StatusOr<std::unique_ptr<CudaNsaAttention>> Create(const ModelConfig& config,
                                                                  int32_t page_size,
                                                                  int64_t max_tokens,
                                                                  int32_t max_model_len,
                                                                  int32_t num_sms);

  // Bytes of one page's compressed entries over every layer (added to the KV block's bytes).
  static int64_t CompressedBytesPerBlock(const ModelConfig& config, int32_t page_size);
  // The compressed cache for num_blocks pages, zero-filled.
  absl::Status AllocateKv(int32_t num_blocks);

  // The attention of `layer` for the step: q (RoPE'd) at qkv's columns [0, q_size), the gate
  // logits at [q_size + 2 kv_size, + 3 num_heads), row stride qkv_stride; the step's K/V already
  // in k_cache / v_cache; out [num_tokens, q_size] bf16.
  absl::Status Run(int32_t layer, const ForwardNsa& nsa, const int32_t* positions,
                   const int32_t* block_tables, int32_t max_blocks_per_seq, int64_t num_tokens,
                   const __nv_bfloat16* qkv, int64_t qkv_stride, const __nv_bfloat16* k_cache,
                   const __nv_bfloat16* v_cache, __nv_bfloat16* out, cudaStream_t stream);

  // The running totals of what the counted groups read (engine/base/ssv.h), copied back after
  // the work queued on `stream` (it synchronises the stream); the current device must be this
  // object's.
  absl::StatusOr<SsvLoadStats> LoadStats(cudaStream_t stream) const;

  const kernels::NsaShape& shape() const { return shape_; }
  int64_t buffer_bytes() const { return buffer_bytes_; }

 private:
  CudaNsaAttention(const ModelConfig& config, const kernels::NsaShape& shape, int64_t max_tokens,
                   int32_t max_model_len, int32_t num_sms);
  absl::Status AllocateBuffers();
  // The workspace either kernel needs for a step of num_tokens tokens in num_groups groups.
  size_t WorkspaceBytes(int64_t num_tokens, int32_t num_groups, int32_t max_group_size,
                        int32_t max_context) const;

  const ModelConfig config_;
  const kernels::NsaShape shape_;
  const int64_t max_tokens_;
  const int32_t max_model_len_;
  const int32_t num_sms_;
  cuda::DeviceMemory o_cmp_;       // [max_tokens, q_size] bf16
  cuda::DeviceMemory selections_;  // [max_tokens, num_kv_heads, S] int32
  // SSV load counting (kernels::NsaLoadCount): each token's own selection at the current layer
  // ([max_tokens, num_kv_heads, S] int32), the totals (one kernels::NsaLoadCounters, zeroed at
  // creation, never moved: graphs hold its address) and their host copy (pinned).
  cuda::DeviceMemory own_selections_;
  cuda::DeviceMemory counters_;
  cuda::PinnedMemory counters_host_;
  cuda::DeviceMemory workspace_;
  cuda::DeviceMemory cmp_;  // per layer: K means then V means, [blocks, kv_heads, epp, head_dim]
  std::vector<__nv_bfloat16*> cmp_k_, cmp_v_;  // [num_layers]
  int64_t buffer_bytes_ = 0;
};

}  // namespace specd
