// CudaRunner's step inputs and CUDA graphs: which graph a batch replays (GraphFor), capture on
// load (decode) or first use (rounds: verification and the draft's catch-up), the padded input
// layout (Prepare) and replay (Execute). See cuda_runner_state.h.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/model/token_tree.h"
#include "engine/runner/cuda/cuda_runner_state.h"
#include "kernels/cuda/nsa.h"

namespace specd {

namespace cuda_runner_internal {

std::vector<int32_t> DecodeBuckets(int32_t cap) {
  std::vector<int32_t> out;
  int32_t b = 1;
  while (b < cap) {
    out.push_back(b);
    const int32_t step = b < 8 ? b : b < 32 ? 8 : b < 128 ? 16 : b < 256 ? 32 : 64;
    b += step;
  }
  out.push_back(cap);
  return out;
}

InputLayout LayoutFor(int64_t num_tokens, int32_t num_seqs, int64_t num_rows) {
  InputLayout l;
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset = (offset + bytes + 15) / 16 * 16;
    return at;
  };
  l.slots = take(8 * num_tokens);
  l.token_ids = take(4 * num_tokens);
  l.positions = take(4 * num_tokens);
  l.seq_lens = take(4 * size_t(num_seqs));
  l.cu_q_lens = take(4 * (size_t(num_seqs) + 1));
  l.logit_rows = take(4 * num_rows);
  l.token_seqs = take(4 * num_tokens);
  l.nsa_groups = take(8 * num_tokens);
  l.nsa_refresh = take(4 * num_tokens);
  l.nsa_flags = take(num_tokens);  // a group per token at most
  l.sparse_slots = take(4 * size_t(num_seqs));
  l.sparse_recent = take(4 * size_t(num_seqs));
  l.bytes = offset;
  return l;
}

}  // namespace cuda_runner_internal

namespace {

using cuda_runner_internal::GraphKey;
using cuda_runner_internal::InputLayout;
using cuda_runner_internal::kGraphReserveBytes;
using cuda_runner_internal::kMaxRoundGraphQueryLen;
using cuda_runner_internal::kMaxRoundGraphs;
using cuda_runner_internal::Launch;
using cuda_runner_internal::LayoutFor;

template <typename T>
T* At(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<uint8_t*>(base) + offset);
}

std::string Describe(GraphKey key) {
  if (key.decode()) return absl::StrCat("decode graph of batch ", key.bucket);
  if (key.sparse != 0) return absl::StrCat("sparse draft graph of batch ", key.bucket);
  return absl::StrCat("round graph of batch ", key.bucket, " x ", key.q_len, " tokens, ", key.rows,
                      " LM-head rows");
}

}  // namespace

GraphKey CudaRunner::State::GraphFor(std::span<const SequenceInput> batch, size_t num_rows,
                                     bool rows_are_chunks, int32_t merge_k) const {
  if (buckets.empty() || batch.empty() || batch.size() > static_cast<size_t>(buckets.back())) {
    return {};
  }
  size_t q_len = 0;
  for (const SequenceInput& in : batch) q_len = std::max(q_len, in.tokens.size());
  if (HasAttention(batch)) {
    // Only a sparse draft step over selection slots replays a graph (its own kind); other
    // attention options run eagerly.
    if (q_len != 1 || !rows_are_chunks || merge_k != 0 || slot_stride == 0 ||
        !AllSlotSparse(batch)) {
      return {};
    }
    const int32_t bucket =
        *std::lower_bound(buckets.begin(), buckets.end(), static_cast<int32_t>(batch.size()));
    return GraphKey{bucket, 1, 0, 0, 1};
  }
  if (q_len == 1 && rows_are_chunks) {
    const int32_t bucket =
        *std::lower_bound(buckets.begin(), buckets.end(), static_cast<int32_t>(batch.size()));
    return merge_k <= 1 ? GraphKey{bucket, 1, 0, merge_k} : GraphKey{};
  }
  return RoundKeyFor(static_cast<int32_t>(batch.size()), q_len, num_rows, merge_k);
}

