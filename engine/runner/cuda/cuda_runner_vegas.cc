// CudaRunner's Vegas attention options (ChunkAttention, engine/model/model.h): a verification
// chunk that collects scores runs kernels::PagedVerifyAttentionWithScores, a draft step's sparse
// chunk kernels::PagedSparseAttention over its per-layer index lists, and the other chunks of the
// same batch stay dense (CudaForward::VegasAttention launches each run of alike sequences on its
// own). Such steps run eagerly. Per step: one upload (segment lengths, index lists, counts,
// recent starts, the scored prefixes); after the forward, kernels::VegasHeadAveragedWeights turns
// the scores, [num_layers, num_scored, 2, parts, stride] f32 (parts: kernels::VegasScoreParts,
// one per q head), into head-averaged attention weights, [num_layers, num_scored, 2, stride] f32,
// on the device (what the CPU Model's HeadAveragedPrefixWeights computes), and one download of
// those is copied into each chunk's [num_layers, 2, prefix] span. See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/model/model.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/vegas.h"

namespace specd {

using Kind = ForwardVegas::Kind;

namespace {

Kind KindOf(const SequenceInput& in) {
  if (in.attention == nullptr) return Kind::kDense;
  if (!in.attention->scores.empty()) return Kind::kScores;
  return in.attention->sparse() ? Kind::kSparse : Kind::kDense;
}

// The sparse chunks' lists as ForwardVegas holds them: indices [layers, n, index_stride], counts
// [layers, n], recent starts [n]; rows of other chunks are zeros and never read.
void SparseLists(std::span<const SequenceInput> batch, int64_t layers, int64_t index_stride,
                 std::vector<int32_t>* indices, std::vector<int32_t>* counts,
                 std::vector<int32_t>* recent) {
  const auto n = static_cast<int64_t>(batch.size());
  indices->assign(static_cast<size_t>(layers * n * index_stride), 0);
  counts->assign(static_cast<size_t>(layers * n), 0);
  recent->assign(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < n; ++s) {
    if (KindOf(batch[s]) != Kind::kSparse) continue;
    const ChunkAttention& a = *batch[s].attention;
    (*recent)[s] = a.recent_start;
    for (int64_t l = 0; l < layers; ++l) {
      const std::span<const int32_t> list = a.layer_indices[l];
      (*counts)[l * n + s] = static_cast<int32_t>(list.size());
      std::copy(list.begin(), list.end(), indices->begin() + (l * n + s) * index_stride);
    }
  }
}

}  // namespace

int32_t CudaRunner::max_attention_option_tokens() const { return kernels::kMaxVerifyQueryLen; }

bool CudaRunner::State::HasAttention(std::span<const SequenceInput> batch) {
  return std::any_of(batch.begin(), batch.end(),
                     [](const SequenceInput& in) { return in.attention != nullptr; });
}

absl::Status CudaRunner::State::ValidateAttention(size_t s, const SequenceInput& in) const {
  const ChunkAttention& a = *in.attention;
  auto bad = [s](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", what));
  };
  if (a.scores.empty() && !a.sparse()) return absl::OkStatus();
  if (absl::Status st = forward->SupportsVegas(); !st.ok()) return bad(std::string(st.message()));
  const int64_t layers = config.num_layers;
  if (!a.scores.empty() && a.sparse()) {
    return bad("a chunk collects scores or attends sparsely, not both");
  }
  if (static_cast<int64_t>(in.tokens.size()) > kernels::kMaxVerifyQueryLen) {
    return bad(absl::StrCat("attention options on a chunk of ", in.tokens.size(),
                            " tokens; the CUDA kernels take up to ", kernels::kMaxVerifyQueryLen));
  }
  if (!a.scores.empty()) {
    if (kernels::VegasScoreParts(forward->attention_shape()) > kernels::kVegasMaxWeightHeads) {
      return bad(absl::StrCat("score collection on a model with more than ",
                              kernels::kVegasMaxWeightHeads, " query heads"));
    }
    if (static_cast<int64_t>(a.scores.size()) != layers * 2 * int64_t{in.start_pos}) {
      return bad(absl::StrCat("score buffer holds ", a.scores.size(), " floats, [", layers, ", 2, ",
                              in.start_pos, "] needed"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(a.layer_indices.size()) != layers) {
    return bad(absl::StrCat("sparse attention has ", a.layer_indices.size(), " index lists for ",
                            layers, " layers"));
  }
  if (a.recent_start < 0 || a.recent_start > in.start_pos) {
    return bad(absl::StrCat("recent_start ", a.recent_start, " outside [0, ", in.start_pos, "]"));
  }
  for (int64_t l = 0; l < layers; ++l) {
    int32_t prev = -1;
    for (int32_t p : a.layer_indices[l]) {
      if (p <= prev || p >= a.recent_start) {
        return bad(absl::StrCat("layer ", l, ": index ", p, " not ascending below recent_start ",
                                a.recent_start));
      }
      prev = p;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::State::PrepareVegas(std::span<const SequenceInput> batch, Launch* launch) {
  pending_scores.clear();
  vegas_weights_bytes = 0;
  if (!HasAttention(batch)) return absl::OkStatus();
  const int64_t layers = config.num_layers;
  const auto n = static_cast<int32_t>(batch.size());
  ForwardVegas& v = vegas;
  v = ForwardVegas{};
  v.score_parts = kernels::VegasScoreParts(forward->attention_shape());
  // Segments: runs of consecutive chunks of one kind.
  std::vector<std::vector<int32_t>> cu;  // per segment, from 0
  int64_t token = 0;
  for (int32_t s = 0; s < n; ++s) {
    const SequenceInput& in = batch[s];
    const Kind kind = KindOf(in);
    const auto len = static_cast<int32_t>(in.tokens.size());
    const int32_t seq_len = in.start_pos + len;
    int32_t keys = seq_len;
    if (kind == Kind::kSparse) {
      size_t most = 0;
      for (std::span<const int32_t> list : in.attention->layer_indices) {
        most = std::max(most, list.size());
      }
      v.index_stride = std::max<int64_t>(v.index_stride, static_cast<int64_t>(most));
      keys = static_cast<int32_t>(most) + seq_len - in.attention->recent_start;
    }
    if (v.segments.empty() || v.segments.back().kind != kind) {
      ForwardVegas::Segment seg;
      seg.kind = kind;
      seg.first_seq = s;
      seg.first_token = token;
      seg.first_scored = v.num_scored;
      v.segments.push_back(seg);
      cu.push_back({0});
    }
    ForwardVegas::Segment& seg = v.segments.back();
    ++seg.num_seqs;
    seg.num_tokens += len;
    seg.max_q_len = std::max(seg.max_q_len, len);
    seg.max_keys = std::max(seg.max_keys, keys);
    cu.back().push_back(static_cast<int32_t>(seg.num_tokens));
    if (kind == Kind::kScores) {
      pending_scores.push_back({in.attention->scores, v.num_scored++, in.start_pos});
      v.score_stride = std::max<int64_t>(v.score_stride, in.start_pos);
    }
    token += len;
  }
  v.score_stride = (v.score_stride + 1) / 2 * 2;  // the kernel stores float2 pairs
  v.index_stride = std::max<int64_t>(v.index_stride, 1);
  std::vector<int32_t> indices, counts, recent;
  if (std::any_of(v.segments.begin(), v.segments.end(),
                  [](const ForwardVegas::Segment& g) { return g.kind == Kind::kSparse; })) {
    SparseLists(batch, layers, v.index_stride, &indices, &counts, &recent);
  }
  cuda::UploadArena& arena = vegas_arena;
  arena.Reset();
  std::vector<size_t> cu_at;
  for (const std::vector<int32_t>& c : cu) cu_at.push_back(arena.Push(c));
  const size_t indices_at = indices.empty() ? 0 : arena.Push(indices);
  const size_t counts_at = counts.empty() ? 0 : arena.Push(counts);
  const size_t recent_at = recent.empty() ? 0 : arena.Push(recent);
  std::vector<int32_t> prefixes;  // [num_scored]: the lengths VegasHeadAveragedWeights reads
  for (const PendingScores& p : pending_scores) prefixes.push_back(p.prefix);
  const size_t prefixes_at = prefixes.empty() ? 0 : arena.Push(prefixes);
  SPECD_RETURN_IF_ERROR(arena.Upload(stream));
  for (size_t g = 0; g < v.segments.size(); ++g) {
    v.segments[g].cu_q_lens = arena.At<int32_t>(cu_at[g]);
  }
  if (!indices.empty()) {
    v.indices = arena.At<int32_t>(indices_at);
    v.counts = arena.At<int32_t>(counts_at);
    v.recent_starts = arena.At<int32_t>(recent_at);
  }
  if (v.num_scored > 0) {
    vegas_prefixes = arena.At<int32_t>(prefixes_at);
    // The previous step synchronised, so nothing still uses the buffers being replaced.
    const int64_t rows = layers * v.num_scored * 2;
    const size_t scores_bytes =
        static_cast<size_t>(rows * v.score_parts * v.score_stride * int64_t{sizeof(float)});
    vegas_weights_bytes = static_cast<size_t>(rows * v.score_stride * int64_t{sizeof(float)});
    vegas_workspace_at = (vegas_weights_bytes + 255) / 256 * 256;
    vegas_workspace_bytes =
        kernels::VegasWeightsWorkspaceBytes(static_cast<int32_t>(rows / 2), v.score_parts);
    if (vegas_scores.bytes() < scores_bytes) {
      SPECD_ASSIGN_OR_RETURN(vegas_scores,
                             cuda::DeviceMemory::Allocate(scores_bytes, "Vegas scores"));
    }
    if (vegas_weights.bytes() < vegas_workspace_at + vegas_workspace_bytes) {
      SPECD_ASSIGN_OR_RETURN(
          vegas_weights, cuda::DeviceMemory::Allocate(vegas_workspace_at + vegas_workspace_bytes,
                                                      "Vegas weights"));
    }
    if (vegas_weights_host.bytes() < vegas_weights_bytes) {
      SPECD_ASSIGN_OR_RETURN(vegas_weights_host,
                             cuda::PinnedMemory::Allocate(vegas_weights_bytes, "Vegas weights"));
    }
    v.scores = vegas_scores.as<float>();
  }
  launch->args.vegas = &vegas;
  launch->args.decode = false;
  return absl::OkStatus();
}

absl::Status CudaRunner::State::EnqueueScoreWeights() {
  if (pending_scores.empty()) return absl::OkStatus();
  const ForwardVegas& v = vegas;
  // Part h is q head h's score over num_q_heads (= parts): parts times a part is the raw score.
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::VegasHeadAveragedWeights(
          v.scores, v.score_parts, v.score_stride, static_cast<float>(v.score_parts),
          vegas_prefixes, v.num_scored, static_cast<int32_t>(config.num_layers * v.num_scored),
          vegas_weights.as<float>(), vegas_weights.as<uint8_t>() + vegas_workspace_at,
          vegas_workspace_bytes, stream),
      "Vegas head-averaged weights"));
  return cuda::Check(cudaMemcpyAsync(vegas_weights_host.as(), vegas_weights.as(),
                                     vegas_weights_bytes, cudaMemcpyDeviceToHost, stream),
                     "copy of Vegas weights");
}

absl::Status CudaRunner::State::SyncStep(const char* what) {
  SPECD_RETURN_IF_ERROR(Sync(what));
  if (pending_scores.empty()) return absl::OkStatus();
  const ForwardVegas& v = vegas;
  const float* host = vegas_weights_host.as<float>();
  const int64_t stride = v.score_stride, layers = config.num_layers;
  for (const PendingScores& p : pending_scores) {
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t row = 0; row < 2; ++row) {
        const float* src = host + ((l * v.num_scored + p.scored) * 2 + row) * stride;
        std::copy_n(src, p.prefix, p.dst.data() + (l * 2 + row) * p.prefix);
      }
    }
  }
  pending_scores.clear();
  return absl::OkStatus();
}

}  // namespace specd
