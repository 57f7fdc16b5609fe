// The specd.v1.Specd service on gRPC's callback API: unary Abort / Tokenize / Detokenize /
// GetModelInfo / GetServerInfo answer inline; Generate is a GenerateCall (generate_call.h:
// a write reactor with capped output, pausing for slow clients). Abort reaches only the
// caller's own calls (call_registry.h). grpcpp stays out of this header.
// Any thread (gRPC's callback threads call the handlers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/grpc/generate_conversion.h"

namespace grpc {
class Service;
}  // namespace grpc

namespace specd {

class Engine;

// Counts the service's calls from handler entry to the end of the RPC, so that a shutdown
// waits for exactly those (gRPC's own Shutdown also waits for idle client connections to
// close, which some clients never do unprompted). Any thread.
class CallTracker {
 public:
  // False once closed: the caller answers UNAVAILABLE instead of starting the call.
  bool Begin();
  void End();
  // Refuses new calls from now on.
  void Close();
  // True when no call is running, waiting at most until `deadline`.
  bool WaitIdle(absl::Time deadline);

 private:
  absl::Mutex mu_;
  int64_t num_calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// Per-stream output limits of Generate (see generate_call.h).
struct StreamLimits {
  size_t max_queued_bytes = size_t{4} << 20;         // over this a call pauses its engine requests
  absl::Duration write_timeout = absl::Seconds(60);  // paused this long without a write: abort
};

struct SpecdServiceConfig {
  Engine* engine = nullptr;      // outlives the service
  CallTracker* calls = nullptr;  // outlives the service
  ServedModel model;
  std::string api_key;  // non-empty: calls need "authorization: Bearer KEY"
  std::string version;
  absl::Time start_time = absl::Now();
  StreamLimits stream_limits;
};

// The service to register on a grpc::ServerBuilder; it must outlive the server.
std::unique_ptr<grpc::Service> NewSpecdService(SpecdServiceConfig config);

}  // namespace specd
