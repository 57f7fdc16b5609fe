// libFuzzer target: an HTTP request body through the OpenAI parsers exactly as the front end
// runs them (ParseJsonObject, CheckModel, then /v1/completions, /v1/chat/completions,
// /tokenize and /detokenize) against the bundled codepair model's tokenizer and chat template.
// Beyond "no crash, no sanitizer report": every refusal is a 4xx (a client cannot cause a
// 500), and every accepted request respects the limits the engine relies on (choices,
// context length, token ids inside the vocabulary).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/jinja/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/errors.h"
#include "server/http/json_fields.h"
#include "server/http/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

namespace specd::fuzz {
namespace {

constexpr char kModelDir[] = SPECD_SOURCE_DIR "/models/codepair/target";
constexpr int32_t kMaxModelLen = 256;

struct Model {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;
  http::ModelContext context;
};

const Model& GetModel() {
  static const Model* model = [] {
    QuietLogs();
    auto* m = new Model;
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromDir(kModelDir);
    FUZZ_CHECK(tok.ok(), tok.status().ToString());
    m->tokenizer = *std::move(tok);
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Parse(m->tokenizer->chat_template());
    FUZZ_CHECK(tmpl.ok(), tmpl.status().ToString());
    m->chat_template = std::make_unique<ChatTemplate>(*std::move(tmpl));
    m->context.served_model_name = "codepair";
    m->context.tokenizer = m->tokenizer.get();
    m->context.chat_template = m->chat_template.get();
    m->context.max_model_len = kMaxModelLen;
    m->context.vocab_size = m->tokenizer->vocab_size();
    return m;
  }();
  return *model;
}

// A refusal must be a client error with a usable body.
void CheckRefusal(const absl::Status& status, const char* route) {
  FUZZ_CHECK(!status.ok(), route);
  http::ApiError error = http::ToApiError(status);
  FUZZ_CHECK(error.http_status >= 400 && error.http_status < 500,
             absl::StrCat(route, ": ", error.http_status, " for ", status.ToString()));
  FUZZ_CHECK(!http::ErrorBody(error).empty(), route);
}

void CheckIds(const std::vector<int32_t>& ids, int32_t vocab_size, const char* route) {
  for (int32_t id : ids) {
    FUZZ_CHECK(id >= 0 && id < vocab_size, absl::StrCat(route, ": id ", id));
  }
}

void CheckGeneration(const absl::StatusOr<http::GenerationSpec>& spec, const Model& model,
                     const char* route) {
  if (!spec.ok()) {
    CheckRefusal(spec.status(), route);
    return;
  }
  FUZZ_CHECK(spec->n >= 1 && spec->n <= http::kMaxN, route);
  FUZZ_CHECK(spec->requests.size() == static_cast<size_t>(spec->num_prompts) * spec->n, route);
  FUZZ_CHECK(spec->requests.size() <= static_cast<size_t>(http::kMaxChoices), route);
  for (const GenerateRequest& r : spec->requests) {
    const int64_t len = static_cast<int64_t>(r.prompt_ids.size());
    FUZZ_CHECK(len < kMaxModelLen, absl::StrCat(route, ": prompt of ", len));
    FUZZ_CHECK(r.params.max_tokens >= 0 && len + r.params.max_tokens <= kMaxModelLen,
               absl::StrCat(route, ": max_tokens ", r.params.max_tokens));
    CheckIds(r.prompt_ids, model.context.vocab_size, route);
  }
}

void FuzzOne(std::string_view body) {
  const Model& model = GetModel();
  absl::StatusOr<http::Json> json = http::ParseJsonObject(body);
  if (!json.ok()) {
    CheckRefusal(json.status(), "parse");
    return;
  }
  absl::Status model_ok = http::CheckModel(*json, model.context);
  if (!model_ok.ok()) CheckRefusal(model_ok, "model");
  CheckGeneration(http::ParseCompletionRequest(*json, model.context), model, "completions");
  CheckGeneration(http::ParseChatRequest(*json, model.context), model, "chat");
  absl::StatusOr<http::TokenizeSpec> tok = http::ParseTokenizeRequest(*json, model.context);
  if (tok.ok()) {
    CheckIds(tok->ids, model.context.vocab_size, "tokenize");
  } else {
    CheckRefusal(tok.status(), "tokenize");
  }
  absl::StatusOr<std::vector<int32_t>> detok = http::ParseDetokenizeRequest(*json, model.context);
  if (detok.ok()) {
    CheckIds(*detok, model.context.vocab_size, "detokenize");
  } else {
    CheckRefusal(detok.status(), "detokenize");
  }
}

}  // namespace
}  // namespace specd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specd::fuzz::FuzzOne(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
