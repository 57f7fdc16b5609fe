#include "engine/runner/cuda/cuda_nsa.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"

namespace specd {
namespace {

absl::Status Launch(cudaError_t e, const char* kernel, int32_t layer) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(kernel, " (layer ", layer, ") failed: ", cudaGetErrorString(e)));
}

// Element offsets in bf16 buffers (the type is opaque to host code).
const __nv_bfloat16* Offset(const __nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(p) + 2 * elems);
}
__nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(p) + 2 * elems);
}

kernels::NsaShape ShapeOf(const ModelConfig& c, int32_t page_size) {
  kernels::NsaShape s;
  s.num_q_heads = c.num_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.page_size = page_size;
  s.block_size = c.nsa.block_size;
  s.block_counts = c.nsa.block_counts;
  s.window_size = c.nsa.window_size;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  return s;
}

}  // namespace

int64_t CudaNsaAttention::CompressedBytesPerBlock(const ModelConfig& c, int32_t page_size) {
  const int64_t epp = kernels::NsaEntriesPerPage(ShapeOf(c, page_size));
  return 2 * int64_t{c.num_layers} * c.num_kv_heads * epp * c.head_dim * 2;
}

CudaNsaAttention::CudaNsaAttention(const ModelConfig& config, const kernels::NsaShape& shape,
                                   int64_t max_tokens, int32_t max_model_len, int32_t num_sms)
    : config_(config),
      shape_(shape),
      max_tokens_(max_tokens),
      max_model_len_(max_model_len),
      num_sms_(num_sms) {}

absl::StatusOr<std::unique_ptr<CudaNsaAttention>> CudaNsaAttention::Create(
    const ModelConfig& config, int32_t page_size, int64_t max_tokens, int32_t max_model_len,
    int32_t num_sms) {
  if (!config.is_nsa()) {
    return absl::InvalidArgumentError(absl::StrCat(config.architecture, " is not an NSA model"));
  }
  const kernels::NsaShape shape = ShapeOf(config, page_size);
  // The kernels check their shapes at every launch; refuse here what they would refuse there.
  const bool epp_ok = page_size % shape.block_size == 0 || shape.block_size % page_size == 0;
  if (!epp_ok || shape.block_counts < 1 || shape.block_counts > kernels::kNsaMaxBlockCounts ||
      shape.window_size < 1 || config.num_heads % config.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NSA on the GPU: block_size ", shape.block_size, " with KV pages of ", page_size,
        " tokens, block_counts ", shape.block_counts, " (at most ", kernels::kNsaMaxBlockCounts,
        "), window_size ", shape.window_size, " is not a shape the kernels run"));
  }
  std::unique_ptr<CudaNsaAttention> a(
      new CudaNsaAttention(config, shape, max_tokens, max_model_len, num_sms));
  SPECD_RETURN_IF_ERROR(a->AllocateBuffers());
  return a;
}

size_t CudaNsaAttention::WorkspaceBytes(int64_t num_tokens, int32_t num_groups,
                                        int32_t max_group_size, int32_t max_context) const {
  const int32_t select_splits =
      kernels::NsaSelectSplits(num_groups, max_group_size, max_context, num_sms_, shape_);
  const int32_t attend_splits =
      kernels::NsaAttendSplits(num_groups, max_group_size, max_context, num_sms_, shape_);
  return std::max(kernels::NsaSelectWorkspaceBytes(num_tokens, select_splits, max_context, shape_),
                  kernels::NsaAttendWorkspaceBytes(num_tokens, num_groups, max_group_size,
                                                   attend_splits, max_context, shape_));
}

