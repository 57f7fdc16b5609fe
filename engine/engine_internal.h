// Private to engine/: the state behind Engine's Shared / Inbox members (the hand-off between
// front-end threads and the engine thread, engine_serving.cc), and the tensor-parallel options
// helper (engine_tp.cc). The engine thread's own state is engine/step's StepPipeline. server/
// never includes this.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/runner/model_runner.h"

namespace specd {

struct TpGroupOptions;
// EngineOptions::tensor_parallel for CreateTpGroup (engine_tp.cc).
TpGroupOptions ToTpGroupOptions(const EngineOptions& options);

// An EAGLE-3 head in SSD's speculator (engine_ssd.cc; HeadDraftsInSsdSpeculator): the head's
// config.json read against `target` (its weights stay unread here), and `runner` set to keep the
// hidden states of the head's layers (RunnerOptions::capture_hidden_layers). InvalidArgument
// naming the file and field for a head that does not fit the target (its target_hidden_size,
// vocabulary or layer ids).
absl::Status CaptureForSsdHead(const SpeculativeConfig& spec, const ModelConfig& target,
                               RunnerOptions* runner);

// The only state shared with front-end threads: the inbox (new requests, aborts, pauses,
// control flags) and the stats snapshot the engine thread publishes after every step.
struct Engine::Shared {
  struct Pending {
    RequestId id;
    GenerateRequest request;
    ResolvedSpeculation speculation;  // Submit's Admit resolved it
    OutputCallback on_output;
    absl::Time arrival;
  };

  // std::mutex rather than absl::Mutex: the distribution's abseil is not built with
  // ThreadSanitizer annotations, and the engine's hand-off must stay checkable by TSAN.
  mutable std::mutex mu;
  std::condition_variable work_cv;  // engine thread: inbox, aborts or stop
  std::condition_variable idle_cv;  // WaitIdle: stats published with nothing left
  std::vector<Pending> inbox ABSL_GUARDED_BY(mu);
  std::vector<RequestId> aborts ABSL_GUARDED_BY(mu);
  std::vector<std::pair<RequestId, bool>> pauses ABSL_GUARDED_BY(mu);  // in call order
  RequestId next_id ABSL_GUARDED_BY(mu) = 1;
  bool started ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool draining ABSL_GUARDED_BY(mu) = false;
  // Published by the engine thread; num_waiting also counts requests it took from the
  // inbox but has not published since (so Submit's bound is never loose).
  EngineStats stats ABSL_GUARDED_BY(mu);

  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return !inbox.empty() || !aborts.empty() || !pauses.empty() || stopping;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return inbox.empty() && stats.num_running == 0 && stats.num_waiting == 0;
  }

  std::mutex join_mu;                           // serializes Start / Stop
  std::thread thread ABSL_GUARDED_BY(join_mu);  // started by Start, joined by Stop
};

// What the engine thread takes from Shared in one go, then applies without the lock.
struct Engine::Inbox {
  std::vector<Shared::Pending> incoming;
  std::vector<std::pair<RequestId, bool>> pauses;  // in call order
  std::vector<RequestId> aborts;
  bool stopping = false;
};

}  // namespace specd
