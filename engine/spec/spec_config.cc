#include "engine/spec/spec_config.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using nlohmann::json;

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative-config: \"", std::string(field), "\" ", std::string(what)));
}

// An integer field in [lo, hi], left unchanged when absent.
absl::Status ReadInt(const json& j, const char* field, int64_t lo, int64_t hi, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) return FieldError(field, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return FieldError(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v));
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

}  // namespace

absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name) {
  if (name.empty()) return SpeculationMethod::kDefault;
  if (name == "none") return SpeculationMethod::kNone;
  if (name == "auto") return SpeculationMethod::kAuto;
  if (name == "draft_model" || name == "draft") return SpeculationMethod::kDraftModel;
  if (name == "ngram") return SpeculationMethod::kNgram;
  if (name == "ssd" || name == "vegas" || name == "ssv") {
    return absl::InvalidArgumentError(
        absl::StrCat("speculation method '", std::string(name),
                     "' is not available yet; use none, auto, draft_model or ngram"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("speculation method '", std::string(name),
                   "' is unknown; use none, auto, draft_model or ngram"));
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
                                           "num_speculative_tokens",
                                           "prompt_lookup_min",
                                           "prompt_lookup_max",
                                           "draft_kv_cache_bytes",
                                           "speculator_device"};
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* k : kKnown) known |= key == k;
    if (!known) return FieldError(key, "is not a known field");
  }
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty()) {
      return FieldError("model", "must be a non-empty string (a draft model directory)");
    }
    config.draft_model = it->get<std::string>();
  }
  config.method =
      config.draft_model.empty() ? SpeculationMethod::kNone : SpeculationMethod::kDraftModel;
  if (auto it = j.find("method"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return FieldError("method", "must be a string");
    absl::StatusOr<SpeculationMethod> m = ParseSpeculationMethod(it->get<std::string>());
    if (!m.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--speculative-config: \"method\": ", std::string(m.status().message())));
    }
    config.method = *m == SpeculationMethod::kDefault ? config.method : *m;
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
    return FieldError("prompt_lookup_min", "must not exceed prompt_lookup_max");
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
      return FieldError("speculator_device",
                        "must be a GPU index (0, 1, ...) or a device name (cpu, cuda:N)");
    }
  }
  if (config.method == SpeculationMethod::kDraftModel && config.draft_model.empty()) {
    return FieldError("model", "is required for method draft_model");
  }
  return config;
}

absl::StatusOr<ResolvedSpeculation> ResolveSpeculation(const SpeculationParams& request,
                                                       const SpeculativeConfig& server,
                                                       bool has_draft_model) {
  if (request.num_speculative_tokens < 0 ||
      request.num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculation.num_speculative_tokens must be in [0, ", kMaxSpeculativeTokens,
                     "], got ", request.num_speculative_tokens));
  }
  SpeculationMethod method =
      request.method == SpeculationMethod::kDefault ? server.method : request.method;
  if (method == SpeculationMethod::kAuto) {
    method = has_draft_model ? SpeculationMethod::kDraftModel : SpeculationMethod::kNgram;
  }
  if (method == SpeculationMethod::kDraftModel && !has_draft_model) {
    return absl::InvalidArgumentError(
        "speculation.method draft_model needs a draft model; start the server with "
        "--speculative-config '{\"method\": \"draft_model\", \"model\": DIR}'");
  }
  ResolvedSpeculation out;
  if (method == SpeculationMethod::kNone || method == SpeculationMethod::kDefault) return out;
  out.method = method;
  out.num_speculative_tokens = request.num_speculative_tokens > 0 ? request.num_speculative_tokens
                                                                  : server.num_speculative_tokens;
  return out;
}

}  // namespace specd