GraphKey CudaRunner::State::RoundKeyFor(int32_t num_seqs, size_t q_len, size_t num_rows,
                                        int32_t merge_k) const {
  if (buckets.empty() || num_seqs < 1 || num_seqs > buckets.back()) return {};
  const int32_t bucket = *std::lower_bound(buckets.begin(), buckets.end(), num_seqs);
  if (q_len > static_cast<size_t>(kMaxRoundGraphQueryLen)) return {};
  const auto m = static_cast<size_t>(q_len_multiple);
  const size_t rounded = std::min<size_t>((q_len + m - 1) / m * m, kMaxRoundGraphQueryLen);
  if (int64_t{bucket} * static_cast<int64_t>(rounded) <= limits.max_tokens) q_len = rounded;
  const int64_t tokens = int64_t{bucket} * static_cast<int64_t>(q_len);
  if (tokens > limits.max_tokens) return {};
  // One row per sequence (the draft's catch-up, rows of some chunks) or up to every token
  // (verification): two row counts per (bucket, q_len), so the LM head does not run q_len times
  // the rows a catch-up needs.
  const int64_t rows =
      num_rows <= static_cast<size_t>(bucket) ? bucket : std::min<int64_t>(tokens, limits.max_rows);
  if (static_cast<int64_t>(num_rows) > rows) return {};
  return {bucket, static_cast<int32_t>(q_len), static_cast<int32_t>(rows), merge_k};
}

absl::StatusOr<GraphKey> CudaRunner::State::EnsureGraph(GraphKey key) {
  if (!key.graph() || graphs.contains(key)) return key;
  // Decode graphs are all captured at load; a missing one (never expected) runs eagerly.
  if (key.decode() || round_graphs_full) return GraphKey{};
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo before, cuda::GetMemoryInfo());
  const absl::Status s = Capture(key);
  if (!s.ok() && !absl::IsResourceExhausted(s)) return s;
  // Tensor parallelism: a graph and an eager run of a step make differently sized collectives,
  // so every rank must choose alike, while their free memory differs: they agree (a collective
  // the same calls reach on every rank; nothing without a communicator).
  SPECD_ASSIGN_OR_RETURN(const int32_t captured_everywhere, MinOverRanks(s.ok() ? 1 : 0));
  if (!captured_everywhere) {
    if (auto it = graphs.find(key); it != graphs.end()) {
      cudaGraphExecDestroy(it->second);
      graphs.erase(it);
    }
    round_graphs_full = true;
    SPECD_LOG_WARN("{}: {}; new round shapes run eagerly", name,
                   s.ok() ? "another tensor-parallel rank ran out of memory capturing a graph"
                          : std::string(s.message()));
    return GraphKey{};
  }
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo after, cuda::GetMemoryInfo());
  const int64_t took = std::max<int64_t>(0, before.free - after.free);
  ++num_round_graphs;
  round_graph_bytes += took;
  // Room for one more of this size under the reserve, else later shapes run eagerly (on every
  // rank once any rank's budget is spent).
  const bool full = num_round_graphs >= kMaxRoundGraphs ||
                    decode_graph_bytes + round_graph_bytes + took > kGraphReserveBytes;
  SPECD_ASSIGN_OR_RETURN(const int32_t room_everywhere, MinOverRanks(full ? 0 : 1));
  round_graphs_full = room_everywhere == 0;
  SPECD_LOG_INFO("{}: captured the {} ({}); {} round graphs hold {}{}", name, Describe(key),
                 cuda::FormatBytes(took), num_round_graphs, cuda::FormatBytes(round_graph_bytes),
                 round_graphs_full ? ": the graph budget is spent, new shapes run eagerly" : "");
  return key;
}

