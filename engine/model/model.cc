#include "engine/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/model/attention.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/json_fields.h"
#include "engine/model/safetensors.h"
#include "kernels/ref/vegas.h"
#include "kernels/ref/vocab_merge.h"

namespace specd {
namespace {

absl::Status SequenceError(size_t seq, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("Forward: sequence ", seq, ": ", AbslView(what)));
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const LoadOptions& opts) {
  SPECD_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  if (config.is_nsa() && opts.tp.enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NSA models do not run under tensor parallelism yet (world size ",
                     opts.tp.world_size, ")"));
  }
  SPECD_ASSIGN_OR_RETURN(TpShard shard, MakeTpShard(config, opts.tp));
  if (opts.tp.enabled()) {
    if (opts.comm == nullptr || opts.comm->on_device() ||
        opts.comm->world_size() != opts.tp.world_size || opts.comm->rank() != opts.tp.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor-parallel rank ", opts.tp.rank, " of ", opts.tp.world_size,
                       " needs a host communicator of that rank and size"));
    }
  }
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint checkpoint, SafetensorsCheckpoint::OpenDir(dir));
  SPECD_ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(config, checkpoint, shard));
  std::unique_ptr<Model> model(new Model(std::move(config), std::move(weights), opts, shard));
  SPECD_LOG_INFO("loaded {} from {}: {} layers, hidden {}, vocab {}, {} threads, tp rank {} of {}",
                 model->config_.architecture, dir, model->config_.num_layers,
                 model->config_.hidden_size, model->config_.vocab_size, model->pool_->num_threads(),
                 shard.rank, shard.world_size);
  return model;
}

Model::Model(ModelConfig config, ModelWeights weights, const LoadOptions& opts,
             const TpShard& shard)
    : config_(std::move(config)),
      local_(LocalModelConfig(config_, shard)),
      shard_(shard),
      comm_(shard.world_size > 1 ? opts.comm : nullptr),
      weights_(std::move(weights)),
      inv_freq_(RopeInvFreq(config_.rope, config_.head_dim)),
      pool_(std::make_unique<ThreadPool>(opts.num_threads)) {
  ConfigureBlas(pool_->num_threads());
  if (local_.is_nsa()) {
    nsa_ = std::make_unique<NsaAttention>(
        NsaShape{local_.num_heads, local_.num_kv_heads, local_.head_dim, local_.nsa},
        local_.num_layers);
  }
}

KvCacheSpec Model::MakeKvCacheSpec(int32_t num_blocks, int32_t block_size) const {
  KvCacheSpec spec;
  spec.num_layers = local_.num_layers;
  spec.num_kv_heads = local_.num_kv_heads;
  spec.head_dim = local_.head_dim;
  spec.block_size = block_size;
  spec.num_blocks = num_blocks;
  // NSA: each complete block's mean K / V kept in its last page (NsaAttention reads them).
  if (local_.is_nsa()) spec.compressed_block_size = local_.nsa.block_size;
  return spec;
}

absl::Status Model::SumOverRanks(float* data, int64_t count) {
  if (comm_ == nullptr) return absl::OkStatus();
  return comm_->AllReduceSum(data, static_cast<size_t>(count), CommDataType::kF32, nullptr);
}

