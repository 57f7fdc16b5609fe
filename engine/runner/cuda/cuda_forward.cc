#include "engine/runner/cuda/cuda_forward.h"

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/model/cpu_ops.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/vegas.h"
#include "kernels/cuda/vocab_merge.h"

namespace specd {
namespace {

// Launch failures name the kernel and the layer.
absl::Status Launch(cudaError_t e, const char* kernel, int32_t layer = -1) {
  if (e == cudaSuccess) return absl::OkStatus();
  return cuda::Check(
      e, layer < 0 ? std::string(kernel) : absl::StrCat(kernel, " (layer ", layer, ")"));
}

// p + elems for bf16 pointers (the type is incomplete outside nvcc).
__nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uint16_t*>(p) + elems);
}

}  // namespace

absl::StatusOr<cuda::DeviceMemory> MakeRopeTable(const RopeConfig& rope, int32_t head_dim,
                                                 int32_t max_positions) {
  const std::vector<float> inv_freq = RopeInvFreq(rope, head_dim);
  SPECD_ASSIGN_OR_RETURN(cuda::DeviceMemory inv,
                         cuda::DeviceMemory::Allocate(inv_freq.size() * 4, "RoPE frequencies"));
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpy(inv.as(), inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice),
      "upload of RoPE frequencies"));
  SPECD_ASSIGN_OR_RETURN(
      cuda::DeviceMemory table,
      cuda::DeviceMemory::Allocate(size_t{4} * max_positions * head_dim, "RoPE table"));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::BuildRopeCache(inv.as<float>(), head_dim, max_positions, table.as<float>(), nullptr),
      "BuildRopeCache"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(nullptr), "BuildRopeCache"));
  return table;
}

absl::StatusOr<std::unique_ptr<kernels::Gemm>> MakeGemm() {
  std::string error;
  std::unique_ptr<kernels::Gemm> gemm = kernels::Gemm::Create(kGemmWorkspaceBytes, &error);
  if (gemm == nullptr) return absl::InternalError(absl::StrCat("cuBLASLt: ", error));
  return gemm;
}

CudaForward::CudaForward(const ModelConfig& config, const TpShard& shard, Communicator* comm,
                         const CudaWeights* weights, const ForwardLimits& limits)
    : config_(LocalModelConfig(config, shard)),
      shard_(shard),
      comm_(comm),
      weights_(weights),
      limits_(limits) {
  shape_.num_q_heads = config_.num_heads;
  shape_.num_kv_heads = config_.num_kv_heads;
  shape_.head_dim = config_.head_dim;
  shape_.block_size = limits.block_size;
  shape_.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  shape_.sliding_window = config_.sliding_window;
  max_blocks_per_seq_ = (limits.max_model_len + limits.block_size - 1) / limits.block_size;
  // NSA's gate logits follow v in each row (CudaLayerWeights::qkv).
  qkv_stride_ =
      int64_t{config_.q_size()} + 2 * int64_t{config_.kv_size()} + int64_t{config_.gate_size()};
  lm_stride_ = shard.world_size == 1 ? config_.vocab_size : (shard.vocab_shard + 15) / 16 * 16;
}

int64_t CudaForward::KvBlockBytes(const ModelConfig& c, int32_t block_size) {
  const int64_t compressed =
      c.is_nsa() ? CudaNsaAttention::CompressedBytesPerBlock(c, block_size) : 0;
  return 2 * int64_t{c.num_layers} * c.num_kv_heads * block_size * c.head_dim * 2 + compressed;
}

absl::StatusOr<std::unique_ptr<CudaForward>> CudaForward::Create(
    const ModelConfig& config, const TpShard& shard, Communicator* comm, const CudaWeights* weights,
    const ForwardLimits& limits, int32_t num_sms) {
  if (comm != nullptr && (!comm->on_device() || comm->world_size() != shard.world_size ||
                          comm->rank() != shard.rank)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA forward: communicator ", comm->name(), " (rank ", comm->rank(), " of ",
                     comm->world_size(), ", ", comm->on_device() ? "device" : "host",
                     " memory) does not match tensor-parallel rank ", shard.rank, " of ",
                     shard.world_size, " on a GPU"));
  }
  if (comm == nullptr && shard.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA forward: tensor-parallel size ",
                                                   shard.world_size, " needs a communicator"));
  }
  std::unique_ptr<CudaForward> f(new CudaForward(config, shard, comm, weights, limits));
  SPECD_RETURN_IF_ERROR(f->AllocateBuffers(num_sms));
  return f;
}