// An NSA step's token -> sequence map and groups (ForwardNsa), into the host inputs `h`: each
// sequence's tokens in groups of C consecutive ones (its SSV strategy's group size, exact mode;
// without one, kNsaMaxGroupSize: the grouped kernel reads each group's blocks once, and every
// query still attends its own selection, so grouping changes no result). A graph's plan is fixed
// by its key: every sequence slot gets q_len groups (enough for C = 1), empty where its tokens run
// out (padding slots: all empty), so capture and replay launch the same plan.
void CudaRunner::State::NsaLayout(std::span<const SequenceInput> batch, const GraphKey& key,
                                  int32_t padded_seqs, int64_t padded_tokens, void* h,
                                  const InputLayout& l, ForwardNsa& nsa) const {
  constexpr int32_t kG = kernels::kNsaMaxGroupSize;
  int32_t* seqs = At<int32_t>(h, l.token_seqs);
  int32_t* groups = At<int32_t>(h, l.nsa_groups);
  int32_t* refresh = At<int32_t>(h, l.nsa_refresh);
  uint8_t* flags = At<uint8_t>(h, l.nsa_flags);
  std::fill(seqs, seqs + padded_tokens, -1);
  std::fill(refresh, refresh + padded_tokens, 1);
  int32_t num_groups = 0, max_group = 1;
  int32_t t = 0;
  for (int32_t s = 0; s < padded_seqs; ++s) {
    const bool real = s < static_cast<int32_t>(batch.size());
    const auto n = real ? static_cast<int32_t>(batch[s].tokens.size()) : 1;
    const SsvStrategy* ssv = real ? batch[s].ssv : nullptr;
    const int32_t c = ssv != nullptr ? ssv->group_size : kG;
    // The request's SSV strategy (lossy ones too): its reuse schedule per token, shared mode
    // per group; and its groups' loads are counted (ssv_load_stats).
    const auto bits = static_cast<uint8_t>(
        ssv == nullptr ? 0
                       : kernels::kNsaGroupCounted |
                             (ssv->mode == SsvMode::kShared ? kernels::kNsaGroupShared : 0));
    if (real) std::fill_n(seqs + t, n, s);
    if (ssv != nullptr) std::fill_n(refresh + t, n, std::max(1, ssv->refresh_every));
    const int32_t slots = key.graph() ? key.q_len : (n + c - 1) / c;
    for (int32_t j = 0; j < slots; ++j) {
      const int32_t count = real ? std::clamp(n - j * c, 0, c) : 0;
      groups[2 * num_groups] = t + std::min(j * c, n);
      groups[2 * num_groups + 1] = count;
      flags[num_groups] = bits;
      ++num_groups;
      max_group = std::max(max_group, count);
    }
    t += n;
  }
  nsa.num_groups = num_groups;
  nsa.max_group_size = key.graph() ? std::min(key.q_len, kG) : max_group;
}

