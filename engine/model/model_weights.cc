#include "engine/model/model_weights.h"

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"

namespace specd {
namespace {

// Reads `name`, of `shape`, into `dest` starting at float `offset` (fused matrices).
absl::Status ReadInto(const SafetensorsCheckpoint& ckpt, const std::string& name,
                      const std::vector<int64_t>& shape, int64_t offset, std::vector<float>& dest) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return ckpt.ReadF32(name, shape, std::span<float>(dest.data() + offset, count));
}

absl::Status LoadAttention(const ModelConfig& c, const SafetensorsCheckpoint& ckpt,
                           const std::string& prefix, LayerWeights& w) {
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  w.qkv.resize((q + 2 * kv) * hidden);
  SPECD_RETURN_IF_ERROR(ReadInto(ckpt, prefix + "q_proj.weight", {q, hidden}, 0, w.qkv));
  SPECD_RETURN_IF_ERROR(ReadInto(ckpt, prefix + "k_proj.weight", {kv, hidden}, q * hidden, w.qkv));
  SPECD_RETURN_IF_ERROR(
      ReadInto(ckpt, prefix + "v_proj.weight", {kv, hidden}, (q + kv) * hidden, w.qkv));
  if (c.qkv_bias) {
    w.qkv_bias.resize(q + 2 * kv);
    SPECD_RETURN_IF_ERROR(ReadInto(ckpt, prefix + "q_proj.bias", {q}, 0, w.qkv_bias));
    SPECD_RETURN_IF_ERROR(ReadInto(ckpt, prefix + "k_proj.bias", {kv}, q, w.qkv_bias));
    SPECD_RETURN_IF_ERROR(ReadInto(ckpt, prefix + "v_proj.bias", {kv}, q + kv, w.qkv_bias));
  }
  if (c.qk_norm) {
    SPECD_ASSIGN_OR_RETURN(w.q_norm, ckpt.ReadF32(prefix + "q_norm.weight", {c.head_dim}));
    SPECD_ASSIGN_OR_RETURN(w.k_norm, ckpt.ReadF32(prefix + "k_norm.weight", {c.head_dim}));
  }
  SPECD_ASSIGN_OR_RETURN(w.o_proj, ckpt.ReadF32(prefix + "o_proj.weight", {hidden, q}));
  if (c.o_bias) {
    SPECD_ASSIGN_OR_RETURN(w.o_bias, ckpt.ReadF32(prefix + "o_proj.bias", {hidden}));
  }
  return absl::OkStatus();
}

absl::Status LoadLayer(const ModelConfig& c, const SafetensorsCheckpoint& ckpt, int32_t index,
                       LayerWeights& w) {
  const std::string prefix = absl::StrCat("model.layers.", index, ".");
  const int64_t hidden = c.hidden_size, ffn = c.intermediate_size;
  SPECD_ASSIGN_OR_RETURN(w.input_norm, ckpt.ReadF32(prefix + "input_layernorm.weight", {hidden}));
  SPECD_RETURN_IF_ERROR(LoadAttention(c, ckpt, prefix + "self_attn.", w));
  SPECD_ASSIGN_OR_RETURN(w.post_norm,
                         ckpt.ReadF32(prefix + "post_attention_layernorm.weight", {hidden}));
  w.gate_up.resize(2 * ffn * hidden);
  SPECD_RETURN_IF_ERROR(
      ReadInto(ckpt, prefix + "mlp.gate_proj.weight", {ffn, hidden}, 0, w.gate_up));
  SPECD_RETURN_IF_ERROR(
      ReadInto(ckpt, prefix + "mlp.up_proj.weight", {ffn, hidden}, ffn * hidden, w.gate_up));
  SPECD_ASSIGN_OR_RETURN(w.down, ckpt.ReadF32(prefix + "mlp.down_proj.weight", {hidden, ffn}));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& c,
                                              const SafetensorsCheckpoint& ckpt) {
  ModelWeights w;
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size;
  SPECD_ASSIGN_OR_RETURN(w.embed, ckpt.ReadF32("model.embed_tokens.weight", {vocab, hidden}));
  w.layers.resize(c.num_layers);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    SPECD_RETURN_IF_ERROR(LoadLayer(c, ckpt, i, w.layers[i]));
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
    SPECD_ASSIGN_OR_RETURN(w.lm_head, ckpt.ReadF32("lm_head.weight", {vocab, hidden}));
  }
  return w;
}

}  // namespace specd
