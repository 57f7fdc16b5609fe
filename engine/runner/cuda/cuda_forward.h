// The transformer forward pass of the CUDA runner as a sequence of kernel launches on one stream:
// embedding, per layer (RMSNorm / fused residual add + RMSNorm, fused qkv GEMM (+ bias), per-head
// q/k norm + RoPE + KV write (one launch), paged decode or prefill attention, o_proj, fused add +
// norm, gate_up GEMM, SiLU-and-mul, down GEMM), final norm, then the LM head on the rows that are
// sampled. A family whose attention is not dense brings its own (NSA: CudaNsaAttention, which
// the fused projection also feeds the gate logits); the rest of its layer is the dense one.
// It owns the activation buffers, the paged bf16 KV cache, the RoPE table and the cuBLASLt
// handle; every launch reads its per-step inputs from device memory, so Run can be captured in a
// CUDA graph and replayed with new inputs. Engine thread only.
// Tensor parallelism (a Communicator on the device): the rank computes its heads and
// intermediate columns (TpShard) and the group meets in all-reduces after the vocabulary-parallel
// embedding, o_proj and down_proj, and in an all-gather of the vocabulary-parallel LM head; the
// collectives are enqueued on the same stream, so they are captured in the graphs too.
#pragma once

#include <driver_types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/base/communicator.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runner/cuda/cuda_nsa.h"
#include "engine/runner/cuda/cuda_weights.h"
#include "engine/runner/model_runner.h"  // kMaxSampleCandidates
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemm.h"

struct __half;  // cuda_fp16.h

