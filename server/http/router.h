// The HTTP API's routes: the optional allowed-hosts check, authentication (Bearer key,
// constant-time compare; /health, /ready and /metrics exempt from both), JSON Content-Type
// on POST routes (415 otherwise), readiness and draining, and dispatch to the OpenAI
// endpoints (generation.h), /v1/models, /tokenize, /detokenize and /metrics.
// The POST routes' body parsing, validation, chat templating and tokenization run on a
// small worker pool, never on the I/O threads, so that /health, /ready and /metrics
// answer while they are busy; the reply or the generation's start is posted back to the
// session's strand. SetModel / SetDraining / StopWorkers: any thread (the main thread).
// Handle: a session's strand.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/http/exchange.h"
#include "server/http/openai_api.h"

namespace boost::asio {
class thread_pool;
}  // namespace boost::asio

namespace specd {
class Engine;
class Metrics;
}  // namespace specd

namespace specd::http {

// The model being served; set once loading finished, then immutable.
struct ServedModel {
  Engine* engine = nullptr;
  ModelContext context;
  std::string root;  // model directory (never shown: /v1/models' root is the served name)
  int64_t created = 0;
};

struct RouterOptions {
  std::string api_key;  // empty: no authentication
  absl::Duration request_timeout = absl::InfiniteDuration();
  // Host header names (lower case; "name" matches any port, "name:port" only that one)
  // accepted on API routes; empty: any.
  std::vector<std::string> allowed_hosts;
  int32_t num_workers = 2;  // threads parsing and tokenizing POST bodies
};

// A parsed request, free of Beast types.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query
  std::string authorization;
  std::string host;              // the Host header
  std::string content_type;      // the Content-Type header
  std::string content_encoding;  // the Content-Encoding header
  std::string body;
};

class Router {
 public:
  Router(RouterOptions options, Metrics* metrics);
  ~Router();

  // Until called, /ready answers 503 and API routes 503 (loading). `model` must outlive
  // the router's use of it.
  void SetModel(const ServedModel* model);
  // /ready and every API route answer 503 from now on.
  void SetDraining();

  // Answers through `exchange`, now or later.
  void Handle(const HttpRequest& request, std::shared_ptr<Exchange> exchange);

  // Drops the work not started and waits for the running: call before the engine, the
  // tokenizer or the served model go away. Idempotent.
  void StopWorkers();

 private:
  absl::Status Authenticate(const HttpRequest& request) const;
  absl::Status CheckHost(const HttpRequest& request) const;
  static HttpReply PolicyReply(const ServedModel& model);
  void HandleApi(const std::string& path, const HttpRequest& request, const ServedModel& model,
                 std::shared_ptr<Exchange> exchange);
  // Runs on a worker: what the strand must do to answer the POST body for `path`.
  std::function<void()> Prepare(const std::string& path, const std::string& body,
                                const ServedModel& model,
                                const std::shared_ptr<Exchange>& exchange) const;
  std::function<void()> PrepareGeneration(Endpoint endpoint, const Json& body,
                                          const ServedModel& model,
                                          const std::shared_ptr<Exchange>& exchange) const;
  HttpReply Ready() const;
  HttpReply MetricsReply() const;

  const RouterOptions options_;
  Metrics* const metrics_;  // may be null
  std::atomic<const ServedModel*> model_{nullptr};
  std::atomic<bool> draining_{false};
  std::unique_ptr<boost::asio::thread_pool> workers_;
};

}  // namespace specd::http