int32_t CudaForward::DecodeSplits(int32_t num_seqs, int32_t max_seq_len) const {
  int32_t splits =
      std::max(1, kernels::ChooseDecodeSplits(num_seqs, max_seq_len, num_sms_, shape_));
  while (splits > 1 &&
         kernels::PagedDecodeWorkspaceBytes(num_seqs, splits, shape_) > workspace_.bytes()) {
    --splits;
  }
  return splits;
}

absl::Status CudaForward::AllocateBuffers(int32_t num_sms) {
  num_sms_ = num_sms;
  const int64_t t = limits_.max_tokens, hidden = config_.hidden_size;
  const int64_t inter = config_.intermediate_size;
  auto alloc = [this](cuda::DeviceMemory& m, int64_t bytes, const char* what) -> absl::Status {
    SPECD_ASSIGN_OR_RETURN(m, cuda::DeviceMemory::Allocate(static_cast<size_t>(bytes), what));
    buffer_bytes_ += bytes;
    return absl::OkStatus();
  };
  SPECD_RETURN_IF_ERROR(alloc(x_, t * hidden * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(h_, t * hidden * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(qkv_, t * qkv_stride_ * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(attn_, t * config_.q_size() * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(gate_up_, t * 2 * inter * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(act_, t * inter * 2, "activations"));
  SPECD_RETURN_IF_ERROR(alloc(gathered_, int64_t{limits_.max_rows} * hidden * 2, "activations"));
  SPECD_RETURN_IF_ERROR(
      alloc(logits_, int64_t{limits_.max_rows} * config_.vocab_size * 4, "logits"));
  if (shard_.world_size > 1) {
    SPECD_RETURN_IF_ERROR(alloc(gathered_logits_,
                                int64_t{shard_.world_size} * limits_.max_rows * lm_stride_ * 4,
                                "gathered logits"));
    const int64_t slots = int64_t{limits_.max_rows} * kMaxSampleCandidates;
    SPECD_RETURN_IF_ERROR(alloc(merge_ids_, slots * 4, "vocabulary merge"));
    SPECD_RETURN_IF_ERROR(
        alloc(merge_pairs_, int64_t{shard_.world_size} * slots * 8, "vocabulary merge"));
    const size_t ws = kernels::TopKWorkspaceBytes(
        limits_.max_rows, std::max<int32_t>(1, static_cast<int32_t>(weights_->vocab_rows)),
        std::min<int32_t>(kMaxSampleCandidates,
                          std::max<int32_t>(1, static_cast<int32_t>(weights_->vocab_rows))));
    if (ws > 0) {
      SPECD_RETURN_IF_ERROR(alloc(merge_workspace_, static_cast<int64_t>(ws), "vocabulary merge"));
    }
  }
  // Attention scratch: the largest decode batch at every split count it may use, or a prefill.
  size_t workspace = kernels::PagedPrefillWorkspaceBytes(t, limits_.max_seqs, shape_);
  for (int32_t n = 1; n <= limits_.max_decode_batch; ++n) {
    const int32_t splits =
        std::max(1, kernels::ChooseDecodeSplits(n, limits_.max_model_len, num_sms_, shape_));
    workspace = std::max(workspace, kernels::PagedDecodeWorkspaceBytes(n, splits, shape_));
  }
  SPECD_RETURN_IF_ERROR(alloc(workspace_, static_cast<int64_t>(workspace), "attention workspace"));
  if (config_.is_nsa()) {
    SPECD_ASSIGN_OR_RETURN(nsa_, CudaNsaAttention::Create(config_, limits_.block_size, t,
                                                          limits_.max_model_len, num_sms_));
    buffer_bytes_ += nsa_->buffer_bytes();
  }
  // RoPE table, built once from the model's (scaled) inverse frequencies as the CPU path does.
  SPECD_ASSIGN_OR_RETURN(rope_,
                         MakeRopeTable(config_.rope, config_.head_dim, limits_.max_model_len));
  buffer_bytes_ += static_cast<int64_t>(rope_.bytes());
  SPECD_ASSIGN_OR_RETURN(gemm_, MakeGemm());
  buffer_bytes_ += static_cast<int64_t>(kGemmWorkspaceBytes);
  return absl::OkStatus();
}

absl::Status CudaForward::AllocateKv(int32_t num_blocks) {
  const int64_t layer_bytes =
      int64_t{num_blocks} * config_.num_kv_heads * limits_.block_size * config_.head_dim * 2;
  SPECD_ASSIGN_OR_RETURN(
      kv_, cuda::DeviceMemory::Allocate(static_cast<size_t>(2 * layer_bytes * config_.num_layers),
                                        "KV cache"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemset(kv_.as(), 0, kv_.bytes()), "KV cache zero-fill"));
  k_cache_.clear();
  v_cache_.clear();
  uint8_t* base = kv_.as<uint8_t>();
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    k_cache_.push_back(reinterpret_cast<__nv_bfloat16*>(base + (2 * l) * layer_bytes));
    v_cache_.push_back(reinterpret_cast<__nv_bfloat16*>(base + (2 * l + 1) * layer_bytes));
  }
  return nsa_ != nullptr ? nsa_->AllocateKv(num_blocks) : absl::OkStatus();
}

absl::Status CudaForward::RunGemm(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                  const __nv_bfloat16* bias, int64_t m, int64_t n, int64_t k,
                                  void* y, int64_t ldy, kernels::GemmOut out, cudaStream_t stream) {
  std::string error;
  if (gemm_->Run(x, ldx, w, bias, m, n, k, y, ldy, out, stream, &error)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("GEMM [", m, ", ", k, "] x [", n, ", ", k, "]^T: ", error));
}

absl::Status CudaForward::SupportsVegas() const {
  if (nsa_ != nullptr) {
    return absl::InvalidArgumentError(
        "attention options (Vegas score collection, sparse attention) are not supported by NSA "
        "models");
  }
  const int32_t group = shape_.num_q_heads / shape_.num_kv_heads;
  if (shape_.head_dim > 128 || shape_.sliding_window != 0 || group > 16 || shard_.world_size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention options (Vegas score collection, sparse attention) need head_dim <= 128 (this "
        "model: ",
        shape_.head_dim, "), no sliding window (", shape_.sliding_window,
        "), at most 16 query heads per KV head (", group, ") and no tensor parallelism (",
        shard_.world_size, " ranks)"));
  }
  return absl::OkStatus();
}

int32_t CudaForward::SparseSplits(int32_t num_seqs, int32_t max_keys) const {
  return DecodeSplits(num_seqs, max_keys);  // kernels::PagedSparseDecodeAttention's grid
}

// Each segment runs as a batch of its own: q, out and cu_q_lens start at its first token, so the
// split-KV workspace and its combine cover only its rows.
absl::Status CudaForward::VegasAttention(int32_t layer, const ForwardArgs& a, cudaStream_t stream) {
  const ForwardVegas& v = *a.vegas;
  using Kind = ForwardVegas::Kind;
  for (const ForwardVegas::Segment& seg : v.segments) {
    const __nv_bfloat16* q = Offset(qkv_.as<__nv_bfloat16>(), seg.first_token * qkv_stride_);
    __nv_bfloat16* out = Offset(attn_.as<__nv_bfloat16>(), seg.first_token * config_.q_size());
    const int32_t* tables = a.block_tables + int64_t{seg.first_seq} * max_blocks_per_seq_;
    const int32_t* seq_lens = a.seq_lens + seg.first_seq;
    if (seg.kind == Kind::kDense) {
      // Token trees beside Vegas chunks: the segment's own rows of the step's masks.
      kernels::AttentionTreeMask tree;
      if (a.tree != nullptr) {
        tree = *a.tree;
        tree.tree_starts += seg.first_seq;
        tree.masks += seg.first_token * tree.mask_words;
      }
      SPECD_RETURN_IF_ERROR(Launch(
          kernels::PagedPrefillAttention(q, qkv_stride_, k_cache_[layer], v_cache_[layer], tables,
                                         max_blocks_per_seq_, seg.cu_q_lens, seq_lens, seg.num_seqs,
                                         seg.num_tokens, seg.max_q_len, shape_, out,
                                         config_.q_size(), workspace_.as(), workspace_.bytes(),
                                         stream, a.tree != nullptr ? &tree : nullptr),
          "PagedPrefillAttention (Vegas step)", layer));
      continue;
    }
    if ((seg.kind == Kind::kSparse || seg.kind == Kind::kSlotSparse) && seg.max_q_len == 1) {
      // One query per sequence (a draft step): the decode kernel over the key lists.
      const bool slots = seg.kind == Kind::kSlotSparse;
      const int64_t rows =
          slots ? int64_t{layer} * v.slot_rows : int64_t{layer} * a.num_seqs + seg.first_seq;
      const int64_t stride = slots ? v.slot_stride : v.index_stride;
      const int32_t* lists = (slots ? v.slot_lists : v.indices) + rows * stride;
      const int32_t* counts = (slots ? v.slot_counts : v.counts) + rows;
      const int32_t splits =
          seg.fixed_splits > 0 ? seg.fixed_splits : SparseSplits(seg.num_seqs, seg.max_keys);
      SPECD_RETURN_IF_ERROR(
          Launch(kernels::PagedSparseDecodeAttention(
                     q, qkv_stride_, k_cache_[layer], v_cache_[layer], tables, max_blocks_per_seq_,
                     seq_lens, lists, stride, counts, v.recent_starts + seg.first_seq,
                     slots ? v.slot_of_seq + seg.first_seq : nullptr, seg.num_seqs, splits, shape_,
                     out, config_.q_size(), workspace_.as(), workspace_.bytes(), stream),
                 "PagedSparseDecodeAttention", layer));
      continue;
    }
    int32_t splits = seg.fixed_splits;
    if (splits <= 0) {
      splits = std::max(1, kernels::ChooseVerifySplits(seg.num_seqs, seg.max_q_len, seg.max_keys,
                                                       num_sms_, shape_));
      while (splits > 1 && kernels::PagedVerifyWorkspaceBytes(seg.num_tokens, splits, shape_) >
                               workspace_.bytes()) {
        --splits;
      }
    }
    if (seg.kind == Kind::kSlotSparse) {
      const int64_t rows = int64_t{layer} * v.slot_rows;
      SPECD_RETURN_IF_ERROR(
          Launch(kernels::PagedSparseAttention(
                     q, qkv_stride_, k_cache_[layer], v_cache_[layer], tables, max_blocks_per_seq_,
                     seg.cu_q_lens, seq_lens, v.slot_lists + rows * v.slot_stride, v.slot_stride,
                     v.slot_counts + rows, v.recent_starts + seg.first_seq, seg.num_seqs,
                     seg.num_tokens, seg.max_q_len, splits, shape_, out, config_.q_size(),
                     workspace_.as(), workspace_.bytes(), stream, v.slot_of_seq + seg.first_seq),
                 "PagedSparseAttention (selection slots)", layer));
      continue;
    }
    if (seg.kind == Kind::kScores) {
      const int64_t rows = (int64_t{layer} * v.num_scored + seg.first_scored) * 2 * v.score_parts;
      SPECD_RETURN_IF_ERROR(
          Launch(kernels::PagedVerifyAttentionWithScores(
                     q, qkv_stride_, k_cache_[layer], v_cache_[layer], tables, max_blocks_per_seq_,
                     seg.cu_q_lens, seq_lens, seg.num_seqs, seg.num_tokens, seg.max_q_len,
                     std::min(splits, kernels::kVegasScoreSplits), shape_, out, config_.q_size(),
                     v.score_logits + rows * v.score_stride,
                     v.score_stats + rows * kernels::kVegasScoreSplits * 2, v.score_stride,
                     workspace_.as(), workspace_.bytes(), stream),
                 "PagedVerifyAttentionWithScores", layer));
      continue;
    }
    const int64_t row = int64_t{layer} * a.num_seqs + seg.first_seq;
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::PagedSparseAttention(
                   q, qkv_stride_, k_cache_[layer], v_cache_[layer], tables, max_blocks_per_seq_,
                   seg.cu_q_lens, seq_lens, v.indices + row * v.index_stride, v.index_stride,
                   v.counts + row, v.recent_starts + seg.first_seq, seg.num_seqs, seg.num_tokens,
                   seg.max_q_len, splits, shape_, out, config_.q_size(), workspace_.as(),
                   workspace_.bytes(), stream),
               "PagedSparseAttention", layer));
  }
  return absl::OkStatus();
}

absl::Status CudaForward::Attention(int32_t layer, const ForwardArgs& a, cudaStream_t stream) {
  auto* qkv = qkv_.as<__nv_bfloat16>();
  auto* attn = attn_.as<__nv_bfloat16>();
  if (nsa_ != nullptr) {
    if (a.vegas != nullptr || a.tree != nullptr) {
      return absl::InvalidArgumentError("NSA models run neither attention options nor token trees");
    }
    return nsa_->Run(layer, a.nsa, a.positions, a.block_tables, max_blocks_per_seq_, a.num_tokens,
                     qkv, qkv_stride_, k_cache_[layer], v_cache_[layer], attn, stream);
  }
  if (a.vegas != nullptr) return VegasAttention(layer, a, stream);
  if (a.decode) {
    return Launch(kernels::PagedDecodeAttention(
                      qkv, qkv_stride_, k_cache_[layer], v_cache_[layer], a.block_tables,
                      max_blocks_per_seq_, a.seq_lens, a.num_seqs, a.num_splits, shape_, attn,
                      config_.q_size(), workspace_.as(), workspace_.bytes(), stream),
                  "PagedDecodeAttention", layer);
  }
  return Launch(
      kernels::PagedPrefillAttention(
          qkv, qkv_stride_, k_cache_[layer], v_cache_[layer], a.block_tables, max_blocks_per_seq_,
          a.cu_q_lens, a.seq_lens, a.num_seqs, a.num_tokens, a.max_q_len, shape_, attn,
          config_.q_size(), workspace_.as(), workspace_.bytes(), stream, a.tree),
      a.tree != nullptr ? "PagedPrefillAttention (token trees)" : "PagedPrefillAttention", layer);
}

absl::Status CudaForward::MoveKv(const int64_t* from, const int64_t* to, int32_t n,
                                 cudaStream_t stream) {
  if (n <= 0 || k_cache_.empty()) return absl::OkStatus();
  // AllocateKv's layout: layer l's K at 2 l layer elements, its V one layer later.
  const int64_t layer_elems = static_cast<int64_t>(kv_.bytes()) / 2 / (2 * config_.num_layers);
  return Launch(kernels::MoveKvSlots(from, to, n, k_cache_[0], config_.num_layers, 2 * layer_elems,
                                     layer_elems, shape_, stream),
                "MoveKvSlots");
}

absl::Status CudaForward::Layer(int32_t l, const ForwardArgs& a, cudaStream_t stream) {
  const CudaLayerWeights& w = weights_->layers[l];
  const int64_t n = a.num_tokens, hidden = config_.hidden_size, inter = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  auto* x = x_.as<__nv_bfloat16>();
  auto* h = h_.as<__nv_bfloat16>();
  auto* qkv = qkv_.as<__nv_bfloat16>();
  auto* k = Offset(qkv, config_.q_size());
  auto* v = Offset(k, config_.kv_size());
  SPECD_RETURN_IF_ERROR(RunGemm(h, hidden, w.qkv, w.qkv_bias, n, qkv_stride_, hidden, qkv,
                                qkv_stride_, kernels::GemmOut::kBf16, stream));
  // Qwen3's q_norm / k_norm (where the model has them), RoPE and the KV write: one launch.
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::RopeAndWriteKvCache(a.positions, n, qkv, qkv_stride_, k, qkv_stride_, v,
                                          qkv_stride_, config_.head_dim, rope_.as<float>(),
                                          config_.qk_norm ? w.q_norm : nullptr,
                                          config_.qk_norm ? w.k_norm : nullptr, eps, a.slot_mapping,
                                          shape_, k_cache_[l], v_cache_[l], stream),
             "RopeAndWriteKvCache", l));
  SPECD_RETURN_IF_ERROR(Attention(l, a, stream));
  SPECD_RETURN_IF_ERROR(RunGemm(attn_.as<__nv_bfloat16>(), config_.q_size(), w.o_proj, w.o_bias, n,
                                hidden, config_.q_size(), h, hidden, kernels::GemmOut::kBf16,
                                stream));
  // Row-parallel o_proj: each rank holds a partial sum over its heads (rank 0's has the bias).
  SPECD_RETURN_IF_ERROR(AllReduceAddNorm(h, x, w.post_norm, n, stream, "o_proj", l));
  auto* gate_up = gate_up_.as<__nv_bfloat16>();
  auto* act = act_.as<__nv_bfloat16>();
  SPECD_RETURN_IF_ERROR(RunGemm(h, hidden, w.gate_up, nullptr, n, 2 * inter, hidden, gate_up,
                                2 * inter, kernels::GemmOut::kBf16, stream));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::SiluAndMul(gate_up, n, inter, act, stream), "SiluAndMul", l));
  SPECD_RETURN_IF_ERROR(RunGemm(act, inter, w.down, nullptr, n, hidden, inter, h, hidden,
                                kernels::GemmOut::kBf16, stream));
  // Row-parallel down_proj, summed into x and normalised for the next layer (or the LM head).
  const __nv_bfloat16* next_norm =
      l + 1 < config_.num_layers ? weights_->layers[l + 1].input_norm : weights_->final_norm;
  return AllReduceAddNorm(h, x, next_norm, n, stream, "down_proj", l);
}

