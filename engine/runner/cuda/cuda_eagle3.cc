#include "engine/runner/cuda/cuda_eagle3.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/base/float16.h"
#include "engine/base/log.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/model/token_tree.h"
#include "engine/runner/cuda/cuda_forward.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"

namespace specd {
namespace {

constexpr int64_t kAlign = 256;
// Rows of one piece of a pass (its activation buffers); larger passes run in pieces.
constexpr int32_t kMaxPieceRows = 1024;
// Random weights of load_format "dummy": as the target's (cuda_weights.cc).
constexpr float kDummyRange = 0.02f;
constexpr uint64_t kDummySeed = 0xea61e3;

absl::Status Launch(cudaError_t e, const char* kernel) {
  if (e == cudaSuccess) return absl::OkStatus();
  return cuda::Check(e, absl::StrCat("EAGLE-3 head: ", kernel));
}

__nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uint16_t*>(p) + elems);
}

}  // namespace

CudaEagle3Compute::~CudaEagle3Compute() {
  cudaSetDevice(options_.device);
  if (options_.stream != nullptr) cudaStreamSynchronize(options_.stream);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : chain_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : round_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : sampled_chain_graphs_) cudaGraphExecDestroy(exec);
  for (auto& [key, exec] : sampled_round_graphs_) cudaGraphExecDestroy(exec);
  if (rounds_in_graph_ + chains_in_graph_ + sampled_rounds_in_graph_ + sampled_chains_in_graph_ >
      0) {
    SPECD_LOG_INFO(
        "EAGLE-3 head: {} greedy rounds in one graph, {} chained graphs after an eager "
        "catch-up; sampled: {} rounds in one graph, {} chained graphs",
        rounds_in_graph_, chains_in_graph_, sampled_rounds_in_graph_, sampled_chains_in_graph_);
  }
  if (owns_stream_ && options_.stream != nullptr) cudaStreamDestroy(options_.stream);
}

absl::StatusOr<std::unique_ptr<CudaEagle3Compute>> CudaEagle3Compute::Create(
    const Options& options) {
  std::unique_ptr<CudaEagle3Compute> c(new CudaEagle3Compute(options));
  absl::Status s = c->LoadWeights();
  if (s.ok()) s = c->AllocateBuffers();
  if (!s.ok() && !absl::StartsWith(s.message(), "EAGLE-3 head: ")) {
    return absl::Status(s.code(), absl::StrCat("EAGLE-3 head: ", s.message()));
  }
  SPECD_RETURN_IF_ERROR(s);
  return c;
}

absl::Status CudaEagle3Compute::LoadWeights() {
  const ModelConfig& target = *options_.target;
  std::unique_ptr<Eagle3Head> head;
  if (options_.dummy) {
    const std::string file = options_.dir + "/config.json";
    SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
    SPECD_ASSIGN_OR_RETURN(config_, ParseEagle3Config(text, file, target));
    d2t_.resize(config_.draft_vocab_size);
    for (int32_t d = 0; d < config_.draft_vocab_size; ++d) d2t_[d] = d;
  } else {
    SPECD_ASSIGN_OR_RETURN(head, Eagle3Head::Load(options_.dir, options_.target_dir, target));
    config_ = head->config();
    d2t_.assign(head->draft_to_target().begin(), head->draft_to_target().end());
  }
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size, vocab = l.vocab_size,
                f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  const int64_t qw = l.q_size() + 2 * int64_t{l.kv_size()}, inter = l.intermediate_size;
  struct Tensor {
    const __nv_bfloat16** dest;
    int64_t count;
    bool norm;
    const std::vector<float>* host;
  };
  const Eagle3Head::Weights* hw = head != nullptr ? &head->weights() : nullptr;
  const bool share_embed = options_.target_embed != nullptr && h == target.hidden_size &&
                           (head == nullptr || head->shares_target_embedding());
  auto host = [hw](const std::vector<float> Eagle3Head::Weights::*m) {
    return hw != nullptr ? &(hw->*m) : nullptr;
  };
  using W = Eagle3Head::Weights;
  const std::vector<Tensor> tensors = {
      {&w_.embed, share_embed ? 0 : vocab * h, false, share_embed ? nullptr : host(&W::embed)},
      {&w_.fc, h * f, false, host(&W::fc)},
      {&w_.input_norm, h, true, host(&W::input_norm)},
      {&w_.hidden_norm, h, true, host(&W::hidden_norm)},
      {&w_.qkv, qw * 2 * h, false, host(&W::qkv)},
      {&w_.o, h * l.q_size(), false, host(&W::o)},
      {&w_.post_norm, h, true, host(&W::post_norm)},
      {&w_.gate_up, 2 * inter * h, false, host(&W::gate_up)},
      {&w_.down, h * inter, false, host(&W::down)},
      {&w_.norm, h, true, host(&W::norm)},
      {&w_.lm_head, int64_t{config_.draft_vocab_size} * h, false, host(&W::lm_head)},
  };
  int64_t bytes = 0;
  std::vector<int64_t> offsets;
  for (const Tensor& t : tensors) {
    if (t.host != nullptr && static_cast<int64_t>(t.host->size()) != t.count) {
      return absl::InternalError(absl::StrCat("EAGLE-3 head: a tensor of ", t.host->size(),
                                              " values where ", t.count, " were expected"));
    }
    offsets.push_back(bytes);
    bytes += (t.count * 2 + kAlign - 1) / kAlign * kAlign;
  }
  SPECD_ASSIGN_OR_RETURN(weights_,
                         cuda::DeviceMemory::Allocate(static_cast<size_t>(bytes), "EAGLE-3 head"));
  weight_bytes_ = bytes;
  std::vector<uint16_t> staging;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    auto* dst = reinterpret_cast<__nv_bfloat16*>(weights_.as<uint8_t>() + offsets[i]);
    *t.dest = dst;
    if (t.count == 0) continue;  // the shared embedding, set below
    if (t.host == nullptr) {
      SPECD_RETURN_IF_ERROR(
          Launch(t.norm ? kernels::FillBf16(dst, t.count, 1.0f, options_.stream)
                        : kernels::FillUniformBf16(dst, t.count, kDummySeed + i, -kDummyRange,
                                                   kDummyRange, options_.stream),
                 "weight fill"));
      continue;
    }
    staging.resize(t.host->size());
    for (size_t e = 0; e < staging.size(); ++e) staging[e] = FloatToBf16((*t.host)[e]);
    SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(dst, staging.data(), staging.size() * 2,
                                                      cudaMemcpyHostToDevice, options_.stream),
                                      "EAGLE-3 head: weight upload"));
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: weight upload"));
  }
  if (share_embed) w_.embed = options_.target_embed;
  return cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: weights");
}