namespace specd {

struct ForwardLimits {
  int64_t max_tokens = 0;     // tokens of one step (activation rows)
  int32_t max_seqs = 0;       // chunks of one step
  int32_t max_rows = 0;       // logits rows of one LM-head launch
  int32_t max_model_len = 0;  // positions of the RoPE table; decode split choice
  int32_t block_size = 16;
  int32_t max_decode_batch = 0;  // largest decode batch (the top CUDA-graph bucket)
};

// Vegas attention options of one eager step (the runner's ChunkAttention, on the device): the
// batch cut into runs of consecutive sequences that attend alike, one attention launch per run
// and layer, each over its own tokens as if it were a batch of its own.
struct ForwardVegas {
  enum class Kind {
    kDense,       // PagedPrefillAttention
    kScores,      // kernels::PagedVerifyAttentionWithScores
    kSparse,      // kernels::PagedSparseAttention
    kSlotSparse,  // kernels::PagedSparseAttention over the runner's selection slots
  };
  struct Segment {
    Kind kind = Kind::kDense;
    int32_t first_seq = 0;  // the run's sequences [first_seq, first_seq + num_seqs)
    int32_t num_seqs = 0;
    int64_t first_token = 0;  // its tokens [first_token, first_token + num_tokens)
    int64_t num_tokens = 0;
    int32_t max_q_len = 0;               // longest chunk
    int32_t max_keys = 0;                // most keys a query of the run sees (split choice)
    int32_t first_scored = 0;            // kScores: the scored index of its first sequence
    const int32_t* cu_q_lens = nullptr;  // [num_seqs + 1] int32, device, from 0
    int32_t fixed_splits = 0;            // > 0: the KV splits (else chosen from max_keys)
  };
  std::vector<Segment> segments;  // in batch order, covering every sequence
  // kScores: kernels::PagedVerifyAttentionWithScores' outputs, per layer its layout (score_parts
  // VegasScoreParts) for the num_scored sequences: [num_layers, num_scored, 2, score_parts,
  // score_stride] fp16 logits and [num_layers, num_scored, 2, score_parts, kVegasScoreSplits, 2]
  // f32 split statistics, device. A scored run takes at most kVegasScoreSplits KV splits.
  __half* score_logits = nullptr;
  float* score_stats = nullptr;
  int32_t num_scored = 0;
  int32_t score_parts = 0;
  int64_t score_stride = 0;
  // kSparse: per layer and sequence the attended prefix positions (rows of other kinds unused).
  const int32_t* indices = nullptr;  // [num_layers, num_seqs, index_stride] int32, device
  int64_t index_stride = 0;
  const int32_t* counts = nullptr;         // [num_layers, num_seqs] int32, device
  const int32_t* recent_starts = nullptr;  // [num_seqs] int32, device (kSparse, kSlotSparse)
  // kSlotSparse: the runner's selection slots (CudaRunner's slot_lists / slot_counts) and each
  // sequence's slot.
  const int32_t* slot_lists = nullptr;   // [num_layers, slot_rows, slot_stride] int32, device
  const int32_t* slot_counts = nullptr;  // [num_layers, slot_rows] int32, device
  int64_t slot_stride = 0;
  int64_t slot_rows = 0;
  const int32_t* slot_of_seq = nullptr;  // [num_seqs] int32, device
};

// One step's shape and its device inputs (all device pointers; see kernels/cuda/attention.h).
struct ForwardArgs {
  int64_t num_tokens = 0;
  int32_t num_seqs = 0;
  bool decode = false;                    // one query token per sequence: PagedDecodeAttention
  int32_t num_splits = 1;                 // decode: KV splits
  int32_t max_q_len = 0;                  // prefill: the longest chunk
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int64_t* slot_mapping = nullptr;  // [num_tokens]; < 0: do not write KV
  const int32_t* seq_lens = nullptr;      // [num_seqs] context after this step
  const int32_t* cu_q_lens = nullptr;     // [num_seqs + 1] prefill only
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  // Vegas options (eager steps only; null: every sequence dense). Overrides `decode`.
  const ForwardVegas* vegas = nullptr;
  // Token trees (eager steps, never `decode`): the attention's tree masks; null: none.
  const kernels::AttentionTreeMask* tree = nullptr;
  // NSA models (the family's attention, CudaNsaAttention): each token's sequence and the step's
  // groups. Unused by other families.
  ForwardNsa nsa;
};

// The RoPE table of RopeInvFreq(rope, head_dim) for positions [0, max_positions): [max_positions,
// head_dim] f32 cos | sin on the current device (kernels::BuildRopeCache), built synchronously.
absl::StatusOr<cuda::DeviceMemory> MakeRopeTable(const RopeConfig& rope, int32_t head_dim,
                                                 int32_t max_positions);
// A cuBLASLt GEMM with kGemmWorkspaceBytes of workspace (what PyTorch gives it on Hopper).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
absl::StatusOr<std::unique_ptr<kernels::Gemm>> MakeGemm();

class CudaForward {
 public:
  // Allocates activations, workspaces, the RoPE table and the cuBLASLt handle on the current
  // device. `config` is the whole model's, `weights` hold `shard` of it (LoadCudaWeights).
  // `comm`: null (one GPU, no collectives) or a device communicator of shard.world_size ranks;
  // `weights` and `comm` must outlive the object.
  static absl::StatusOr<std::unique_ptr<CudaForward>> Create(
      const ModelConfig& config, const TpShard& shard, Communicator* comm,
      const CudaWeights* weights, const ForwardLimits& limits, int32_t num_sms);

  // Bytes of one KV block over every layer (K and V, bf16; and an NSA model's compressed
  // entries) for `config`'s KV heads: pass the rank's LocalModelConfig under tensor parallelism.
  static int64_t KvBlockBytes(const ModelConfig& config, int32_t block_size);
  // Allocates the cache: num_blocks blocks, zero-filled (padding rows read block 0 of a scratch
  // block the caller reserves among them).
  absl::Status AllocateKv(int32_t num_blocks);