absl::Status CudaForward::AllReduceAddNorm(__nv_bfloat16* h, __nv_bfloat16* x,
                                           const __nv_bfloat16* norm, int64_t rows,
                                           cudaStream_t stream, const char* what, int32_t layer) {
  const int64_t hidden = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  if (comm_ != nullptr && comm_->FusesAllReduceAddRmsNorm(rows, hidden)) {
    const absl::Status s = comm_->AllReduceAddRmsNorm(h, x, norm, rows, hidden, eps, stream);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("all-reduce + RMSNorm after ", what, " (layer ",
                                               layer, "): ", s.message()));
  }
  SPECD_RETURN_IF_ERROR(AllReduce(h, rows * hidden, stream, what, layer));
  return Launch(kernels::FusedAddRmsNorm(h, x, norm, rows, hidden, eps, h, stream),
                "FusedAddRmsNorm", layer);
}

absl::Status CudaForward::Run(const ForwardArgs& a, cudaStream_t stream) {
  const int64_t hidden = config_.hidden_size;
  // Vocabulary-parallel: ids outside the rank's rows give zero rows, the all-reduce the lookup.
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::EmbeddingGather(a.token_ids, a.num_tokens, weights_->embed, weights_->vocab_begin,
                               weights_->vocab_rows, hidden, x_.as<__nv_bfloat16>(), stream),
      "EmbeddingGather"));
  SPECD_RETURN_IF_ERROR(
      AllReduce(x_.as<__nv_bfloat16>(), a.num_tokens * hidden, stream, "embedding", -1));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::RmsNorm(x_.as<__nv_bfloat16>(), weights_->layers[0].input_norm, a.num_tokens, hidden,
                       static_cast<float>(config_.rms_norm_eps), h_.as<__nv_bfloat16>(), stream),
      "RmsNorm", 0));
  const auto num_captured = static_cast<int64_t>(capture_layers_.size());
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    for (int64_t i = 0; i < num_captured && capture_ != nullptr; ++i) {
      if (capture_layers_[i] != l) continue;
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpy2DAsync(Offset(capture_, i * hidden), size_t(2 * num_captured * hidden),
                            x_.as<__nv_bfloat16>(), size_t(2 * hidden), size_t(2 * hidden),
                            size_t(a.num_tokens), cudaMemcpyDeviceToDevice, stream),
          absl::StrCat("capture of layer ", l, "'s input")));
    }
    SPECD_RETURN_IF_ERROR(Layer(l, a, stream));
  }
  return absl::OkStatus();  // h holds the final norm's output (the last Layer's AllReduceAddNorm)
}

