// One Generate call of the gRPC front end: a server-streaming write reactor over one engine
// request per choice. The engine's OutputCallback only queues (it never blocks the engine
// thread); one write is in flight at a time and updates are merged while it is outstanding.
// Backpressure: the bytes queued for a stream are capped; over the cap the call pauses its
// engine requests (they keep their KV cache but are not scheduled) and resumes them once a
// quarter is left; paused with no completed write for the write timeout, it is aborted (its
// KV freed) and cancelled (CheckStalled). Client cancel, deadlines and the Abort RPC stop the
// engine work. Reactions, engine updates, Abort and CheckStalled may run on any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "proto/specd.pb.h"
#include "server/grpc/call_registry.h"
#include "server/grpc/specd_service.h"

namespace specd {

class Tokenizer;

// absl and gRPC share the canonical codes.
grpc::Status ToGrpcStatus(const absl::Status& status);
grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message);

// Owned by shared_ptrs: its own (dropped in OnDone) and one in each engine OutputCallback,
// so an engine update arriving after the RPC ended finds it alive (and ignores it). All state
// is under mu_; StartWrite / Finish / Engine calls are made after mu_ is released (gRPC may
// run a reaction inline, and the engine's calls take its locks).
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  struct Params {
    Engine* engine = nullptr;
    const Tokenizer* tokenizer = nullptr;
    CallRegistry<GenerateCall>* registry = nullptr;
    CallTracker* calls = nullptr;
    grpc::CallbackServerContext* context = nullptr;  // the call's; valid until OnDone
    std::string caller;                              // the registry's key with request_id
    std::string request_id;
    size_t num_choices = 1;
    bool with_logprobs = false;
    StreamLimits limits;
  };
  explicit GenerateCall(Params params);

  // Submits one engine request per choice; `self` keeps the call alive until OnDone.
  static GenerateCall* Launch(std::shared_ptr<GenerateCall> self,
                              std::vector<GenerateRequest> requests);
  const std::string& caller() const { return caller_; }
  // The Abort RPC: the engine ends the choices, and the call ends CANCELLED.
  void AbortByRequest();
  // Aborts and cancels the call when it has been paused for its client with no completed
  // write for the write timeout (the service's stall check calls it about once a second).
  void CheckStalled(absl::Time now);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Choice {
    std::optional<RequestId> engine_id;  // once submitted
    bool done = false;
  };
  struct Pending {
    v1::GenerateResponse message;
    size_t bytes = 0;  // its estimated wire size
  };
  // What to do once mu_ is released.
  struct Action {
    enum { kNothing, kWrite, kFinish } kind = kNothing;
    v1::GenerateResponse message;  // kWrite
    grpc::Status status;           // kFinish
    std::vector<RequestId> to_abort;
    bool pause_changed = false;  // tell the engine the current paused_
  };

  void OnOutput(size_t index, RequestOutput&& output);  // engine thread
  void Queue(size_t index, const RequestOutput& output) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pauses over the byte cap, resumes at a quarter of it.
  void UpdatePauseLocked(Action* action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the call with `status` (the first stop wins) and collects the engine work to end.
  void StopLocked(grpc::Status status, Action* action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlanLocked(Action* action) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<RequestId> OpenRequestsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Action action);
  // Applies the latest paused_ to the open engine requests.
  void ApplyPause();

  Engine* const engine_;
  const Tokenizer* const tokenizer_;
  CallRegistry<GenerateCall>* const registry_;
  CallTracker* const calls_;
  const std::string caller_;
  const std::string request_id_;
  const bool with_logprobs_;
  const StreamLimits limits_;
  std::shared_ptr<GenerateCall> self_;  // set by Launch, dropped by OnDone

  // Serializes ApplyPause so the engine ends in the state paused_ ended in.
  absl::Mutex pause_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Alive until OnDone, which cannot come before Finish: CheckStalled holds Finish back
  // (holding_finish_) while it calls TryCancel.
  grpc::CallbackServerContext* const context_;

  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  size_t num_open_ ABSL_GUARDED_BY(mu_);
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer in_flight_;                       // touched only by the write in flight
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;     // pending_ and the write in flight
  size_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // of the write in flight
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);     // paused or last write completed
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;         // CheckStalled gave up on the client
  bool holding_finish_ ABSL_GUARDED_BY(mu_) = false;  // CheckStalled is in TryCancel
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_by_request_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;  // client gone: drop what is pending
  std::optional<grpc::Status> stop_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace specd
