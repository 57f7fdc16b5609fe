#include "server/http/openai_api.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/status.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/chat_prompt.h"
#include "server/http/errors.h"

namespace specd::http {
namespace {

constexpr double kAnyFinite = std::numeric_limits<double>::max();
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
// Completions default to 16 tokens, as OpenAI does; chat to the rest of the context.
constexpr int32_t kDefaultCompletionMaxTokens = 16;

using Prompts = std::vector<std::vector<int32_t>>;

absl::Status ContextError(absl::string_view param, std::string message) {
  return WithCode(InvalidParam(param, message), "context_length_exceeded");
}

// Fields of OpenAI's API we do not implement: refused when they would change the result.
absl::Status RejectUnsupported(const Json& body) {
  if (const Json* v = FindField(body, "logit_bias"); v && !(v->is_object() && v->empty())) {
    return InvalidParam("logit_bias", "logit_bias is not supported");
  }
  bool echo = false;
  SPECD_RETURN_IF_ERROR(ReadBool(body, "echo", &echo));
  if (echo) return InvalidParam("echo", "echo is not supported");
  if (FindField(body, "suffix")) return InvalidParam("suffix", "suffix is not supported");
  if (const Json* v = FindField(body, "response_format")) {
    if (!v->is_object() || v->value("type", Json()) != "text") {
      return InvalidParam("response_format",
                          "only response_format {\"type\": \"text\"} is supported");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadSampling(const Json& body, SamplingParams* p) {
  p->temperature = 1.0f;
  SPECD_RETURN_IF_ERROR(ReadFloat(body, "temperature", -kAnyFinite, kAnyFinite, &p->temperature));
  SPECD_RETURN_IF_ERROR(ReadFloat(body, "top_p", -kAnyFinite, kAnyFinite, &p->top_p));
  SPECD_RETURN_IF_ERROR(ReadInt32(body, "top_k", -1, kInt32Max, &p->top_k));
  SPECD_RETURN_IF_ERROR(ReadFloat(body, "min_p", -kAnyFinite, kAnyFinite, &p->min_p));
  SPECD_RETURN_IF_ERROR(
      ReadFloat(body, "presence_penalty", -kAnyFinite, kAnyFinite, &p->presence_penalty));
  SPECD_RETURN_IF_ERROR(
      ReadFloat(body, "frequency_penalty", -kAnyFinite, kAnyFinite, &p->frequency_penalty));
  SPECD_RETURN_IF_ERROR(
      ReadFloat(body, "repetition_penalty", -kAnyFinite, kAnyFinite, &p->repetition_penalty));
  int64_t seed = 0;
  if (FindField(body, "seed")) {
    SPECD_RETURN_IF_ERROR(ReadInt(body, "seed", std::numeric_limits<int64_t>::min(),
                                  std::numeric_limits<int64_t>::max(), &seed));
    p->seed = static_cast<uint64_t>(seed);
  }
  SPECD_RETURN_IF_ERROR(ReadStringOrList(body, "stop", &p->stop));
  SPECD_RETURN_IF_ERROR(ReadIntList(body, "stop_token_ids", 0, kInt32Max, &p->stop_token_ids));
  SPECD_RETURN_IF_ERROR(ReadBool(body, "ignore_eos", &p->ignore_eos));
  SPECD_RETURN_IF_ERROR(ReadInt32(body, "min_tokens", 0, kInt32Max, &p->min_tokens));
  return absl::OkStatus();
}

absl::Status ReadStreamFields(const Json& body, GenerationSpec* spec) {
  SPECD_RETURN_IF_ERROR(ReadBool(body, "stream", &spec->stream));
  const Json* options = FindField(body, "stream_options");
  if (options == nullptr) return absl::OkStatus();
  if (!options->is_object())
    return SchemaError("stream_options", "'stream_options' must be an object");
  if (!spec->stream) {
    return InvalidParam("stream_options", "stream_options is only allowed when stream is true");
  }
  for (const auto& [key, value] : options->items()) {
    if (key != "include_usage" && key != "continuous_usage_stats") {
      return InvalidParam("stream_options",
                          absl::StrCat("unknown stream_options field '", key, "'"));
    }
  }
  return ReadBool(*options, "include_usage", &spec->include_usage);
}

absl::Status CheckIds(const std::vector<int32_t>& ids, int32_t vocab_size,
                      absl::string_view param) {
  for (int32_t id : ids) {
    if (id >= vocab_size) {
      return InvalidParam(
          param, absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& text, bool add_special,
                                                const ModelContext& model,
                                                absl::string_view param) {
  if (model.tokenizer == nullptr) {
    return InvalidParam(param, "this model has no tokenizer: give token ids");
  }
  SPECD_RETURN_IF_ERROR(CheckTextLength(text.size(), model, param));
  absl::StatusOr<std::vector<int32_t>> ids = model.tokenizer->Encode(text, add_special);
  if (!ids.ok()) return InvalidParam(param, ids.status().message());
  return ids;
}

// One element of `prompt`: a string or an array of token ids.
absl::StatusOr<std::vector<int32_t>> ParseOnePrompt(const Json& v, const ModelContext& model) {
  constexpr char kShape[] =
      "'prompt' must be a string, an array of token ids, or an array of strings or of token "
      "id arrays";
  std::vector<int32_t> ids;
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().empty()) return InvalidParam("prompt", "prompt is empty");
    SPECD_ASSIGN_OR_RETURN(ids, EncodeText(v.get<std::string>(), true, model, "prompt"));
  } else if (v.is_array()) {
    Json wrapper = {{"prompt", v}};
    SPECD_RETURN_IF_ERROR(ReadIntList(wrapper, "prompt", 0, kInt32Max, &ids));
    SPECD_RETURN_IF_ERROR(CheckIds(ids, model.vocab_size, "prompt"));
  } else {
    return SchemaError("prompt", kShape);
  }
  if (ids.empty()) return InvalidParam("prompt", "prompt is empty");
  return ids;
}

absl::StatusOr<Prompts> ParsePrompts(const Json& body, const ModelContext& model) {
  const Json* v = FindField(body, "prompt");
  if (v == nullptr) return SchemaError("prompt", "'prompt' is required");
  Prompts prompts;
  // A list of strings or of id lists is several prompts; a flat id list is one.
  const bool many = v->is_array() && !v->empty() && ((*v)[0].is_string() || (*v)[0].is_array());
  if (!many) {
    SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseOnePrompt(*v, model));
    prompts.push_back(std::move(ids));
    return prompts;
  }
  for (const Json& item : *v) {
    if (item.is_array() != (*v)[0].is_array()) {
      return SchemaError("prompt", "'prompt' mixes strings and token id arrays");
    }
    SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseOnePrompt(item, model));
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// The fields of the object `speculation.<name>` under their full names ("speculation.<name>.
// <field>": value, null when absent), so that errors name them so; unknown fields are 400.
absl::StatusOr<Json> NamedFields(const Json& object, const char* name,
                                 std::initializer_list<const char*> fields) {
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::none_of(fields.begin(), fields.end(), [&](const char* f) { return key == f; })) {
      std::string known;
      for (const char* f : fields) {
        absl::StrAppend(&known, known.empty() ? "" : f == *(fields.end() - 1) ? " and " : ", ", f);
      }
      return InvalidParam(
          absl::StrCat("speculation.", name, ".", key),
          absl::StrCat("unknown speculation.", name, " field '", key, "'; use ", known));
    }
  }
  Json named = Json::object();
  for (const char* f : fields)
    named[absl::StrCat("speculation.", name, ".", f)] = object.value(f, Json());
  return named;
}

// The speculation object is read for its syntax: JSON types (422), unknown fields and method
// names (400), each naming the field. Its values are checked by SpeculationParams::Validate (the
// rules the engine applies again at Submit, where ResolveSpeculation refuses what the server
// cannot run), 400 naming the field through the status's field payload. A count here is only
// an integer of the wire's sign: 0 and -1 are how the struct says "unset", so the JSON may not
// send them where the API has no such value.
constexpr int32_t kAnyCount = std::numeric_limits<int32_t>::max();

// speculation.policy: {"max_k": 0..64, "forbid": ["draft_model", "ngram", "ssd", "vegas",
// "streaming"]}.
absl::Status ReadSpeculationPolicy(const Json& speculation, SpeculationParams* out) {
  const Json* policy = FindField(speculation, "policy");
  if (policy == nullptr) return absl::OkStatus();
  if (!policy->is_object()) {
    return SchemaError("speculation.policy", "'speculation.policy' must be an object");
  }
  for (const auto& [key, value] : policy->items()) {
    if (key != "max_k" && key != "forbid") {
      return InvalidParam(
          absl::StrCat("speculation.policy.", key),
          absl::StrCat("unknown speculation.policy field '", key, "'; use max_k and forbid"));
    }
  }
  constexpr char kMaxK[] = "speculation.policy.max_k";
  constexpr char kForbid[] = "speculation.policy.forbid";
  const Json named = {{kMaxK, policy->value("max_k", Json())},
                      {kForbid, policy->value("forbid", Json())}};
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kMaxK, 0, kAnyCount, &out->policy_max_k));
  const Json* forbid = FindField(named, kForbid);
  if (forbid == nullptr) return absl::OkStatus();
  if (!forbid->is_array()) {
    return SchemaError(kForbid, "'speculation.policy.forbid' must be an array of method names");
  }
  for (const Json& name : *forbid) {
    if (!name.is_string()) {
      return SchemaError(kForbid, "'speculation.policy.forbid' must be an array of method names");
    }
    absl::StatusOr<SpeculationMethod> m = ParseSpeculationMethod(name.get<std::string>());
    if (!m.ok()) return InvalidParam(kForbid, m.status().message());
    out->policy_forbid.push_back(*m);
  }
  return absl::OkStatus();
}

// speculation.ssv (NSA targets): {"group_size": 1..16, "mode": "exact" | "shared",
// "refresh_every": >= 1, "strict": bool}; the engine refuses it for a dense target.
absl::Status ReadSpeculationSsv(const Json& speculation, SpeculationParams* out) {
  const Json* ssv = FindField(speculation, "ssv");
  if (ssv == nullptr) return absl::OkStatus();
  if (!ssv->is_object())
    return SchemaError("speculation.ssv", "'speculation.ssv' must be an object");
  constexpr char kGroup[] = "speculation.ssv.group_size";
  constexpr char kMode[] = "speculation.ssv.mode";
  constexpr char kRefresh[] = "speculation.ssv.refresh_every";
  constexpr char kStrict[] = "speculation.ssv.strict";
  SPECD_ASSIGN_OR_RETURN(
      const Json named,
      NamedFields(*ssv, "ssv", {"group_size", "mode", "refresh_every", "strict"}));
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kGroup, 1, kAnyCount, &out->ssv_group_size));
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kRefresh, 1, kAnyCount, &out->ssv_refresh_every));
  std::string mode;
  SPECD_RETURN_IF_ERROR(ReadString(named, kMode, &mode));
  if (FindField(named, kMode) != nullptr) {
    SsvMode m;
    if (!ParseSsvMode(mode, &m)) {
      return InvalidParam(kMode, "'speculation.ssv.mode' must be \"exact\" or \"shared\"");
    }
    out->ssv_mode = m;
  }
  return ReadBool(named, kStrict, &out->ssv_strict);
}