  const kernels::AttentionShape& attention_shape() const { return shape_; }
  int32_t max_blocks_per_seq() const { return max_blocks_per_seq_; }
  // KV splits a decode launch of num_seqs sequences uses; `max_seq_len` is the longest context
  // it may see (max_model_len inside graphs). Never more than the workspace holds.
  int32_t DecodeSplits(int32_t num_seqs, int32_t max_seq_len) const;
  // Whether the Vegas kernels (score collection, sparse attention) run this model's attention:
  // OK, or InvalidArgument saying what they lack.
  absl::Status SupportsVegas() const;
  // KV splits of a sparse attention launch over `num_seqs` one-token chunks whose queries see at
  // most `max_keys` keys (kernels::PagedSparseDecodeAttention: DecodeSplits' choice).
  int32_t SparseSplits(int32_t num_seqs, int32_t max_keys) const;

  // Embedding through the final norm: afterwards hidden() holds the normed final hidden state of
  // every token (the same on every rank).
  absl::Status Run(const ForwardArgs& args, cudaStream_t stream);
  // logits()[r] = LM head of hidden row rows[r] for r < num_rows (<= max_rows); with
  // gather == false the rows are hidden rows 0 .. num_rows - 1 and `rows` is unused. Under tensor
  // parallelism every rank gets the full rows (its vocabulary shard, all-gathered), or with
  // merge_k > 0 (VocabMergeK, the same on every rank) the rows merged from every shard's
  // merge_k best logits: those, and -inf elsewhere.
  absl::Status LmHead(const int32_t* rows, int32_t num_rows, int64_t num_tokens, bool gather,
                      int32_t merge_k, cudaStream_t stream);
  float* logits() const { return logits_.as<float>(); }  // [max_rows, vocab] f32, device

  // EAGLE-3: every Run also copies the residual stream at the input of layers `layer_ids` (0:
  // the embedding output) into `buffer`, [max_tokens, layer_ids.size() * hidden] bf16 (row t:
  // token t of the step, the layers side by side). Kept in graphs captured afterwards.
  void SetCapture(std::vector<int32_t> layer_ids, __nv_bfloat16* buffer) {
    capture_layers_ = std::move(layer_ids);
    capture_ = buffer;
  }

  // Token trees: every layer's K and V at slot from[i] copied to slot to[i], in order
  // (kernels::MoveKvSlots). from, to: [n] int64, device.
  absl::Status MoveKv(const int64_t* from, const int64_t* to, int32_t n, cudaStream_t stream);

  int64_t buffer_bytes() const { return buffer_bytes_; }
  int64_t kv_bytes() const { return static_cast<int64_t>(kv_.bytes()); }
  // The NSA family's attention (its SSV load counters); null for dense families.
  const CudaNsaAttention* nsa() const { return nsa_.get(); }

 private:
  CudaForward(const ModelConfig& config, const TpShard& shard, Communicator* comm,
              const CudaWeights* weights, const ForwardLimits& limits);
  absl::Status AllocateBuffers(int32_t num_sms);
  // comm_->AllReduceSum over `count` bf16 elements, or nothing without a communicator.
  absl::Status AllReduce(__nv_bfloat16* data, int64_t count, cudaStream_t stream, const char* what,
                         int32_t layer);
  // The row-parallel output h ([rows, hidden]) summed over the ranks, added into the residual x
  // and normalised with `norm` into h: one fused kernel where the communicator has it
  // (Communicator::AllReduceAddRmsNorm), else AllReduce then kernels::FusedAddRmsNorm.
  absl::Status AllReduceAddNorm(__nv_bfloat16* h, __nv_bfloat16* x, const __nv_bfloat16* norm,
                                int64_t rows, cudaStream_t stream, const char* what, int32_t layer);
  // The vocabulary-parallel LM head of `num_rows` rows of x: [num_rows, vocab_shard] per rank,
  // all-gathered and laid out as logits().
  absl::Status ParallelLmHead(const __nv_bfloat16* x, int32_t num_rows, int32_t merge_k,
                              cudaStream_t stream);
  // ParallelLmHead's merge of the rank's block `own` (row stride lm_stride_) by its k best.
  absl::Status MergeLmHead(const float* own, int32_t num_rows, int32_t merge_k,
                           cudaStream_t stream);
  absl::Status RunGemm(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                       const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k, void* y,
                       int64_t ldy, kernels::GemmOut out, cudaStream_t stream);
  absl::Status Attention(int32_t layer, const ForwardArgs& args, cudaStream_t stream);
  // Attention with Vegas options: one launch per segment of args.vegas.
  absl::Status VegasAttention(int32_t layer, const ForwardArgs& args, cudaStream_t stream);
  // One decoder layer: on entry h holds its input, normalised; on exit x holds the residual
  // stream and h the next layer's normalised input (after the last layer: the final norm's).
  absl::Status Layer(int32_t layer, const ForwardArgs& args, cudaStream_t stream);

