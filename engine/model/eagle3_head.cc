#include "engine/model/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/mapped_file.h"
#include "engine/base/status.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/json_fields.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors.h"

namespace specd {
namespace {

using json = nlohmann::json;

// The architecture names vLLM maps to its EAGLE-3 Llama head.
bool IsEagle3Architecture(const std::string& a) {
  return a == "LlamaForCausalLMEagle3" || a == "Eagle3LlamaForCausalLM";
}

// eagle_aux_hidden_state_layer_ids at the top level or in eagle_config; vLLM's default else.
absl::StatusOr<std::vector<int32_t>> AuxLayerIds(const json& root, const JsonFields& f,
                                                 std::string_view file, const ModelConfig& target) {
  const json* ids = nullptr;
  std::string field = "eagle_aux_hidden_state_layer_ids";
  if (auto it = root.find(field); it != root.end() && !it->is_null()) ids = &*it;
  SPECD_ASSIGN_OR_RETURN(const json* eagle, f.OptionalObject("eagle_config"));
  if (ids == nullptr && eagle != nullptr) {
    if (auto it = eagle->find(field); it != eagle->end() && !it->is_null()) {
      ids = &*it;
      field = "eagle_config." + field;
    }
  }
  const int32_t layers = target.num_layers;
  std::vector<int32_t> out;
  if (ids == nullptr) {
    out = {2, layers / 2, layers - 3};
    field = "eagle_aux_hidden_state_layer_ids (vLLM's default 2, L/2, L-3)";
  } else {
    if (!ids->is_array()) return f.Error(field, "must be a list of layer ids");
    for (const json& v : *ids) {
      const std::optional<int64_t> id = JsonToInt(v);
      if (!id) return f.Error(field, "must be a list of integers");
      out.push_back(static_cast<int32_t>(std::clamp<int64_t>(*id, -1, layers)));
    }
  }
  if (out.size() != 3) {
    return f.Error(field, absl::StrCat("an EAGLE-3 head reads 3 target layers, got ", out.size()));
  }
  for (int32_t id : out) {
    if (id < 0 || id >= layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(AbslView(file), ": field '", field, "': layer id ", id,
                       " is outside the target's layers [0, ", layers, ")"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Eagle3Config> ParseEagle3Config(std::string_view json_text, std::string_view file,
                                               const ModelConfig& target) {
  SPECD_ASSIGN_OR_RETURN(json root, ParseJsonObject(json_text, file));
  const JsonFields f(root, file);
  auto arch = root.find("architectures");
  if (arch == root.end() || !arch->is_array() || arch->empty() || !(*arch)[0].is_string() ||
      !IsEagle3Architecture((*arch)[0].get<std::string>())) {
    return f.Error("architectures",
                   "an EAGLE-3 head must be LlamaForCausalLMEagle3 (the speculators library's "
                   "Eagle3Speculator layout is not read yet)");
  }
  // The layer is a Llama layer: parse the shape with the model parser.
  json as_llama = root;
  as_llama["architectures"] = json::array({"LlamaForCausalLM"});
  Eagle3Config c;
  SPECD_ASSIGN_OR_RETURN(c.layer, ParseModelConfig(as_llama.dump(), file));
  c.layer.architecture = (*arch)[0].get<std::string>();
  if (c.layer.num_layers != 1) {
    return f.Error("num_hidden_layers", absl::StrCat("heads with ", c.layer.num_layers,
                                                     " layers are not supported (1)"));
  }
  if (c.layer.vocab_size != target.vocab_size) {
    return f.Error("vocab_size", absl::StrCat("is ", c.layer.vocab_size, "; the target's is ",
                                              target.vocab_size));
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> draft_vocab, f.OptionalInt("draft_vocab_size"));
  const int64_t dv = draft_vocab.value_or(c.layer.vocab_size);
  if (dv < 1 || dv > c.layer.vocab_size) {
    return f.Error("draft_vocab_size",
                   absl::StrCat("must be in [1, ", c.layer.vocab_size, "], got ", dv));
  }
  c.draft_vocab_size = static_cast<int32_t>(dv);
  SPECD_ASSIGN_OR_RETURN(std::optional<int64_t> target_hidden, f.OptionalInt("target_hidden_size"));
  c.target_hidden_size = static_cast<int32_t>(target_hidden.value_or(c.layer.hidden_size));
  if (c.target_hidden_size != target.hidden_size) {
    return f.Error(
        target_hidden ? "target_hidden_size" : "hidden_size",
        absl::StrCat("the head reads target hidden states of width ", c.target_hidden_size,
                     "; the target's hidden_size is ", target.hidden_size));
  }
  SPECD_ASSIGN_OR_RETURN(c.aux_layer_ids, AuxLayerIds(root, f, file, target));
  SPECD_ASSIGN_OR_RETURN(std::optional<bool> before, f.OptionalBool("norm_before_residual"));
  c.norm_before_residual = before.value_or(false);
  return c;
}

void Eagle3Head::Kv::Truncate(int32_t slot) {
  const auto it = std::lower_bound(slots.begin(), slots.end(), slot);
  const size_t n = static_cast<size_t>(it - slots.begin());
  const size_t width = slots.empty() ? 0 : k.size() / slots.size();
  slots.resize(n);
  k.resize(n * width);
  v.resize(n * width);
}

void Eagle3Head::Fuse(const float* features, int64_t rows, float* out) const {
  Linear(features, rows, fc_input_size(), w_.fc.data(), hidden_size(), nullptr, out);
}

void Eagle3Head::Attend(const Row& row, const float* q, float* out) {
  const ModelConfig& c = config_.layer;
  const int32_t hd = c.head_dim, kvs = c.kv_size();
  const int32_t group = c.num_heads / c.num_kv_heads;
  const std::vector<int32_t>& slots = row.kv->slots;
  // A chain row sees every entry up to its slot; a tree row those before the region, then its
  // path's (the cache holds them: they ran before it).
  const int32_t bound = row.tree == nullptr ? row.cache_slot() + 1 : row.tree->start;
  const auto below = std::lower_bound(slots.begin(), slots.end(), bound) - slots.begin();
  keys_.resize(static_cast<size_t>(below));
  std::iota(keys_.begin(), keys_.end(), 0);
  if (row.tree != nullptr) {
    path_.clear();
    AppendTreePath(row.tree->parents, row.cache_slot() - row.tree->start, &path_);
    for (int32_t node : path_) {
      const auto it = std::lower_bound(slots.begin(), slots.end(), row.tree->start + node);
      if (it != slots.end() && *it == row.tree->start + node) {
        keys_.push_back(static_cast<int32_t>(it - slots.begin()));
      }
    }
  }
  const auto n = static_cast<int64_t>(keys_.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  scores_.resize(n);
  for (int32_t h = 0; h < c.num_heads; ++h) {
    const float* qh = q + int64_t{h} * hd;
    const int64_t kv_off = int64_t{h / group} * hd;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const float* kj = &row.kv->k[int64_t{keys_[j]} * kvs + kv_off];
      float dot = 0;
      for (int32_t d = 0; d < hd; ++d) dot += qh[d] * kj[d];
      scores_[j] = dot * scale;
      max = std::max(max, scores_[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      scores_[j] = std::exp(scores_[j] - max);
      sum += scores_[j];
    }
    float* oh = out + int64_t{h} * hd;
    std::fill(oh, oh + hd, 0.0f);
    for (int64_t j = 0; j < n; ++j) {
      const float p = static_cast<float>(scores_[j] / sum);
      const float* vj = &row.kv->v[int64_t{keys_[j]} * kvs + kv_off];
      for (int32_t d = 0; d < hd; ++d) oh[d] += p * vj[d];
    }
  }
}

absl::Status Eagle3Head::CheckRow(std::span<const Row> rows, size_t r, int32_t vocab) {
  const Row& row = rows[r];
  if (row.token < 0 || row.token >= vocab || row.hidden == nullptr || row.kv == nullptr ||
      row.position < 0) {
    return absl::InvalidArgumentError(absl::StrCat("eagle3 head: row ", r, " is malformed"));
  }
  // The cache's last slot, counting the rows before this one in the same call.
  int32_t last = row.kv->slots.empty() ? -1 : row.kv->slots.back();
  for (size_t e = r; e-- > 0;) {
    if (rows[e].kv == row.kv) {
      last = std::max(last, rows[e].cache_slot());
      break;
    }
  }
  const int32_t slot = row.cache_slot();
  if (slot <= last) {
    return absl::InvalidArgumentError(
        absl::StrCat("eagle3 head: row ", r, " at slot ", slot, " is not after ", last));
  }
  if (row.tree == nullptr) return absl::OkStatus();
  const TokenTree& tree = *row.tree;
  if (slot < tree.start || slot - tree.start >= static_cast<int64_t>(tree.parents.size())) {
    return absl::InvalidArgumentError(absl::StrCat("eagle3 head: tree row ", r, " at slot ", slot,
                                                   " is outside its tree's slots [", tree.start,
                                                   ", ", tree.start + tree.parents.size(), ")"));
  }
  SPECD_RETURN_IF_ERROR(ValidateTreeParents(tree.parents.first(slot - tree.start + 1)));
  return absl::OkStatus();
}

absl::Status Eagle3Head::Forward(std::span<const Row> rows, std::vector<float>* prenorm,
                                 std::vector<float>* logits) {
  const ModelConfig& c = config_.layer;
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size();
  const int64_t qkv_width = qs + 2 * kvs;
  for (size_t r = 0; r < rows.size(); ++r) {
    SPECD_RETURN_IF_ERROR(CheckRow(rows, r, c.vocab_size));
  }
  // [embedding, hidden] normed side by side; the residual is the hidden input.
  x_.resize(n * 2 * hidden);
  residual_.resize(n * hidden);
  for (int64_t r = 0; r < n; ++r) {
    float* x = &x_[r * 2 * hidden];
    std::memcpy(x, &w_.embed[int64_t{rows[r].token} * hidden], sizeof(float) * hidden);
    std::memcpy(x + hidden, rows[r].hidden, sizeof(float) * hidden);
    RmsNorm(x, w_.input_norm.data(), 1, c.hidden_size, hidden, c.rms_norm_eps, x);
    RmsNorm(x + hidden, w_.hidden_norm.data(), 1, c.hidden_size, hidden, c.rms_norm_eps,
            x + hidden);
    std::memcpy(&residual_[r * hidden], config_.norm_before_residual ? x + hidden : rows[r].hidden,
                sizeof(float) * hidden);
  }
  qkv_.resize(n * qkv_width);
  Linear(x_.data(), n, 2 * hidden, w_.qkv.data(), qkv_width, nullptr, qkv_.data());
  const int32_t hd = c.head_dim;
  cos_.resize(hd / 2);
  sin_.resize(hd / 2);
  for (int64_t r = 0; r < n; ++r) {
    float* row = &qkv_[r * qkv_width];
    RopeCosSin(inv_freq_, rows[r].position, cos_.data(), sin_.data());
    for (int32_t h = 0; h < c.num_heads + c.num_kv_heads; ++h) {
      ApplyRope(row + int64_t{h} * hd, cos_.data(), sin_.data(), hd);
    }
    Kv& kv = *rows[r].kv;
    kv.slots.push_back(rows[r].cache_slot());
    kv.k.insert(kv.k.end(), row + qs, row + qs + kvs);
    kv.v.insert(kv.v.end(), row + qs + kvs, row + qs + 2 * kvs);
  }
  attn_.resize(n * qs);
  for (int64_t r = 0; r < n; ++r) Attend(rows[r], &qkv_[r * qkv_width], &attn_[r * qs]);
  proj_.resize(n * hidden);
  Linear(attn_.data(), n, qs, w_.o.data(), hidden, nullptr, proj_.data());
  for (int64_t i = 0; i < n * hidden; ++i) residual_[i] += proj_[i];
  normed_.resize(n * hidden);
  RmsNorm(residual_.data(), w_.post_norm.data(), n, c.hidden_size, hidden, c.rms_norm_eps,
          normed_.data());
  const int64_t ffn = c.intermediate_size;
  gate_up_.resize(n * 2 * ffn);
  Linear(normed_.data(), n, hidden, w_.gate_up.data(), 2 * ffn, nullptr, gate_up_.data());
  act_.resize(n * ffn);
  SiluMul(gate_up_.data(), n, c.intermediate_size, act_.data());
  Linear(act_.data(), n, ffn, w_.down.data(), hidden, nullptr, proj_.data());
  prenorm->resize(n * hidden);
  for (int64_t i = 0; i < n * hidden; ++i) (*prenorm)[i] = residual_[i] + proj_[i];
  // Logits of the rows that want them, over the draft vocabulary, then spread to the target's.
  int64_t m = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (!rows[r].logits) continue;
    std::memcpy(&normed_[m * hidden], &(*prenorm)[r * hidden], sizeof(float) * hidden);
    ++m;
  }
  RmsNorm(normed_.data(), w_.norm.data(), m, c.hidden_size, hidden, c.rms_norm_eps, normed_.data());
  const int64_t draft_vocab = config_.draft_vocab_size, vocab = c.vocab_size;
  scores_.resize(m * draft_vocab);
  Linear(normed_.data(), m, hidden, w_.lm_head.data(), draft_vocab, nullptr, scores_.data());
  logits->assign(m * vocab, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t d = 0; d < draft_vocab; ++d) {
      (*logits)[i * vocab + draft_to_target_[d]] = scores_[i * draft_vocab + d];
    }
  }
  return absl::OkStatus();
}

namespace {

// The first of `names` the checkpoint holds ("" when none).
std::string FirstPresent(const SafetensorsCheckpoint& ckpt,
                         std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (ckpt.Contains(n)) return n;
  }
  return "";
}

// Reads the tensor known by any of `names` (checkpoints differ: `midlayer.` in EAGLE's own,
// `layers.0.` / `model.layers.0.` in converted ones) with exactly `shape`.
absl::StatusOr<std::vector<float>> ReadAny(const SafetensorsCheckpoint& ckpt,
                                           const std::string& dir,
                                           std::initializer_list<const char*> names,
                                           const std::vector<int64_t>& shape) {
  const std::string name = FirstPresent(ckpt, names);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": the EAGLE-3 head has no tensor '", *names.begin(), "'"));
  }
  return ckpt.ReadF32(name, shape);
}

// One tensor of the decoder layer under any of the three prefixes.
absl::StatusOr<std::vector<float>> ReadLayer(const SafetensorsCheckpoint& ckpt,
                                             const std::string& dir, const std::string& suffix,
                                             const std::vector<int64_t>& shape) {
  const std::string a = "midlayer." + suffix, b = "layers.0." + suffix,
                    c = "model.layers.0." + suffix;
  return ReadAny(ckpt, dir, {a.c_str(), b.c_str(), c.c_str()}, shape);
}

// Appends `more` to `out` (stacking projections row-wise).
void Stack(std::vector<float>& out, const std::vector<float>& more) {
  out.insert(out.end(), more.begin(), more.end());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Eagle3Head>> Eagle3Head::Load(const std::string& dir,
                                                             const std::string& target_dir,
                                                             const ModelConfig& target) {
  const std::string file = dir + "/config.json";
  SPECD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
  SPECD_ASSIGN_OR_RETURN(Eagle3Config config, ParseEagle3Config(text, file, target));
  std::unique_ptr<Eagle3Head> head(new Eagle3Head(std::move(config)));
  SPECD_RETURN_IF_ERROR(head->LoadWeights(dir, target_dir));
  SPECD_RETURN_IF_ERROR(head->LoadDraftMap(dir));
  head->inv_freq_ = RopeInvFreq(head->config_.layer.rope, head->config_.layer.head_dim);
  return head;
}

absl::Status Eagle3Head::LoadWeights(const std::string& dir, const std::string& target_dir) {
  const ModelConfig& c = config_.layer;
  const int64_t h = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), ffn = c.intermediate_size;
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::OpenDir(dir));
  const std::vector<int64_t> vec = {h};
  SPECD_ASSIGN_OR_RETURN(
      w_.fc, ReadAny(ckpt, dir, {"fc.weight", "model.fc.weight"}, {h, fc_input_size()}));
  SPECD_ASSIGN_OR_RETURN(w_.input_norm, ReadLayer(ckpt, dir, "input_layernorm.weight", vec));
  SPECD_ASSIGN_OR_RETURN(w_.hidden_norm, ReadLayer(ckpt, dir, "hidden_norm.weight", vec));
  SPECD_ASSIGN_OR_RETURN(w_.qkv, ReadLayer(ckpt, dir, "self_attn.q_proj.weight", {qs, 2 * h}));
  SPECD_ASSIGN_OR_RETURN(std::vector<float> k,
                         ReadLayer(ckpt, dir, "self_attn.k_proj.weight", {kvs, 2 * h}));
  SPECD_ASSIGN_OR_RETURN(std::vector<float> v,
                         ReadLayer(ckpt, dir, "self_attn.v_proj.weight", {kvs, 2 * h}));
  Stack(w_.qkv, k);
  Stack(w_.qkv, v);
  SPECD_ASSIGN_OR_RETURN(w_.o, ReadLayer(ckpt, dir, "self_attn.o_proj.weight", {h, qs}));
  SPECD_ASSIGN_OR_RETURN(w_.post_norm,
                         ReadLayer(ckpt, dir, "post_attention_layernorm.weight", vec));
  SPECD_ASSIGN_OR_RETURN(w_.gate_up, ReadLayer(ckpt, dir, "mlp.gate_proj.weight", {ffn, h}));
  SPECD_ASSIGN_OR_RETURN(std::vector<float> up,
                         ReadLayer(ckpt, dir, "mlp.up_proj.weight", {ffn, h}));
  Stack(w_.gate_up, up);
  SPECD_ASSIGN_OR_RETURN(w_.down, ReadLayer(ckpt, dir, "mlp.down_proj.weight", {h, ffn}));
  SPECD_ASSIGN_OR_RETURN(w_.norm, ReadAny(ckpt, dir, {"norm.weight", "model.norm.weight"}, vec));
  SPECD_ASSIGN_OR_RETURN(w_.lm_head,
                         ReadAny(ckpt, dir, {"lm_head.weight"}, {config_.draft_vocab_size, h}));
  const std::vector<int64_t> embed_shape = {c.vocab_size, h};
  if (const std::string name =
          FirstPresent(ckpt, {"embed_tokens.weight", "model.embed_tokens.weight"});
      !name.empty()) {
    SPECD_ASSIGN_OR_RETURN(w_.embed, ckpt.ReadF32(name, embed_shape));
    return absl::OkStatus();
  }
  // The head shares the target's embedding (its hidden size must then be the target's).
  shares_target_embedding_ = true;
  // Named as the target's family names it (fla's NSA checkpoints are not transformers').
  SPECD_ASSIGN_OR_RETURN(const ModelConfig target_config, LoadModelConfig(target_dir));
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint target, SafetensorsCheckpoint::OpenDir(target_dir));
  SPECD_ASSIGN_OR_RETURN(
      w_.embed,
      ReadAny(target, target_dir, {TensorNamesOf(target_config.family).embed}, embed_shape));
  return absl::OkStatus();
}

absl::Status Eagle3Head::LoadDraftMap(const std::string& dir) {
  const int32_t dv = config_.draft_vocab_size, vocab = config_.layer.vocab_size;
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::OpenDir(dir));
  const TensorInfo* d2t = ckpt.Find("d2t");
  draft_to_target_.resize(dv);
  if (d2t == nullptr) {
    if (dv != vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": the EAGLE-3 head's draft vocabulary (", dv, ") is smaller than the target's (",
          vocab, ") but it has no 'd2t' tensor mapping draft ids to target ids"));
    }
    for (int32_t i = 0; i < dv; ++i) draft_to_target_[i] = i;
    return absl::OkStatus();
  }
  const bool i64 = d2t->dtype == TensorDtype::kI64, i32 = d2t->dtype == TensorDtype::kI32;
  if ((!i64 && !i32) || d2t->shape != std::vector<int64_t>{dv}) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": tensor 'd2t' must be I64 or I32 of shape [", dv, "], got ", d2t->dtype_name));
  }
  std::vector<bool> used(vocab, false);
  for (int32_t i = 0; i < dv; ++i) {
    int64_t offset = 0;
    if (i64) {
      std::memcpy(&offset, d2t->data.data() + int64_t{i} * 8, 8);
    } else {
      int32_t o32 = 0;
      std::memcpy(&o32, d2t->data.data() + int64_t{i} * 4, 4);
      offset = o32;
    }
    const int64_t id = i + offset;
    if (id < 0 || id >= vocab || used[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": tensor 'd2t' maps draft id ", i, " to target id ", id,
          id < 0 || id >= vocab ? " outside the vocabulary" : ", which another draft id has"));
    }
    used[id] = true;
    draft_to_target_[i] = static_cast<int32_t>(id);
  }
  return absl::OkStatus();
}

}  // namespace specd
