#include "server/grpc/generate_conversion.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string_view>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/field_status.h"
#include "engine/base/status.h"
#include "engine/tokenizer/tokenizer.h"

namespace specd {
namespace {

absl::StatusOr<std::vector<int32_t>> PromptIds(const v1::GenerateRequest& request,
                                               const ServedModel& model) {
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return absl::InvalidArgumentError("prompt text is empty");
      if (model.tokenizer == nullptr) {
        return absl::InvalidArgumentError(
            "this model has no tokenizer: give the prompt as token_ids");
      }
      return model.tokenizer->Encode(request.text(), /*add_special=*/true);
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return absl::InvalidArgumentError("prompt token_ids is empty");
      return std::vector<int32_t>(ids.begin(), ids.end());
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("prompt is required: set text or token_ids");
}

// The wire's syntax only: method names, and the optional fields whose wire value the struct
// reads as "unset" (a count of 0 or below) refused as such; the values themselves are checked by
// SpeculationParams::Validate, the rules every front end and the engine share. "" keeps the
// server's default; "draft" is accepted for "draft_model".
absl::StatusOr<SpeculationParams> ToSpeculationParams(const v1::SpeculationOptions& options) {
  SpeculationParams params;
  absl::StatusOr<SpeculationMethod> method = ParseSpeculationMethod(options.method());
  if (!method.ok()) {
    return FieldError("speculation.method",
                      absl::StrCat("speculation.method: ", method.status().message()));
  }
  params.method = *method;
  params.num_speculative_tokens = options.num_speculative_tokens();
  if (options.has_saguaro_c()) {
    if (!(options.saguaro_c() >= 0.0f)) {
      return FieldError(
          "speculation.saguaro_c",
          absl::StrCat("speculation.saguaro_c must be in [0, 1], got ", options.saguaro_c()));
    }
    params.saguaro_c = options.saguaro_c();
  }
  if (options.has_sparsity_ratio()) {
    if (!(options.sparsity_ratio() >= 0.0)) {
      return FieldError("speculation.sparsity_ratio",
                        absl::StrCat("speculation.sparsity_ratio must be in (0, 1], got ",
                                     options.sparsity_ratio()));
    }
    params.sparsity_ratio = options.sparsity_ratio();
  }
  // A count the struct reads as unset below `min`: given explicitly, it is an error here.
  auto count = [](const char* field, bool has, int32_t value, int32_t min,
                  int32_t* out) -> absl::Status {
    if (!has) return absl::OkStatus();
    if (value < min) {
      return FieldError(
          field, absl::StrCat(
                     field, min == 0 ? " must not be negative, got " : " must be at least 1, got ",
                     value));
    }
    *out = value;
    return absl::OkStatus();
  };
  SPECD_RETURN_IF_ERROR(count("speculation.min_tokens", options.has_min_tokens(),
                              options.min_tokens(), 0, &params.sparse_min_tokens));
  SPECD_RETURN_IF_ERROR(count("speculation.max_tokens", options.has_max_tokens(),
                              options.max_tokens(), 0, &params.sparse_max_tokens));
  const v1::SpeculationPolicy& policy = options.policy();
  SPECD_RETURN_IF_ERROR(count("speculation.policy.max_k", policy.has_max_k(), policy.max_k(), 0,
                              &params.policy_max_k));
  for (const std::string& name : policy.forbid()) {
    absl::StatusOr<SpeculationMethod> m = ParseSpeculationMethod(name);
    if (!m.ok()) {
      return FieldError("speculation.policy.forbid",
                        absl::StrCat("speculation.policy.forbid: ", m.status().message()));
    }
    params.policy_forbid.push_back(*m);
  }
  const v1::SsvOptions& ssv = options.ssv();
  SPECD_RETURN_IF_ERROR(count("speculation.ssv.group_size", ssv.has_group_size(), ssv.group_size(),
                              1, &params.ssv_group_size));
  SPECD_RETURN_IF_ERROR(count("speculation.ssv.refresh_every", ssv.has_refresh_every(),
                              ssv.refresh_every(), 1, &params.ssv_refresh_every));
  if (ssv.has_mode()) {
    SsvMode mode;
    if (!ParseSsvMode(ssv.mode(), &mode)) {
      return FieldError("speculation.ssv.mode",
                        absl::StrCat("speculation.ssv.mode must be \"exact\" or \"shared\", got \"",
                                     ssv.mode(), "\""));
    }
    params.ssv_mode = mode;
  }
  params.ssv_strict = ssv.strict();
  const v1::TreeOptions& tree = options.tree();
  SPECD_RETURN_IF_ERROR(
      count("speculation.tree.depth", tree.has_depth(), tree.depth(), 1, &params.tree.depth));
  SPECD_RETURN_IF_ERROR(
      count("speculation.tree.top_k", tree.has_top_k(), tree.top_k(), 1, &params.tree.top_k));
  SPECD_RETURN_IF_ERROR(count("speculation.tree.num_nodes", tree.has_num_nodes(), tree.num_nodes(),
                              1, &params.tree.num_nodes));
  params.tree.enabled = tree.has_depth() || tree.has_top_k() || tree.has_num_nodes();
  if (tree.has_enabled()) {
    if (tree.enabled()) {
      params.tree.enabled = true;
    } else if (params.tree.enabled) {
      return FieldError("speculation.tree", "speculation.tree: enabled false with tree fields set");
    } else {
      params.tree_off = true;
    }
  }
  SPECD_RETURN_IF_ERROR(params.Validate());
  return params;
}

// max_tokens: as given (it must fit the context), or what the context leaves.
absl::StatusOr<int32_t> MaxTokens(const v1::GenerateRequest& request, int64_t num_prompt,
                                  int32_t max_model_len) {
  if (num_prompt >= max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("prompt has ", num_prompt,
                                                   " tokens; the context limit is ", max_model_len,
                                                   " (prompt + max_tokens)"));
  }
  if (!request.has_max_tokens()) return static_cast<int32_t>(max_model_len - num_prompt);
  if (request.max_tokens() < 1) return absl::InvalidArgumentError("max_tokens must be >= 1");
  if (num_prompt + request.max_tokens() > max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", num_prompt, " tokens) + max_tokens (", request.max_tokens(),
                     ") exceeds the context limit of ", max_model_len, " tokens"));
  }
  return request.max_tokens();
}

