#include "server/http/router.h"

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <exception>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/status.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/api_key.h"
#include "server/http/errors.h"
#include "server/http/generation.h"
#include "server/http/openai_format.h"
#include "server/metrics.h"
#include "server/random_id.h"

namespace specd::http {
namespace {

struct Route {
  const char* path;
  const char* method;
  bool exempt;  // no API key, served while loading and draining
};

constexpr Route kRoutes[] = {
    {"/health", "GET", true},           {"/ready", "GET", true},
    {"/metrics", "GET", true},          {"/v1/models", "GET", false},
    {"/v1/completions", "POST", false}, {"/v1/chat/completions", "POST", false},
    {"/tokenize", "POST", false},       {"/detokenize", "POST", false},
    {"/v1/debug/policy", "GET", false},
};
constexpr char kModelsPrefix[] = "/v1/models/";

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const Route* FindRoute(absl::string_view path) {
  if (absl::StartsWith(path, kModelsPrefix)) return &kRoutes[3];
  for (const Route& r : kRoutes) {
    if (path == r.path) return &r;
  }
  return nullptr;
}

Json ModelCard(const ServedModel& model) {
  return Json{{"id", model.context.served_model_name},
              {"object", "model"},
              {"created", model.created},
              {"owned_by", "specd"},
              {"root", model.context.served_model_name},  // never the model's path
              {"parent", nullptr},
              {"max_model_len", model.context.max_model_len}};
}

// The media type before any parameters ("application/json; charset=utf-8").
absl::string_view MediaType(absl::string_view content_type) {
  return absl::StripAsciiWhitespace(content_type.substr(0, content_type.find(';')));
}

// POST bodies must say they are JSON (a browser's form or text/plain POST cannot), and
// must not be compressed (we would read the compressed bytes as JSON): 415 otherwise.
absl::Status CheckJsonBody(const HttpRequest& request) {
  const absl::string_view type = MediaType(request.content_type);
  if (!absl::EqualsIgnoreCase(type, "application/json")) {
    return WithCode(WithHttpStatus(absl::InvalidArgumentError(
                                       absl::StrCat("Content-Type must be application/json, not '",
                                                    type.empty() ? "(none)" : type, "'")),
                                   415),
                    "unsupported_media_type");
  }
  const absl::string_view encoding = absl::StripAsciiWhitespace(request.content_encoding);
  if (!encoding.empty() && !absl::EqualsIgnoreCase(encoding, "identity")) {
    return WithCode(WithHttpStatus(absl::InvalidArgumentError(absl::StrCat(
                                       "Content-Encoding '", encoding,
                                       "' is not supported; send the body uncompressed")),
                                   415),
                    "unsupported_media_type");
  }
  return absl::OkStatus();
}

// The Host header's name without its port ("[::1]:8000" -> "::1", "a.b:80" -> "a.b").
absl::string_view HostName(absl::string_view host) {
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    return close == absl::string_view::npos ? host : host.substr(1, close - 1);
  }
  const size_t colon = host.find(':');
  if (colon != absl::string_view::npos && host.find(':', colon + 1) == absl::string_view::npos) {
    return host.substr(0, colon);
  }
  return host;
}

absl::StatusOr<HttpReply> Models(absl::string_view path, const ServedModel& model) {
  if (path.size() > sizeof(kModelsPrefix) - 1) {
    absl::string_view name = path.substr(sizeof(kModelsPrefix) - 1);
    if (name != model.context.served_model_name) {
      return WithCode(absl::NotFoundError(absl::StrCat("The model '", name, "' does not exist")),
                      "model_not_found");
    }
    return JsonReply(200, Dump(ModelCard(model)));
  }
  Json list = {{"object", "list"}, {"data", Json::array({ModelCard(model)})}};
  return JsonReply(200, Dump(list));
}

absl::StatusOr<HttpReply> Tokenize(const Json& body, const ServedModel& model) {
  SPECD_ASSIGN_OR_RETURN(TokenizeSpec spec, ParseTokenizeRequest(body, model.context));
  Json out = {{"count", spec.ids.size()},
              {"max_model_len", model.context.max_model_len},
              {"tokens", spec.ids},
              {"token_strs", nullptr}};
  if (spec.return_token_strs) {
    out["token_strs"] = Json::array();
    for (int32_t id : spec.ids) {
      out["token_strs"].push_back(std::string(model.context.tokenizer->IdToToken(id)));
    }
  }
  return JsonReply(200, Dump(out));
}

absl::StatusOr<HttpReply> Detokenize(const Json& body, const ServedModel& model) {
  SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseDetokenizeRequest(body, model.context));
  absl::StatusOr<std::string> text = model.context.tokenizer->Decode(ids, /*skip_special=*/false);
  if (!text.ok()) return WithParam(absl::InvalidArgumentError(text.status().message()), "tokens");
  return JsonReply(200, Dump(Json{{"prompt", *text}}));
}

}  // namespace

