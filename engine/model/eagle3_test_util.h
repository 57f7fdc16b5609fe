// Writes EAGLE-3 head checkpoints for tests: a random head shaped for a given target (config.json
// and model.safetensors in the LlamaForCausalLMEagle3 layout), with knobs that break it the ways
// a loader must refuse. Random weights draft badly, which is all the lossless tests need; the
// trained codepair head (models/codepair/eagle3) is what measures acceptance. Tests only.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model_config.h"

namespace specd::eagle3_test {

struct HeadOptions {
  int32_t draft_vocab_size = 0;             // 0: the target's vocabulary (no d2t written)
  std::vector<int32_t> aux_layer_ids = {};  // empty: not written (the loader's default)
  int32_t target_hidden_size = 0;           // 0: the target's
  int32_t num_layers = 1;
  std::string architecture = "LlamaForCausalLMEagle3";
  bool write_d2t = true;             // with a reduced draft vocabulary
  int64_t d2t_override_at = -1;      // >= 0: d2t[at] made to collide with d2t[0]
  std::string omit_tensor = {};      // a tensor left out
  std::string misshape_tensor = {};  // a tensor written one row short
  float scale = 0.05f;               // weights ~ N(0, scale)
  uint64_t seed = 7;
};

// A safetensors file of F32 tensors (and I64 ones), as the format lays them out.
class SafetensorsWriter {
 public:
  void AddF32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    Add(name, "F32", std::move(shape), v.data(), v.size() * sizeof(float));
  }
  void AddI64(const std::string& name, std::vector<int64_t> shape, const std::vector<int64_t>& v) {
    Add(name, "I64", std::move(shape), v.data(), v.size() * sizeof(int64_t));
  }
  void Write(const std::string& path) const {
    nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
    for (const auto& [name, entry] : entries_) header[name] = entry;
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    const uint64_t n = h.size();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << h;
    out.write(data_.data(), static_cast<std::streamsize>(data_.size()));
  }

 private:
  void Add(const std::string& name, const char* dtype, std::vector<int64_t> shape,
           const void* bytes, size_t size) {
    const size_t begin = data_.size();
    data_.resize(begin + size);
    std::memcpy(data_.data() + begin, bytes, size);
    entries_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, begin + size}}};
  }
  std::map<std::string, nlohmann::json> entries_;
  std::vector<char> data_;
};

// Writes a random head for `target` (hidden size and layer shape of the target's) into `dir`.
inline void WriteRandomHead(const std::string& dir, const ModelConfig& target,
                            const HeadOptions& o = {}) {
  std::filesystem::create_directories(dir);
  const int64_t h = target.hidden_size, hd = target.head_dim, heads = target.num_heads;
  const int64_t kv = target.num_kv_heads, ffn = target.intermediate_size;
  const int64_t vocab = target.vocab_size;
  const int64_t dv = o.draft_vocab_size > 0 ? o.draft_vocab_size : vocab;
  const int64_t th = o.target_hidden_size > 0 ? o.target_hidden_size : h;
  nlohmann::json config = {{"architectures", {o.architecture}},
                           {"model_type", "llama"},
                           {"hidden_size", h},
                           {"intermediate_size", ffn},
                           {"num_attention_heads", heads},
                           {"num_key_value_heads", kv},
                           {"head_dim", hd},
                           {"num_hidden_layers", o.num_layers},
                           {"rms_norm_eps", target.rms_norm_eps},
                           {"rope_theta", target.rope.theta},
                           {"max_position_embeddings", target.max_position_embeddings},
                           {"vocab_size", vocab},
                           {"draft_vocab_size", dv},
                           {"target_hidden_size", th},
                           {"tie_word_embeddings", false}};
  if (!o.aux_layer_ids.empty()) config["eagle_aux_hidden_state_layer_ids"] = o.aux_layer_ids;
  std::ofstream(dir + "/config.json") << config.dump(2);

  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, o.scale);
  SafetensorsWriter w;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    if (name == o.omit_tensor) return;
    if (name == o.misshape_tensor) shape[0] -= 1;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (float& x : v) x = ones ? 1.0f + normal(rng) : normal(rng);
    w.AddF32(name, shape, v);
  };
  add("fc.weight", {h, 3 * th});
  add("midlayer.input_layernorm.weight", {h}, true);
  add("midlayer.hidden_norm.weight", {h}, true);
  add("midlayer.self_attn.q_proj.weight", {heads * hd, 2 * h});
  add("midlayer.self_attn.k_proj.weight", {kv * hd, 2 * h});
  add("midlayer.self_attn.v_proj.weight", {kv * hd, 2 * h});
  add("midlayer.self_attn.o_proj.weight", {h, heads * hd});
  add("midlayer.post_attention_layernorm.weight", {h}, true);
  add("midlayer.mlp.gate_proj.weight", {ffn, h});
  add("midlayer.mlp.up_proj.weight", {ffn, h});
  add("midlayer.mlp.down_proj.weight", {h, ffn});
  add("norm.weight", {h}, true);
  add("lm_head.weight", {dv, h});
  if (dv < vocab && o.write_d2t && o.omit_tensor != "d2t") {
    // Every other id from 0 up: target id = 2 i (i + d2t[i]).
    std::vector<int64_t> d2t(dv);
    for (int64_t i = 0; i < dv; ++i) d2t[i] = i;
    if (o.d2t_override_at >= 0) d2t[o.d2t_override_at] = -o.d2t_override_at;  // -> target 0
    w.AddI64("d2t", {dv}, d2t);
  }
  w.Write(dir + "/model.safetensors");
}

}  // namespace specd::eagle3_test