SamplingParams ToSamplingParams(const v1::GenerateRequest& request, int32_t max_tokens) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.min_tokens = request.min_tokens();
  if (request.has_temperature()) p.temperature = request.temperature();
  if (request.has_top_p()) p.top_p = request.top_p();
  p.top_k = request.top_k();
  p.min_p = request.min_p();
  if (request.has_repetition_penalty()) p.repetition_penalty = request.repetition_penalty();
  p.presence_penalty = request.presence_penalty();
  p.frequency_penalty = request.frequency_penalty();
  if (request.has_seed()) p.seed = request.seed();
  p.stop.assign(request.stop().begin(), request.stop().end());
  p.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  p.ignore_eos = request.ignore_eos();
  if (request.has_logprobs()) p.logprobs = request.logprobs();
  return p;
}

void SetTokenLogprob(int32_t id, float logprob, const Tokenizer* tokenizer, v1::TokenLogprob* out) {
  out->set_token_id(id);
  out->set_logprob(logprob);
  if (tokenizer == nullptr) return;
  absl::StatusOr<std::string> text =
      tokenizer->Decode(std::span<const int32_t>(&id, 1), /*skip_special=*/false);
  if (text.ok()) out->set_token(*std::move(text));
}

}  // namespace

absl::StatusOr<std::vector<GenerateRequest>> ToEngineRequests(const v1::GenerateRequest& request,
                                                              const ServedModel& model,
                                                              const std::string& request_id,
                                                              absl::Time deadline) {
  if (!request.model().empty() && request.model() != model.served_model_name) {
    return absl::NotFoundError(absl::StrCat("model '", request.model(),
                                            "' is not served here; this server serves '",
                                            model.served_model_name, "'"));
  }
  if (request.has_skip_special_tokens() && !request.skip_special_tokens()) {
    return absl::UnimplementedError("skip_special_tokens=false is not supported yet");
  }
  const int32_t n = request.has_n() ? request.n() : 1;
  if (n < 1 || n > kMaxChoices) {
    return absl::InvalidArgumentError(absl::StrCat("n must be in [1, ", kMaxChoices, "]"));
  }
  if (request.has_logprobs() && request.logprobs() < 0) {
    return absl::InvalidArgumentError("logprobs must be between 0 and 20");
  }
  SPECD_ASSIGN_OR_RETURN(SpeculationParams speculation, ToSpeculationParams(request.speculation()));
  SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, PromptIds(request, model));
  SPECD_ASSIGN_OR_RETURN(
      int32_t max_tokens,
      MaxTokens(request, static_cast<int64_t>(prompt_ids.size()), model.max_model_len));
  if (model.vocab_size > 0) {
    SPECD_RETURN_IF_ERROR(ToSamplingParams(request, max_tokens).Validate(model.vocab_size));
  }
  std::vector<GenerateRequest> out(n);
  for (int32_t i = 0; i < n; ++i) {
    GenerateRequest& r = out[i];
    r.prompt_ids = prompt_ids;
    r.params = ToSamplingParams(request, max_tokens);
    r.speculation = speculation;
    if (r.params.seed) *r.params.seed += static_cast<uint64_t>(i);
    r.deadline = deadline;
    r.request_id = n == 1 ? request_id : absl::StrCat(request_id, "/", i);
  }
  return out;
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return v1::FINISH_REASON_ABORT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void AppendOutput(const RequestOutput& output, const Tokenizer* tokenizer, bool with_logprobs,
                  v1::GenerateResponse* response) {
  for (const GeneratedToken& t : output.tokens) {
    response->add_token_ids(t.id);
    if (!with_logprobs) continue;
    v1::GeneratedTokenLogprobs* lp = response->add_logprobs();
    SetTokenLogprob(t.id, t.logprob, tokenizer, lp->mutable_sampled());
    for (const TokenLogprob& c : t.top) SetTokenLogprob(c.id, c.logprob, tokenizer, lp->add_top());
  }
  response->mutable_text()->append(output.text);
  if (!output.finished || !output.status.ok()) return;
  response->set_finish_reason(ToProto(output.finish_reason));
  v1::Usage* usage = response->mutable_usage();
  usage->set_prompt_tokens(output.usage.prompt_tokens);
  usage->set_completion_tokens(output.usage.completion_tokens);
  usage->set_cached_prompt_tokens(output.usage.cached_prompt_tokens);
  v1::SpeculationStats* stats = response->mutable_speculation_stats();
  stats->set_num_drafts(output.usage.num_drafts);
  stats->set_num_draft_tokens(output.usage.num_draft_tokens);
  stats->set_num_accepted_tokens(output.usage.num_accepted_tokens);
  stats->set_mean_accepted_length(output.usage.mean_accepted_length());
  stats->set_num_cache_hit_drafts(output.usage.num_cache_hit_drafts);
  stats->set_num_cache_hit_draft_tokens(output.usage.num_cache_hit_draft_tokens);
  stats->set_num_cache_hit_accepted_tokens(output.usage.num_cache_hit_accepted_tokens);
  stats->set_num_cache_miss_drafts(output.usage.num_cache_miss_drafts);
  stats->set_ssd_wait_seconds(output.usage.ssd_wait_seconds);
  stats->set_draft_context_stop(output.usage.draft_context_stop);
  for (const RequestUsage::MethodUsage& m : output.usage.by_method) {
    v1::MethodSpeculationStats* s = stats->add_by_method();
    s->set_method(m.method);
    s->set_num_drafts(m.num_drafts);
    s->set_num_draft_tokens(m.num_draft_tokens);
    s->set_num_accepted_tokens(m.num_accepted_tokens);
  }
}

absl::Status ReadModelFileInfo(const std::string& model_dir, ServedModel* model) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr,
                                                      /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON"));
  auto arch = config.find("architectures");
  if (arch != config.end() && arch->is_array() && !arch->empty() && arch->front().is_string()) {
    model->architecture = arch->front().get<std::string>();
  }
  auto vocab = config.find("vocab_size");
  if (vocab != config.end() && vocab->is_number_integer()) {
    model->vocab_size = vocab->get<int32_t>();
  }
  return absl::OkStatus();
}

}  // namespace specd
