// CudaRunner's Vegas attention options (ChunkAttention, engine/model/model.h): a verification
// chunk that collects scores runs kernels::PagedVerifyAttentionWithScores, a draft step's sparse
// chunk kernels::PagedSparseAttention (or, one query per sequence, PagedSparseDecodeAttention) over
// its per-layer index lists or its selection slot, and the other chunks of the same batch stay
// dense (CudaForward::VegasAttention launches each run of alike sequences on its own). Scoring
// steps and sparse steps over host lists run eagerly; sparse steps over slots replay CUDA graphs
// (cuda_runner_graphs.cc). Per eager step: one upload (segment lengths, index lists, counts,
// recent starts, the scored prefixes); after the forward, kernels::VegasPrefixWeights turns the
// collected fp16 logits and split statistics ([num_layers, num_scored, 2, parts, ...], parts
// kernels::VegasScoreParts, one per q head) into head-averaged attention weights,
// [num_layers, num_scored, 2, stride] f32 (what the CPU Model's HeadAveragedPrefixWeights
// computes), then kernels::VegasSelectTopK selects into the chunks' slots on the device, and
// chunks that asked for their scores on the host get one download copied into their
// [num_layers, 2, prefix] spans. See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"
#include "engine/model/model.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/vegas.h"
#include "kernels/ref/vegas.h"