// speculation.tree: {"depth": 1..64, "top_k": 1..16, "num_nodes": 1..64} (each optional: the
// server's, else the defaults), or false (chains even where the server drafts trees).
absl::Status ReadSpeculationTree(const Json& speculation, SpeculationParams* out) {
  const Json* tree = FindField(speculation, "tree");
  if (tree == nullptr) return absl::OkStatus();
  if (tree->is_boolean()) {
    if (tree->get<bool>()) {
      out->tree.enabled = true;
    } else {
      out->tree_off = true;
    }
    return absl::OkStatus();
  }
  if (!tree->is_object()) {
    return SchemaError("speculation.tree", "'speculation.tree' must be an object or a boolean");
  }
  constexpr char kDepth[] = "speculation.tree.depth";
  constexpr char kTopK[] = "speculation.tree.top_k";
  constexpr char kNodes[] = "speculation.tree.num_nodes";
  SPECD_ASSIGN_OR_RETURN(const Json named,
                         NamedFields(*tree, "tree", {"depth", "top_k", "num_nodes"}));
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kDepth, 1, kAnyCount, &out->tree.depth));
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kTopK, 1, kAnyCount, &out->tree.top_k));
  SPECD_RETURN_IF_ERROR(ReadInt32(named, kNodes, 1, kAnyCount, &out->tree.num_nodes));
  out->tree.enabled = true;
  return absl::OkStatus();
}

