// The model's shape and generation defaults, parsed from a Hugging Face model directory
// (config.json + generation_config.json) and validated once; immutable afterwards.
// Understands LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
// MistralForCausalLM, in both the transformers 4.x form (rope_theta / rope_scaling) and
// the 5.x form (rope_parameters). Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral };

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

  GenerationConfig generation;

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
};

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