absl::Status Model::ValidateBatch(std::span<const SequenceInput> batch,
                                  const CpuKvCache& kv) const {
  const KvCacheSpec& spec = kv.spec();
  if (!(spec == MakeKvCacheSpec(spec.num_blocks, spec.block_size))) {
    return absl::InvalidArgumentError("Forward: KV cache was not made for this model");
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& seq = batch[s];
    if (seq.tokens.empty()) return SequenceError(s, "no tokens");
    if (seq.start_pos < 0) return SequenceError(s, "negative start_pos");
    const int64_t end = int64_t{seq.start_pos} + static_cast<int64_t>(seq.tokens.size());
    if (end > config_.max_position_embeddings) {
      return SequenceError(
          s, absl::StrCat("positions up to ", end - 1, " exceed max_position_embeddings ",
                          config_.max_position_embeddings));
    }
    const int64_t blocks_needed = (end + spec.block_size - 1) / spec.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed) {
      return SequenceError(
          s, absl::StrCat("block table has ", seq.block_table.size(), " blocks, positions up to ",
                          end - 1, " need ", blocks_needed));
    }
    for (int64_t b = 0; b < blocks_needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= spec.num_blocks) {
        return SequenceError(s, absl::StrCat("block id ", seq.block_table[b], " outside [0, ",
                                             spec.num_blocks, ")"));
      }
    }
    for (int32_t id : seq.tokens) {
      if (id < 0 || id >= config_.vocab_size) {
        return SequenceError(
            s, absl::StrCat("token id ", id, " outside the vocabulary of ", config_.vocab_size));
      }
    }
    if (seq.attention != nullptr) SPECD_RETURN_IF_ERROR(ValidateAttention(s, seq));
    if (seq.tree != nullptr) SPECD_RETURN_IF_ERROR(ValidateTree(s, seq));
    if (seq.ssv != nullptr) {
      if (nsa_ == nullptr) return SequenceError(s, "an SSV strategy needs an NSA model");
      const absl::Status st = ValidateSsvStrategy(*seq.ssv, "ssv.");
      if (!st.ok()) return SequenceError(s, std::string(st.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::ValidateTree(size_t s, const SequenceInput& seq) const {
  const TokenTree& tree = *seq.tree;
  if (nsa_ != nullptr) return SequenceError(s, "token trees are not supported by NSA models");
  if (seq.attention != nullptr || seq.ssv != nullptr) {
    return SequenceError(s, "a token tree takes no attention options or SSV strategy");
  }
  const absl::Status st = ValidateChunkTree(tree, seq.start_pos, seq.tokens.size());
  if (!st.ok()) return SequenceError(s, std::string(st.message()));
  return absl::OkStatus();
}

absl::Status Model::ValidateAttention(size_t s, const SequenceInput& seq) const {
  const ChunkAttention& a = *seq.attention;
  if (nsa_ != nullptr) return SequenceError(s, "attention options are not supported by NSA models");
  // Head averages need every head, and sparse lists would have to travel to every rank.
  if (comm_ != nullptr) return SequenceError(s, "attention options need tensor parallelism off");
  const int64_t layers = config_.num_layers;
  if (a.select_slot >= 0 || a.slot >= 0) {
    return SequenceError(s, "selection slots need a runner that keeps selections on its device");
  }
  if (!a.scores.empty() && a.sparse()) {
    return SequenceError(s, "a chunk collects scores or attends sparsely, not both");
  }
  if (!a.scores.empty() &&
      static_cast<int64_t>(a.scores.size()) != layers * 2 * int64_t{seq.start_pos}) {
    return SequenceError(s, absl::StrCat("score buffer holds ", a.scores.size(), " floats, [",
                                         layers, ", 2, ", seq.start_pos, "] needed"));
  }
  if (!a.sparse()) return absl::OkStatus();
  if (static_cast<int64_t>(a.layer_indices.size()) != layers) {
    return SequenceError(s, absl::StrCat("sparse attention has ", a.layer_indices.size(),
                                         " index lists for ", layers, " layers"));
  }
  if (a.recent_start < 0 || a.recent_start > seq.start_pos) {
    return SequenceError(
        s, absl::StrCat("recent_start ", a.recent_start, " outside [0, ", seq.start_pos, "]"));
  }
  for (int64_t l = 0; l < layers; ++l) {
    int32_t prev = -1;
    for (int32_t p : a.layer_indices[l]) {
      if (p <= prev || p >= a.recent_start) {
        return SequenceError(s, absl::StrCat("layer ", l, ": index ", p,
                                             " not ascending below recent_start ", a.recent_start));
      }
      prev = p;
    }
  }
  return absl::OkStatus();
}

// Capture slots: a scored chunk's first token (row 0) and last token (row 1), one slot for both
// when the chunk has one token.
void Model::PlanAttentionOptions(std::span<const SequenceInput> batch) {
  ws_.attention.assign(batch.size(), nullptr);
  ws_.any_sparse = false;
  ws_.ssv.clear();
  for (size_t s = 0; s < batch.size(); ++s) {
    if (batch[s].ssv == nullptr) continue;
    if (ws_.ssv.empty()) ws_.ssv.assign(batch.size(), nullptr);
    ws_.ssv[s] = batch[s].ssv;
  }
  ws_.slot_of_token.clear();
  ws_.slot_seq.clear();
  ws_.slot_prefix.clear();
  ws_.capture_stride = 0;
  int64_t first = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& seq = batch[s];
    const int64_t last = first + static_cast<int64_t>(seq.tokens.size()) - 1;
    ws_.attention[s] = seq.attention;
    if (seq.attention != nullptr) ws_.any_sparse |= seq.attention->sparse();
    if (seq.attention != nullptr && !seq.attention->scores.empty()) {
      if (ws_.slot_of_token.empty()) ws_.slot_of_token.assign(ws_.tokens.size(), -1);
      for (int64_t t : {first, last}) {
        if (ws_.slot_of_token[t] >= 0) continue;
        ws_.slot_of_token[t] = static_cast<int32_t>(ws_.slot_seq.size());
        ws_.slot_seq.push_back(static_cast<int32_t>(s));
        ws_.slot_prefix.push_back(seq.start_pos);
        ws_.capture_stride = std::max<int64_t>(ws_.capture_stride, seq.start_pos);
      }
    }
    first = last + 1;
  }
  ws_.capture.resize(ws_.slot_seq.size() * local_.num_heads * ws_.capture_stride);
  ws_.sparse.assign(ws_.any_sparse ? batch.size() : 0, SparseKeys{});
}

void Model::PlanLayerAttention(int32_t layer) {
  for (size_t s = 0; s < ws_.sparse.size(); ++s) {
    const ChunkAttention* a = ws_.attention[s];
    ws_.sparse[s] = a != nullptr && a->sparse()
                        ? SparseKeys{a->layer_indices[layer], a->recent_start}
                        : SparseKeys{};
  }
  std::fill(ws_.capture.begin(), ws_.capture.end(), -std::numeric_limits<float>::infinity());
}

// Each head's raw scores become its attention weights over the scored prefix (a softmax over
// [0, n): the fork's default "weight" score mode, normalised over the prefix rather than the
// whole row, so no other keys are needed), then the heads are averaged, summed in order from 0.
// Averaging raw pre-softmax scores instead lets the heads with the widest score range decide the
// selection: on codepair-long (engine_vegas_test, ratio 0.2, K 4 / 8) Vegas accepted 1.64 / 1.64
// tokens a round that way against 3.29 / 2.88 with weights (StreamingLLM at the same budget:
// 1.92 / 2.09). The arithmetic is kernels/ref's, so the CUDA kernel that computes these weights
// for the CUDA runner (kernels::VegasPrefixWeights) is tested against what this Model runs.
void HeadAveragedPrefixWeights(const float* scores, int64_t heads, int64_t stride, int64_t n,
                               float to_raw, float* out) {
  kernels::ref::HeadAveragedPrefixWeights(scores, heads, stride, n, to_raw, out);
}

void Model::ReduceScores(int32_t layer) {
  const int64_t heads = local_.num_heads, stride = ws_.capture_stride;
  std::vector<int32_t> seen(ws_.attention.size(), 0);  // slots of each sequence met so far
  for (size_t slot = 0; slot < ws_.slot_seq.size(); ++slot) {
    const int32_t s = ws_.slot_seq[slot];
    const ChunkAttention& a = *ws_.attention[s];
    const int64_t n = ws_.slot_prefix[slot];
    const bool one_row = slot + 1 == ws_.slot_seq.size() || ws_.slot_seq[slot + 1] != s;
    const int first_row = seen[s]++ == 0 ? 0 : 1;
    const int last_row = one_row && first_row == 0 ? 1 : first_row;
    float* first = a.scores.data() + (int64_t{layer} * 2 + first_row) * n;
    HeadAveragedPrefixWeights(&ws_.capture[slot * heads * stride], heads, stride, n, 1.0f, first);
    if (last_row != first_row) std::copy(first, first + n, first + n);
  }
}

void Model::PlanBatch(std::span<const SequenceInput> batch) {
  ws_.tokens.clear();
  ws_.positions.clear();
  ws_.seq_of_token.clear();
  ws_.logit_rows.clear();
  ws_.block_tables.clear();
  const bool any_tree = std::any_of(batch.begin(), batch.end(),
                                    [](const SequenceInput& seq) { return seq.tree != nullptr; });
  ws_.slots.clear();
  ws_.tree_prefix.clear();
  ws_.tree_key_data.clear();
  ws_.tree_keys.clear();
  std::vector<size_t> key_offsets;  // [T + 1] when any_tree
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& seq = batch[s];
    const int64_t first = static_cast<int64_t>(ws_.tokens.size());
    if (seq.tree != nullptr) TreeDepths(seq.tree->parents, &ws_.depths);
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      const int32_t slot = seq.start_pos + static_cast<int32_t>(i);
      ws_.tokens.push_back(seq.tokens[i]);
      ws_.seq_of_token.push_back(static_cast<int32_t>(s));
      if (!any_tree) {
        ws_.positions.push_back(slot);
        continue;
      }
      ws_.slots.push_back(slot);
      key_offsets.push_back(ws_.tree_key_data.size());
      if (seq.tree == nullptr) {
        ws_.positions.push_back(slot);
        ws_.tree_prefix.push_back(-1);
        continue;
      }
      const int32_t node = slot - seq.tree->start;
      ws_.positions.push_back(seq.tree->start + ws_.depths[node]);
      ws_.tree_prefix.push_back(seq.tree->start);
      ws_.path.clear();
      AppendTreePath(seq.tree->parents, node, &ws_.path);
      for (int32_t n : ws_.path) ws_.tree_key_data.push_back(seq.tree->start + n);
    }
    const int64_t last = static_cast<int64_t>(ws_.tokens.size()) - 1;
    for (int64_t t = seq.all_logits ? first : last; t <= last; ++t) ws_.logit_rows.push_back(t);
    ws_.block_tables.push_back(seq.block_table);
  }
  if (any_tree) {  // spans into tree_key_data once it stopped growing
    key_offsets.push_back(ws_.tree_key_data.size());
    for (size_t t = 0; t + 1 < key_offsets.size(); ++t) {
      ws_.tree_keys.push_back(std::span<const int32_t>(ws_.tree_key_data)
                                  .subspan(key_offsets[t], key_offsets[t + 1] - key_offsets[t]));
    }
  }
  PlanAttentionOptions(batch);
  const int64_t n = static_cast<int64_t>(ws_.tokens.size());
  const int32_t half = local_.head_dim / 2;
  ws_.x.resize(n * local_.hidden_size);
  ws_.h.resize(n * local_.hidden_size);
  ws_.proj.resize(n * local_.hidden_size);
  ws_.qkv.resize(n * qkv_stride());
  ws_.attn.resize(n * local_.q_size());
  ws_.gate_up.resize(n * 2 * local_.intermediate_size);
  ws_.act.resize(n * local_.intermediate_size);
  ws_.cos.resize(n * half);
  ws_.sin.resize(n * half);
  for (int64_t t = 0; t < n; ++t) {
    RopeCosSin(inv_freq_, ws_.positions[t], &ws_.cos[t * half], &ws_.sin[t * half]);
  }
}