// The optional `speculation` object: {"method": none|auto|draft_model|draft|ngram|ssd|vegas|
// streaming, "num_speculative_tokens": 1..64, "saguaro_c": 0..1 (SSD's down-weighting C),
// "sparsity_ratio": (0, 1], "min_tokens", "max_tokens" (vegas / streaming: the prefix tokens a
// draft step keeps, clamp(ceil(ratio * n), min, max); max 0: no cap)}, "policy": {"max_k": 0..64,
// "forbid": [method, ...]} (ReadSpeculationPolicy), "ssv", "tree". Syntax here (see kAnyCount),
// values by SpeculationParams::Validate; a method the server cannot run is the engine's 400.
absl::Status ReadSpeculation(const Json& body, const ModelContext& model, GenerationSpec* spec) {
  spec->report_speculation = model.speculative.method != SpeculationMethod::kNone;
  const Json* v = FindField(body, "speculation");
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_object()) return SchemaError("speculation", "'speculation' must be an object");
  spec->report_speculation = true;
  constexpr char kMethod[] = "speculation.method";
  constexpr char kNumTokens[] = "speculation.num_speculative_tokens";
  for (const auto& [key, value] : v->items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "saguaro_c" &&
        key != "sparsity_ratio" && key != "min_tokens" && key != "max_tokens" && key != "policy" &&
        key != "ssv" && key != "tree") {
      return InvalidParam(
          absl::StrCat("speculation.", key),
          absl::StrCat("unknown speculation field '", key,
                       "'; use method, num_speculative_tokens, saguaro_c, sparsity_ratio, "
                       "min_tokens, max_tokens, policy, ssv and tree"));
    }
  }
  SPECD_RETURN_IF_ERROR(ReadSpeculationPolicy(*v, &spec->speculation));
  SPECD_RETURN_IF_ERROR(ReadSpeculationTree(*v, &spec->speculation));
  SPECD_RETURN_IF_ERROR(ReadSpeculationSsv(*v, &spec->speculation));
  // The fields under their full names, so that errors name them so.
  constexpr char kSaguaroC[] = "speculation.saguaro_c";
  constexpr char kRatio[] = "speculation.sparsity_ratio";
  constexpr char kMinTokens[] = "speculation.min_tokens";
  constexpr char kMaxTokens[] = "speculation.max_tokens";
  const Json named = {{kMethod, v->value("method", Json())},
                      {kNumTokens, v->value("num_speculative_tokens", Json())},
                      {kSaguaroC, v->value("saguaro_c", Json())},
                      {kRatio, v->value("sparsity_ratio", Json())},
                      {kMinTokens, v->value("min_tokens", Json())},
                      {kMaxTokens, v->value("max_tokens", Json())}};
  std::string method;
  SPECD_RETURN_IF_ERROR(ReadString(named, kMethod, &method));
  absl::StatusOr<SpeculationMethod> parsed = ParseSpeculationMethod(method);
  if (!parsed.ok()) return InvalidParam(kMethod, parsed.status().message());
  spec->speculation.method = *parsed;
  // Absent or null: the server's K.
  SPECD_RETURN_IF_ERROR(
      ReadInt32(named, kNumTokens, 1, kAnyCount, &spec->speculation.num_speculative_tokens));
  constexpr double kAnyNumber = std::numeric_limits<float>::max();
  SPECD_RETURN_IF_ERROR(ReadFloat(named, kSaguaroC, 0.0, kAnyNumber, &spec->speculation.saguaro_c));
  float ratio = -1.0f;
  SPECD_RETURN_IF_ERROR(ReadFloat(named, kRatio, 0.0, kAnyNumber, &ratio));
  spec->speculation.sparsity_ratio = ratio;
  SPECD_RETURN_IF_ERROR(
      ReadInt32(named, kMinTokens, 0, kAnyCount, &spec->speculation.sparse_min_tokens));
  SPECD_RETURN_IF_ERROR(
      ReadInt32(named, kMaxTokens, 0, kAnyCount, &spec->speculation.sparse_max_tokens));
  // The values (the rules the engine applies again at Submit), each error naming its field.
  return spec->speculation.Validate();
}

