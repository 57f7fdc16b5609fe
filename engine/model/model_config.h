// The model's shape and generation defaults, parsed from a Hugging Face model directory
// (config.json + generation_config.json) and validated once; immutable afterwards.
// Understands LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
// MistralForCausalLM, in both the transformers 4.x form (rope_theta / rope_scaling) and
// the 5.x form (rope_parameters), and fla's NSAForCausalLM (model_type "nsa", fla's field
// names: num_heads, num_kv_heads, norm_eps). Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral, kNsa };

// Native Sparse Attention (fla's NSAConfig, fla >= 0.5.2 semantics; see
// engine/model/nsa_attention.h). Only meaningful when the family is kNsa.
struct NsaConfig {
  int32_t block_size = 0;    // tokens per block: compression kernel = stride = selection block
  int32_t block_counts = 0;  // S: blocks selected per query and KV head (a power of two)
  int32_t window_size = 0;   // sliding-window branch: the keys p - window_size + 1 .. p
};

// How RoPE frequencies are derived from theta (transformers' `rope_type`).
enum class RopeType { kDefault, kLinear, kLlama3 };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;  // linear and llama3
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct GenerationConfig {
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // any of these ends generation; may be empty
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
};

struct ModelConfig {
  std::string architecture;  // as in config.json, e.g. "LlamaForCausalLM"
  ModelFamily family = ModelFamily::kLlama;

  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;     // query heads
  int32_t num_kv_heads = 0;  // divides num_heads (GQA / MQA)
  int32_t head_dim = 0;      // may differ from hidden_size / num_heads (Qwen3)
  int32_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;

  bool tie_word_embeddings = false;  // lm_head shares the token embedding
  bool qkv_bias = false;             // q/k/v projections have biases (Qwen2, Llama attention_bias)
  bool o_bias = false;               // o_proj has a bias (Llama attention_bias)
  bool qk_norm = false;              // per-head RMSNorm of q and k before RoPE (Qwen3)
  int32_t sliding_window = 0;        // 0: full causal attention; else keys in (q - window, q]
  NsaConfig nsa;                     // kNsa only

  GenerationConfig generation;

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
  bool is_nsa() const { return family == ModelFamily::kNsa; }
  // NSA's gate logits per token: 3 per query head (compressed, selected, window), else none.
  int32_t gate_size() const { return is_nsa() ? 3 * num_heads : 0; }
};

// A family's checkpoint tensor names, for every backend's loader (fla's module tree (NSA) is not
// transformers'): the embedding, and per layer (after "model.layers.<i>.") the input norm, the
// attention module's prefix (its q_proj / k_proj / v_proj / o_proj and NSA's g_proj, the gate
// logits, 3 rows per query head) and the post-attention norm. The MLP, final norm and LM head
// are named alike in every family.
struct TensorNames {
  const char* embed = "model.embed_tokens.weight";
  const char* input_norm = "input_layernorm.weight";
  const char* attn = "self_attn.";
  const char* post_norm = "post_attention_layernorm.weight";
};
TensorNames TensorNamesOf(ModelFamily family);

// Parses config.json text; `file` names it in error messages. InvalidArgument for bad
// JSON, missing/negative/inconsistent fields, unknown RoPE types or unsupported
// architectures. The generation defaults come from the config's bos/eos ids.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view file);

// Parses generation_config.json text over `base` (usually the one config.json gave).
absl::StatusOr<GenerationConfig> ParseGenerationConfig(std::string_view json_text,
                                                       std::string_view file,
                                                       GenerationConfig base);

// Reads dir/config.json and, when present, dir/generation_config.json.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace specd