absl::Status CudaForward::LmHead(const int32_t* rows, int32_t num_rows, int64_t num_tokens,
                                 bool gather, int32_t merge_k, cudaStream_t stream) {
  const int64_t hidden = config_.hidden_size;
  const __nv_bfloat16* src = h_.as<__nv_bfloat16>();
  if (gather) {
    auto* dst = gathered_.as<__nv_bfloat16>();
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::EmbeddingGather(rows, num_rows, src, 0, num_tokens, hidden, dst, stream),
               "EmbeddingGather (logits rows)"));
    src = dst;
  }
  if (comm_ != nullptr) return ParallelLmHead(src, num_rows, merge_k, stream);
  return RunGemm(src, hidden, weights_->lm_head, nullptr, num_rows, config_.vocab_size, hidden,
                 logits_.as<float>(), config_.vocab_size, kernels::GemmOut::kF32, stream);
}

absl::Status CudaForward::AllReduce(__nv_bfloat16* data, int64_t count, cudaStream_t stream,
                                    const char* what, int32_t layer) {
  if (comm_ == nullptr || count == 0) return absl::OkStatus();
  const absl::Status s =
      comm_->AllReduceSum(data, static_cast<size_t>(count), CommDataType::kBF16, stream);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("all-reduce after ", what,
                                             layer < 0 ? "" : absl::StrCat(" (layer ", layer, ")"),
                                             ": ", s.message()));
}