// Reads what both endpoints share: model, unsupported fields, stream options, n, the
// speculation options and the sampling fields.
absl::Status ReadCommon(const Json& body, const ModelContext& model, GenerationSpec* spec,
                        SamplingParams* params) {
  SPECD_RETURN_IF_ERROR(CheckModel(body, model));
  spec->model = model.served_model_name;
  SPECD_RETURN_IF_ERROR(RejectUnsupported(body));
  SPECD_RETURN_IF_ERROR(ReadStreamFields(body, spec));
  SPECD_RETURN_IF_ERROR(ReadInt32(body, "n", 1, kMaxN, &spec->n));
  SPECD_RETURN_IF_ERROR(ReadBool(body, "return_tokens_as_token_ids", &spec->tokens_as_ids));
  if (const Json* best_of = FindField(body, "best_of")) {
    if (!best_of->is_number_integer() || best_of->get<int64_t>() != spec->n) {
      return InvalidParam("best_of", "best_of must equal n (or be omitted)");
    }
  }
  SPECD_RETURN_IF_ERROR(ReadSpeculation(body, model, spec));
  return ReadSampling(body, params);
}

// SamplingParams::Validate's errors name their field (the status's field payload: "param").
absl::Status ValidateParams(const SamplingParams& params, const ModelContext& model) {
  return params.Validate(model.vocab_size);
}