absl::Status CudaNsaAttention::AllocateBuffers() {
  const int64_t t = max_tokens_;
  auto alloc = [this](cuda::DeviceMemory& m, int64_t bytes, const char* what) -> absl::Status {
    SPECD_ASSIGN_OR_RETURN(m, cuda::DeviceMemory::Allocate(static_cast<size_t>(bytes), what));
    buffer_bytes_ += bytes;
    return absl::OkStatus();
  };
  SPECD_RETURN_IF_ERROR(alloc(o_cmp_, t * config_.q_size() * 2, "NSA compressed branch"));
  SPECD_RETURN_IF_ERROR(alloc(selections_, t * config_.num_kv_heads * shape_.block_counts * 4,
                              "NSA block selections"));
  SPECD_RETURN_IF_ERROR(alloc(own_selections_, t * config_.num_kv_heads * shape_.block_counts * 4,
                              "NSA own selections (SSV load counting)"));
  constexpr auto kCounterBytes = static_cast<int64_t>(sizeof(kernels::NsaLoadCounters));
  SPECD_RETURN_IF_ERROR(alloc(counters_, kCounterBytes, "SSV load counters"));
  SPECD_ASSIGN_OR_RETURN(counters_host_,
                         cuda::PinnedMemory::Allocate(kCounterBytes, "SSV load counters' copy"));
  // The legacy stream's memset, waited for: the runner's own stream does not order after it.
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaMemset(counters_.as(), 0, kCounterBytes), "SSV counters"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(nullptr), "SSV counters zero-fill"));
  // The most any step needs at the longest context: the kernels' split counts grow as a step's
  // groups get fewer (to fill the GPU), and the partial rows with tokens x splits. A step of n
  // groups of at most g tokens has at most min(max_tokens, n g) tokens: every such step, every g
  // (a request's SSV group size is any of 1-16). Run lowers splits should a step still need more.
  size_t bytes = 0;
  const auto most_groups = static_cast<int32_t>(std::min<int64_t>(t, INT32_MAX));
  for (int32_t g = 1; g <= kernels::kNsaMaxGroupSize; ++g) {
    for (int32_t groups = 1; groups <= most_groups; ++groups) {
      const int64_t tokens = std::min<int64_t>(t, int64_t{groups} * g);
      bytes = std::max(bytes, WorkspaceBytes(tokens, groups, g, max_model_len_));
    }
  }
  return alloc(workspace_, static_cast<int64_t>(std::max<size_t>(bytes, 256)), "NSA workspace");
}

absl::Status CudaNsaAttention::AllocateKv(int32_t num_blocks) {
  const int64_t epp = kernels::NsaEntriesPerPage(shape_);
  const int64_t layer_elems = int64_t{num_blocks} * config_.num_kv_heads * epp * config_.head_dim;
  SPECD_ASSIGN_OR_RETURN(
      cmp_, cuda::DeviceMemory::Allocate(
                static_cast<size_t>(2 * layer_elems * 2 * config_.num_layers), "NSA compressed"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemset(cmp_.as(), 0, cmp_.bytes()), "NSA compressed cache zero-fill"));
  cmp_k_.clear();
  cmp_v_.clear();
  auto* base = cmp_.as<__nv_bfloat16>();
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    cmp_k_.push_back(Offset(base, (2 * l) * layer_elems));
    cmp_v_.push_back(Offset(base, (2 * l + 1) * layer_elems));
  }
  return absl::OkStatus();
}