Router::Router(RouterOptions options, Metrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      workers_(std::make_unique<boost::asio::thread_pool>(std::max(1, options_.num_workers))) {}

Router::~Router() { StopWorkers(); }

void Router::StopWorkers() {
  workers_->stop();
  workers_->join();
}

void Router::SetModel(const ServedModel* model) { model_.store(model, std::memory_order_release); }

void Router::SetDraining() { draining_.store(true, std::memory_order_release); }

void Router::Handle(const HttpRequest& request, std::shared_ptr<Exchange> exchange) {
  const std::string path = request.target.substr(0, request.target.find('?'));
  const Route* route = FindRoute(path);
  if (route == nullptr) {
    exchange->Reply(ErrorReply(
        WithCode(absl::NotFoundError(absl::StrCat("no route ", request.method, " ", path)),
                 "unknown_route")));
    return;
  }
  if (request.method != route->method) {
    HttpReply reply = ErrorReply(WithHttpStatus(
        absl::InvalidArgumentError(absl::StrCat("method ", request.method, " is not allowed on ",
                                                path, "; use ", route->method)),
        405));
    reply.headers.emplace_back("Allow", route->method);
    exchange->Reply(std::move(reply));
    return;
  }
  if (path == "/health") return exchange->Reply(JsonReply(200, "{}"));
  if (path == "/ready") return exchange->Reply(Ready());
  if (path == "/metrics") return exchange->Reply(MetricsReply());
  if (absl::Status s = CheckHost(request); !s.ok()) return exchange->Reply(ErrorReply(s));
  if (absl::Status s = Authenticate(request); !s.ok()) return exchange->Reply(ErrorReply(s));
  if (request.method == "POST") {
    if (absl::Status s = CheckJsonBody(request); !s.ok()) return exchange->Reply(ErrorReply(s));
  }
  const ServedModel* model = model_.load(std::memory_order_acquire);
  if (draining_.load(std::memory_order_acquire)) {
    return exchange->Reply(ErrorReply(absl::UnavailableError("the server is shutting down")));
  }
  if (model == nullptr) {
    return exchange->Reply(ErrorReply(absl::UnavailableError("the model is still loading")));
  }
  HandleApi(path, request, *model, std::move(exchange));
}

absl::Status Router::Authenticate(const HttpRequest& request) const {
  if (options_.api_key.empty()) return absl::OkStatus();
  absl::Status s = CheckBearerCredential(request.authorization, options_.api_key);
  return s.ok() ? s : WithCode(std::move(s), "invalid_api_key");
}

// Allowed-hosts check against DNS rebinding: a page on another origin that resolves its
// name to this server still sends its own name as Host.
absl::Status Router::CheckHost(const HttpRequest& request) const {
  if (options_.allowed_hosts.empty()) return absl::OkStatus();
  const absl::string_view host = absl::StripAsciiWhitespace(request.host);
  for (const std::string& allowed : options_.allowed_hosts) {
    if (absl::EqualsIgnoreCase(host, allowed) || absl::EqualsIgnoreCase(HostName(host), allowed)) {
      return absl::OkStatus();
    }
  }
  return WithCode(absl::InvalidArgumentError(absl::StrCat(
                      "Host '", host, "' is not allowed on this server (--allowed-hosts)")),
                  "host_not_allowed");
}

// GET /v1/debug/policy: `auto` speculation's cost profile and where it came from.
HttpReply Router::PolicyReply(const ServedModel& model) {
  const std::string& profile = model.engine->cost_profile_json();
  Json j = {{"cost_profile_source", model.engine->cost_profile_source()},
            {"cost_profile", profile.empty() ? Json() : Json::parse(profile, nullptr, false)}};
  return JsonReply(200, Dump(j));
}

void Router::HandleApi(const std::string& path, const HttpRequest& request,
                       const ServedModel& model, std::shared_ptr<Exchange> exchange) {
  if (path == "/v1/debug/policy") return exchange->Reply(PolicyReply(model));
  if (request.method == "GET") {
    absl::StatusOr<HttpReply> reply = Models(path, model);
    return exchange->Reply(reply.ok() ? *std::move(reply) : ErrorReply(reply.status()));
  }
  // The client may leave while its body waits for a worker: then nothing is started.
  auto gone = std::make_shared<std::atomic<bool>>(false);
  exchange->OnDisconnect([gone] { gone->store(true); });
  boost::asio::post(*workers_, [this, path, body = request.body, &model, exchange, gone] {
    if (gone->load()) return;
    std::function<void()> answer;
    // Our code returns statuses; this only catches a throwing library (JSON, allocation),
    // so that one request fails with a 500 instead of the process.
    try {
      answer = Prepare(path, body, model, exchange);
    } catch (const std::exception& e) {
      SPECD_LOG_ERROR("POST {}: unexpected exception: {}", path, e.what());
      answer = [exchange] { exchange->Reply(ErrorReply(absl::InternalError("internal error"))); };
    }
    exchange->Post([gone, answer = std::move(answer)] {
      if (!gone->load()) answer();
    });
  });
}

std::function<void()> Router::Prepare(const std::string& path, const std::string& body,
                                      const ServedModel& model,
                                      const std::shared_ptr<Exchange>& exchange) const {
  absl::StatusOr<HttpReply> reply;
  if (absl::StatusOr<Json> json = ParseJsonObject(body); !json.ok()) {
    reply = json.status();
  } else if (path == "/v1/completions") {
    return PrepareGeneration(Endpoint::kCompletions, *json, model, exchange);
  } else if (path == "/v1/chat/completions") {
    return PrepareGeneration(Endpoint::kChat, *json, model, exchange);
  } else {
    reply = path == "/tokenize" ? Tokenize(*json, model) : Detokenize(*json, model);
  }
  HttpReply out = reply.ok() ? *std::move(reply) : ErrorReply(reply.status());
  return [exchange, out = std::move(out)] { exchange->Reply(out); };
}

std::function<void()> Router::PrepareGeneration(Endpoint endpoint, const Json& body,
                                                const ServedModel& model,
                                                const std::shared_ptr<Exchange>& exchange) const {
  absl::StatusOr<GenerationSpec> spec = endpoint == Endpoint::kChat
                                            ? ParseChatRequest(body, model.context)
                                            : ParseCompletionRequest(body, model.context);
  if (!spec.ok()) {
    return [exchange, reply = ErrorReply(spec.status())] { exchange->Reply(reply); };
  }
  ResponseMeta meta;
  meta.endpoint = endpoint;
  absl::StatusOr<std::string> id = NewRandomId(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  if (!id.ok()) {
    return [exchange, reply = ErrorReply(id.status())] { exchange->Reply(reply); };
  }
  meta.id = *std::move(id);
  meta.created = absl::ToUnixSeconds(absl::Now());
  meta.model = spec->model;
  meta.logprobs = spec->logprobs;
  meta.top_logprobs = spec->top_logprobs;
  meta.include_usage = spec->include_usage;
  meta.tokenizer = model.context.tokenizer;
  meta.tokens_as_ids = spec->tokens_as_ids;
  // std::function needs a copyable callable: the spec travels behind a shared_ptr.
  auto shared = std::make_shared<GenerationSpec>(*std::move(spec));
  return [engine = model.engine, shared, meta = std::move(meta), exchange,
          timeout = options_.request_timeout] {
    StartGeneration(engine, std::move(*shared), meta, exchange, timeout);
  };
}

HttpReply Router::Ready() const {
  if (draining_.load(std::memory_order_acquire)) {
    return ErrorReply(absl::UnavailableError("draining"));
  }
  if (model_.load(std::memory_order_acquire) == nullptr) {
    return ErrorReply(absl::UnavailableError("loading"));
  }
  return JsonReply(200, R"({"status":"ready"})");
}

HttpReply Router::MetricsReply() const {
  HttpReply reply;
  reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
  if (metrics_ == nullptr) return reply;
  if (const ServedModel* model = model_.load(std::memory_order_acquire)) {
    metrics_->UpdateGauges(model->engine->Stats());
  }
  reply.body = metrics_->Render();
  return reply;
}

}  // namespace specd::http