absl::Status Model::Embed() {
  const int64_t hidden = local_.hidden_size;
  if (comm_ == nullptr) {
    for (size_t t = 0; t < ws_.tokens.size(); ++t) {
      std::memcpy(&ws_.x[t * hidden], &weights_.embed[ws_.tokens[t] * hidden],
                  sizeof(float) * hidden);
    }
    return absl::OkStatus();
  }
  // Vocabulary-parallel: the rank holding an id's row contributes it, the others zeros.
  for (size_t t = 0; t < ws_.tokens.size(); ++t) {
    const int64_t row = ws_.tokens[t] - shard_.vocab_begin;
    if (row >= 0 && row < shard_.vocab_local) {
      std::memcpy(&ws_.x[t * hidden], &weights_.embed[row * hidden], sizeof(float) * hidden);
    } else {
      std::memset(&ws_.x[t * hidden], 0, sizeof(float) * hidden);
    }
  }
  return SumOverRanks(ws_.x.data(), static_cast<int64_t>(ws_.tokens.size()) * hidden);
}

void Model::QkNormAndRope(const LayerWeights& w) {
  const int64_t n = static_cast<int64_t>(ws_.tokens.size());
  const int32_t hd = local_.head_dim, half = hd / 2;
  const int32_t heads = local_.num_heads + local_.num_kv_heads;  // q heads, then k heads
  const int64_t stride = qkv_stride();
  for (int64_t t = 0; t < n; ++t) {
    float* row = &ws_.qkv[t * stride];
    if (local_.qk_norm) {
      RmsNorm(row, w.q_norm.data(), local_.num_heads, hd, hd, local_.rms_norm_eps, row);
      float* k = row + local_.q_size();
      RmsNorm(k, w.k_norm.data(), local_.num_kv_heads, hd, hd, local_.rms_norm_eps, k);
    }
    for (int32_t h = 0; h < heads; ++h) {
      ApplyRope(row + int64_t{h} * hd, &ws_.cos[t * half], &ws_.sin[t * half], hd);
    }
  }
}

