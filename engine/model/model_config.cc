#include "engine/model/model_config.h"

#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/model/json_fields.h"

namespace specd {
namespace {

using nlohmann::json;

absl::StatusOr<ModelFamily> FamilyOf(const std::string& architecture, const JsonFields& f) {
  if (architecture == "LlamaForCausalLM") return ModelFamily::kLlama;
  if (architecture == "Qwen2ForCausalLM") return ModelFamily::kQwen2;
  if (architecture == "Qwen3ForCausalLM") return ModelFamily::kQwen3;
  if (architecture == "MistralForCausalLM") return ModelFamily::kMistral;
  if (architecture == "NSAForCausalLM") {
    SPECD_ASSIGN_OR_RETURN(std::optional<std::string> type, f.OptionalString("model_type"));
    if (type.has_value() && *type != "nsa") {
      return f.Error("model_type",
                     absl::StrCat("'", *type, "' with NSAForCausalLM (expected 'nsa')"));
    }
    return ModelFamily::kNsa;
  }
  return f.Error("architectures",
                 absl::StrCat("unsupported architecture '", architecture,
                              "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                              "Qwen3ForCausalLM, MistralForCausalLM, NSAForCausalLM)"));
}

// Field names differ by family: fla's configs (NSA) are not transformers'.
struct ShapeKeys {
  std::string_view num_heads = "num_attention_heads";
  std::string_view num_kv_heads = "num_key_value_heads";
  std::string_view norm_eps = "rms_norm_eps";
};

ShapeKeys ShapeKeysOf(ModelFamily family) {
  if (family == ModelFamily::kNsa) return {"num_heads", "num_kv_heads", "norm_eps"};
  return {};
}

// transformers' Qwen3Config and fla's NSAConfig default head_dim; the others derive it.
std::optional<int32_t> DefaultHeadDim(ModelFamily family) {
  if (family == ModelFamily::kQwen3) return 128;
  if (family == ModelFamily::kNsa) return 64;
  return std::nullopt;
}

absl::StatusOr<std::string> ArchitectureOf(const json& root, const JsonFields& f) {
  auto it = root.find("architectures");
  if (it == root.end() || it->is_null()) return f.Error("architectures", "missing");
  if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return f.Error("architectures", "expected a non-empty list of strings");
  }
  return (*it)[0].get<std::string>();
}

// Reads a required positive int32 field.
absl::StatusOr<int32_t> PositiveInt(const JsonFields& f, std::string_view key) {
  SPECD_ASSIGN_OR_RETURN(int64_t v, f.Int(key));
  if (v <= 0 || v > std::numeric_limits<int32_t>::max()) {
    return f.Error(key, absl::StrCat("must be a positive 32-bit integer, got ", v));
  }
  return static_cast<int32_t>(v);
}

// Reads an optional positive int32 field, `fallback` when absent or null.
absl::StatusOr<int32_t> OptionalPositiveInt(const JsonFields& f, std::string_view key,
                                            int32_t fallback) {
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> v, f.OptionalInt(key));
  if (!v.has_value()) return fallback;
  return PositiveInt(f, key);
}

absl::StatusOr<double> PositiveDouble(const JsonFields& f, std::string_view key,
                                      std::optional<double> fallback) {
  SPECD_ASSIGN_OR_RETURN(std::optional<double> v, f.OptionalDouble(key));
  if (!v.has_value()) {
    if (!fallback.has_value()) return f.Error(key, "missing");
    return *fallback;
  }
  if (*v <= 0.0) return f.Error(key, absl::StrCat("must be positive, got ", *v));
  return *v;
}

absl::Status ParseShape(const JsonFields& f, ModelConfig* c) {
  const ShapeKeys keys = ShapeKeysOf(c->family);
  SPECD_ASSIGN_OR_RETURN(c->vocab_size, PositiveInt(f, "vocab_size"));
  SPECD_ASSIGN_OR_RETURN(c->hidden_size, PositiveInt(f, "hidden_size"));
  SPECD_ASSIGN_OR_RETURN(c->intermediate_size, PositiveInt(f, "intermediate_size"));
  SPECD_ASSIGN_OR_RETURN(c->num_layers, PositiveInt(f, "num_hidden_layers"));
  SPECD_ASSIGN_OR_RETURN(c->num_heads, PositiveInt(f, keys.num_heads));
  SPECD_ASSIGN_OR_RETURN(c->max_position_embeddings, PositiveInt(f, "max_position_embeddings"));
  SPECD_ASSIGN_OR_RETURN(c->num_kv_heads, OptionalPositiveInt(f, keys.num_kv_heads, c->num_heads));
  if (c->num_heads % c->num_kv_heads != 0) {
    return f.Error(keys.num_kv_heads, absl::StrCat(c->num_kv_heads, " does not divide ",
                                                   AbslView(keys.num_heads), " ", c->num_heads));
  }
  const std::optional<int32_t> fixed_head_dim = DefaultHeadDim(c->family);
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, f.OptionalInt("head_dim"));
  if (!head_dim.has_value() && !fixed_head_dim.has_value() && c->hidden_size % c->num_heads != 0) {
    return f.Error("hidden_size", absl::StrCat(c->hidden_size, " is not divisible by ",
                                               AbslView(keys.num_heads), " ", c->num_heads));
  }
  SPECD_ASSIGN_OR_RETURN(
      c->head_dim,
      OptionalPositiveInt(f, "head_dim", fixed_head_dim.value_or(c->hidden_size / c->num_heads)));
  if (c->head_dim % 2 != 0) {
    return f.Error("head_dim", absl::StrCat("must be even for RoPE, got ", c->head_dim));
  }
  SPECD_ASSIGN_OR_RETURN(c->rms_norm_eps, PositiveDouble(f, keys.norm_eps, 1e-6));
  SPECD_ASSIGN_OR_RETURN(std::optional<std::string> act, f.OptionalString("hidden_act"));
  // fla's GatedMLP names SiLU "swish" (and refuses "silu"); transformers' models say "silu".
  const bool silu = !act.has_value() || *act == "silu" || (c->is_nsa() && *act == "swish");
  if (!silu) return f.Error("hidden_act", absl::StrCat("unsupported activation '", *act, "'"));
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> tie, f.OptionalBool("tie_word_embeddings"));
  c->tie_word_embeddings = tie.value_or(false);
  return absl::OkStatus();
}

