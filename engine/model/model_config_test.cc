#include "engine/model/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/base/mapped_file.h"

namespace specd {
namespace {

std::string ModelPath(const std::string& rel) {
  return std::string(SPECD_SHARED_DIR) + "/models/" + rel;
}

// A minimal valid transformers 4.x Llama config.
nlohmann::json LlamaJson() {
  return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                        {"vocab_size", 100},
                        {"hidden_size", 64},
                        {"intermediate_size", 128},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"max_position_embeddings", 256},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 500000.0},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2}};
}

absl::StatusOr<ModelConfig> Parse(const nlohmann::json& j) {
  return ParseModelConfig(j.dump(), "dir/config.json");
}

// The error is InvalidArgument and names the file and the field.
void ExpectBadField(const nlohmann::json& j, const std::string& field) {
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_FALSE(c.ok()) << "accepted a config with a bad " << field;
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("dir/config.json"), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
}

TEST(ModelConfigTest, ParsesTransformers4Llama) {
  absl::StatusOr<ModelConfig> c = Parse(LlamaJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->generation.bos_token_id, 1);
  EXPECT_EQ(c->generation.eos_token_ids, std::vector<int32_t>{2});
}

TEST(ModelConfigTest, ParsesTransformers4RopeScaling) {
  nlohmann::json j = LlamaJson();
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 8192);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // legacy key
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c->rope.factor, 2.0);
}

TEST(ModelConfigTest, ParsesEveryShippedFamily) {
  struct Case {
    const char* dir;
    ModelFamily family;
    RopeType rope;
    int32_t head_dim;
    bool qkv_bias, qk_norm, tied;
    int32_t sliding_window;
  } cases[] = {
      {"tiny-random/llama3", ModelFamily::kLlama, RopeType::kLlama3, 16, false, false, false, 0},
      {"tiny-random/llama-linear", ModelFamily::kLlama, RopeType::kLinear, 16, false, false, false,
       0},
      {"tiny-random/qwen2", ModelFamily::kQwen2, RopeType::kDefault, 16, true, false, true, 0},
      {"tiny-random/qwen3", ModelFamily::kQwen3, RopeType::kDefault, 32, false, true, false, 0},
      {"tiny-random/mistral", ModelFamily::kMistral, RopeType::kDefault, 16, false, false, false,
       16},
      {"codepair/target", ModelFamily::kLlama, RopeType::kDefault, 64, false, false, true, 0},
      {"stories260K/hf", ModelFamily::kLlama, RopeType::kDefault, 8, false, false, true, 0},
  };
  for (const Case& k : cases) {
    absl::StatusOr<ModelConfig> c = LoadModelConfig(ModelPath(k.dir));
    ASSERT_TRUE(c.ok()) << k.dir << ": " << c.status();
    EXPECT_EQ(c->family, k.family) << k.dir;
    EXPECT_EQ(c->rope.type, k.rope) << k.dir;
    EXPECT_EQ(c->head_dim, k.head_dim) << k.dir;
    EXPECT_EQ(c->qkv_bias, k.qkv_bias) << k.dir;
    EXPECT_EQ(c->qk_norm, k.qk_norm) << k.dir;
    EXPECT_EQ(c->tie_word_embeddings, k.tied) << k.dir;
    EXPECT_EQ(c->sliding_window, k.sliding_window) << k.dir;
    EXPECT_FALSE(c->generation.eos_token_ids.empty()) << k.dir;
  }
}

TEST(ModelConfigTest, ReadsTransformers5RopeParameters) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(ModelPath("tiny-random/llama3"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 512);
  c = LoadModelConfig(ModelPath("codepair/target"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope.theta, 100000.0);
  EXPECT_EQ(c->generation.bos_token_id, 0);
  EXPECT_EQ(c->generation.eos_token_ids, std::vector<int32_t>{1});
}

TEST(ModelConfigTest, GenerationConfigOverridesIdsAndSetsSamplingDefaults) {
  GenerationConfig base;
  base.bos_token_id = 1;
  base.eos_token_ids = {2};
  absl::StatusOr<GenerationConfig> g = ParseGenerationConfig(
      R"({"eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9, "top_k": 20})",
      "generation_config.json", base);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bos_token_id, 1);
  EXPECT_EQ(g->eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_FLOAT_EQ(*g->temperature, 0.6f);
  EXPECT_FLOAT_EQ(*g->top_p, 0.9f);
  EXPECT_EQ(*g->top_k, 20);
  g = ParseGenerationConfig(R"({"top_p": 1.5})", "generation_config.json", base);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  g = ParseGenerationConfig(R"({"eos_token_id": "x"})", "generation_config.json", base);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, Qwen3HeadDimMayDifferFromHiddenOverHeads) {
  nlohmann::json j = LlamaJson();
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["head_dim"] = 32;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->q_size(), 128);
  EXPECT_TRUE(c->qk_norm);
}

TEST(ModelConfigTest, RejectsUnsupportedArchitecture) {
  nlohmann::json j = LlamaJson();
  j["architectures"] = {"GPT2LMHeadModel"};
  ExpectBadField(j, "architectures");
  j.erase("architectures");
  ExpectBadField(j, "architectures");
}

TEST(ModelConfigTest, RejectsMissingOrNonPositiveShapeFields) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings"}) {
    nlohmann::json j = LlamaJson();
    j.erase(field);
    ExpectBadField(j, field);
    j[field] = -4;
    ExpectBadField(j, field);
    j[field] = 0;
    ExpectBadField(j, field);
    j[field] = "64";
    ExpectBadField(j, field);
  }
}