// Under tensor parallelism o_proj's output is this rank's partial sum (its heads' columns; the
// bias only on rank 0), summed over the ranks before the residual add.
absl::Status Model::AttentionBlock(int32_t layer, CpuKvCache& kv) {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t n = static_cast<int64_t>(ws_.tokens.size());
  const int64_t hidden = local_.hidden_size;
  const int64_t stride = qkv_stride();
  RmsNorm(ws_.x.data(), w.input_norm.data(), n, local_.hidden_size, hidden, local_.rms_norm_eps,
          ws_.h.data());
  Linear(ws_.h.data(), n, hidden, w.qkv.data(), stride,
         w.qkv_bias.empty() ? nullptr : w.qkv_bias.data(), ws_.qkv.data());
  QkNormAndRope(w);
  const TokenLayout layout{ws_.positions, ws_.seq_of_token, ws_.block_tables,
                           ws_.slots,     ws_.tree_prefix,  ws_.tree_keys};
  const float* k = ws_.qkv.data() + local_.q_size();
  WriteKv(layout, k, k + local_.kv_size(), stride, layer, kv);
  Attend(layer, layout, kv);
  Linear(ws_.attn.data(), n, local_.q_size(), w.o_proj.data(), hidden,
         w.o_bias.empty() ? nullptr : w.o_bias.data(), ws_.proj.data());
  SPECD_RETURN_IF_ERROR(SumOverRanks(ws_.proj.data(), n * hidden));
  AddInPlace(ws_.x.data(), ws_.proj.data(), n * hidden);
  return absl::OkStatus();
}