namespace specd {

using Kind = ForwardVegas::Kind;

namespace {

Kind KindOf(const SequenceInput& in) {
  if (in.attention == nullptr) return Kind::kDense;
  if (in.attention->collects()) return Kind::kScores;
  if (in.attention->slot_sparse()) return Kind::kSlotSparse;
  return in.attention->sparse() ? Kind::kSparse : Kind::kDense;
}

// What a select into a slot keeps of n prefix tokens: VegasKeepCount of the chunk's budget (no
// cap: 0), and the same budget for the kernel with the cap at the lists' stride (every count it
// keeps of a prefix up to max_model_len fits: VegasKeepCount grows with n).
kernels::ref::VegasBudget RefBudget(const SelectBudget& b) {
  return {b.ratio, b.min_tokens,
          b.max_tokens > 0 ? int64_t{b.max_tokens} : std::numeric_limits<int64_t>::max()};
}
kernels::VegasBudget SlotBudget(const SelectBudget& b, int64_t stride) {
  const int64_t cap = b.max_tokens > 0 ? std::min<int64_t>(b.max_tokens, stride) : stride;
  return {b.ratio, static_cast<int32_t>(std::min<int64_t>(b.min_tokens, cap)),
          static_cast<int32_t>(cap)};
}
bool SameBudget(const SelectBudget& a, const SelectBudget& b) {
  return a.ratio == b.ratio && a.min_tokens == b.min_tokens && a.max_tokens == b.max_tokens;
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
  if (!a.collects() && !a.sparse() && !a.slot_sparse()) return absl::OkStatus();
  if (absl::Status st = forward->SupportsVegas(); !st.ok()) return bad(std::string(st.message()));
  const int64_t layers = config.num_layers;
  if (int{a.collects()} + int{a.sparse()} + int{a.slot_sparse()} > 1) {
    return bad("a chunk collects scores or attends sparsely (a list or a slot), one of them");
  }
  if ((a.select_slot >= 0 || a.slot >= 0) && num_sparse_slots == 0) {
    return bad("selection slots are not kept on this runner");
  }
  if (a.select_slot >= 0 && !a.scores.empty()) {
    return bad("a chunk's selection goes to the host (scores) or into a slot, not both");
  }
  if (static_cast<int64_t>(in.tokens.size()) > kernels::kMaxVerifyQueryLen) {
    return bad(absl::StrCat("attention options on a chunk of ", in.tokens.size(),
                            " tokens; the CUDA kernels take up to ", kernels::kMaxVerifyQueryLen));
  }
  if (a.select_slot >= 0) {
    const SelectBudget& b = a.select_budget;
    if (a.select_slot >= num_sparse_slots) {
      return bad(
          absl::StrCat("selection slot ", a.select_slot, " outside [0, ", num_sparse_slots, ")"));
    }
    if (!(b.ratio >= 0.0 && b.ratio <= 1.0) || b.min_tokens < 0 || b.max_tokens < 0 ||
        (b.max_tokens > 0 && b.max_tokens < b.min_tokens)) {
      return bad(absl::StrCat("selection budget (ratio ", b.ratio, ", min ", b.min_tokens, ", max ",
                              b.max_tokens, ") out of range"));
    }
    if (kernels::VegasScoreParts(forward->attention_shape()) > kernels::kVegasMaxWeightHeads) {
      return bad(absl::StrCat("score collection on a model with more than ",
                              kernels::kVegasMaxWeightHeads, " query heads"));
    }
    return absl::OkStatus();
  }
  if (a.slot_sparse()) {
    if (a.slot >= num_sparse_slots) {
      return bad(absl::StrCat("selection slot ", a.slot, " outside [0, ", num_sparse_slots, ")"));
    }
    if (slot_stride == 0 || a.slot_count < 0 || a.slot_count > slot_stride) {
      return bad(absl::StrCat("slot_count ", a.slot_count, " outside [0, ", slot_stride,
                              "] (what a select into the slot keeps)"));
    }
    if (a.recent_start < 0 || a.recent_start > in.start_pos) {
      return bad(absl::StrCat("recent_start ", a.recent_start, " outside [0, ", in.start_pos, "]"));
    }
    return absl::OkStatus();
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

bool CudaRunner::State::AllSlotSparse(std::span<const SequenceInput> batch) {
  return !batch.empty() && std::all_of(batch.begin(), batch.end(), [](const SequenceInput& in) {
    return in.attention != nullptr && in.attention->slot_sparse();
  });
}

absl::Status CudaRunner::State::EnsureSlotLists(int64_t kept) {
  kept = std::max<int64_t>(kept, 1);
  if (kept <= slot_stride) return absl::OkStatus();
  const int64_t layers = config.num_layers, rows = int64_t{num_sparse_slots} + 1;
  // Room for a budget a little larger than this one without another copy.
  const int64_t stride = (kept + 63) / 64 * 64;
  SPECD_ASSIGN_OR_RETURN(
      cuda::DeviceMemory lists,
      cuda::DeviceMemory::Allocate(static_cast<size_t>(layers * rows * stride * 4),
                                   "Vegas selection slots"));
  cuda::DeviceMemory counts = std::move(slot_counts);
  if (counts.as() == nullptr) {
    SPECD_ASSIGN_OR_RETURN(
        counts,
        cuda::DeviceMemory::Allocate(static_cast<size_t>(layers * rows * 4), "Vegas slot counts"));
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemsetAsync(counts.as(), 0, counts.bytes(), stream), "Vegas slot counts"));
  }
  if (slot_stride > 0) {  // every slot's lists move to the wider rows
    SPECD_RETURN_IF_ERROR(cuda::Check(
        cudaMemcpy2DAsync(lists.as(), static_cast<size_t>(stride * 4), slot_lists.as(),
                          static_cast<size_t>(slot_stride * 4),
                          static_cast<size_t>(slot_stride * 4), static_cast<size_t>(layers * rows),
                          cudaMemcpyDeviceToDevice, stream),
        "Vegas selection slots"));
  }
  SPECD_RETURN_IF_ERROR(Sync("Vegas selection slots"));  // nothing queued reads the old lists
  // Sparse draft graphs hold the old lists' address and split count.
  for (auto it = graphs.begin(); it != graphs.end();) {
    if (it->first.sparse == 0) {
      ++it;
      continue;
    }
    cudaGraphExecDestroy(it->second);
    it = graphs.erase(it);
    --num_round_graphs;
  }
  slot_lists = std::move(lists);
  slot_counts = std::move(counts);
  slot_stride = stride;
  return absl::OkStatus();
}

int32_t CudaRunner::State::SlotSplits(int32_t num_seqs) const {
  const std::vector<int32_t> b = cuda_runner_internal::DecodeBuckets(limits.max_decode_batch);
  const auto it = std::lower_bound(b.begin(), b.end(), num_seqs);
  const int32_t bucket = it == b.end() ? num_seqs : *it;
  return forward->SparseSplits(
      bucket, static_cast<int32_t>(slot_stride) + cuda_runner_internal::kMaxRoundGraphQueryLen);
}

void CudaRunner::State::FillSlotVegas(int32_t num_seqs, int64_t num_tokens,
                                      const int32_t* cu_q_lens, const int32_t* slots,
                                      const int32_t* recent, ForwardVegas* v) const {
  *v = ForwardVegas{};
  ForwardVegas::Segment seg;
  seg.kind = Kind::kSlotSparse;
  seg.num_seqs = num_seqs;
  seg.num_tokens = num_tokens;
  seg.max_q_len = 1;
  seg.max_keys = static_cast<int32_t>(slot_stride) + cuda_runner_internal::kMaxRoundGraphQueryLen;
  seg.cu_q_lens = cu_q_lens;
  seg.fixed_splits = SlotSplits(num_seqs);
  v->segments.push_back(seg);
  v->slot_lists = slot_lists.as<int32_t>();
  v->slot_counts = slot_counts.as<int32_t>();
  v->slot_stride = slot_stride;
  v->slot_rows = int64_t{num_sparse_slots} + 1;
  v->slot_of_seq = slots;
  v->recent_starts = recent;
}

absl::Status CudaRunner::State::PrepareVegas(std::span<const SequenceInput> batch, Launch* launch) {
  pending_scores.clear();
  slot_selects.clear();
  vegas_weights_bytes = 0;
  // A sparse draft graph's inputs are Prepare's (the graph holds graph_vegas' launches).
  if (launch->key.sparse != 0 || !HasAttention(batch)) return absl::OkStatus();
  const int64_t layers = config.num_layers;
  const auto n = static_cast<int32_t>(batch.size());
  int64_t kept = 0;  // the most tokens a select of this step keeps a layer
  for (const SequenceInput& in : batch) {
    if (in.attention != nullptr && in.attention->select_slot >= 0) {
      kept = std::max(kept, kernels::ref::VegasKeepCount(max_model_len,
                                                         RefBudget(in.attention->select_budget)));
    }
  }
  if (kept > slot_stride) SPECD_RETURN_IF_ERROR(EnsureSlotLists(kept));
  ForwardVegas& v = vegas;
  v = ForwardVegas{};
  v.score_parts = kernels::VegasScoreParts(forward->attention_shape());
  std::vector<int32_t> slot_of_seq(static_cast<size_t>(n), num_sparse_slots);
  std::vector<int32_t> recent_of_seq(static_cast<size_t>(n), 0);
  std::vector<std::pair<SelectBudget, int32_t>> slot_scored;  // (budget, slot) per scored chunk
  bool any_slot = false;
  // Segments: runs of consecutive chunks of one kind.
  std::vector<std::vector<int32_t>> cu;  // per segment, from 0
  int64_t token = 0;
  for (int32_t s = 0; s < n; ++s) {
    const SequenceInput& in = batch[s];
    const Kind kind = KindOf(in);
    const auto len = static_cast<int32_t>(in.tokens.size());
    const int32_t seq_len = in.start_pos + len;
    int32_t keys = seq_len;
    if (kind == Kind::kSlotSparse) {
      any_slot = true;
      slot_of_seq[s] = in.attention->slot;
      recent_of_seq[s] = in.attention->recent_start;
      keys = in.attention->slot_count + seq_len - in.attention->recent_start;
    }
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
      if (in.attention->select_slot >= 0) {
        slot_scored.resize(static_cast<size_t>(v.num_scored) + 1, {SelectBudget{}, -1});
        slot_scored.back() = {in.attention->select_budget, in.attention->select_slot};
      } else {
        pending_scores.push_back({in.attention->scores, v.num_scored, in.start_pos});
      }
      ++v.num_scored;
      v.score_stride = std::max<int64_t>(v.score_stride, in.start_pos);
    }
    token += len;
  }
  slot_scored.resize(static_cast<size_t>(v.num_scored), {SelectBudget{}, -1});
  for (ForwardVegas::Segment& seg : v.segments) {
    if (seg.kind == Kind::kSlotSparse && seg.max_q_len == 1) {
      seg.fixed_splits = SlotSplits(seg.num_seqs);  // as a sparse graph of its bucket reduces
    }
  }
  v.score_stride = (v.score_stride + 3) / 4 * 4;  // VegasPrefixWeights reads 4 logits a load
  v.index_stride = std::max<int64_t>(v.index_stride, 1);
  std::vector<int32_t> indices, counts, recent;
  if (std::any_of(v.segments.begin(), v.segments.end(),
                  [](const ForwardVegas::Segment& g) { return g.kind == Kind::kSparse; })) {
    SparseLists(batch, layers, v.index_stride, &indices, &counts, &recent);
  }
  if (any_slot) {  // one recent start per sequence, lists and slots alike
    if (recent.empty()) recent.assign(static_cast<size_t>(n), 0);
    for (int32_t s = 0; s < n; ++s) {
      if (KindOf(batch[s]) == Kind::kSlotSparse) recent[s] = recent_of_seq[s];
    }
  }
  cuda::UploadArena& arena = vegas_arena;
  arena.Reset();
  std::vector<size_t> cu_at;
  for (const std::vector<int32_t>& c : cu) cu_at.push_back(arena.Push(c));
  const size_t indices_at = indices.empty() ? 0 : arena.Push(indices);
  const size_t counts_at = counts.empty() ? 0 : arena.Push(counts);
  const size_t recent_at = recent.empty() ? 0 : arena.Push(recent);
  const size_t slot_rows_at = any_slot ? arena.Push(slot_of_seq) : 0;
  std::vector<int32_t> prefixes;  // [num_scored]: the lengths VegasPrefixWeights reads
  for (const SequenceInput& in : batch) {
    if (KindOf(in) == Kind::kScores) prefixes.push_back(in.start_pos);
  }
  const size_t prefixes_at = prefixes.empty() ? 0 : arena.Push(prefixes);
  // One select launch per budget: out_rows the chunk's slot for its budget's chunks, else -1.
  std::vector<std::pair<SelectBudget, size_t>> selects;
  for (size_t i = 0; i < slot_scored.size(); ++i) {
    if (slot_scored[i].second < 0) continue;
    const SelectBudget& b = slot_scored[i].first;
    if (std::any_of(selects.begin(), selects.end(),
                    [&](const auto& x) { return SameBudget(x.first, b); })) {
      continue;
    }
    std::vector<int32_t> rows(slot_scored.size(), -1);
    for (size_t j = i; j < slot_scored.size(); ++j) {
      if (slot_scored[j].second >= 0 && SameBudget(slot_scored[j].first, b)) {
        rows[j] = slot_scored[j].second;
      }
    }
    selects.emplace_back(b, arena.Push(rows));
  }
  SPECD_RETURN_IF_ERROR(arena.Upload(stream));
  for (const auto& [budget, at] : selects) slot_selects.push_back({budget, arena.At<int32_t>(at)});
  if (any_slot) {
    v.slot_lists = slot_lists.as<int32_t>();
    v.slot_counts = slot_counts.as<int32_t>();
    v.slot_stride = slot_stride;
    v.slot_rows = int64_t{num_sparse_slots} + 1;
    v.slot_of_seq = arena.At<int32_t>(slot_rows_at);
  }
  for (size_t g = 0; g < v.segments.size(); ++g) {
    v.segments[g].cu_q_lens = arena.At<int32_t>(cu_at[g]);
  }
  if (!indices.empty()) {
    v.indices = arena.At<int32_t>(indices_at);
    v.counts = arena.At<int32_t>(counts_at);
  }
  if (!recent.empty()) v.recent_starts = arena.At<int32_t>(recent_at);
  if (v.num_scored > 0) {
    vegas_prefixes = arena.At<int32_t>(prefixes_at);
    // The previous step synchronised, so nothing still uses the buffers being replaced.
    const int64_t rows = layers * v.num_scored * 2;
    const int64_t head_rows = rows * v.score_parts;
    const size_t logits_bytes =
        static_cast<size_t>(head_rows * v.score_stride * 2 + 255) / 256 * 256;  // fp16
    const size_t scores_bytes =
        logits_bytes + static_cast<size_t>(head_rows * kernels::kVegasScoreSplits * 2 * 4);
    vegas_weights_bytes = static_cast<size_t>(rows * v.score_stride * int64_t{sizeof(float)});
    vegas_workspace_at = (vegas_weights_bytes + 255) / 256 * 256;
    // The selects into slots use the workspace.
    vegas_workspace_bytes =
        slot_selects.empty()
            ? size_t{0}
            : kernels::VegasSelectWorkspaceBytes(static_cast<int32_t>(rows / 2), v.score_stride);
    // Grown by half again at least: the scored prefix grows every round, and a reallocation
    // (cudaFree synchronises the device) each round cost more than the pass itself.
    auto grow = [](cuda::DeviceMemory& buffer, size_t bytes, const char* what) -> absl::Status {
      if (buffer.bytes() >= bytes) return absl::OkStatus();
      const size_t want = std::max(bytes, buffer.bytes() + buffer.bytes() / 2);
      buffer = cuda::DeviceMemory();  // freed before the larger one is taken
      SPECD_ASSIGN_OR_RETURN(buffer, cuda::DeviceMemory::Allocate(want, what));
      return absl::OkStatus();
    };
    SPECD_RETURN_IF_ERROR(grow(vegas_scores, scores_bytes, "Vegas scores"));
    SPECD_RETURN_IF_ERROR(
        grow(vegas_weights, vegas_workspace_at + vegas_workspace_bytes, "Vegas weights"));
    if (!pending_scores.empty() && vegas_weights_host.bytes() < vegas_weights_bytes) {
      SPECD_ASSIGN_OR_RETURN(vegas_weights_host,
                             cuda::PinnedMemory::Allocate(vegas_weights_bytes, "Vegas weights"));
    }
    v.score_logits = reinterpret_cast<__half*>(vegas_scores.as<uint8_t>());
    v.score_stats = reinterpret_cast<float*>(vegas_scores.as<uint8_t>() + logits_bytes);
  }
  launch->args.vegas = &vegas;
  launch->args.decode = false;
  return absl::OkStatus();
}

absl::Status CudaRunner::State::EnqueueScoreWeights() {
  if (vegas_weights_bytes == 0) return absl::OkStatus();  // nothing scored this step
  const ForwardVegas& v = vegas;
  SPECD_RETURN_IF_ERROR(cuda::Check(
      kernels::VegasPrefixWeights(v.score_logits, v.score_stats, v.score_parts, v.score_stride,
                                  vegas_prefixes, v.num_scored,
                                  static_cast<int32_t>(config.num_layers * v.num_scored),
                                  vegas_weights.as<float>(), stream),
      "Vegas head-averaged weights"));
  // The chunks selecting into slots: the top k per layer of the weights, on the device.
  const int32_t pairs = static_cast<int32_t>(config.num_layers * v.num_scored);
  for (const SlotSelect& sel : slot_selects) {
    SPECD_RETURN_IF_ERROR(cuda::Check(
        kernels::VegasSelectTopK(
            vegas_weights.as<float>(), 1, v.score_stride, vegas_prefixes, v.num_scored, pairs,
            SlotBudget(sel.budget, slot_stride), slot_lists.as<int32_t>(), slot_stride,
            slot_counts.as<int32_t>(), vegas_weights.as<uint8_t>() + vegas_workspace_at,
            vegas_workspace_bytes, stream, sel.out_rows, int64_t{num_sparse_slots} + 1),
        "Vegas selection into slots"));
  }
  if (pending_scores.empty()) return absl::OkStatus();
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
