#include "engine/speculation/spec_config.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/base/field_status.h"
#include "engine/base/status.h"

namespace specd {

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
  out.ssv_planned = target_is_nsa && request.ssv_group_size == 0 && !request.ssv_mode.has_value() &&
                    request.ssv_refresh_every == 0;
  out.ssv_strict = request.ssv_strict;
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