// Rank r's block [num_rows, vocab_rows] (row stride lm_stride_) is written in place at row r of
// the gather buffer, the all-gather fills the other ranks' blocks, and one strided copy per rank
// puts its columns at [r * vocab_shard, r * vocab_shard + its vocab_local) of logits_. At world
// size 1 the block is logits_ itself and nothing moves.
absl::Status CudaForward::ParallelLmHead(const __nv_bfloat16* x, int32_t num_rows, int32_t merge_k,
                                         cudaStream_t stream) {
  const int64_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  const int64_t count = int64_t{num_rows} * lm_stride_;  // elements of one rank's block
  const int32_t world = shard_.world_size;
  float* gathered = world == 1 ? logits_.as<float>() : gathered_logits_.as<float>();
  float* own = gathered + shard_.rank * count;
  if (weights_->vocab_rows > 0) {
    SPECD_RETURN_IF_ERROR(RunGemm(x, hidden, weights_->lm_head, nullptr, num_rows,
                                  weights_->vocab_rows, hidden, own, lm_stride_,
                                  kernels::GemmOut::kF32, stream));
  }
  if (count == 0) return absl::OkStatus();
  if (merge_k > 0 && world > 1) return MergeLmHead(own, num_rows, merge_k, stream);
  const absl::Status s =
      comm_->AllGather(own, gathered, static_cast<size_t>(count), CommDataType::kF32, stream);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("all-gather of logits: ", s.message()));
  if (world == 1) return absl::OkStatus();
  for (int32_t r = 0; r < world; ++r) {
    const int64_t begin = r * shard_.vocab_shard;
    const int64_t cols = std::clamp<int64_t>(vocab - begin, 0, shard_.vocab_shard);
    if (cols == 0) continue;
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpy2DAsync(logits_.as<float>() + begin, static_cast<size_t>(vocab) * 4,
                                      gathered + r * count, static_cast<size_t>(lm_stride_) * 4,
                                      static_cast<size_t>(cols) * 4, static_cast<size_t>(num_rows),
                                      cudaMemcpyDeviceToDevice, stream),
                    "re-layout of gathered logits"));
  }
  return absl::OkStatus();
}