absl::Status CudaEagle3Compute::AllocateBuffers() {
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size,
                f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  const int64_t qw = l.q_size() + 2 * int64_t{l.kv_size()}, inter = l.intermediate_size;
  const int64_t dv = config_.draft_vocab_size;
  const int64_t seqs = std::max(1, options_.max_seqs), tokens = std::max(1, options_.max_tokens);
  // Rows that draw in one pass: a sequence's one (chains), or a tree level's nodes.
  max_logit_rows_ = static_cast<int32_t>(std::min<int64_t>(4 * seqs, std::max<int64_t>(seqs, 256)));
  const int64_t rows = max_logit_rows_;
  max_rows_ = kMaxPieceRows;
  shape_.num_q_heads = l.num_heads;
  shape_.num_kv_heads = l.num_kv_heads;
  shape_.head_dim = l.head_dim;
  shape_.block_size = options_.block_size;
  shape_.scale = 1.0f / std::sqrt(static_cast<float>(l.head_dim));
  shape_.sliding_window = 0;
  max_blocks_per_seq_ = (options_.max_model_len + options_.block_size - 1) / options_.block_size;
  auto alloc = [this](cuda::DeviceMemory& m, int64_t bytes, const char* what) -> absl::Status {
    SPECD_ASSIGN_OR_RETURN(m, cuda::DeviceMemory::Allocate(static_cast<size_t>(bytes), what));
    buffer_bytes_ += bytes;
    return absl::OkStatus();
  };
  pool_rows_ = seqs * kEagle3PoolWindow + tokens;
  SPECD_RETURN_IF_ERROR(alloc(table_, (pool_rows_ + 2 * rows) * h * 2, "EAGLE-3 pool"));
  SPECD_RETURN_IF_ERROR(alloc(features_, tokens * f * 2, "EAGLE-3 features"));
  SPECD_RETURN_IF_ERROR(alloc(fused_, tokens * h * 2, "EAGLE-3 features"));
  const int64_t r = max_rows_;
  for (cuda::DeviceMemory* m : {&e_, &hin_, &resid_, &h_}) {
    SPECD_RETURN_IF_ERROR(alloc(*m, r * h * 2, "EAGLE-3 activations"));
  }
  SPECD_RETURN_IF_ERROR(alloc(cat_, r * 2 * h * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(qkv_, r * qw * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(attn_, r * l.q_size() * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(gate_up_, r * 2 * inter * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(act_, r * inter * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(gathered_, rows * h * 2, "EAGLE-3 activations"));
  SPECD_RETURN_IF_ERROR(alloc(logits_, rows * dv * 4, "EAGLE-3 logits"));
  SPECD_RETURN_IF_ERROR(alloc(ids_, rows * 4, "EAGLE-3 ids"));
  const int64_t cands = rows * kernels::kMaxTopK;
  SPECD_RETURN_IF_ERROR(alloc(cand_ids_, cands * 4, "EAGLE-3 tree candidates"));
  SPECD_RETURN_IF_ERROR(alloc(cand_logprobs_, cands * 4, "EAGLE-3 tree candidates"));
  SPECD_RETURN_IF_ERROR(
      alloc(topk_workspace_,
            std::max<int64_t>(
                16, static_cast<int64_t>(kernels::TopKWorkspaceBytes(
                        static_cast<int32_t>(rows), static_cast<int32_t>(dv), kernels::kMaxTopK))),
            "EAGLE-3 top-k workspace"));
  SPECD_ASSIGN_OR_RETURN(cand_host_, cuda::PinnedMemory::Allocate(static_cast<size_t>(cands) * 8,
                                                                  "EAGLE-3 tree candidates"));
  SPECD_ASSIGN_OR_RETURN(
      ids_host_, cuda::PinnedMemory::Allocate(static_cast<size_t>(rows) * 4, "EAGLE-3 ids"));
  SPECD_ASSIGN_OR_RETURN(logits_host_, cuda::PinnedMemory::Allocate(
                                           static_cast<size_t>(rows * dv * 4), "EAGLE-3 logits"));
  SPECD_RETURN_IF_ERROR(alloc(
      workspace_, static_cast<int64_t>(kernels::PagedPrefillWorkspaceBytes(r, max_rows_, shape_)),
      "EAGLE-3 attention workspace"));
  // Draft-step graphs: buckets as the target's decode graphs, inputs as GraphLayout says.
  for (int32_t b = 1; b < seqs; b = b < 8 ? 2 * b : b + 8) buckets_.push_back(b);
  buckets_.push_back(static_cast<int32_t>(seqs));
  const size_t in_bytes = GraphInBytes(seqs);
  SPECD_RETURN_IF_ERROR(alloc(graph_in_, static_cast<int64_t>(in_bytes), "EAGLE-3 graph inputs"));
  SPECD_ASSIGN_OR_RETURN(graph_in_host_,
                         cuda::PinnedMemory::Allocate(in_bytes, "EAGLE-3 graph inputs"));
  const size_t round_bytes = RoundLayout(max_rows_, seqs).bytes;
  SPECD_RETURN_IF_ERROR(
      alloc(round_in_, static_cast<int64_t>(round_bytes), "EAGLE-3 round graph inputs"));
  SPECD_ASSIGN_OR_RETURN(round_in_host_,
                         cuda::PinnedMemory::Allocate(round_bytes, "EAGLE-3 round graph inputs"));
  const int64_t chain_ids = int64_t{kMaxChainSteps} * seqs;
  SPECD_RETURN_IF_ERROR(alloc(chain_ids_, chain_ids * 4, "EAGLE-3 chain ids"));
  SPECD_ASSIGN_OR_RETURN(chain_ids_host_, cuda::PinnedMemory::Allocate(
                                              static_cast<size_t>(chain_ids) * 4, "EAGLE-3 ids"));
  if (options_.draws != nullptr) {
    const size_t draw_bytes = DrawInBytes();
    SPECD_RETURN_IF_ERROR(
        alloc(draw_in_, static_cast<int64_t>(draw_bytes), "EAGLE-3 sampled graph inputs"));
    SPECD_ASSIGN_OR_RETURN(
        draw_in_host_, cuda::PinnedMemory::Allocate(draw_bytes, "EAGLE-3 sampled graph inputs"));
  }
  if (options_.standalone) {
    SPECD_RETURN_IF_ERROR(alloc(host_capture_, tokens * f * 2, "EAGLE-3 target rows"));
    SPECD_ASSIGN_OR_RETURN(
        host_capture_staging_,
        cuda::PinnedMemory::Allocate(static_cast<size_t>(tokens * f * 2), "EAGLE-3 target rows"));
  }
  SPECD_RETURN_IF_ERROR(alloc(d2t_dev_, dv * 4, "EAGLE-3 draft map"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(d2t_dev_.as(), d2t_.data(), static_cast<size_t>(dv) * 4,
                                  cudaMemcpyHostToDevice, options_.stream),
                  "EAGLE-3 head: draft map"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: draft map"));
  const int64_t table_bytes = seqs * max_blocks_per_seq_ * 4;
  SPECD_RETURN_IF_ERROR(alloc(graph_tables_, table_bytes, "EAGLE-3 graph block tables"));
  SPECD_ASSIGN_OR_RETURN(
      graph_tables_host_,
      cuda::PinnedMemory::Allocate(static_cast<size_t>(table_bytes), "EAGLE-3 graph block tables"));
  SPECD_ASSIGN_OR_RETURN(rope_, MakeRopeTable(l.rope, l.head_dim, options_.max_model_len));
  buffer_bytes_ += static_cast<int64_t>(rope_.bytes());
  SPECD_ASSIGN_OR_RETURN(gemm_, MakeGemm());
  buffer_bytes_ += static_cast<int64_t>(kGemmWorkspaceBytes);
  return absl::OkStatus();
}

int64_t CudaEagle3Compute::KvBlockBytes() const {
  const ModelConfig& l = config_.layer;
  return 2 * int64_t{l.num_kv_heads} * options_.block_size * l.head_dim * 2;
}

absl::Status CudaEagle3Compute::AllocateKv(int32_t num_blocks) {
  SPECD_ASSIGN_OR_RETURN(
      kv_, cuda::DeviceMemory::Allocate(static_cast<size_t>(int64_t{num_blocks} * KvBlockBytes()),
                                        "EAGLE-3 KV cache"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemset(kv_.as(), 0, kv_.bytes()), "EAGLE-3 KV cache zero-fill"));
  scratch_block_ = num_blocks - 1;  // the target's scratch block (CudaRunner's last)
  num_kv_blocks_ = num_blocks;
  k_cache_ = kv_.as<__nv_bfloat16>();
  v_cache_ = Offset(k_cache_, int64_t{num_blocks} * KvBlockBytes() / 4);
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::Gemm(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w,
                                     int64_t m, int64_t n, int64_t k, void* y, int64_t ldy,
                                     bool f32_out) {
  std::string error;
  if (gemm_->Run(x, ldx, w, nullptr, m, n, k, y, ldy,
                 f32_out ? kernels::GemmOut::kF32 : kernels::GemmOut::kBf16, options_.stream,
                 &error)) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat("EAGLE-3 head: GEMM [", m, ", ", k, "] x [", n, ", ", k, "]^T: ", error));
}

absl::Status CudaEagle3Compute::Fuse(std::span<const int32_t> capture_rows,
                                     std::span<const int32_t> pool_rows) {
  if (capture_rows.size() != pool_rows.size()) {
    return absl::InvalidArgumentError("EAGLE-3 head: Fuse of mismatched row lists");
  }
  if (capture_rows.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  if (capture_ == nullptr) return absl::FailedPreconditionError("EAGLE-3 head: no capture");
  for (size_t i = 0; i < capture_rows.size(); ++i) {
    if (capture_rows[i] < 0 || capture_rows[i] >= capture_rows_ || pool_rows[i] < 0 ||
        pool_rows[i] >= pool_rows_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EAGLE-3 head: Fuse of captured row ", capture_rows[i], " into pool row ", pool_rows[i]));
    }
  }
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size,
                f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  auto* table = table_.as<__nv_bfloat16>();
  for (size_t at = 0; at < capture_rows.size(); at += options_.max_tokens) {
    const size_t n = std::min<size_t>(options_.max_tokens, capture_rows.size() - at);
    fuse_arena_.Reset();
    const size_t ids = fuse_arena_.Push(capture_rows.data() + at, n * 4);
    SPECD_RETURN_IF_ERROR(fuse_arena_.Upload(options_.stream));
    SPECD_RETURN_IF_ERROR(Launch(
        kernels::EmbeddingGather(fuse_arena_.At<int32_t>(ids), static_cast<int64_t>(n), capture_, 0,
                                 capture_rows_, f, features_.as<__nv_bfloat16>(), options_.stream),
        "EmbeddingGather (captured rows)"));
    SPECD_RETURN_IF_ERROR(Gemm(features_.as<__nv_bfloat16>(), f, w_.fc, static_cast<int64_t>(n), h,
                               f, fused_.as(), h, false));
    // One copy per run of consecutive pool rows.
    for (size_t i = 0; i < n;) {
      size_t j = i + 1;
      while (j < n && pool_rows[at + j] == pool_rows[at + j - 1] + 1) ++j;
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(table, int64_t{pool_rows[at + i]} * h),
                          Offset(fused_.as<__nv_bfloat16>(), static_cast<int64_t>(i) * h),
                          (j - i) * h * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: pool rows"));
      i = j;
    }
    // The arena's staging is refilled by the next piece. (The next call comes after a
    // synchronisation: the target's step, or a Forward, ends with one.)
    if (at + n < capture_rows.size()) {
      SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 Fuse"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::SetHostCapture(std::span<const float> rows) {
  if (!options_.standalone) return Eagle3Compute::SetHostCapture(rows);
  const int64_t f = static_cast<int64_t>(config_.aux_layer_ids.size()) * config_.target_hidden_size;
  const int64_t n = static_cast<int64_t>(rows.size()) / f;
  if (n * f != static_cast<int64_t>(rows.size()) || n > options_.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", rows.size(),
                                                   " floats of target rows (rows of ", f,
                                                   ", at most ", options_.max_tokens, ")"));
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  // The staging is free: the last upload was waited for.
  auto* staged = host_capture_staging_.as<uint16_t>();
  for (size_t i = 0; i < rows.size(); ++i) staged[i] = FloatToBf16(rows[i]);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemcpyAsync(host_capture_.as(), staged, rows.size() * 2,
                                                    cudaMemcpyHostToDevice, options_.stream),
                                    "EAGLE-3 head: target rows"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: target rows"));
  set_capture(host_capture_.as<__nv_bfloat16>(), n);
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::SetDeviceCapture(const void* rows, int64_t n) {
  if (!options_.standalone) return Eagle3Compute::SetDeviceCapture(rows, n);
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  // The last Fuse may still read the rows before (and its upload arena is refilled next).
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head: device target rows"));
  set_capture(static_cast<const __nv_bfloat16*>(rows), rows == nullptr ? 0 : n);
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::CopyHidden(std::span<const int32_t> from,
                                           std::span<const int32_t> to) {
  if (from.size() != to.size()) {
    return absl::InvalidArgumentError("EAGLE-3 head: CopyHidden of mismatched row lists");
  }
  if (from.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t h = config_.layer.hidden_size;
  // The last pass's prenorm rows: the half it wrote (Forward flipped prenorm_half_ to it).
  const int64_t prenorm_base = pool_rows_ + int64_t{prenorm_half_} * max_logit_rows_;
  auto* table = table_.as<__nv_bfloat16>();
  // One kernel launch per kMaxRowCopies rows (a pass's rows were one cudaMemcpyAsync each:
  // 0.1 ms a pass of 24 branches), in order, as the copies were.
  kernels::RowCopies copies;
  for (size_t i = 0; i < from.size(); ++i) {
    const int64_t src = from[i] >= 0 ? from[i] : prenorm_base + (-int64_t{from[i]} - 1);
    if ((from[i] >= 0 && from[i] >= pool_rows_) ||
        (from[i] < 0 && -int64_t{from[i]} > max_logit_rows_) || to[i] < 0 || to[i] >= pool_rows_) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE-3 head: CopyHidden of row ", from[i], " into pool row ", to[i]));
    }
    if (src == to[i]) continue;
    if (h % 8 != 0) {  // not 16-byte columns (no head shipped): one copy each
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(table, int64_t{to[i]} * h), Offset(table, src * h),
                          static_cast<size_t>(h) * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: hidden rows"));
      continue;
    }
    copies.src[copies.count] = static_cast<int32_t>(src);
    copies.dst[copies.count] = to[i];
    if (++copies.count == kernels::kMaxRowCopies) {
      SPECD_RETURN_IF_ERROR(cuda::Check(kernels::CopyRows(copies, table, h, options_.stream),
                                        "EAGLE-3 head: hidden rows"));
      copies.count = 0;
    }
  }
  return cuda::Check(kernels::CopyRows(copies, table, h, options_.stream),
                     "EAGLE-3 head: hidden rows");
}

absl::Status CudaEagle3Compute::CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> src_dst) {
  if (k_cache_ == nullptr) return absl::FailedPreconditionError("EAGLE-3 head: no KV cache");
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t half = KvBlockBytes() / 4;  // one block's K (or V), in elements
  for (const auto& [src, dst] : src_dst) {
    if (src < 0 || dst < 0 || src >= num_kv_blocks_ || dst >= num_kv_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("EAGLE-3 head: KV block copy ", src, " -> ", dst));
    }
    for (__nv_bfloat16* cache : {k_cache_, v_cache_}) {
      SPECD_RETURN_IF_ERROR(cuda::Check(
          cudaMemcpyAsync(Offset(cache, dst * half), Offset(cache, src * half),
                          static_cast<size_t>(half) * 2, cudaMemcpyDeviceToDevice, options_.stream),
          "EAGLE-3 head: KV block copy"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Eagle3Compute>> CreateStandaloneCudaEagle3Compute(
    const StandaloneEagle3Options& options, int32_t device) {
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(device), "cudaSetDevice"));
  SPECD_ASSIGN_OR_RETURN(ModelConfig target, LoadModelConfig(options.target_dir));
  cudaStream_t stream = nullptr;
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                    "EAGLE-3 head: stream"));
  CudaEagle3Compute::Options o;
  o.dir = options.dir;
  o.target_dir = options.target_dir;
  o.dummy = options.dummy;
  o.target = &target;
  o.max_tokens = 512;  // target rows of one Fuse
  o.max_seqs = std::max(1, options.max_states);
  o.max_model_len = options.max_model_len;
  o.block_size = options.block_size;
  cudaDeviceProp prop{};
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaGetDeviceProperties(&prop, device), "device properties"));
  o.num_sms = prop.multiProcessorCount;
  o.device = device;
  o.stream = stream;
  // Its cache waves (one row per branch) replay the one-step graphs, captured below;
  // SPECD_SSD_HEAD_GRAPHS=0 keeps every pass eager (for side-by-side runs).
  const char* graphs_env = std::getenv("SPECD_SSD_HEAD_GRAPHS");
  o.eager = graphs_env != nullptr && std::string_view(graphs_env) == "0";
  o.standalone = true;
  absl::StatusOr<std::unique_ptr<CudaEagle3Compute>> c = CudaEagle3Compute::Create(o);
  if (!c.ok()) {
    cudaStreamDestroy(stream);
    return c.status();
  }
  (*c)->AdoptTarget(std::move(target), stream);
  const int64_t bytes = options.kv_cache_bytes > 0 ? options.kv_cache_bytes : int64_t{2} << 30;
  const auto blocks = static_cast<int32_t>(
      std::max<int64_t>(2, std::min<int64_t>(bytes / (*c)->KvBlockBytes(), INT32_MAX)));
  SPECD_RETURN_IF_ERROR((*c)->AllocateKv(blocks));
  const absl::Time start = absl::Now();
  SPECD_ASSIGN_OR_RETURN(const int32_t graphs, (*c)->CaptureStepGraphs());
  if (graphs > 0) {
    SPECD_LOG_INFO("cuda:{}: EAGLE-3 head: {} step graphs captured in {:.0f} ms", device, graphs,
                   absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  SPECD_LOG_INFO(
      "cuda:{}: EAGLE-3 head {} for SSD's speculator: weights {}, buffers {}, KV {} blocks of {}",
      device, options.dir, cuda::FormatBytes((*c)->weight_bytes()),
      cuda::FormatBytes((*c)->buffer_bytes()), blocks, options.block_size);
  return std::unique_ptr<Eagle3Compute>(*std::move(c));
}

absl::Status CudaEagle3Compute::RunPiece(std::span<const Row> rows, size_t begin, size_t end,
                                         int32_t logits_base, int32_t* num_logits) {
  const ModelConfig& l = config_.layer;
  const auto n = static_cast<int64_t>(end - begin);
  const int32_t bs = options_.block_size;
  const int64_t read_base = pool_rows_ + int64_t{prenorm_half_} * max_logit_rows_;
  const int64_t write_base = pool_rows_ + int64_t{1 - prenorm_half_} * max_logit_rows_;
  std::vector<int32_t> tokens, positions, hidden, seq_lens, cu = {0}, logit_rows;
  std::vector<int64_t> slots;
  // Groups: runs of one sequence's consecutive slots in one tree or none (the attention's
  // "sequences").
  std::vector<size_t> group_first;
  int32_t width = 1, max_q_len = 1;
  bool any_tree = false;
  auto slot_of = [](const Row& r) { return r.slot >= 0 ? r.slot : r.position; };
  for (size_t i = begin; i < end; ++i) {
    const Row& r = rows[i];
    const int32_t slot = slot_of(r);
    const bool new_group = i == begin || r.seq != rows[i - 1].seq ||
                           slot != slot_of(rows[i - 1]) + 1 || r.tree != rows[i - 1].tree;
    if (new_group) group_first.push_back(i);
    any_tree = any_tree || r.tree != nullptr;
    const int64_t block = slot / bs;
    const bool tree_ok =
        r.tree == nullptr ||
        (slot >= r.tree->start &&
         slot - int64_t{r.tree->start} < static_cast<int64_t>(r.tree->parents.size()) &&
         r.tree->parents.size() <= size_t{64} * kernels::kMaxTreeMaskWords);
    if (r.position < 0 || r.position >= options_.max_model_len || slot < 0 ||
        slot >= options_.max_model_len || block >= static_cast<int64_t>(r.block_table.size()) ||
        r.token < 0 || r.token >= l.vocab_size || !tree_ok) {
      return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: row ", i, " (position ",
                                                     r.position, ", slot ", slot, ", token ",
                                                     r.token, ") is malformed"));
    }
    tokens.push_back(r.token);
    positions.push_back(r.position);
    slots.push_back(int64_t{r.block_table[block]} * bs + slot % bs);
    if (r.hidden >= 0) {
      if (r.hidden >= pool_rows_) {
        return absl::InvalidArgumentError(
            absl::StrCat("EAGLE-3 head: row ", i, " reads pool row ", r.hidden));
      }
      hidden.push_back(r.hidden);
    } else {
      const int64_t k = -int64_t{r.hidden} - 1;
      if (k >= max_logit_rows_) {
        return absl::InvalidArgumentError(
            absl::StrCat("EAGLE-3 head: row ", i, " reads logits row ", k));
      }
      hidden.push_back(static_cast<int32_t>(read_base + k));
    }
    if (r.logits) logit_rows.push_back(static_cast<int32_t>(i - begin));
  }
  const auto num_groups = static_cast<int32_t>(group_first.size());
  for (int32_t g = 0; g < num_groups; ++g) {
    const size_t first = group_first[g];
    const size_t last = (g + 1 < num_groups ? group_first[g + 1] : end) - 1;
    const int32_t len = slot_of(rows[last]) + 1;
    seq_lens.push_back(len);
    cu.push_back(cu.back() + static_cast<int32_t>(last - first + 1));
    max_q_len = std::max(max_q_len, static_cast<int32_t>(last - first + 1));
    width = std::max(width, (len + bs - 1) / bs);
  }
  tables_host_.assign(static_cast<size_t>(num_groups) * width, 0);
  for (int32_t g = 0; g < num_groups; ++g) {
    const Row& r = rows[group_first[g]];
    const int32_t used = (seq_lens[g] + bs - 1) / bs;
    if (static_cast<int32_t>(r.block_table.size()) < used) {
      return absl::InvalidArgumentError("EAGLE-3 head: a block table is too short");
    }
    std::copy_n(r.block_table.begin(), used, tables_host_.begin() + int64_t{g} * width);
  }
  const auto m = static_cast<int32_t>(logit_rows.size());
  *num_logits = m;
  // Tree rows: each group's tree start (INT32_MAX: none) and each row's mask (its node's
  // ancestors and itself, bits of the slots after the start).
  std::vector<int32_t> tree_starts;
  std::vector<uint64_t> masks;
  size_t words = 1;
  if (any_tree) {
    for (size_t i = begin; i < end; ++i) {
      if (rows[i].tree != nullptr)
        words = std::max(words, (rows[i].tree->parents.size() + 63) / 64);
    }
    tree_starts.assign(static_cast<size_t>(num_groups), INT32_MAX);
    masks.assign(static_cast<size_t>(n) * words, 0);
    for (int32_t g = 0; g < num_groups; ++g) {
      const TokenTree* tree = rows[group_first[g]].tree;
      if (tree != nullptr) tree_starts[g] = tree->start;
    }
    for (size_t i = begin; i < end; ++i) {
      const Row& r = rows[i];
      if (r.tree == nullptr) continue;
      SetTreeMaskBits(r.tree->parents, slot_of(r) - r.tree->start,
                      std::span<uint64_t>(masks).subspan((i - begin) * words, words));
    }
  }
  arena_.Reset();
  const size_t a_tokens = arena_.Push(tokens), a_pos = arena_.Push(positions),
               a_slots = arena_.Push(slots), a_hidden = arena_.Push(hidden),
               a_lens = arena_.Push(seq_lens), a_cu = arena_.Push(cu),
               a_tables = arena_.Push(tables_host_), a_rows = arena_.Push(logit_rows);
  const size_t a_starts = any_tree ? arena_.Push(tree_starts) : 0;
  const size_t a_masks = any_tree ? arena_.Push(masks) : 0;
  SPECD_RETURN_IF_ERROR(arena_.Upload(options_.stream));
  Pass p;
  p.tokens = arena_.At<int32_t>(a_tokens);
  p.positions = arena_.At<int32_t>(a_pos);
  p.slots = arena_.At<int64_t>(a_slots);
  p.hidden = arena_.At<int32_t>(a_hidden);
  p.seq_lens = arena_.At<int32_t>(a_lens);
  p.cu_q_lens = arena_.At<int32_t>(a_cu);
  p.tables = arena_.At<int32_t>(a_tables);
  p.rows = arena_.At<int32_t>(a_rows);
  p.table_stride = width;
  p.num_groups = num_groups;
  p.max_q_len = max_q_len;
  p.n = n;
  p.m = m;
  p.prenorm_dst = write_base + logits_base;
  p.logits_base = logits_base;
  if (any_tree) {
    tree_mask_.tree_starts = arena_.At<int32_t>(a_starts);
    tree_mask_.masks = arena_.At<uint64_t>(a_masks);
    tree_mask_.mask_words = static_cast<int32_t>(words);
    p.tree = &tree_mask_;
  }
  return Body(p);
}

absl::Status CudaEagle3Compute::Body(const Pass& p) {
  const ModelConfig& l = config_.layer;
  const int64_t h = l.hidden_size, q = l.q_size(), kvs = l.kv_size(), qw = q + 2 * kvs;
  const int64_t inter = l.intermediate_size, dv = config_.draft_vocab_size;
  const auto eps = static_cast<float>(l.rms_norm_eps);
  const int64_t n = p.n;
  const int32_t m = p.m;
  cudaStream_t st = options_.stream;
  auto* table = table_.as<__nv_bfloat16>();
  auto* e = e_.as<__nv_bfloat16>();
  auto* hin = hin_.as<__nv_bfloat16>();
  auto* resid = resid_.as<__nv_bfloat16>();
  auto* hb = h_.as<__nv_bfloat16>();
  auto* cat = cat_.as<__nv_bfloat16>();
  auto* qkv = qkv_.as<__nv_bfloat16>();
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(p.tokens, n, w_.embed, 0, l.vocab_size, h, e, st),
             "EmbeddingGather (tokens)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(p.hidden, n, table, 0,
                                      pool_rows_ + 2 * int64_t{max_logit_rows_}, h, hin, st),
             "EmbeddingGather (hidden inputs)"));
  SPECD_RETURN_IF_ERROR(Launch(kernels::RmsNorm(e, w_.input_norm, n, h, eps, e, st), "RmsNorm"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::RmsNorm(hin, w_.hidden_norm, n, h, eps, hb, st), "RmsNorm (hidden)"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpy2DAsync(cat, size_t(4 * h), e, size_t(2 * h), size_t(2 * h), size_t(n),
                                    cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: [embedding, hidden]"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpy2DAsync(Offset(cat, h), size_t(4 * h), hb, size_t(2 * h), size_t(2 * h),
                                    size_t(n), cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: [embedding, hidden]"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(resid, config_.norm_before_residual ? hb : hin, size_t(n * h * 2),
                                  cudaMemcpyDeviceToDevice, st),
                  "EAGLE-3 head: residual"));
  SPECD_RETURN_IF_ERROR(Gemm(cat, 2 * h, w_.qkv, n, qw, 2 * h, qkv, qw, false));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::RopeAndWriteKvCache(p.positions, n, qkv, qw, Offset(qkv, q), qw,
                                   Offset(qkv, q + kvs), qw, l.head_dim, rope_.as<float>(), nullptr,
                                   nullptr, eps, p.slots, shape_, k_cache_, v_cache_, st),
      "RopeAndWriteKvCache"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::PagedPrefillAttention(qkv, qw, k_cache_, v_cache_, p.tables, p.table_stride,
                                            p.cu_q_lens, p.seq_lens, p.num_groups, n, p.max_q_len,
                                            shape_, attn_.as<__nv_bfloat16>(), q, workspace_.as(),
                                            workspace_.bytes(), st, p.tree),
             "PagedPrefillAttention"));
  SPECD_RETURN_IF_ERROR(Gemm(attn_.as<__nv_bfloat16>(), q, w_.o, n, h, q, hb, h, false));
  SPECD_RETURN_IF_ERROR(Launch(kernels::FusedAddRmsNorm(hb, resid, w_.post_norm, n, h, eps, hb, st),
                               "FusedAddRmsNorm"));
  SPECD_RETURN_IF_ERROR(Gemm(hb, h, w_.gate_up, n, 2 * inter, h, gate_up_.as(), 2 * inter, false));
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::SiluAndMul(gate_up_.as<__nv_bfloat16>(), n, inter, act_.as<__nv_bfloat16>(), st),
      "SiluAndMul"));
  SPECD_RETURN_IF_ERROR(Gemm(act_.as<__nv_bfloat16>(), inter, w_.down, n, h, inter, hb, h, false));
  // resid becomes the prenorm output, hb its final norm.
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::FusedAddRmsNorm(hb, resid, w_.norm, n, h, eps, hb, st), "FusedAddRmsNorm"));
  if (m == 0) return absl::OkStatus();
  const int32_t* rows_dev = p.rows;
  // The next pass's hidden inputs: the prenorm rows of the rows that draw.
  SPECD_RETURN_IF_ERROR(Launch(
      kernels::EmbeddingGather(rows_dev, m, resid, 0, n, h, Offset(table, p.prenorm_dst * h), st),
      "EmbeddingGather (prenorm rows)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::EmbeddingGather(rows_dev, m, hb, 0, n, h, gathered_.as<__nv_bfloat16>(), st),
             "EmbeddingGather (logits rows)"));
  return Gemm(gathered_.as<__nv_bfloat16>(), h, w_.lm_head, m, dv, h,
              logits_.as<float>() + int64_t{p.logits_base} * dv, dv, true);
}