absl::Status ParseRopeType(const JsonFields& r, const std::string& type, RopeConfig* rope) {
  if (type == "default") {
    rope->type = RopeType::kDefault;
    return absl::OkStatus();
  }
  if (type == "linear") {
    rope->type = RopeType::kLinear;
    SPECD_ASSIGN_OR_RETURN(rope->factor, PositiveDouble(r, "factor", std::nullopt));
    return absl::OkStatus();
  }
  if (type != "llama3") {
    return r.Error("rope_type", absl::StrCat("unsupported RoPE type '", type,
                                             "' (supported: default, linear, llama3)"));
  }
  rope->type = RopeType::kLlama3;
  SPECD_ASSIGN_OR_RETURN(rope->factor, PositiveDouble(r, "factor", std::nullopt));
  SPECD_ASSIGN_OR_RETURN(rope->low_freq_factor, PositiveDouble(r, "low_freq_factor", std::nullopt));
  SPECD_ASSIGN_OR_RETURN(rope->high_freq_factor,
                         PositiveDouble(r, "high_freq_factor", std::nullopt));
  SPECD_ASSIGN_OR_RETURN(rope->original_max_position_embeddings,
                         PositiveInt(r, "original_max_position_embeddings"));
  if (rope->high_freq_factor <= rope->low_freq_factor) {
    return r.Error("high_freq_factor", "must be greater than low_freq_factor");
  }
  return absl::OkStatus();
}