// Each rank's merge_k best (logit, global id) of every row are gathered (world * rows * k pairs
// instead of world * rows * vocab_shard logits) and scattered into -inf rows.
absl::Status CudaForward::MergeLmHead(const float* own, int32_t num_rows, int32_t merge_k,
                                      cudaStream_t stream) {
  if (merge_k > kMaxSampleCandidates) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary merge of ", merge_k,
                                                   " candidates; at most ", kMaxSampleCandidates));
  }
  const auto local = static_cast<int32_t>(weights_->vocab_rows);
  const int32_t kept = std::min(merge_k, local);
  auto* ids = merge_ids_.as<int32_t>();
  if (kept == 1) {
    SPECD_RETURN_IF_ERROR(Launch(kernels::ArgmaxRows(own, lm_stride_, num_rows, local, ids, stream),
                                 "ArgmaxRows (merge)"));
  } else if (kept > 1) {
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::TopKRows(own, lm_stride_, num_rows, local, kept, ids,
                                 merge_workspace_.as<void>(), merge_workspace_.bytes(), stream),
               "TopKRows (merge)"));
  }
  const int64_t count = int64_t{num_rows} * merge_k * 2;  // int32 per rank
  int32_t* pairs = merge_pairs_.as<int32_t>();
  int32_t* mine = pairs + shard_.rank * count;
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::PackShardCandidates(own, lm_stride_, num_rows, merge_k, ids, kept,
                                          static_cast<int32_t>(shard_.rank * shard_.vocab_shard),
                                          mine, stream),
             "PackShardCandidates"));
  const absl::Status s =
      comm_->AllGather(mine, pairs, static_cast<size_t>(count), CommDataType::kI32, stream);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("all-gather of logits candidates: ", s.message()));
  }
  return Launch(kernels::ScatterShardCandidates(pairs, shard_.world_size, num_rows, merge_k,
                                                static_cast<int32_t>(config_.vocab_size),
                                                logits_.as<float>(), config_.vocab_size, stream),
                "ScatterShardCandidates");
}

}  // namespace specd
