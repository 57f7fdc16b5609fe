// What a request and the server say about speculative decoding, and how the two combine.
// A request carries SpeculationParams (HTTP `speculation`, gRPC SpeculationOptions); the
// server's defaults come from `--speculative-config` (vLLM's JSON: method, model,
// num_speculative_tokens, prompt_lookup_min/max). ResolveSpeculation is the small policy that
// turns both into what runs: which speculator and how many draft tokens per round.
// Pure values and functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

// kDefault: the request said nothing (the server's default applies). kAuto: let the server
// pick (the draft model when one is loaded, else n-gram prompt lookup).
enum class SpeculationMethod { kDefault, kNone, kAuto, kDraftModel, kNgram };

// "auto", "none", "draft_model" (also "draft"), "ngram"; "" is kDefault. Methods that later
// issues add ("ssd", "vegas", "ssv") are InvalidArgument "not available yet"; anything else is
// InvalidArgument naming the accepted values.
absl::StatusOr<SpeculationMethod> ParseSpeculationMethod(std::string_view name);
const char* SpeculationMethodName(SpeculationMethod m);  // "none", "draft_model", "ngram", ...

// Longest draft one round may carry (requests and config alike).
inline constexpr int32_t kMaxSpeculativeTokens = 64;

// Per-request options.
struct SpeculationParams {
  SpeculationMethod method = SpeculationMethod::kDefault;
  int32_t num_speculative_tokens = 0;  // 0: the server's default
};

// The server's speculation settings (`--speculative-config`), immutable after parsing.
struct SpeculativeConfig {
  SpeculationMethod method = SpeculationMethod::kNone;  // default for requests that say nothing
  std::string draft_model;             // HF model dir of the draft (method draft_model); may be
                                       // set with another default method, so requests can ask
  int32_t num_speculative_tokens = 4;  // default K
  int32_t prompt_lookup_min = 1;       // n-gram: shortest suffix matched
  int32_t prompt_lookup_max = 4;       // n-gram: longest suffix matched
  int64_t draft_kv_cache_bytes = 0;    // draft model's KV pool; 0: the device default
  std::string speculator_device;       // where the draft runs ("cpu", "cuda:N"; JSON also takes
                                       // an integer N); "": the target's device

  bool enabled() const { return method != SpeculationMethod::kNone || !draft_model.empty(); }
};

// Parses vLLM-style JSON, e.g. {"method": "draft_model", "model": "DIR",
// "num_speculative_tokens": 4} or {"method": "ngram", "prompt_lookup_max": 4}. "" gives the
// default (no speculation). InvalidArgument naming the field for unknown fields, wrong types
// or out-of-range values, or a draft_model method without "model".
absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(std::string_view json);

// What one request runs with.
struct ResolvedSpeculation {
  SpeculationMethod method = SpeculationMethod::kNone;  // kNone, kDraftModel or kNgram
  int32_t num_speculative_tokens = 0;                   // K; 0 when method is kNone
  bool enabled() const { return method != SpeculationMethod::kNone; }
};

// The request's method (or the server default when it gave none), `auto` resolved to the draft
// model when `has_draft_model`, else n-gram; K from the request, else the server's.
// InvalidArgument when the request asks for a draft model the server has not loaded, or K
// outside [0, kMaxSpeculativeTokens].
absl::StatusOr<ResolvedSpeculation> ResolveSpeculation(const SpeculationParams& request,
                                                       const SpeculativeConfig& server,
                                                       bool has_draft_model);

}  // namespace specd