void Model::Attend(int32_t layer, const TokenLayout& layout, CpuKvCache& kv) {
  const int64_t stride = qkv_stride();
  if (nsa_ != nullptr) {
    const float* gates = ws_.qkv.data() + local_.q_size() + 2 * local_.kv_size();
    nsa_->Run(*pool_, layout, ws_.qkv.data(), stride, gates, stride, kv, layer, ws_.attn.data(),
              ws_.ssv);
    return;
  }
  const AttentionShape shape{local_.num_heads, local_.num_kv_heads, local_.head_dim,
                             local_.sliding_window};
  PlanLayerAttention(layer);
  const ScoreCapture capture{ws_.slot_of_token, ws_.slot_prefix, ws_.capture.data(),
                             ws_.capture_stride};
  PagedAttention(*pool_, shape, layout, ws_.qkv.data(), stride, kv, layer, ws_.attn.data(),
                 ws_.sparse, ws_.slot_seq.empty() ? nullptr : &capture);
  if (!ws_.slot_seq.empty()) ReduceScores(layer);
}

// Under tensor parallelism gate/up hold this rank's intermediate columns and down's output is
// its partial sum.
absl::Status Model::MlpBlock(int32_t layer) {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t n = static_cast<int64_t>(ws_.tokens.size());
  const int64_t hidden = local_.hidden_size, ffn = local_.intermediate_size;
  RmsNorm(ws_.x.data(), w.post_norm.data(), n, local_.hidden_size, hidden, local_.rms_norm_eps,
          ws_.h.data());
  Linear(ws_.h.data(), n, hidden, w.gate_up.data(), 2 * ffn, nullptr, ws_.gate_up.data());
  SiluMul(ws_.gate_up.data(), n, local_.intermediate_size, ws_.act.data());
  Linear(ws_.act.data(), n, ffn, w.down.data(), hidden, nullptr, ws_.proj.data());
  SPECD_RETURN_IF_ERROR(SumOverRanks(ws_.proj.data(), n * hidden));
  AddInPlace(ws_.x.data(), ws_.proj.data(), n * hidden);
  return absl::OkStatus();
}