absl::StatusOr<Launch> CudaRunner::State::Prepare(std::span<const SequenceInput> batch,
                                                  std::span<const int32_t> logit_rows,
                                                  GraphKey key) {
  const int32_t num_seqs = static_cast<int32_t>(batch.size());
  int64_t num_tokens = 0;
  bool decode = true;
  for (const SequenceInput& in : batch) {
    num_tokens += static_cast<int64_t>(in.tokens.size());
    decode = decode && in.tokens.size() == 1;
  }
  captured_tokens = num_tokens;  // the rows CudaForward's capture will hold
  Launch launch;
  launch.key = key;
  launch.merge_k = key.merge_k;
  const bool graph = key.graph();
  const int32_t padded_seqs = graph ? key.bucket : num_seqs;
  const int64_t padded_tokens = graph ? int64_t{key.bucket} * key.q_len : num_tokens;
  const int64_t layout_rows = graph ? key.rows : static_cast<int64_t>(logit_rows.size());
  const InputLayout l = LayoutFor(padded_tokens, padded_seqs, layout_rows);
  void* h = inputs_host.as();
  const int32_t stride = forward->max_blocks_per_seq();
  int32_t* tables_h = tables_host.as<int32_t>();
  int64_t t = 0;
  int32_t width = 1, max_q_len = 1, max_seq_len = 1;
  At<int32_t>(h, l.cu_q_lens)[0] = 0;
  // Real chunks first, as an eager step lays them out, so every real row sees what it would see
  // eagerly (the attention and every other kernel are row-independent).
  bool tree = false;
  std::vector<int32_t> depths;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SequenceInput& in = batch[s];
    const int32_t n = static_cast<int32_t>(in.tokens.size()), len = in.start_pos + n;
    // A token tree's node sits in its own slot at the position of its depth.
    if (in.tree != nullptr) TreeDepths(in.tree->parents, &depths);
    tree = tree || in.tree != nullptr;
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int32_t pos = in.start_pos + i;
      At<int32_t>(h, l.token_ids)[t] = in.tokens[i];
      At<int32_t>(h, l.positions)[t] =
          in.tree == nullptr ? pos : in.tree->start + depths[pos - in.tree->start];
      At<int64_t>(h, l.slots)[t] =
          int64_t{in.block_table[pos / block_size]} * block_size + pos % block_size;
    }
    At<int32_t>(h, l.seq_lens)[s] = len;
    At<int32_t>(h, l.cu_q_lens)[s + 1] = static_cast<int32_t>(t);
    const int32_t used = (len + block_size - 1) / block_size;
    std::copy_n(in.block_table.begin(), used, tables_h + int64_t{s} * stride);
    width = std::max(width, used);
    max_q_len = std::max(max_q_len, n);
    max_seq_len = std::max(max_seq_len, len);
  }
  if (config.is_nsa()) NsaLayout(batch, key, padded_seqs, padded_tokens, h, l, launch.args.nsa);
  for (int32_t s = num_seqs; s < padded_seqs; ++s, ++t) {  // graph padding: 1-token dummies
    At<int32_t>(h, l.token_ids)[t] = 0;
    At<int32_t>(h, l.positions)[t] = 0;
    At<int64_t>(h, l.slots)[t] = -1;
    At<int32_t>(h, l.seq_lens)[s] = 1;
    At<int32_t>(h, l.cu_q_lens)[s + 1] = static_cast<int32_t>(t + 1);
    tables_h[int64_t{s} * stride] = num_kv_blocks;  // the scratch block
  }
  // Round graphs: the tokens left up to bucket * q_len belong to no sequence (cu_q_lens ends
  // before them). The attention computes no query there (its rows are unspecified), their KV is
  // not written, and no logits row reads them: they only fill the graph's fixed shapes.
  for (; t < padded_tokens; ++t) {
    At<int32_t>(h, l.token_ids)[t] = 0;
    At<int32_t>(h, l.positions)[t] = 0;
    At<int64_t>(h, l.slots)[t] = -1;
  }
  int32_t* rows_h = At<int32_t>(h, l.logit_rows);
  const auto num_real_rows = std::min<int64_t>(layout_rows, std::ssize(logit_rows));
  std::copy_n(logit_rows.begin(), num_real_rows, rows_h);
  std::fill(rows_h + num_real_rows, rows_h + layout_rows, 0);  // a round graph's spare rows
  if (key.sparse != 0) {
    // Each sequence's slot and recent start (padding: the padding slot, whose count is 0), and
    // the one segment the graph's attention launches (FillSlotVegas).
    int32_t* slots_h = At<int32_t>(h, l.sparse_slots);
    int32_t* recent_h = At<int32_t>(h, l.sparse_recent);
    for (int32_t s = 0; s < padded_seqs; ++s) {
      const bool real = s < num_seqs;
      slots_h[s] = real ? batch[s].attention->slot : num_sparse_slots;
      recent_h[s] = real ? batch[s].attention->recent_start : 0;
    }
    FillSlotVegas(padded_seqs, padded_tokens, At<int32_t>(inputs.as(), l.cu_q_lens),
                  At<int32_t>(inputs.as(), l.sparse_slots),
                  At<int32_t>(inputs.as(), l.sparse_recent), &graph_vegas);
    launch.args.vegas = &graph_vegas;
  }
  SPECD_RETURN_IF_ERROR(cuda::Check(
      cudaMemcpyAsync(inputs.as(), h, l.bytes, cudaMemcpyHostToDevice, stream), "step inputs"));
  SPECD_RETURN_IF_ERROR(
      cuda::Check(cudaMemcpy2DAsync(tables.as(), size_t{4} * stride, tables_h, size_t{4} * stride,
                                    size_t{4} * width, padded_seqs, cudaMemcpyHostToDevice, stream),
                  "block tables"));
  ForwardArgs& a = launch.args;
  a.num_tokens = padded_tokens;
  a.num_seqs = padded_seqs;
  // Trees need the masked kernels; a sparse draft step the sparse ones (graph_vegas).
  a.decode = graph ? key.q_len == 1 && key.sparse == 0 : decode && !tree;
  // Graphs replay for every context length up to max_model_len: their split count is fixed (the
  // verification attention fixes its own from the table width).
  a.num_splits =
      a.decode ? forward->DecodeSplits(padded_seqs, graph ? max_model_len : max_seq_len) : 1;
  a.max_q_len = graph ? key.q_len : max_q_len;
  a.token_ids = At<int32_t>(inputs.as(), l.token_ids);
  a.positions = At<int32_t>(inputs.as(), l.positions);
  a.slot_mapping = At<int64_t>(inputs.as(), l.slots);
  a.seq_lens = At<int32_t>(inputs.as(), l.seq_lens);
  a.cu_q_lens = At<int32_t>(inputs.as(), l.cu_q_lens);
  a.block_tables = tables.as<int32_t>();
  if (config.is_nsa()) {
    a.nsa.token_seqs = At<int32_t>(inputs.as(), l.token_seqs);
    a.nsa.groups = At<int32_t>(inputs.as(), l.nsa_groups);
    a.nsa.refresh_every = At<int32_t>(inputs.as(), l.nsa_refresh);
    a.nsa.group_flags = At<uint8_t>(inputs.as(), l.nsa_flags);
    a.nsa.max_context = graph ? max_model_len : max_seq_len;
  }
  launch.num_rows = static_cast<int32_t>(logit_rows.size());
  launch.logit_rows = At<int32_t>(inputs.as(), l.logit_rows);
  return launch;
}