// transformers 5.x keeps theta and the type in `rope_parameters`; 4.x has a top-level
// `rope_theta` and an optional `rope_scaling` (whose type key is `rope_type` or `type`).
absl::Status ParseRope(const JsonFields& f, std::string_view file, RopeConfig* rope) {
  SPECD_ASSIGN_OR_RETURN(const json* params, f.OptionalObject("rope_parameters"));
  std::string path = "rope_parameters.";
  if (params == nullptr) {
    SPECD_ASSIGN_OR_RETURN(params, f.OptionalObject("rope_scaling"));
    path = "rope_scaling.";
  }
  SPECD_ASSIGN_OR_RETURN(rope->theta, PositiveDouble(f, "rope_theta", 10000.0));
  SPECD_ASSIGN_OR_RETURN(std::optional<double> partial, f.OptionalDouble("partial_rotary_factor"));
  if (partial.has_value() && *partial != 1.0) {
    return f.Error("partial_rotary_factor", "partial rotary embeddings are not supported");
  }
  if (params == nullptr) return absl::OkStatus();
  JsonFields r(*params, file, path);
  SPECD_ASSIGN_OR_RETURN(rope->theta, PositiveDouble(r, "rope_theta", rope->theta));
  SPECD_ASSIGN_OR_RETURN(std::optional<std::string> type, r.OptionalString("rope_type"));
  if (!type.has_value()) {
    SPECD_ASSIGN_OR_RETURN(type, r.OptionalString("type"));
  }
  return ParseRopeType(r, type.value_or("default"), rope);
}

absl::Status CheckFullAttentionOnly(const json& root, const JsonFields& f) {
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> sliding, f.OptionalBool("use_sliding_window"));
  if (sliding.value_or(false)) {
    return f.Error("use_sliding_window", "sliding-window Qwen models are not supported");
  }
  auto it = root.find("layer_types");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return f.Error("layer_types", "expected a list of strings");
  for (const json& t : *it) {
    if (!t.is_string() || t.get<std::string>() != "full_attention") {
      return f.Error("layer_types", "only full_attention layers are supported");
    }
  }
  return absl::OkStatus();
}

// fla's NSA variants this backend does not compute are refused here, never run wrongly.
absl::Status ParseNsa(const json& root, const JsonFields& f, ModelConfig* c) {
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> qkv_bias, f.OptionalBool("qkv_bias"));
  if (qkv_bias.value_or(false)) {
    return f.Error("qkv_bias", "NSA with q/k/v biases is not supported");
  }
  auto attnres = root.find("attnres_block_size");
  if (attnres != root.end() && !attnres->is_null()) {
    return f.Error("attnres_block_size", "NSA with attention residuals is not supported");
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> affine, f.OptionalBool("elementwise_affine"));
  if (!affine.value_or(true)) {
    return f.Error("elementwise_affine", "norms without weights are not supported");
  }
  for (std::string_view key : {"rope_scaling", "rope_parameters"}) {
    auto it = root.find(key);
    if (it != root.end() && !it->is_null()) {
      return f.Error(key, "NSA models have plain RoPE (rope_theta only)");
    }
  }
  NsaConfig& n = c->nsa;
  // Required: fla's defaults moved between releases, and window_size 0 (no window branch, two
  // gates per head) is a variant this backend does not compute.
  SPECD_ASSIGN_OR_RETURN(n.block_size, PositiveInt(f, "block_size"));
  SPECD_ASSIGN_OR_RETURN(n.block_counts, PositiveInt(f, "block_counts"));
  SPECD_ASSIGN_OR_RETURN(n.window_size, PositiveInt(f, "window_size"));
  // fla selects next_pow2(block_counts) blocks; other counts are ambiguous between releases.
  if ((n.block_counts & (n.block_counts - 1)) != 0) {
    return f.Error("block_counts", absl::StrCat("must be a power of two, got ", n.block_counts));
  }
  return absl::OkStatus();
}

absl::Status ParseFamilyFeatures(const json& root, const JsonFields& f, ModelConfig* c) {
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> bias, f.OptionalBool("attention_bias"));
  switch (c->family) {
    case ModelFamily::kLlama: {
      c->qkv_bias = c->o_bias = bias.value_or(false);
      SPECD_ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, f.OptionalBool("mlp_bias"));
      if (mlp_bias.value_or(false)) return f.Error("mlp_bias", "MLP biases are not supported");
      return absl::OkStatus();
    }
    case ModelFamily::kQwen2:
      c->qkv_bias = true;
      return CheckFullAttentionOnly(root, f);
    case ModelFamily::kQwen3:
      c->qk_norm = true;
      c->qkv_bias = c->o_bias = bias.value_or(false);
      return CheckFullAttentionOnly(root, f);
    case ModelFamily::kMistral: {
      SPECD_ASSIGN_OR_RETURN(c->sliding_window, OptionalPositiveInt(f, "sliding_window", 0));
      return absl::OkStatus();
    }
    case ModelFamily::kNsa:
      return ParseNsa(root, f, c);
  }
  return absl::OkStatus();
}

