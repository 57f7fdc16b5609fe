// The `--speculative-config` JSON (spec_config.h): ParseSpeculativeConfig, which reads and checks
// every field (errors name the field), and SpeculativeConfigToJson, its inverse. The per-field
// reads go through engine/base/json_fields.h. Pure; any thread.
#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/json_fields.h"
#include "engine/speculation/spec_config.h"
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
  switch (ReadJsonInt(j, field, lo, hi, out)) {
    case JsonFieldError::kNone:
      return absl::OkStatus();
    case JsonFieldError::kWrongType:
      return ConfigFieldError(field, "must be an integer");
    case JsonFieldError::kOutOfRange:
      break;
  }
  return ConfigFieldError(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ",
                                              FindJsonField(j, field)->dump()));
}

absl::Status ReadInt32(const json& j, const char* field, int64_t lo, int64_t hi, int32_t* out) {
  int64_t v = *out;
  if (absl::Status s = ReadInt(j, field, lo, hi, &v); !s.ok()) return s;
  *out = static_cast<int32_t>(v);
  return absl::OkStatus();
}

// A string field, left unchanged when absent; non-empty unless `allow_empty`.
absl::Status ReadString(const json& j, const char* field, bool allow_empty, std::string* out) {
  if (FindJsonField(j, field) == nullptr) return absl::OkStatus();
  std::string v;
  if (ReadJsonString(j, field, &v) != JsonFieldError::kNone || (!allow_empty && v.empty())) {
    return ConfigFieldError(field, "must be a non-empty string");
  }
  *out = std::move(v);
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
  if (ReadJsonBool(j, "launch_speculator", &o->launch) != JsonFieldError::kNone) {
    return ConfigFieldError("launch_speculator", "must be true or false");
  }
  if (absl::Status s = ReadString(j, "speculator_binary", false, &o->binary); !s.ok()) return s;
  std::string build = o->complete_cache ? "complete" : "interruptible";
  if (absl::Status s = ReadString(j, "cache_build", false, &build); !s.ok()) return s;
  if (build != "complete" && build != "interruptible") {
    return ConfigFieldError("cache_build", "must be \"interruptible\" or \"complete\"");
  }
  o->complete_cache = build == "complete";
  std::string budget = o->time_budget ? "time" : "fixed";
  if (absl::Status s = ReadString(j, "cache_budget", false, &budget); !s.ok()) return s;
  if (budget != "time" && budget != "fixed") {
    return ConfigFieldError("cache_budget", "must be \"time\" or \"fixed\"");
  }
  o->time_budget = budget == "time";
  std::string path = o->device_data_path ? "device" : "host";
  if (absl::Status s = ReadString(j, "data_path", false, &path); !s.ok()) return s;
  if (path != "device" && path != "host") {
    return ConfigFieldError("data_path", "must be \"device\" or \"host\"");
  }
  o->device_data_path = path == "device";
  if (ReadJsonBool(j, "cache_offers", &o->cache_offers) != JsonFieldError::kNone) {
    return ConfigFieldError("cache_offers", "must be true or false");
  }
  if (auto it = j.find("speculator_drafter"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "draft_model" && *it != "eagle3")) {
      return ConfigFieldError("speculator_drafter", "must be \"draft_model\" or \"eagle3\"");
    }
    o->eagle3_drafter = *it == "eagle3";
  }
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
  if (ReadJsonNumber(j, field, lo, hi, out) != JsonFieldError::kNone) {
    return ConfigFieldError(field, absl::StrCat("must be a number in [", lo, ", ", hi, "]"));
  }
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
    int64_t v = *out;
    if (ReadJsonInt(*it, field, 1, hi, &v) != JsonFieldError::kNone) {
      return ConfigFieldError(absl::StrCat("tree.", field),
                              absl::StrCat("must be an integer in [1, ", hi, "]"));
    }
    *out = static_cast<int32_t>(v);
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
    int64_t v = *out;
    if (ReadJsonInt(*it, field, 1, hi, &v) != JsonFieldError::kNone) {
      return ConfigFieldError(absl::StrCat("ssv.", field),
                              absl::StrCat("must be an integer in [1, ", hi, "]"));
    }
    *out = static_cast<int32_t>(v);
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
                                           "cache_budget",
                                           "data_path",
                                           "cache_offers",
                                           "speculator_drafter",
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
  if (auto it = j.find("speculator_drafter");
      (it == j.end() || it->is_null()) && config.method == SpeculationMethod::kSsd &&
      config.draft_model.empty() && !config.eagle3_model.empty()) {
    config.ssd.eagle3_drafter = true;  // the head is all the speculator could draft with
  }
  if (config.ssd.eagle3_drafter && config.eagle3_model.empty()) {
    return ConfigFieldError("speculator_drafter",
                            "eagle3 needs the head's directory in \"eagle3_model\"");
  }
  if (config.ssd.eagle3_drafter && config.parallel_drafting) {
    return ConfigFieldError("speculator_drafter", "eagle3 does not draft in parallel");
  }
  if (config.method == SpeculationMethod::kSsd && config.draft_model.empty() &&
      !config.ssd.eagle3_drafter) {
    return ConfigFieldError("model",
                            "is required for method ssd (the speculator's draft model), or "
                            "\"eagle3_model\" for an EAGLE-3 head in the speculator");
  }
  if (config.parallel_drafting && config.draft_model.empty()) {
    return ConfigFieldError("parallel", "drafts with a draft model: name it with \"model\"");
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
  j["cache_budget"] = c.ssd.time_budget ? "time" : "fixed";
  j["data_path"] = c.ssd.device_data_path ? "device" : "host";
  j["cache_offers"] = c.ssd.cache_offers;
  j["speculator_drafter"] = c.ssd.eagle3_drafter ? "eagle3" : "draft_model";
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

}  // namespace specd
