// CudaEagle3Compute's set-up (cuda_eagle3.h): the head's weights loaded (or drawn at random for
// load_format "dummy"), its activation buffers and paged KV cache allocated, and the standalone
// head the SSD speculator drafts with.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/base/float16.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/runner/cuda/cuda_eagle3.h"
#include "engine/runner/cuda/cuda_eagle3_util.h"
#include "engine/runner/cuda/cuda_forward.h"
#include "kernels/cuda/init.h"
#include "kernels/cuda/sampling.h"

namespace specd {
namespace {

constexpr int64_t kAlign = 256;
// Rows of one piece of a pass (its activation buffers); larger passes run in pieces.
constexpr int32_t kMaxPieceRows = 1024;
// Random weights of load_format "dummy": as the target's (cuda_weights.cc).
constexpr float kDummyRange = 0.02f;
constexpr uint64_t kDummySeed = 0xea61e3;

}  // namespace

using eagle3_cuda::Launch;
using eagle3_cuda::Offset;

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
  // Then the prenorm halves, then a ranked round's keep rows.
  keep_base_ = pool_rows_ + 2 * rows;
  SPECD_RETURN_IF_ERROR(alloc(
      table_, (keep_base_ + int64_t{kMaxChainSteps} * kMaxRankedSeqs) * h * 2, "EAGLE-3 pool"));
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
  const int64_t ranked = int64_t{kMaxChainSteps} * kMaxRankedSeqs * kernels::kMaxTopK;
  SPECD_RETURN_IF_ERROR(alloc(ranked_, ranked * 8, "EAGLE-3 ranked round candidates"));
  SPECD_ASSIGN_OR_RETURN(ranked_host_,
                         cuda::PinnedMemory::Allocate(static_cast<size_t>(ranked) * 8,
                                                      "EAGLE-3 ranked round candidates"));
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

}  // namespace specd