// bos/eos ids: config.json's, overridden by generation_config.json's.
absl::Status ParseSpecialIds(const JsonFields& f, int32_t vocab_size, GenerationConfig* g) {
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> bos, f.OptionalInt("bos_token_id"));
  if (bos.has_value()) {
    if (*bos < 0 || (vocab_size > 0 && *bos >= vocab_size)) {
      return f.Error("bos_token_id", absl::StrCat(*bos, " is not a token id"));
    }
    g->bos_token_id = static_cast<int32_t>(*bos);
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> eos,
                         f.OptionalIntList("eos_token_id"));
  if (eos.has_value()) {
    g->eos_token_ids.clear();
    for (int64_t id : *eos) {
      if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
        return f.Error("eos_token_id", absl::StrCat(id, " is not a token id"));
      }
      g->eos_token_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseSamplingDefaults(const JsonFields& f, GenerationConfig* g) {
  SPECD_ASSIGN_OR_RETURN(std::optional<double> temperature, f.OptionalDouble("temperature"));
  if (temperature.has_value()) {
    if (*temperature < 0) return f.Error("temperature", "must not be negative");
    g->temperature = static_cast<float>(*temperature);
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<double> top_p, f.OptionalDouble("top_p"));
  if (top_p.has_value()) {
    if (*top_p <= 0 || *top_p > 1) return f.Error("top_p", "must be in (0, 1]");
    g->top_p = static_cast<float>(*top_p);
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, f.OptionalInt("top_k"));
  if (top_k.has_value()) {
    if (*top_k < 0 || *top_k > std::numeric_limits<int32_t>::max()) {
      return f.Error("top_k", "must be a non-negative 32-bit integer");
    }
    g->top_k = static_cast<int32_t>(*top_k);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view file) {
  SPECD_ASSIGN_OR_RETURN(json root, ParseJsonObject(json_text, file));
  JsonFields f(root, file);
  ModelConfig c;
  SPECD_ASSIGN_OR_RETURN(c.architecture, ArchitectureOf(root, f));
  SPECD_ASSIGN_OR_RETURN(c.family, FamilyOf(c.architecture, f));
  SPECD_RETURN_IF_ERROR(ParseShape(f, &c));
  SPECD_RETURN_IF_ERROR(ParseRope(f, file, &c.rope));
  SPECD_RETURN_IF_ERROR(ParseFamilyFeatures(root, f, &c));
  SPECD_RETURN_IF_ERROR(ParseSpecialIds(f, c.vocab_size, &c.generation));
  return c;
}

absl::StatusOr<GenerationConfig> ParseGenerationConfig(std::string_view json_text,
                                                       std::string_view file,
                                                       GenerationConfig base) {
  SPECD_ASSIGN_OR_RETURN(json root, ParseJsonObject(json_text, file));
  JsonFields f(root, file);
  SPECD_RETURN_IF_ERROR(ParseSpecialIds(f, /*vocab_size=*/0, &base));
  SPECD_RETURN_IF_ERROR(ParseSamplingDefaults(f, &base));
  return base;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  SPECD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  SPECD_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, config_path));
  const std::string gen_path = dir + "/generation_config.json";
  std::error_code ec;
  if (std::filesystem::exists(gen_path, ec)) {
    SPECD_ASSIGN_OR_RETURN(std::string gen_text, ReadFileToString(gen_path));
    SPECD_ASSIGN_OR_RETURN(config.generation,
                           ParseGenerationConfig(gen_text, gen_path, config.generation));
  }
  for (int32_t id : config.generation.eos_token_ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(gen_path, ": field 'eos_token_id': ", id, " is not a token id"));
    }
  }
  if (config.generation.bos_token_id.has_value() &&
      (*config.generation.bos_token_id < 0 ||
       *config.generation.bos_token_id >= config.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(gen_path, ": field 'bos_token_id': ", *config.generation.bos_token_id,
                     " is not a token id"));
  }
  return config;
}

TensorNames TensorNamesOf(ModelFamily family) {
  if (family == ModelFamily::kNsa) {
    return {"model.embeddings.weight", "attn_norm.weight", "attn.", "mlp_norm.weight"};
  }
  return {};
}

}  // namespace specd