// Fills spec->requests: one per (prompt, choice), max_tokens checked against the context.
absl::Status BuildRequests(Prompts prompts, SamplingParams params,
                           std::optional<int32_t> max_tokens, absl::string_view prompt_param,
                           const ModelContext& model, GenerationSpec* spec) {
  spec->num_prompts = static_cast<int32_t>(prompts.size());
  if (int64_t{spec->num_prompts} * spec->n > kMaxChoices) {
    return InvalidParam(
        "n", absl::StrCat("at most ", kMaxChoices, " choices per request (prompts times n)"));
  }
  if (spec->logprobs) params.logprobs = spec->top_logprobs;
  for (std::vector<int32_t>& ids : prompts) {
    const int64_t len = static_cast<int64_t>(ids.size());
    if (len >= model.max_model_len) {
      return ContextError(
          prompt_param, absl::StrCat("This model's maximum context length is ", model.max_model_len,
                                     " tokens; the prompt has ", len, " tokens"));
    }
    const int32_t room = static_cast<int32_t>(model.max_model_len - len);
    SamplingParams p = params;
    if (max_tokens) {
      if (*max_tokens > room) {
        return ContextError(
            "max_tokens",
            absl::StrCat("This model's maximum context length is ", model.max_model_len,
                         " tokens. However, you requested ", len + *max_tokens, " tokens (", len,
                         " in the prompt, ", *max_tokens, " for the completion)"));
      }
      p.max_tokens = *max_tokens;
    } else {
      p.max_tokens =
          spec->endpoint == Endpoint::kChat ? room : std::min(room, kDefaultCompletionMaxTokens);
    }
    SPECD_RETURN_IF_ERROR(ValidateParams(p, model));
    for (int32_t j = 0; j < spec->n; ++j) {
      GenerateRequest r;
      r.prompt_ids = ids;
      r.params = p;
      r.speculation = spec->speculation;
      // Distinct but reproducible seeds per choice, else n seeded choices would be equal.
      if (p.seed) r.params.seed = *p.seed + static_cast<uint64_t>(j);
      spec->requests.push_back(std::move(r));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int32_t>> ReadMaxTokens(const Json& body,
                                                     std::initializer_list<const char*> keys) {
  std::optional<int32_t> max_tokens;
  for (const char* key : keys) {
    if (max_tokens || FindField(body, key) == nullptr) continue;
    int32_t v = 0;
    SPECD_RETURN_IF_ERROR(ReadInt32(body, key, 1, std::numeric_limits<int32_t>::max(), &v));
    max_tokens = v;
  }
  return max_tokens;
}

}  // namespace

absl::Status CheckTextLength(size_t bytes, const ModelContext& model, absl::string_view param) {
  const int64_t limit = kMaxTextBytesPerToken * model.max_model_len;
  if (static_cast<int64_t>(bytes) <= limit) return absl::OkStatus();
  return ContextError(param,
                      absl::StrCat("This model's maximum context length is ", model.max_model_len,
                                   " tokens; text of ", bytes, " bytes cannot fit (the limit is ",
                                   kMaxTextBytesPerToken, " bytes per token, ", limit, " bytes)"));
}

absl::Status CheckModel(const Json& body, const ModelContext& model) {
  // Absent or null: the served model. "" names no model (404, as any other unknown name).
  if (FindField(body, "model") == nullptr) return absl::OkStatus();
  std::string name;
  SPECD_RETURN_IF_ERROR(ReadString(body, "model", &name));
  if (name == model.served_model_name) return absl::OkStatus();
  return WithCode(WithParam(absl::NotFoundError(absl::StrCat(
                                "The model '", name, "' does not exist; this server serves '",
                                model.served_model_name, "'")),
                            "model"),
                  "model_not_found");
}

absl::StatusOr<GenerationSpec> ParseCompletionRequest(const Json& body, const ModelContext& model) {
  GenerationSpec spec;
  spec.endpoint = Endpoint::kCompletions;
  SamplingParams params;
  SPECD_RETURN_IF_ERROR(ReadCommon(body, model, &spec, &params));
  if (FindField(body, "logprobs")) {
    SPECD_RETURN_IF_ERROR(ReadInt32(body, "logprobs", 0, kMaxLogprobs, &spec.top_logprobs));
    spec.logprobs = true;
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<int32_t> max_tokens, ReadMaxTokens(body, {"max_tokens"}));
  SPECD_ASSIGN_OR_RETURN(Prompts prompts, ParsePrompts(body, model));
  SPECD_RETURN_IF_ERROR(
      BuildRequests(std::move(prompts), params, max_tokens, "prompt", model, &spec));
  return spec;
}

absl::StatusOr<GenerationSpec> ParseChatRequest(const Json& body, const ModelContext& model) {
  GenerationSpec spec;
  spec.endpoint = Endpoint::kChat;
  SamplingParams params;
  SPECD_RETURN_IF_ERROR(ReadCommon(body, model, &spec, &params));
  SPECD_RETURN_IF_ERROR(ReadBool(body, "logprobs", &spec.logprobs));
  if (FindField(body, "top_logprobs")) {
    SPECD_RETURN_IF_ERROR(ReadInt32(body, "top_logprobs", 0, kMaxLogprobs, &spec.top_logprobs));
    if (!spec.logprobs) {
      return InvalidParam("top_logprobs", "top_logprobs needs logprobs set to true");
    }
  }
  SPECD_ASSIGN_OR_RETURN(std::optional<int32_t> max_tokens,
                         ReadMaxTokens(body, {"max_completion_tokens", "max_tokens"}));
  SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ChatPromptIds(body, model, false));
  Prompts prompts;
  prompts.push_back(std::move(ids));
  SPECD_RETURN_IF_ERROR(
      BuildRequests(std::move(prompts), params, max_tokens, "messages", model, &spec));
  return spec;
}

absl::StatusOr<TokenizeSpec> ParseTokenizeRequest(const Json& body, const ModelContext& model) {
  SPECD_RETURN_IF_ERROR(CheckModel(body, model));
  TokenizeSpec spec;
  SPECD_RETURN_IF_ERROR(ReadBool(body, "return_token_strs", &spec.return_token_strs));
  const bool chat = FindField(body, "messages") != nullptr;
  if (chat == (FindField(body, "prompt") != nullptr)) {
    return SchemaError("prompt", "give exactly one of 'prompt' or 'messages'");
  }
  bool add_special = !chat;
  SPECD_RETURN_IF_ERROR(ReadBool(body, "add_special_tokens", &add_special));
  if (chat) {
    SPECD_ASSIGN_OR_RETURN(spec.ids, ChatPromptIds(body, model, add_special));
    return spec;
  }
  std::string prompt;
  SPECD_RETURN_IF_ERROR(ReadString(body, "prompt", &prompt));
  SPECD_ASSIGN_OR_RETURN(spec.ids, EncodeText(prompt, add_special, model, "prompt"));
  return spec;
}

absl::StatusOr<std::vector<int32_t>> ParseDetokenizeRequest(const Json& body,
                                                            const ModelContext& model) {
  SPECD_RETURN_IF_ERROR(CheckModel(body, model));
  if (FindField(body, "tokens") == nullptr) return SchemaError("tokens", "'tokens' is required");
  std::vector<int32_t> ids;
  SPECD_RETURN_IF_ERROR(ReadIntList(body, "tokens", 0, kInt32Max, &ids));
  SPECD_RETURN_IF_ERROR(CheckIds(ids, model.vocab_size, "tokens"));
  if (model.tokenizer == nullptr) return InvalidParam("tokens", "this model has no tokenizer");
  return ids;
}

}  // namespace specd::http
