// The HTTP front end: binds host:port (0: a free port), runs a few I/O threads over one
// asio io_context (connections are strands, never threads), optionally terminates TLS,
// and serves every connection with http_session.h against a Router.
// Start / port / Shutdown: the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace specd {
class Metrics;
}  // namespace specd

namespace specd::http {

class Router;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int32_t port = 8000;
  std::string tls_cert_file;  // both set: HTTPS (PEM)
  std::string tls_key_file;
  int64_t max_body_bytes = int64_t{8} << 20;
  int32_t num_io_threads = 2;
  // Per connection: bytes queued for a client past which its stream is paused, and how long
  // a pending write may make no progress before the connection is closed (its requests
  // aborted). See http_session.h.
  int64_t max_queued_bytes = int64_t{4} << 20;
  absl::Duration write_timeout = absl::Seconds(60);
};

class HttpServer {
 public:
  // Binds and starts serving; InvalidArgument for bad TLS files, Unavailable when the
  // address cannot be bound. router and metrics must outlive the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           Router* router, Metrics* metrics);
  virtual ~HttpServer() = default;
  virtual int32_t port() const = 0;
  // Stops accepting, lets exchanges in progress finish writing for up to `grace`, then
  // closes every connection and joins the I/O threads. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;
};

}  // namespace specd::http