absl::Status Model::ComputeLogits(std::vector<float>* logits, int32_t vocab_merge_k) {
  const int64_t hidden = local_.hidden_size, vocab = local_.vocab_size;
  const int64_t rows = static_cast<int64_t>(ws_.logit_rows.size());
  for (int64_t r = 0; r < rows; ++r) {  // gather, then normalise only the rows returned
    RmsNorm(&ws_.x[ws_.logit_rows[r] * hidden], weights_.final_norm.data(), 1, local_.hidden_size,
            hidden, local_.rms_norm_eps, &ws_.h[r * hidden]);
  }
  if (comm_ != nullptr) return ComputeShardedLogits(rows, logits, vocab_merge_k);
  const size_t offset = logits->size();
  logits->resize(offset + rows * vocab);
  Linear(ws_.h.data(), rows, hidden, weights_.output_matrix().data(), vocab, nullptr,
         logits->data() + offset);
  return absl::OkStatus();
}

// Every rank computes [rows, S] (its vocab_local columns, zero padding past the vocabulary) into
// its row of the gather buffer; after the gather, rank r's block holds columns [r * S, ...) of
// every row.
absl::Status Model::ComputeShardedLogits(int64_t rows, std::vector<float>* logits,
                                         int32_t vocab_merge_k) {
  const int64_t hidden = local_.hidden_size, vocab = local_.vocab_size;
  const int64_t stride = shard_.vocab_shard, local = shard_.vocab_local;
  const int32_t world = shard_.world_size;
  ws_.gathered.resize(world * rows * stride);
  float* mine = ws_.gathered.data() + shard_.rank * rows * stride;
  if (local > 0) {
    Linear(ws_.h.data(), rows, hidden, weights_.output_matrix().data(), local, nullptr, mine);
  }
  if (vocab_merge_k > 0) {  // [rows, local] -> each rank's k best, gathered, scattered
    const int64_t count = rows * vocab_merge_k * 2;
    ws_.pairs.resize(world * count);
    int32_t* own = ws_.pairs.data() + shard_.rank * count;
    kernels::ref::ShardCandidates(mine, local, static_cast<int32_t>(rows),
                                  static_cast<int32_t>(local), vocab_merge_k,
                                  static_cast<int32_t>(shard_.rank * stride), own);
    SPECD_RETURN_IF_ERROR(comm_->AllGather(own, ws_.pairs.data(), static_cast<size_t>(count),
                                           CommDataType::kI32, nullptr));
    const size_t offset = logits->size();
    logits->resize(offset + rows * vocab);
    kernels::ref::ScatterCandidates(ws_.pairs.data(), world, static_cast<int32_t>(rows),
                                    vocab_merge_k, static_cast<int32_t>(vocab),
                                    logits->data() + offset, vocab);
    return absl::OkStatus();
  }
  if (local < stride) {  // spread [rows, local] to [rows, stride], last row first
    for (int64_t r = rows - 1; r >= 0; --r) {
      if (local > 0) std::memmove(mine + r * stride, mine + r * local, sizeof(float) * local);
      std::memset(mine + r * stride + local, 0, sizeof(float) * (stride - local));
    }
  }
  SPECD_RETURN_IF_ERROR(comm_->AllGather(
      mine, ws_.gathered.data(), static_cast<size_t>(rows * stride), CommDataType::kF32, nullptr));
  const size_t offset = logits->size();
  logits->resize(offset + rows * vocab);
  float* out = logits->data() + offset;
  for (int32_t rank = 0; rank < world; ++rank) {
    const int64_t begin = rank * stride;
    const int64_t count = std::clamp<int64_t>(vocab - begin, 0, stride);
    const float* block = ws_.gathered.data() + rank * rows * stride;
    for (int64_t r = 0; count > 0 && r < rows; ++r) {
      std::memcpy(out + r * vocab + begin, block + r * stride, sizeof(float) * count);
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const SequenceInput> batch, CpuKvCache& kv,
                            std::vector<float>* logits, int32_t vocab_merge_k) {
  if (logits == nullptr) return absl::InvalidArgumentError("Forward: logits is null");
  SPECD_RETURN_IF_ERROR(ValidateBatch(batch, kv));
  if (batch.empty()) return absl::OkStatus();
  PlanBatch(batch);
  SPECD_RETURN_IF_ERROR(Embed());
  if (num_aux_ > 0) aux_.resize(ws_.tokens.size() * num_aux_ * local_.hidden_size);
  for (int32_t layer = 0; layer < local_.num_layers; ++layer) {
    if (num_aux_ > 0 && aux_layer_[layer]) CaptureAux(layer);
    SPECD_RETURN_IF_ERROR(AttentionBlock(layer, kv));
    SPECD_RETURN_IF_ERROR(MlpBlock(layer));
  }
  return ComputeLogits(logits, vocab_merge_k);
}

absl::Status Model::SetAuxHiddenLayers(std::span<const int32_t> ids) {
  std::vector<bool> layer(config_.num_layers, false);
  for (int32_t id : ids) {
    if (id < 0 || id >= config_.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("aux hidden-state layer id ", id,
                                                     " is outside [0, ", config_.num_layers, ")"));
    }
    layer[id] = true;
  }
  aux_ids_.assign(ids.begin(), ids.end());
  aux_layer_ = std::move(layer);
  num_aux_ = static_cast<int32_t>(ids.size());
  aux_.clear();
  return absl::OkStatus();
}

void Model::CaptureAux(int32_t layer) {
  const int64_t hidden = local_.hidden_size;
  const int64_t stride = num_aux_ * hidden;
  for (int32_t slot = 0; slot < num_aux_; ++slot) {
    if (aux_ids_[slot] != layer) continue;
    for (size_t t = 0; t < ws_.tokens.size(); ++t) {
      std::memcpy(&aux_[t * stride + slot * hidden], &ws_.x[t * hidden], sizeof(float) * hidden);
    }
  }
}

}  // namespace specd
