#include "engine/model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

namespace specd {
namespace {

// Reads rows [row_begin, row_begin + num_rows) of `name` (of `shape`, all columns) into `dest`
// starting at float `offset` (fused matrices).
absl::Status ReadRowsInto(const SafetensorsCheckpoint& ckpt, const std::string& name,
                          const std::vector<int64_t>& shape, int64_t row_begin, int64_t num_rows,
                          int64_t offset, std::vector<float>& dest) {
  const int64_t cols = shape.size() == 2 ? shape[1] : 1;
  return ckpt.ReadF32Slice(name, shape, {row_begin, num_rows, 0, cols},
                           std::span<float>(dest.data() + offset, num_rows * cols));
}

// Columns [col_begin, col_begin + num_cols) of every row of the 2-D `name` (row-parallel layers).
absl::StatusOr<std::vector<float>> ReadColumns(const SafetensorsCheckpoint& ckpt,
                                               const std::string& name,
                                               const std::vector<int64_t>& shape, int64_t col_begin,
                                               int64_t num_cols) {
  std::vector<float> out(shape[0] * num_cols);
  SPECD_RETURN_IF_ERROR(
      ckpt.ReadF32Slice(name, shape, {0, shape[0], col_begin, num_cols}, std::span<float>(out)));
  return out;
}

// Rows of q then k then v, each projection's heads of this rank (weights, or biases with
// hidden 0).
absl::Status ReadQkv(const ModelConfig& c, const SafetensorsCheckpoint& ckpt,
                     const std::string& prefix, const std::string& suffix, const TpShard& s,
                     std::vector<float>& dest) {
  const int64_t hd = c.head_dim, q = c.q_size(), kv = c.kv_size();
  const int64_t q_local = s.q_size(c.head_dim), kv_local = s.kv_size(c.head_dim);
  const bool matrix = suffix == "weight";
  const int64_t cols = matrix ? c.hidden_size : 1;
  auto shape = [&](int64_t rows) {
    return matrix ? std::vector<int64_t>{rows, cols} : std::vector<int64_t>{rows};
  };
  // NSA's gate rows (3 per query head) follow v in the weight matrix; TP refuses NSA, so the rank
  // holds every head here.
  const int64_t gates = matrix ? c.gate_size() : 0;
  dest.resize((q_local + 2 * kv_local + gates) * cols);
  if (gates > 0) {
    SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, prefix + "g_proj.weight", shape(gates), 0, gates,
                                       (q_local + 2 * kv_local) * cols, dest));
  }
  SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, prefix + "q_proj." + suffix, shape(q), s.head_begin * hd,
                                     q_local, 0, dest));
  SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, prefix + "k_proj." + suffix, shape(kv),
                                     s.kv_head_begin * hd, kv_local, q_local * cols, dest));
  return ReadRowsInto(ckpt, prefix + "v_proj." + suffix, shape(kv), s.kv_head_begin * hd, kv_local,
                      (q_local + kv_local) * cols, dest);
}

absl::Status LoadAttention(const ModelConfig& c, const SafetensorsCheckpoint& ckpt,
                           const std::string& prefix, const TpShard& s, LayerWeights& w) {
  const int64_t hidden = c.hidden_size;
  SPECD_RETURN_IF_ERROR(ReadQkv(c, ckpt, prefix, "weight", s, w.qkv));
  if (c.qkv_bias) SPECD_RETURN_IF_ERROR(ReadQkv(c, ckpt, prefix, "bias", s, w.qkv_bias));
  if (c.qk_norm) {
    SPECD_ASSIGN_OR_RETURN(w.q_norm, ckpt.ReadF32(prefix + "q_norm.weight", {c.head_dim}));
    SPECD_ASSIGN_OR_RETURN(w.k_norm, ckpt.ReadF32(prefix + "k_norm.weight", {c.head_dim}));
  }
  SPECD_ASSIGN_OR_RETURN(w.o_proj,
                         ReadColumns(ckpt, prefix + "o_proj.weight", {hidden, c.q_size()},
                                     int64_t{s.head_begin} * c.head_dim, s.q_size(c.head_dim)));
  // The partial sums of o_proj are all-reduced: its bias is added once, by rank 0.
  if (c.o_bias && s.rank == 0) {
    SPECD_ASSIGN_OR_RETURN(w.o_bias, ckpt.ReadF32(prefix + "o_proj.bias", {hidden}));
  }
  return absl::OkStatus();
}