absl::Status CudaEagle3Compute::Forward(std::span<const Row> rows,
                                        std::span<const uint8_t> host_logits,
                                        std::vector<int32_t>* ids, std::vector<float>* logits) {
  ids->clear();
  logits->clear();
  int64_t m = 0;
  for (const Row& r : rows) m += r.logits ? 1 : 0;
  if (m > max_logit_rows_ || static_cast<int64_t>(host_logits.size()) != m) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", m, " rows draw (at most ",
                                                   max_logit_rows_, ") with ", host_logits.size(),
                                                   " host-logits flags"));
  }
  if (rows.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const int64_t dv = config_.draft_vocab_size;
  const int64_t vocab = config_.layer.vocab_size;
  bool any_host = false;
  for (uint8_t f : host_logits) any_host = any_host || f != 0;
  if (!any_host && m == static_cast<int64_t>(rows.size())) {
    bool ran = false;
    SPECD_RETURN_IF_ERROR(RunStepGraph(rows, &ran));
    last_logit_rows_ = static_cast<int32_t>(m);
    if (ran) {
      for (int64_t k = 0; k < m; ++k) ids->push_back(d2t_[ids_host_.as<int32_t>()[k]]);
      return absl::OkStatus();
    }
  }
  last_logit_rows_ = static_cast<int32_t>(m);
  int32_t done = 0;
  for (size_t begin = 0; begin < rows.size(); begin += max_rows_) {
    const size_t end = std::min(rows.size(), begin + static_cast<size_t>(max_rows_));
    int32_t count = 0;
    SPECD_RETURN_IF_ERROR(RunPiece(rows, begin, end, done, &count));
    done += count;
    // The arena's staging is refilled by the next piece.
    if (end < rows.size()) {
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaStreamSynchronize(options_.stream), "EAGLE-3 head pass"));
    }
  }
  prenorm_half_ = 1 - prenorm_half_;
  cudaStream_t st = options_.stream;
  if (m > 0) {
    SPECD_RETURN_IF_ERROR(
        Launch(kernels::ArgmaxRows(logits_.as<float>(), dv, static_cast<int32_t>(m),
                                   static_cast<int32_t>(dv), ids_.as<int32_t>(), st),
               "ArgmaxRows"));
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpyAsync(ids_host_.as(), ids_.as(), size_t(m) * 4, cudaMemcpyDeviceToHost, st),
        "EAGLE-3 head: ids"));
    if (any_host) {
      SPECD_RETURN_IF_ERROR(
          cuda::Check(cudaMemcpyAsync(logits_host_.as(), logits_.as(), size_t(m * dv * 4),
                                      cudaMemcpyDeviceToHost, st),
                      "EAGLE-3 head: logits"));
    }
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 head pass"));
  for (int64_t k = 0; k < m; ++k) {
    ids->push_back(d2t_[ids_host_.as<int32_t>()[k]]);
    if (!host_logits[k]) continue;
    const size_t at = logits->size();
    logits->resize(at + vocab, -std::numeric_limits<float>::infinity());
    const float* src = logits_host_.as<float>() + k * dv;
    for (int64_t d = 0; d < dv; ++d) (*logits)[at + d2t_[d]] = src[d];
  }
  return absl::OkStatus();
}