absl::Status CudaNsaAttention::Run(int32_t layer, const ForwardNsa& nsa, const int32_t* positions,
                                   const int32_t* block_tables, int32_t max_blocks_per_seq,
                                   int64_t num_tokens, const __nv_bfloat16* qkv, int64_t qkv_stride,
                                   const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                   __nv_bfloat16* out, cudaStream_t stream) {
  if (nsa.token_seqs == nullptr || nsa.groups == nullptr || nsa.max_context < 1 ||
      num_tokens > max_tokens_ || layer < 0 || layer >= static_cast<int32_t>(cmp_k_.size())) {
    return absl::InternalError(absl::StrCat("NSA attention (layer ", layer, "): a step of ",
                                            num_tokens, " tokens without its NSA layout, or ",
                                            "before the compressed cache was allocated"));
  }
  const int32_t max_context = std::min(nsa.max_context, max_model_len_);
  const kernels::NsaCache cache{k_cache,       v_cache,      cmp_k_[layer],
                                cmp_v_[layer], block_tables, max_blocks_per_seq};
  // The selections buffer carries a token's selection across the step's layers for its reuse
  // schedule: a reuse layer's NsaSelect leaves its rows as its last refresh layer wrote them.
  const kernels::NsaTokens tokens{positions, nsa.token_seqs, num_tokens, nsa.refresh_every, layer};
  const kernels::NsaGroups groups{nsa.groups, nsa.num_groups, nsa.max_group_size, nsa.group_flags};
  // Every layer of every step counts (the groups flagged counted add), so graphs captured from
  // any step keep counting when replayed.
  const kernels::NsaLoadCount count{own_selections_.as<int32_t>(),
                                    counters_.as<kernels::NsaLoadCounters>()};
  // The planned splits, fewer where the workspace would not hold them (it holds every step shape
  // AllocateBuffers foresaw; fewer splits only cost parallelism).
  int32_t select_splits =
      kernels::NsaSelectSplits(nsa.num_groups, nsa.max_group_size, max_context, num_sms_, shape_);
  while (select_splits > 1 &&
         kernels::NsaSelectWorkspaceBytes(num_tokens, select_splits, max_context, shape_) >
             workspace_.bytes()) {
    --select_splits;
  }
  int32_t attend_splits =
      kernels::NsaAttendSplits(nsa.num_groups, nsa.max_group_size, max_context, num_sms_, shape_);
  while (attend_splits > 1 && kernels::NsaAttendWorkspaceBytes(
                                  num_tokens, nsa.num_groups, nsa.max_group_size, attend_splits,
                                  max_context, shape_) > workspace_.bytes()) {
    --attend_splits;
  }
  const int64_t q_size = config_.q_size();
  const __nv_bfloat16* gates = Offset(qkv, q_size + 2 * int64_t{config_.kv_size()});
  auto* o_cmp = o_cmp_.as<__nv_bfloat16>();
  auto* selections = selections_.as<int32_t>();
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::NsaCompress(cache, tokens, shape_, stream), "NsaCompress", layer));
  SPECD_RETURN_IF_ERROR(
      Launch(kernels::NsaSelect(qkv, qkv_stride, cache, tokens, groups, shape_, max_context,
                                select_splits, o_cmp, q_size, selections, workspace_.as(),
                                workspace_.bytes(), stream, &count),
             "NsaSelect", layer));
  return Launch(kernels::NsaAttend(qkv, qkv_stride, cache, tokens, groups, selections,
                                   /*shared_selection=*/false, o_cmp, q_size, gates, qkv_stride,
                                   shape_, max_context, attend_splits, out, q_size, workspace_.as(),
                                   workspace_.bytes(), stream, &count),
                "NsaAttend", layer);
}

absl::StatusOr<SsvLoadStats> CudaNsaAttention::LoadStats(cudaStream_t stream) const {
  auto* host = counters_host_.as<kernels::NsaLoadCounters>();
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(host, counters_.as(), sizeof(*host), cudaMemcpyDeviceToHost, stream),
      "SSV load counters' copy"));
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaStreamSynchronize(stream), "SSV load counters' copy"));
  const kernels::NsaLoadCounters& c = *host;
  return SsvLoadStats{.queries = static_cast<int64_t>(c.queries),
                      .per_query_keys = static_cast<int64_t>(c.per_query_keys),
                      .grouped_keys = static_cast<int64_t>(c.grouped_keys),
                      .per_query_blocks = static_cast<int64_t>(c.per_query_blocks),
                      .grouped_blocks = static_cast<int64_t>(c.grouped_blocks),
                      .overlap_sum = c.overlap_sum,
                      .overlap_pairs = static_cast<int64_t>(c.overlap_pairs)};
}

}  // namespace specd