absl::Status LoadLayer(const ModelConfig& c, const SafetensorsCheckpoint& ckpt, int32_t index,
                       const TpShard& s, LayerWeights& w) {
  const TensorNames names = TensorNamesOf(c.family);
  const std::string prefix = absl::StrCat("model.layers.", index, ".");
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size, ffn_local = s.intermediate;
  SPECD_ASSIGN_OR_RETURN(w.input_norm,
                         ckpt.ReadF32(absl::StrCat(prefix, names.input_norm), {hidden}));
  SPECD_RETURN_IF_ERROR(LoadAttention(c, ckpt, absl::StrCat(prefix, names.attn), s, w));
  SPECD_ASSIGN_OR_RETURN(w.post_norm,
                         ckpt.ReadF32(absl::StrCat(prefix, names.post_norm), {hidden}));
  w.gate_up.resize(2 * ffn_local * hidden);
  SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, prefix + "mlp.gate_proj.weight", {ffn, hidden},
                                     s.intermediate_begin, ffn_local, 0, w.gate_up));
  SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, prefix + "mlp.up_proj.weight", {ffn, hidden},
                                     s.intermediate_begin, ffn_local, ffn_local * hidden,
                                     w.gate_up));
  SPECD_ASSIGN_OR_RETURN(w.down, ReadColumns(ckpt, prefix + "mlp.down_proj.weight", {hidden, ffn},
                                             s.intermediate_begin, ffn_local));
  return absl::OkStatus();
}

// This rank's vocabulary rows of the [vocab, hidden] `name`.
absl::StatusOr<std::vector<float>> ReadVocabRows(const ModelConfig& c,
                                                 const SafetensorsCheckpoint& ckpt,
                                                 const std::string& name, const TpShard& s) {
  std::vector<float> out(s.vocab_local * c.hidden_size);
  if (s.vocab_local == 0) return out;  // a last rank past the vocabulary (begin may exceed it)
  SPECD_RETURN_IF_ERROR(ReadRowsInto(ckpt, name, {c.vocab_size, c.hidden_size}, s.vocab_begin,
                                     s.vocab_local, 0, out));
  return out;
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& c,
                                              const SafetensorsCheckpoint& ckpt,
                                              const TpShard& shard) {
  ModelWeights w;
  const int64_t hidden = c.hidden_size;
  SPECD_ASSIGN_OR_RETURN(w.embed,
                         ReadVocabRows(c, ckpt, std::string(TensorNamesOf(c.family).embed), shard));
  w.layers.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    SPECD_RETURN_IF_ERROR(LoadLayer(c, ckpt, i, shard, w.layers[i]));
  }
  SPECD_ASSIGN_OR_RETURN(w.final_norm, ckpt.ReadF32("model.norm.weight", {hidden}));
  const bool has_lm_head = ckpt.Contains("lm_head.weight");
  w.tied = c.tie_word_embeddings || !has_lm_head;
  if (!c.tie_word_embeddings && !has_lm_head) {
    SPECD_LOG_WARN(
        "no lm_head.weight although tie_word_embeddings is false: using the "
        "token embedding as the output matrix");
  }
  if (!w.tied) {
    SPECD_ASSIGN_OR_RETURN(w.lm_head, ReadVocabRows(c, ckpt, "lm_head.weight", shard));
  }
  return w;
}

}  // namespace specd