absl::Status CudaEagle3Compute::TopCandidates(int32_t k, std::vector<int32_t>* ids,
                                              std::vector<float>* logprobs) {
  const int32_t m = last_logit_rows_;
  if (k < 1 || k > kernels::kMaxTopK) {
    return absl::InvalidArgumentError(absl::StrCat("EAGLE-3 head: ", k, " candidates a row"));
  }
  if (m == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(options_.device), "cudaSetDevice"));
  const auto dv = static_cast<int32_t>(config_.draft_vocab_size);
  const size_t n = static_cast<size_t>(m) * k;
  cudaStream_t st = options_.stream;
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::TopKRows(logits_.as<float>(), dv, m, dv, k, cand_ids_.as<int32_t>(),
                               topk_workspace_.as(), topk_workspace_.bytes(), st),
             "TopKRows (tree candidates)"));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::LogSoftmaxAt(logits_.as<float>(), dv, m, dv, cand_ids_.as<int32_t>(), k,
                                   cand_logprobs_.as<float>(), st),
             "LogSoftmaxAt (tree candidates)"));
  auto* host_ids = cand_host_.as<int32_t>();
  auto* host_lp = reinterpret_cast<float*>(host_ids + n);
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host_ids, cand_ids_.as(), n * 4, cudaMemcpyDeviceToHost, st),
                  "EAGLE-3 head: candidates"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpyAsync(host_lp, cand_logprobs_.as(), n * 4, cudaMemcpyDeviceToHost, st),
                  "EAGLE-3 head: candidates"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(st), "EAGLE-3 head candidates"));
  for (size_t i = 0; i < n; ++i) ids->push_back(d2t_[host_ids[i]]);
  logprobs->insert(logprobs->end(), host_lp, host_lp + n);
  return absl::OkStatus();
}

}  // namespace specd