absl::Status CudaRunner::State::RunGraphBody(const Launch& launch) {
  SPECD_RETURN_IF_ERROR(forward->Run(launch.args, stream));
  if (launch.key.rows == 0) {  // decode and sparse draft graphs: a row per chunk
    return forward->LmHead(nullptr, launch.key.bucket, launch.args.num_tokens, /*gather=*/false,
                           launch.merge_k, stream);
  }
  return forward->LmHead(launch.logit_rows, launch.key.rows, launch.args.num_tokens,
                         /*gather=*/true, launch.merge_k, stream);
}

// Graph: replay. Eager: the forward and the LM head of the first min(num_rows, max_rows)
// gathered rows.
absl::Status CudaRunner::State::Execute(const Launch& launch) {
  if (launch.key.graph()) {
    auto it = graphs.find(launch.key);
    if (it == graphs.end()) {
      return absl::InternalError(absl::StrCat("no captured ", Describe(launch.key)));
    }
    ++(launch.key.decode() ? stats.decode_launches : stats.round_launches);
    return cuda::Check(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
  }
  SPECD_RETURN_IF_ERROR(forward->Run(launch.args, stream));
  if (launch.num_rows == 0) return absl::OkStatus();
  return forward->LmHead(launch.logit_rows, std::min(launch.num_rows, limits.max_rows),
                         launch.args.num_tokens, /*gather=*/true, launch.merge_k, stream);
}

// Runs the key's padded dummy batch eagerly first (cuBLASLt picks its algorithms outside
// capture, and the kernels see their shapes once), then captures the same launches.
absl::Status CudaRunner::CaptureRoundGraphs(int32_t max_batch, std::span<const int32_t> q_lens,
                                            bool all_rows) {
  if (s_->eager || s_->buckets.empty()) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(cuda::Check(cudaSetDevice(s_->device), "cudaSetDevice"));
  // Every bucket up to max_batch's own.
  const int32_t last = *std::lower_bound(s_->buckets.begin(), s_->buckets.end(),
                                         std::clamp(max_batch, 1, s_->buckets.back()));
  for (const int32_t bucket : s_->buckets) {
    if (bucket > last) break;
    for (const int32_t q_len : q_lens) {
      if (q_len < 1) continue;
      const size_t rows =
          all_rows ? static_cast<size_t>(bucket) * static_cast<size_t>(q_len) : bucket;
      if (q_len == 1 && !all_rows) continue;  // a decode graph, captured at load
      SPECD_RETURN_IF_ERROR(s_->EnsureGraph(s_->RoundKeyFor(bucket, q_len, rows, 0)).status());
      if (s_->round_graphs_full) return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::State::Capture(GraphKey key) {
  SPECD_ASSIGN_OR_RETURN(Launch launch, Prepare({}, {}, key));
  SPECD_RETURN_IF_ERROR(RunGraphBody(launch));
  SPECD_RETURN_IF_ERROR(Sync("graph warm-up"));
  SPECD_ASSIGN_OR_RETURN(cudaGraphExec_t exec,
                         cuda::CaptureGraph(
                             stream, [&] { return RunGraphBody(launch); }, Describe(key)));
  graphs[key] = exec;
  return absl::OkStatus();
}

absl::Status CudaRunner::State::WarmUpAndCapture() {
  // A two-token prefill into the scratch block: the prefill kernels see this model's shape now,
  // so a shape they cannot run fails at load, not on the first request.
  if (limits.max_tokens >= 2 && block_size >= 2) {
    const std::vector<int32_t> tokens = {0, 0}, table = {num_kv_blocks}, row = {1};
    const SequenceInput prefill{tokens, 0, table, false};
    SPECD_ASSIGN_OR_RETURN(Launch launch, Prepare({&prefill, 1}, row, GraphKey{}));
    SPECD_RETURN_IF_ERROR(Execute(launch));
    SPECD_RETURN_IF_ERROR(Sync("prefill warm-up"));
  }
  if (eager) {
    SPECD_ASSIGN_OR_RETURN(Launch decode, Prepare({}, {}, GraphKey{1, 1, 0}));
    SPECD_RETURN_IF_ERROR(RunGraphBody(decode));
    return Sync("decode warm-up");
  }
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo before, cuda::GetMemoryInfo());
  // Under tensor parallelism greedy decode steps merge the vocabulary shards by their argmax
  // (VocabMergeK 1): those graphs too.
  const int32_t merges = shard.world_size > 1 ? 2 : 1;
  for (int32_t bucket : cuda_runner_internal::DecodeBuckets(limits.max_decode_batch)) {
    for (int32_t merge_k = 0; merge_k < merges; ++merge_k) {
      SPECD_RETURN_IF_ERROR(Capture(GraphKey{bucket, 1, 0, merge_k}));
    }
    buckets.push_back(bucket);
  }
  SPECD_ASSIGN_OR_RETURN(const cuda::MemoryInfo after, cuda::GetMemoryInfo());
  decode_graph_bytes = std::max<int64_t>(0, before.free - after.free);
  return absl::OkStatus();
}

}  // namespace specd