TEST(ModelConfigTest, RejectsInconsistentHeads) {
  nlohmann::json j = LlamaJson();
  j["num_key_value_heads"] = 3;  // 4 query heads
  ExpectBadField(j, "num_key_value_heads");
  j = LlamaJson();
  j["num_attention_heads"] = 3;  // 64 / 3, no head_dim given
  j["num_key_value_heads"] = 3;
  ExpectBadField(j, "hidden_size");
  j = LlamaJson();
  j["head_dim"] = 15;
  ExpectBadField(j, "head_dim");
}

TEST(ModelConfigTest, RejectsBadRope) {
  nlohmann::json j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  ExpectBadField(j, "rope_parameters.rope_type");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}};
  ExpectBadField(j, "rope_parameters.factor");
  j["rope_parameters"] = {{"rope_type", "llama3"},
                          {"factor", 8.0},
                          {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  ExpectBadField(j, "rope_parameters.low_freq_factor");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", -1.0}};
  ExpectBadField(j, "rope_parameters.rope_theta");
  j = LlamaJson();
  j["rope_theta"] = 0;
  ExpectBadField(j, "rope_theta");
  j = LlamaJson();
  j["rope_scaling"] = "linear";
  ExpectBadField(j, "rope_scaling");
}

TEST(ModelConfigTest, RejectsUnsupportedFeatures) {
  nlohmann::json j = LlamaJson();
  j["hidden_act"] = "gelu";
  ExpectBadField(j, "hidden_act");
  j = LlamaJson();
  j["mlp_bias"] = true;
  ExpectBadField(j, "mlp_bias");
  j = LlamaJson();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["use_sliding_window"] = true;
  ExpectBadField(j, "use_sliding_window");
  j["use_sliding_window"] = false;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  ExpectBadField(j, "layer_types");
  j = LlamaJson();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = -16;
  ExpectBadField(j, "sliding_window");
}

TEST(ModelConfigTest, RejectsBadSpecialIdsAndTypes) {
  nlohmann::json j = LlamaJson();
  j["eos_token_id"] = {2, 100};  // vocab is 100
  ExpectBadField(j, "eos_token_id");
  j = LlamaJson();
  j["bos_token_id"] = -1;
  ExpectBadField(j, "bos_token_id");
  j = LlamaJson();
  j["tie_word_embeddings"] = "yes";
  ExpectBadField(j, "tie_word_embeddings");
  j = LlamaJson();
  j["rms_norm_eps"] = 0.0;
  ExpectBadField(j, "rms_norm_eps");
}

TEST(ModelConfigTest, RejectsMalformedJsonAndMissingFiles) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("{\"vocab_size\": ", "dir/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("dir/config.json"), std::string::npos);
  c = ParseModelConfig("[1, 2]", "dir/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(LoadModelConfig("/nonexistent/model").ok());
}

// fla's NSAConfig as nsa-codepair ships it: fla's field names, hidden_act "swish".
TEST(ModelConfigTest, ParsesFlaNsaConfig) {
  absl::StatusOr<ModelConfig> c = LoadModelConfig(ModelPath("nsa-codepair"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kNsa);
  EXPECT_TRUE(c->is_nsa());
  EXPECT_EQ(c->num_heads, 16);
  EXPECT_EQ(c->num_kv_heads, 1);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->intermediate_size, 1024);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope.theta, 100000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->nsa.block_size, 32);
  EXPECT_EQ(c->nsa.block_counts, 8);
  EXPECT_EQ(c->nsa.window_size, 64);
  EXPECT_EQ(c->gate_size(), 48);
  EXPECT_EQ(c->generation.eos_token_ids, std::vector<int32_t>{1});
  // The 8B-class speed shape parses too (GQA 32 / 2, 64-token blocks).
  absl::StatusOr<ModelConfig> big = LoadModelConfig(ModelPath("shapes/nsa-8b"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->num_kv_heads, 2);
  EXPECT_EQ(big->nsa.block_counts, 16);
  EXPECT_DOUBLE_EQ(big->rms_norm_eps, 1e-5);
}

// NSA variants the CPU oracle does not compute are refused by name, never run wrongly.
TEST(ModelConfigTest, RefusesUnsupportedNsaVariants) {
  absl::StatusOr<std::string> text = ReadFileToString(ModelPath("nsa-codepair/config.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json base = nlohmann::json::parse(*text);
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = base;
    j[key] = value;
    return j;
  };
  ExpectBadField(with("qkv_bias", true), "qkv_bias");
  ExpectBadField(with("attnres_block_size", 4), "attnres_block_size");
  ExpectBadField(with("hidden_act", "gelu"), "hidden_act");
  ExpectBadField(with("block_counts", 6), "block_counts");
  ExpectBadField(with("window_size", 0), "window_size");
  ExpectBadField(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}), "rope_scaling");
  ExpectBadField(with("model_type", "llama"), "model_type");
  ExpectBadField(with("num_kv_heads", 3), "num_kv_heads");
  nlohmann::json no_blocks = base;
  no_blocks.erase("block_size");
  ExpectBadField(no_blocks, "block_size");
  // "swish" is fla's name for SiLU only in NSA configs; a Llama config keeps transformers' names.
  nlohmann::json llama = LlamaJson();
  llama["hidden_act"] = "swish";
  ExpectBadField(llama, "hidden_act");
  EXPECT_TRUE(Parse(with("hidden_act", "silu")).ok());
}

}  // namespace
}  // namespace specd
