// The HTTP API's routes: authentication (Bearer key, constant-time compare; /health,
// /ready and /metrics exempt), readiness and draining, and dispatch to the OpenAI
// endpoints (generation.h), /v1/models, /tokenize, /detokenize and /metrics.
// SetModel / SetDraining: any thread (the main thread). Handle: a session's strand.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/http/exchange.h"
#include "server/http/openai_api.h"

namespace specd {
class Engine;
class Metrics;
}  // namespace specd

namespace specd::http {

// The model being served; set once loading finished, then immutable.
struct ServedModel {
  Engine* engine = nullptr;
  ModelContext context;
  std::string root;  // model directory, shown in /v1/models
  int64_t created = 0;
};

struct RouterOptions {
  std::string api_key;  // empty: no authentication
  absl::Duration request_timeout = absl::InfiniteDuration();
};

// A parsed request, free of Beast types.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query
  std::string authorization;
  std::string body;
};

class Router {
 public:
  Router(RouterOptions options, Metrics* metrics);

  // Until called, /ready answers 503 and API routes 503 (loading). `model` must outlive
  // the router's use of it.
  void SetModel(const ServedModel* model);
  // /ready and every API route answer 503 from now on.
  void SetDraining();

  // Answers through `exchange`, now or later.
  void Handle(const HttpRequest& request, std::shared_ptr<Exchange> exchange);

 private:
  absl::Status Authenticate(const HttpRequest& request) const;
  void HandleApi(const std::string& path, const HttpRequest& request, const ServedModel& model,
                 std::shared_ptr<Exchange> exchange);
  void Generate(Endpoint endpoint, const HttpRequest& request, const ServedModel& model,
                std::shared_ptr<Exchange> exchange);
  HttpReply Ready() const;
  HttpReply MetricsReply() const;

  const RouterOptions options_;
  Metrics* const metrics_;  // may be null
  std::atomic<const ServedModel*> model_{nullptr};
  std::atomic<bool> draining_{false};
};

}  // namespace specd::http
