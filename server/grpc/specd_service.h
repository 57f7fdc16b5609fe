// The specd.v1.Specd service on gRPC's callback API: unary Abort / Tokenize / Detokenize /
// GetModelInfo / GetServerInfo answer inline; Generate is a write reactor fed by the
// engine's OutputCallback (which only queues and never blocks the engine thread) with one
// write in flight at a time, updates merged while a write is outstanding. Client cancel,
// gRPC deadlines and Abort stop the engine work. grpcpp stays out of this header.
// Any thread (gRPC's callback threads call the handlers).
#pragma once

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

struct SpecdServiceConfig {
  Engine* engine = nullptr;      // outlives the service
  CallTracker* calls = nullptr;  // outlives the service
  ServedModel model;
  std::string api_key;  // non-empty: calls need "authorization: Bearer KEY"
  std::string version;
  absl::Time start_time = absl::Now();
};

// The service to register on a grpc::ServerBuilder; it must outlive the server.
std::unique_ptr<grpc::Service> NewSpecdService(SpecdServiceConfig config);

}  // namespace specd
