// The gRPC front end: the specd.v1 service (streaming Generate, Abort, Tokenize,
// Detokenize, GetModelInfo, GetServerInfo), the standard grpc.health.v1 service and server
// reflection, on its own port, over the same Engine as the HTTP front end.
// This header keeps grpcpp out of its includers (a file including grpcpp compiles slowly);
// the implementation hides behind it. Start/SetServing/Shutdown: the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace specd {

class Engine;

struct GrpcFrontEndOptions {
  std::string host = "0.0.0.0";
  int32_t port = 50051;       // 0: pick a free port (see GrpcFrontEnd::port)
  std::string api_key;        // non-empty: every call but health needs "authorization:
                              // Bearer KEY" metadata (constant-time compare)
  std::string tls_cert_file;  // both set: TLS (PEM files)
  std::string tls_key_file;
  std::string served_model_name;
  std::string version;  // reported by GetServerInfo
  // The model directory, for GetModelInfo's architecture and vocab_size (its config.json);
  // empty: architecture unknown, vocab_size the tokenizer's.
  std::string model_dir;
  // Backpressure: a Generate stream with more than this many bytes waiting for its client
  // pauses its engine requests (they keep their KV cache) until a quarter is left;
  // paused this long without completing a write, it is aborted and cancelled.
  int64_t max_queued_bytes_per_stream = int64_t{4} << 20;
  absl::Duration write_timeout = absl::Seconds(60);
};

class GrpcFrontEnd {
 public:
  // Binds and starts serving. The engine must outlive the front end.
  static absl::StatusOr<std::unique_ptr<GrpcFrontEnd>> Start(Engine* engine,
                                                             const GrpcFrontEndOptions& options);
  virtual ~GrpcFrontEnd() = default;
  // The bound port.
  virtual int32_t port() const = 0;
  // grpc.health.v1 status of "" and "specd.v1.Specd": SERVING or NOT_SERVING (draining).
  virtual void SetServing(bool serving) = 0;
  // Stops accepting calls; in-flight calls may finish until the deadline, then are cancelled.
  virtual void Shutdown(absl::Time deadline) = 0;
};

}  // namespace specd
