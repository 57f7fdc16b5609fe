#include "engine/speculation/spec_config.h"

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "engine/base/field_status.h"
#include "engine/base/status.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using nlohmann::json;

absl::Status ConfigFieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative-config: \"", std::string(field), "\" ", std::string(what)));
}

// An integer field in [lo, hi], left unchanged when absent.
absl::Status ReadInt(const json& j, const char* field, int64_t lo, int64_t hi, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return ConfigFieldError(field, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return ConfigFieldError(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status ReadInt32(const json& j, const char* field, int64_t lo, int64_t hi, int32_t* out) {
  int64_t v = *out;
  if (absl::Status s = ReadInt(j, field, lo, hi, &v); !s.ok()) return s;
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

// A string field, left unchanged when absent; non-empty unless `allow_empty`.
absl::Status ReadString(const json& j, const char* field, bool allow_empty, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string() || (!allow_empty && it->get<std::string>().empty())) {
    return ConfigFieldError(field, "must be a non-empty string");
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// The SSD link's secret file and TLS files (after "launch_speculator" was read).
absl::Status ReadSsdSecurity(const json& j, SsdOptions* o) {
  const std::pair<const char*, std::string*> files[] = {{"speculator_secret_file", &o->secret_file},
                                                        {"speculator_tls_cert", &o->tls_cert},
                                                        {"speculator_tls_key", &o->tls_key},
                                                        {"speculator_tls_ca", &o->tls_ca}};
  for (const auto& [field, out] : files) {
    if (absl::Status s = ReadString(j, field, false, out); !s.ok()) return s;
  }
  const int num_tls = !o->tls_cert.empty() + !o->tls_key.empty() + !o->tls_ca.empty();
  if (num_tls != 0 && num_tls != 3) {
    return ConfigFieldError(
        "speculator_tls_cert",
        "speculator_tls_cert, speculator_tls_key and speculator_tls_ca go together");
  }
  if (num_tls == 3 && o->launch) {
    return ConfigFieldError(
        "speculator_tls_cert",
        "TLS is for a speculator on another host: set \"launch_speculator\": false");
  }
  return absl::OkStatus();
}

absl::Status ReadSsdOptions(const json& j, SsdOptions* o) {
  if (absl::Status s = ReadInt32(j, "fan_out", 1, 64, &o->fan_out); !s.ok()) return s;
  std::string mode = o->geometric_fan_out ? "geometric" : "constant";
  if (absl::Status s = ReadString(j, "fan_out_mode", false, &mode); !s.ok()) return s;
  if (mode != "geometric" && mode != "constant") {
    return ConfigFieldError("fan_out_mode", "must be \"geometric\" or \"constant\"");
  }
  o->geometric_fan_out = mode == "geometric";
  if (auto it = j.find("saguaro_c"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() < 0.0 || it->get<double>() > 1.0) {
      return ConfigFieldError("saguaro_c", "must be a number in [0, 1]");
    }
    o->saguaro_c = it->get<float>();
  }
  if (absl::Status s = ReadInt32(j, "critical_batch_size", 0, 1 << 20, &o->critical_batch_size);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadString(j, "backup", false, &o->backup); !s.ok()) return s;
  if (o->backup != "ngram" && o->backup != "random") {
    return ConfigFieldError("backup", "must be \"ngram\" or \"random\"");
  }
  if (absl::Status s = ReadString(j, "speculator_address", false, &o->address); !s.ok()) return s;
  if (o->address.rfind(':') == std::string::npos) {
    return ConfigFieldError("speculator_address", "must be HOST:PORT");
  }
  if (auto it = j.find("launch_speculator"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return ConfigFieldError("launch_speculator", "must be true or false");
    o->launch = it->get<bool>();
  }
  if (absl::Status s = ReadString(j, "speculator_binary", false, &o->binary); !s.ok()) return s;
  std::string build = o->complete_cache ? "complete" : "interruptible";
  if (absl::Status s = ReadString(j, "cache_build", false, &build); !s.ok()) return s;
  if (build != "complete" && build != "interruptible") {
    return ConfigFieldError("cache_build", "must be \"interruptible\" or \"complete\"");
  }
  o->complete_cache = build == "complete";
  if (auto it = j.find("speculator_gpu_memory_utilization"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0.0 || it->get<double>() > 1.0) {
      return ConfigFieldError("speculator_gpu_memory_utilization", "must be a number in (0, 1]");
    }
    o->gpu_memory_utilization = it->get<double>();
  }
  if (absl::Status s = ReadInt32(j, "speculator_timeout_ms", 1, 600000, &o->timeout_ms); !s.ok()) {
    return s;
  }
  return ReadSsdSecurity(j, o);
}

// A number field in [lo, hi], left unchanged when absent.
absl::Status ReadUnit(const json& j, const char* field, double lo, double hi, double* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number() || it->get<double>() < lo || it->get<double>() > hi) {
    return ConfigFieldError(field, absl::StrCat("must be a number in [", lo, ", ", hi, "]"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

// A field of the "replay" object: its errors name it "replay.<field>".
absl::Status InReplay(absl::Status s) {
  if (s.ok()) return s;
  std::string m(s.message());
  const size_t quote = m.find('"');
  if (quote != std::string::npos) m.insert(quote + 1, "replay.");
  return absl::InvalidArgumentError(m);
}

absl::Status ReadReplayOptions(const json& j, DraftReplayOptions* o) {
  auto it = j.find("replay");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return ConfigFieldError("replay", "must be an object");
  for (const auto& [key, value] : it->items()) {
    if (key != "file" && key != "alpha" && key != "candidate_hit" && key != "seed") {
      return ConfigFieldError(absl::StrCat("replay.", key), "is not a known field");
    }
  }
  if (absl::Status s = InReplay(ReadString(*it, "file", false, &o->file)); !s.ok()) return s;
  if (o->file.empty()) return ConfigFieldError("replay.file", "is required");
  if (absl::Status s = InReplay(ReadUnit(*it, "alpha", 0.0, 1.0, &o->alpha)); !s.ok()) return s;
  if (absl::Status s = InReplay(ReadUnit(*it, "candidate_hit", 0.0, 1.0, &o->candidate_hit));
      !s.ok()) {
    return s;
  }
  int64_t seed = static_cast<int64_t>(o->seed);
  if (absl::Status s =
          InReplay(ReadInt(*it, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
      !s.ok()) {
    return s;
  }
  o->seed = static_cast<uint64_t>(seed);
  return absl::OkStatus();
}

// "tree": {"depth": D, "top_k": T, "num_nodes": N} (each optional; null or absent: chains).
absl::Status ReadTreeShape(const json& j, TreeShape* o) {
  auto it = j.find("tree");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return ConfigFieldError("tree", "must be an object");
  for (const auto& [key, value] : it->items()) {
    if (key != "depth" && key != "top_k" && key != "num_nodes") {
      return ConfigFieldError(absl::StrCat("tree.", key),
                              "is not a known field (depth, top_k, num_nodes)");
    }
  }
  for (auto [field, out, hi] : {std::tuple{"depth", &o->depth, kMaxSpeculativeTokens},
                                std::tuple{"top_k", &o->top_k, kMaxTreeTopK},
                                std::tuple{"num_nodes", &o->num_nodes, kMaxSpeculativeTokens}}) {
    if (auto v = it->find(field); v != it->end() && !v->is_null()) {
      if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > hi) {
        return ConfigFieldError(absl::StrCat("tree.", field),
                                absl::StrCat("must be an integer in [1, ", hi, "]"));
      }
      *out = static_cast<int32_t>(v->get<int64_t>());
    }
  }
  o->enabled = true;  // unset fields take the defaults once the round's K is known
  return absl::OkStatus();
}

// "ssv": {"group_size": C, "mode": "exact" | "shared", "refresh_every": R}.
absl::Status ReadSsvStrategy(const json& j, SsvStrategy* o) {
  auto it = j.find("ssv");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return ConfigFieldError("ssv", "must be an object");
  for (const auto& [key, value] : it->items()) {
    if (key != "group_size" && key != "mode" && key != "refresh_every") {
      return ConfigFieldError(absl::StrCat("ssv.", key), "is not a known field");
    }
  }
  if (auto m = it->find("mode"); m != it->end() && !m->is_null()) {
    if (!m->is_string() || !ParseSsvMode(m->get<std::string>(), &o->mode)) {
      return ConfigFieldError("ssv.mode", "must be \"exact\" or \"shared\"");
    }
  }
  for (auto [field, out, hi] : {std::tuple{"group_size", &o->group_size, kMaxSsvGroupSize},
                                std::tuple{"refresh_every", &o->refresh_every, 1 << 16}}) {
    if (auto v = it->find(field); v != it->end() && !v->is_null()) {
      if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > hi) {
        return ConfigFieldError(absl::StrCat("ssv.", field),
                                absl::StrCat("must be an integer in [1, ", hi, "]"));
      }
      *out = static_cast<int32_t>(v->get<int64_t>());
    }
  }
  return absl::OkStatus();
}

absl::Status ReadSparseOptions(const json& j, SparseDraftOptions* o) {
  if (auto it = j.find("sparsity_ratio"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || !(it->get<double>() > 0.0 && it->get<double>() <= 1.0)) {
      return ConfigFieldError("sparsity_ratio", "must be a number in (0, 1]");
    }
    o->sparsity_ratio = it->get<double>();
  }
  constexpr int64_t kMaxTokens = int64_t{1} << 30;
  if (absl::Status s = ReadInt32(j, "min_tokens", 0, kMaxTokens, &o->min_tokens); !s.ok()) return s;
  if (absl::Status s = ReadInt32(j, "max_tokens", 0, kMaxTokens, &o->max_tokens); !s.ok()) return s;
  if (o->max_tokens > 0 && o->max_tokens < o->min_tokens) {
    return ConfigFieldError("max_tokens", "must be 0 (no cap) or at least min_tokens");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name) {
  if (name.empty()) return SpeculationMethod::kDefault;
  if (name == "none") return SpeculationMethod::kNone;
  if (name == "auto") return SpeculationMethod::kAuto;
  if (name == "draft_model" || name == "draft") return SpeculationMethod::kDraftModel;
  if (name == "ngram") return SpeculationMethod::kNgram;
  if (name == "ssd") return SpeculationMethod::kSsd;
  if (name == "vegas") return SpeculationMethod::kVegas;
  if (name == "streaming") return SpeculationMethod::kStreaming;
  if (name == "eagle3" || name == "eagle-3") return SpeculationMethod::kEagle3;
  if (name == "ssv") {
    return absl::InvalidArgumentError(
        "'ssv' is how an NSA model verifies, not a way to draft: pick a method (draft_model, "
        "eagle3, ngram, ssd or auto) and set its verification with the \"ssv\" object");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("speculation method '", std::string(name),
                   "' is unknown; use none, auto, draft_model, eagle3, ngram, ssd, vegas or "
                   "streaming"));
}

const char* SpeculationMethodName(SpeculationMethod m) {
  switch (m) {
    case SpeculationMethod::kDefault:
      return "default";
    case SpeculationMethod::kNone:
      return "none";
    case SpeculationMethod::kAuto:
      return "auto";
    case SpeculationMethod::kDraftModel:
      return "draft_model";
    case SpeculationMethod::kNgram:
      return "ngram";
    case SpeculationMethod::kSsd:
      return "ssd";
    case SpeculationMethod::kVegas:
      return "vegas";
    case SpeculationMethod::kStreaming:
      return "streaming";
    case SpeculationMethod::kSsv:
      return "ssv";
    case SpeculationMethod::kEagle3:
      return "eagle3";
  }
  return "unknown";
}

absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(std::string_view text) {
  SpeculativeConfig config;
  if (text.empty()) return config;
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("--speculative-config must be a JSON object");
  }
  static constexpr const char* kKnown[] = {"method",
                                           "model",
                                           "eagle3_model",
                                           "parallel",
                                           "parallel_drafting",
                                           "num_speculative_tokens",
                                           "prompt_lookup_min",
                                           "prompt_lookup_max",
                                           "draft_kv_cache_bytes",
                                           "speculator_device",
                                           "fan_out",
                                           "fan_out_mode",
                                           "saguaro_c",
                                           "critical_batch_size",
                                           "backup",
                                           "speculator_address",
                                           "launch_speculator",
                                           "speculator_binary",
                                           "speculator_timeout_ms",
                                           "cache_build",
                                           "speculator_gpu_memory_utilization",
                                           "speculator_secret_file",
                                           "speculator_tls_cert",
                                           "speculator_tls_key",
                                           "speculator_tls_ca",
                                           "replay",
                                           "sparsity_ratio",
                                           "min_tokens",
                                           "max_tokens",
                                           "ssv",
                                           "tree"};
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) return ConfigFieldError(key, "is not a known field");
  }
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty()) {
      return ConfigFieldError("model", "must be a non-empty string (a draft model directory)");
    }
    config.draft_model = it->get<std::string>();
  }
  config.method =
      config.draft_model.empty() ? SpeculationMethod::kNone : SpeculationMethod::kDraftModel;
  if (auto it = j.find("method"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return ConfigFieldError("method", "must be a string");
    absl::StatusOr<SpeculationMethod> m = ParseSpeculationMethod(it->get<std::string>());
    if (!m.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-config: \"method\": ", std::string(m.status().message())));
    }
    config.method = *m == SpeculationMethod::kDefault ? config.method : *m;
  }
  // vLLM's form: {"method": "eagle3", "model": HEAD}; "eagle3_model" names a head beside a
  // draft model ("model" then stays the draft's).
  if (auto it = j.find("eagle3_model"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty()) {
      return ConfigFieldError("eagle3_model",
                              "must be a non-empty string (an EAGLE-3 head directory)");
    }
    config.eagle3_model = it->get<std::string>();
    if (!j.contains("method") && config.draft_model.empty()) {
      config.method = SpeculationMethod::kEagle3;
    }
  } else if (config.method == SpeculationMethod::kEagle3) {
    std::swap(config.eagle3_model, config.draft_model);
  }
  for (const char* key : {"parallel", "parallel_drafting"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) {
      if (!it->is_boolean()) return ConfigFieldError(key, "must be true or false");
      config.parallel_drafting = config.parallel_drafting || it->get<bool>();
    }
  }
  if (absl::Status s = ReadInt32(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens,
                                 &config.num_speculative_tokens);
      !s.ok()) {
    return s;
  }
  constexpr int64_t kMaxLookup = 64;
  if (absl::Status s = ReadInt32(j, "prompt_lookup_min", 1, kMaxLookup, &config.prompt_lookup_min);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadInt32(j, "prompt_lookup_max", 1, kMaxLookup, &config.prompt_lookup_max);
      !s.ok()) {
    return s;
  }
  if (config.prompt_lookup_min > config.prompt_lookup_max) {
    return ConfigFieldError("prompt_lookup_min", "must not exceed prompt_lookup_max");
  }
  if (absl::Status s = ReadInt(j, "draft_kv_cache_bytes", 0, std::numeric_limits<int64_t>::max(),
                               &config.draft_kv_cache_bytes);
      !s.ok()) {
    return s;
  }
  if (auto it = j.find("speculator_device"); it != j.end() && !it->is_null()) {
    if (it->is_number_integer() && it->get<int64_t>() >= 0 && it->get<int64_t>() < 1024) {
      config.speculator_device = absl::StrCat("cuda:", it->get<int64_t>());
    } else if (it->is_string() && !it->get<std::string>().empty()) {
      config.speculator_device = it->get<std::string>();
    } else {
      return ConfigFieldError("speculator_device",
                              "must be a GPU index (0, 1, ...) or a device name (cpu, cuda:N)");
    }
  }
  if (absl::Status s = ReadSsdOptions(j, &config.ssd); !s.ok()) return s;
  if (absl::Status s = ReadReplayOptions(j, &config.replay); !s.ok()) return s;
  if (absl::Status s = ReadSparseOptions(j, &config.sparse); !s.ok()) return s;
  if (absl::Status s = ReadSsvStrategy(j, &config.ssv); !s.ok()) return s;
  if (absl::Status s = ReadTreeShape(j, &config.tree); !s.ok()) return s;
  if (config.method == SpeculationMethod::kDraftModel && config.draft_model.empty()) {
    return ConfigFieldError("model", "is required for method draft_model");
  }
  if (config.method == SpeculationMethod::kSsd && config.draft_model.empty()) {
    return ConfigFieldError("model", "is required for method ssd (the speculator's draft model)");
  }
  if (config.parallel_drafting && config.draft_model.empty()) {
    return ConfigFieldError("parallel", "drafts with a draft model: name it with \"model\"");
  }
  if (config.parallel_drafting && config.method == SpeculationMethod::kSsd) {
    return ConfigFieldError("parallel", "is not available with method ssd yet");
  }
  if (config.method == SpeculationMethod::kEagle3 && config.eagle3_model.empty()) {
    return ConfigFieldError("model",
                            "is required for method eagle3 (the EAGLE-3 head's directory)");
  }
  return config;
}

std::string SpeculativeConfigToJson(const SpeculativeConfig& c) {
  json j;
  j["method"] = SpeculationMethodName(c.method);
  if (!c.draft_model.empty()) j["model"] = c.draft_model;
  if (!c.eagle3_model.empty()) j["eagle3_model"] = c.eagle3_model;
  if (c.parallel_drafting) j["parallel"] = true;
  j["num_speculative_tokens"] = c.num_speculative_tokens;
  j["prompt_lookup_min"] = c.prompt_lookup_min;
  j["prompt_lookup_max"] = c.prompt_lookup_max;
  j["draft_kv_cache_bytes"] = c.draft_kv_cache_bytes;
  if (!c.speculator_device.empty()) j["speculator_device"] = c.speculator_device;
  j["fan_out"] = c.ssd.fan_out;
  j["fan_out_mode"] = c.ssd.geometric_fan_out ? "geometric" : "constant";
  if (c.ssd.saguaro_c >= 0.0f) j["saguaro_c"] = c.ssd.saguaro_c;
  j["critical_batch_size"] = c.ssd.critical_batch_size;
  j["backup"] = c.ssd.backup;
  j["speculator_address"] = c.ssd.address;
  j["launch_speculator"] = c.ssd.launch;
  if (!c.ssd.binary.empty()) j["speculator_binary"] = c.ssd.binary;
  j["speculator_timeout_ms"] = c.ssd.timeout_ms;
  j["cache_build"] = c.ssd.complete_cache ? "complete" : "interruptible";
  if (c.ssd.gpu_memory_utilization > 0) {
    j["speculator_gpu_memory_utilization"] = c.ssd.gpu_memory_utilization;
  }
  const std::pair<const char*, const std::string*> files[] = {
      {"speculator_secret_file", &c.ssd.secret_file},
      {"speculator_tls_cert", &c.ssd.tls_cert},
      {"speculator_tls_key", &c.ssd.tls_key},
      {"speculator_tls_ca", &c.ssd.tls_ca}};
  for (const auto& [field, value] : files) {
    if (!value->empty()) j[field] = *value;
  }
  j["sparsity_ratio"] = c.sparse.sparsity_ratio;
  j["min_tokens"] = c.sparse.min_tokens;
  j["max_tokens"] = c.sparse.max_tokens;
  if (c.tree.enabled) {
    json tree = json::object();
    if (c.tree.depth > 0) tree["depth"] = c.tree.depth;
    if (c.tree.top_k > 0) tree["top_k"] = c.tree.top_k;
    if (c.tree.num_nodes > 0) tree["num_nodes"] = c.tree.num_nodes;
    j["tree"] = tree;
  }
  j["ssv"] = {{"group_size", c.ssv.group_size},
              {"mode", std::string(SsvModeName(c.ssv.mode))},
              {"refresh_every", c.ssv.refresh_every}};
  if (c.replay.enabled()) {
    j["replay"] = {{"file", c.replay.file},
                   {"alpha", c.replay.alpha},
                   {"candidate_hit", c.replay.candidate_hit},
                   {"seed", static_cast<int64_t>(c.replay.seed & 0x7fffffffffffffffULL)}};
  }
  return j.dump();
}

absl::Status ValidateSparseDraftOptions(const SparseDraftOptions& o, std::string_view prefix) {
  const std::string p(prefix);
  if (!(o.sparsity_ratio > 0.0 && o.sparsity_ratio <= 1.0)) {
    return FieldError(p + "sparsity_ratio",
                      absl::StrCat(p, "sparsity_ratio must be in (0, 1], got ", o.sparsity_ratio));
  }
  if (o.min_tokens < 0) {
    return FieldError(p + "min_tokens",
                      absl::StrCat(p, "min_tokens must not be negative, got ", o.min_tokens));
  }
  if (o.max_tokens < 0) {
    return FieldError(p + "max_tokens", absl::StrCat(p,
                                                     "max_tokens must not be negative (0: no "
                                                     "cap), got ",
                                                     o.max_tokens));
  }
  if (o.max_tokens > 0 && o.max_tokens < o.min_tokens) {
    return FieldError(p + "max_tokens", absl::StrCat(p, "max_tokens ", o.max_tokens,
                                                     " is below min_tokens ", o.min_tokens));
  }
  return absl::OkStatus();
}

namespace {

constexpr char kMethodField[] = "speculation.method";
constexpr char kMaxKField[] = "speculation.policy.max_k";
constexpr char kForbidField[] = "speculation.policy.forbid";
constexpr char kSsvField[] = "speculation.ssv";

bool IsSpeculating(SpeculationMethod m) {
  return m != SpeculationMethod::kDefault && m != SpeculationMethod::kNone &&
         m != SpeculationMethod::kAuto;
}

absl::Status TreeMethodError(SpeculationMethod method) {
  return FieldError("speculation.tree",
                    absl::StrCat("speculation.tree needs a pinned method that drafts trees "
                                 "(draft_model, eagle3, ngram); this request's is ",
                                 SpeculationMethodName(method)));
}

// The forbidden methods as bits (Validate checked the entries).
uint32_t ForbiddenBits(const SpeculationParams& request) {
  uint32_t bits = 0;
  for (SpeculationMethod m : request.policy_forbid) bits |= 1u << static_cast<int>(m);
  return bits;
}

// speculation.ssv over the server's strategy (ResolveSpeculation's rules; Validate checked the
// request's own values).
absl::StatusOr<SsvStrategy> ResolveSsv(const SpeculationParams& request,
                                       const SpeculativeConfig& server, bool target_is_nsa) {
  if (request.has_ssv() && !target_is_nsa) {
    return FieldError(kSsvField,
                      "speculation.ssv sets how an NSA model verifies; this server's model is "
                      "not one");
  }
  SsvStrategy ssv = server.ssv;
  if (request.ssv_group_size != 0) ssv.group_size = request.ssv_group_size;
  if (request.ssv_mode.has_value()) ssv.mode = *request.ssv_mode;
  if (request.ssv_refresh_every != 0) ssv.refresh_every = request.ssv_refresh_every;
  SPECD_RETURN_IF_ERROR(ValidateSsvStrategy(ssv, "speculation.ssv."));
  if (request.ssv_strict) {
    ssv.mode = SsvMode::kExact;
    ssv.refresh_every = 1;
  }
  return ssv;
}

}  // namespace

absl::Status SpeculationParams::Validate() const {
  if (num_speculative_tokens < 0 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return FieldError("speculation.num_speculative_tokens",
                      absl::StrCat("speculation.num_speculative_tokens must be in [0, ",
                                   kMaxSpeculativeTokens, "], got ", num_speculative_tokens));
  }
  if (!(saguaro_c < 0.0f || saguaro_c <= 1.0f)) {  // NaN included
    return FieldError("speculation.saguaro_c",
                      absl::StrCat("speculation.saguaro_c must be in [0, 1], got ", saguaro_c));
  }
  if (!(sparsity_ratio < 0.0 || (sparsity_ratio > 0.0 && sparsity_ratio <= 1.0))) {
    return FieldError(
        "speculation.sparsity_ratio",
        absl::StrCat("speculation.sparsity_ratio must be in (0, 1], got ", sparsity_ratio));
  }
  if (sparse_min_tokens < -1) {
    return FieldError(
        "speculation.min_tokens",
        absl::StrCat("speculation.min_tokens must not be negative, got ", sparse_min_tokens));
  }
  if (sparse_max_tokens < -1) {
    return FieldError("speculation.max_tokens",
                      absl::StrCat("speculation.max_tokens must not be negative (0: no cap), got ",
                                   sparse_max_tokens));
  }
  if (sparse_max_tokens > 0 && sparse_min_tokens >= 0 && sparse_max_tokens < sparse_min_tokens) {
    return FieldError("speculation.max_tokens",
                      absl::StrCat("speculation.max_tokens ", sparse_max_tokens,
                                   " is below min_tokens ", sparse_min_tokens));
  }
  if (policy_max_k < -1 || policy_max_k > kMaxSpeculativeTokens) {
    return FieldError(kMaxKField, absl::StrCat("speculation.policy.max_k must be in [0, ",
                                               kMaxSpeculativeTokens, "], got ", policy_max_k));
  }
  for (SpeculationMethod m : policy_forbid) {
    if (!IsSpeculating(m)) {
      return FieldError(kForbidField,
                        absl::StrCat("speculation.policy.forbid: '", SpeculationMethodName(m),
                                     "' is not a speculation method; list draft_model, eagle3, "
                                     "ngram, ssd, vegas or streaming"));
    }
    if (m == method) {
      return FieldError(
          kForbidField,
          absl::StrCat("speculation.method ", SpeculationMethodName(method),
                       " is forbidden by the request's own speculation.policy.forbid"));
    }
  }
  if (policy_max_k >= 0 && num_speculative_tokens > policy_max_k) {
    return FieldError(
        kMaxKField,
        absl::StrCat("speculation.num_speculative_tokens ", num_speculative_tokens,
                     " exceeds the request's own speculation.policy.max_k ", policy_max_k));
  }
  if (ssv_group_size != 0 && (ssv_group_size < 1 || ssv_group_size > kMaxSsvGroupSize)) {
    return FieldError("speculation.ssv.group_size",
                      absl::StrCat("speculation.ssv.group_size must be in [1, ", kMaxSsvGroupSize,
                                   "], got ", ssv_group_size));
  }
  if (ssv_refresh_every < 0) {
    return FieldError("speculation.ssv.refresh_every",
                      absl::StrCat("speculation.ssv.refresh_every must be at least 1 (1: every "
                                   "layer), got ",
                                   ssv_refresh_every));
  }
  if (ssv_strict && ssv_mode == SsvMode::kShared) {
    return FieldError(kSsvField,
                      "speculation.ssv: mode \"shared\" is lossy and \"strict\": true allows "
                      "lossless strategies only");
  }
  if (ssv_strict && ssv_refresh_every > 1) {
    return FieldError(kSsvField,
                      "speculation.ssv: refresh_every above 1 is lossy and \"strict\": true "
                      "allows lossless strategies only");
  }
  SPECD_RETURN_IF_ERROR(ValidateTreeShape(tree, "speculation.tree."));
  // A method the request pins (the server's default is ResolveSpeculation's to check).
  if (tree.enabled && !tree_off && method != SpeculationMethod::kDefault && !DraftsTrees(method)) {
    return TreeMethodError(method);
  }
  return absl::OkStatus();
}

absl::StatusOr<ResolvedSpeculation> ResolveSpeculation(const SpeculationParams& request,
                                                       const SpeculativeConfig& server,
                                                       bool has_draft_model, bool has_ssd,
                                                       bool has_sparse_drafting,
                                                       bool target_is_nsa) {
  SPECD_RETURN_IF_ERROR(request.Validate());
  const uint32_t forbidden = ForbiddenBits(request);
  // Validate refused an explicit method the request forbids; a server default it forbids
  // resolves to no speculation.
  SpeculationMethod method =
      request.method != SpeculationMethod::kDefault ? request.method : server.method;
  if (IsSpeculating(method) && (forbidden >> static_cast<int>(method) & 1u)) {
    method = SpeculationMethod::kNone;
  }
  if (method == SpeculationMethod::kDraftModel && !has_draft_model) {
    return FieldError(kMethodField,
                      "speculation.method draft_model needs a draft model; start the server with "
                      "--speculative-config '{\"method\": \"draft_model\", \"model\": DIR}'");
  }
  if (method == SpeculationMethod::kEagle3 && server.eagle3_model.empty()) {
    return FieldError(kMethodField,
                      "speculation.method eagle3 needs an EAGLE-3 head; start the server with "
                      "--speculative-config '{\"method\": \"eagle3\", \"model\": HEAD_DIR}'");
  }
  if (method == SpeculationMethod::kSsd && !has_ssd) {
    return FieldError(kMethodField,
                      "speculation.method ssd needs a speculator; start the server with "
                      "--speculative-config '{\"method\": \"ssd\", \"model\": DIR}'");
  }
  if ((method == SpeculationMethod::kVegas || method == SpeculationMethod::kStreaming) &&
      !has_sparse_drafting) {
    return FieldError(kMethodField,
                      absl::StrCat("speculation.method ", SpeculationMethodName(method),
                                   " needs sparse drafting, which this server lacks "
                                   "(tensor parallelism is on)"));
  }
  SparseDraftOptions sparse = server.sparse;
  if (request.sparsity_ratio > 0) sparse.sparsity_ratio = request.sparsity_ratio;
  if (request.sparse_min_tokens >= 0) sparse.min_tokens = request.sparse_min_tokens;
  if (request.sparse_max_tokens >= 0) sparse.max_tokens = request.sparse_max_tokens;
  // A request's own values may make the server's cap fall below its floor: the floor wins then.
  if (request.sparse_min_tokens >= 0 && request.sparse_max_tokens < 0 && sparse.max_tokens > 0) {
    sparse.max_tokens = std::max(sparse.max_tokens, sparse.min_tokens);
  }
  SPECD_RETURN_IF_ERROR(ValidateSparseDraftOptions(sparse, "speculation."));
  SPECD_ASSIGN_OR_RETURN(const SsvStrategy ssv, ResolveSsv(request, server, target_is_nsa));
  if (request.tree.enabled && !request.tree_off && !DraftsTrees(method)) {
    return TreeMethodError(method);
  }
  ResolvedSpeculation out;
  if (method == SpeculationMethod::kNone || method == SpeculationMethod::kDefault) return out;
  out.method = method;
  out.ssv = ssv;
  out.sparse = sparse;
  out.forbidden_bits = forbidden;
  out.saguaro_c = request.saguaro_c >= 0.0f ? request.saguaro_c : server.ssd.saguaro_c;
  out.k_pinned = request.num_speculative_tokens > 0;
  out.num_speculative_tokens =
      out.k_pinned ? request.num_speculative_tokens : server.num_speculative_tokens;
  if (request.policy_max_k >= 0) {
    out.num_speculative_tokens = std::min(out.num_speculative_tokens, request.policy_max_k);
  }
  if (out.num_speculative_tokens == 0) return ResolvedSpeculation{};  // max_k 0: plain
  if (request.tree_off || !DraftsTrees(method) || !(request.tree.enabled || server.tree.enabled)) {
    return out;
  }
  // The request's fields over the server's over the defaults; num_nodes is the round's K.
  auto pick = [](int32_t mine, int32_t server_value, int32_t fallback) {
    return mine > 0 ? mine : server_value > 0 ? server_value : fallback;
  };
  TreeShape& t = out.tree;
  t.enabled = true;
  t.depth = pick(request.tree.depth, server.tree.depth, out.num_speculative_tokens);
  t.top_k = pick(request.tree.top_k, server.tree.top_k, kDefaultTreeTopK);
  t.num_nodes = pick(request.tree.num_nodes, server.tree.num_nodes, kDefaultTreeNodes);
  if (request.policy_max_k >= 0) t.num_nodes = std::min(t.num_nodes, request.policy_max_k);
  t.depth = std::min(t.depth, t.num_nodes);
  out.num_speculative_tokens = t.num_nodes;
  out.k_pinned = true;
  return out;
}

bool DraftsTrees(SpeculationMethod m) {
  return m == SpeculationMethod::kDraftModel || m == SpeculationMethod::kEagle3 ||
         m == SpeculationMethod::kNgram;
}

absl::Status ValidateTreeShape(const TreeShape& t, std::string_view prefix) {
  const struct {
    const char* name;
    int32_t value;
    int32_t hi;
  } fields[] = {{"depth", t.depth, kMaxSpeculativeTokens},
                {"top_k", t.top_k, kMaxTreeTopK},
                {"num_nodes", t.num_nodes, kMaxSpeculativeTokens}};
  for (const auto& f : fields) {
    if (f.value < 0 || f.value > f.hi) {
      const std::string field = absl::StrCat(std::string(prefix), f.name);
      return FieldError(field, absl::StrCat(field, " must be in [1, ", f.hi, "], got ", f.value));
    }
  }
  return absl::OkStatus();
}

}  // namespace specd