  const ModelConfig config_;  // the rank's: its heads and intermediate columns (LocalModelConfig)
  const TpShard shard_;
  Communicator* const comm_;  // null: one GPU, no collectives
  const CudaWeights* weights_;
  const ForwardLimits limits_;
  kernels::AttentionShape shape_;
  int32_t max_blocks_per_seq_ = 0;
  int32_t num_sms_ = 0;
  int64_t qkv_stride_ = 0;  // q_size + 2 kv_size + gate_size
  // Row stride of a rank's LM-head block in gathered_logits_: vocab_shard rounded up to 16
  // (64-byte rows); the vocabulary itself at world size 1, where the block is logits_.
  int64_t lm_stride_ = 0;

  std::unique_ptr<kernels::Gemm> gemm_;
  cuda::DeviceMemory x_;         // [max_tokens, hidden] bf16 residual stream
  cuda::DeviceMemory h_;         // [max_tokens, hidden] bf16 normed input / sublayer output
  cuda::DeviceMemory qkv_;       // [max_tokens, q_size + 2 kv_size] bf16
  cuda::DeviceMemory attn_;      // [max_tokens, q_size] bf16
  cuda::DeviceMemory gate_up_;   // [max_tokens, 2 intermediate] bf16
  cuda::DeviceMemory act_;       // [max_tokens, intermediate] bf16
  cuda::DeviceMemory gathered_;  // [max_rows, hidden] bf16 rows fed to the LM head
  cuda::DeviceMemory logits_;    // [max_rows, vocab] f32
  // World size > 1: every rank's LM-head block, packed per call as [world_size, num_rows,
  // lm_stride_] f32 (columns past a rank's vocab_local are padding, never read).
  cuda::DeviceMemory gathered_logits_;  // [world_size * max_rows * lm_stride_] f32
  // The vocabulary merge (world_size > 1): the shard's best ids, their (logit, id) pairs, every
  // rank's pairs, and the top-k workspace.
  cuda::DeviceMemory merge_ids_;        // [max_rows, kMaxSampleCandidates] int32
  cuda::DeviceMemory merge_pairs_;      // [world_size, max_rows, kMaxSampleCandidates, 2] int32
  cuda::DeviceMemory merge_workspace_;  // kernels::TopKWorkspaceBytes
  cuda::DeviceMemory rope_;             // [max_model_len, head_dim] f32 cos | sin
  cuda::DeviceMemory workspace_;        // attention scratch (decode partials or prefill)
  cuda::DeviceMemory kv_;  // per layer: K then V, [num_blocks, kv_heads, block, head_dim]
  std::vector<__nv_bfloat16*> k_cache_;  // [num_layers]
  std::vector<__nv_bfloat16*> v_cache_;  // [num_layers]
  int64_t buffer_bytes_ = 0;
  // The family's attention where it is not the dense kernels' (NSA); null for dense families.
  std::unique_ptr<CudaNsaAttention> nsa_;
  std::vector<int32_t> capture_layers_;  // SetCapture
  __nv_bfloat16* capture_ = nullptr;
};

}  // namespace specd
