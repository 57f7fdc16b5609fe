// Private to engine/: the state behind Engine's pimpl members, shared by engine.cc (model,
// steps, sampling, offline calls) and engine_serving.cc (the engine thread and the
// thread-safe serving API). server/ never includes this.
#pragma once

#include <array>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/kv/block_manager.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/acceptance.h"
#include "engine/sample/sampler.h"
#include "engine/sched/scheduler.h"
#include "engine/speculation/speculator.h"
#include "engine/stop_checker.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/verification/verifier.h"

namespace specd {

// The speculator slot (Core::method_seconds, Request::by_method) of a method; -1 for none.
int SpeculatorSlot(SpeculationMethod m);

struct TpGroupOptions;
// EngineOptions::tensor_parallel for CreateTpGroup (engine_tp.cc).
TpGroupOptions ToTpGroupOptions(const EngineOptions& options);

// One request while it is live: its scheduler Sequence plus what turns logits into
// streamed text. Owned by Core::live; engine thread (or the offline caller) only.
struct Engine::Request {
  Request(RequestId id, GenerateRequest req, ResolvedSpeculation spec, int32_t block_size,
          const Tokenizer* tok);

  RequestId id;
  GenerateRequest request;
  Sequence seq;
  uint64_t seed;  // the request's, or drawn at arrival: CPU sampler RNG and GPU Philox key
  Sampler sampler;
  ResolvedSpeculation spec;          // what this request speculates with (Admit resolved it)
  std::optional<Acceptor> acceptor;  // when spec.enabled(): verification, its own seeded RNG
  int64_t num_drafts = 0;            // speculation stats (RequestUsage)
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  int64_t num_cache_hit_drafts = 0;  // SSD: rounds drafted from the speculation cache
  int64_t num_cache_hit_draft_tokens = 0;
  int64_t num_cache_hit_accepted_tokens = 0;
  // This step's speculation (Prepare): `spec`, or for auto `spec` with the policy's method and
  // K (method kNone: plain). What Speculate, BuildBatch and Apply read.
  ResolvedSpeculation step;
  bool used_policy = false;    // auto: the policy has state for it (Forget when it ends)
  int32_t policy_method = -1;  // the policy's last strategy for it (PolicyMethod, K)
  int32_t policy_k = 0;
  uint32_t used_speculators = 0;  // bit m: speculator slot m was asked to draft for it
  // Rounds, draft and accepted tokens per speculator slot (kSpeculatorMethods' order).
  std::array<RequestUsage::MethodUsage, kNumSpeculatorSlots> by_method{};
  TokenHistory history;
  std::optional<IncrementalDetokenizer> detok;
  StopChecker stop;
  OutputCallback on_output;            // serving
  GenerateResult* sink = nullptr;      // offline: where the result goes when finished
  size_t index = 0;                    // offline: index in the batch, for on_token
  std::vector<GeneratedToken> tokens;  // generated so far (offline result)
  absl::Time arrival;
  std::optional<absl::Time> first_scheduled;
  std::optional<absl::Time> first_token;
  absl::Time last_token;

  // Sends an update: to on_output (serving) or on_token and the result (offline).
  void Emit(const TokenCallback* on_token, std::vector<GeneratedToken> new_tokens, std::string text,
            bool finished, FinishReason reason, absl::Status status);
  RequestUsage Usage() const;
};

// Everything the engine thread (or the offline caller) owns; never touched by others.
struct Engine::Core {
  Core(int32_t num_blocks, int32_t block_size, const EngineOptions& options)
      : blocks(num_blocks, block_size, options.enable_prefix_caching),
        scheduler({options.max_num_seqs, options.max_num_batched_tokens}, &blocks) {}

  BlockManager blocks;
  Scheduler scheduler;
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> live;
  const TokenCallback* on_token = nullptr;  // offline GenerateBatch's callback
  bool serving = false;                     // inside ServeLoop
  RequestId next_offline_id = 1;
  std::vector<SequenceInput> batch;          // [num_chunks] scratch
  std::vector<SampleRow> rows;               // [num_rows] scratch: chunks drawing a token
  std::vector<Request*> row_requests;        // [num_rows] scratch
  std::vector<std::vector<int32_t>> banned;  // [num_rows] scratch (min_tokens)
  std::vector<SampleResult> sampled;         // [num_rows] scratch
  // The step's stages, per sample row: the draft (empty: plain decode), the chunk's tokens of a
  // drafted decode (the sequence's last token, then the drafts), the request's acceptor (host
  // verification), and what verification gave.
  std::vector<Draft> drafts;                      // [num_rows]
  std::vector<std::vector<int32_t>> spec_tokens;  // [num_rows]
  // Tree rows' chunks: the tree's parents over the chunk (the root, then the drafts) and the
  // chunk's TokenTree (SequenceInput::tree points at it).
  std::vector<std::vector<int32_t>> spec_parents;  // [num_rows]
  std::vector<TokenTree> spec_trees;               // [num_rows]
  std::vector<KvSlotMove> kv_moves;                // scratch: trees' accepted paths
  std::vector<Acceptor*> acceptors;                // [num_rows]
  std::vector<RowOutcome> outcomes;                // [num_rows]
  std::vector<int32_t> chunk_row;                  // [num_chunks] its drafted row, or -1
  std::vector<DraftInput> draft_inputs;            // [num_inputs] one speculator's batch
  std::vector<int32_t> draft_rows;                 // [num_inputs] their sample rows
  std::vector<Draft> proposed;                     // [num_inputs]
  std::vector<VerifiedRound> rounds;               // one speculator's outcomes
  double verify_seconds = 0;                       // this step's verification pass
  double draft_seconds = 0;                        // this step's Propose time
  SsvLoadStats ssv_reported;  // the runner's SSV totals as the last step's metrics had them
  // Draft model, n-gram, SSD, vegas, streaming.
  SpeculationStepMetrics::MethodSeconds method_seconds[kNumSpeculatorSlots];
  // Vegas rows' verification chunks: the attention options asking for scores and their buffers
  // ([num_layers, 2, scored_len]); scored_len -1 when the row collects none.
  std::vector<ChunkAttention> row_attention;   // [num_rows]
  std::vector<std::vector<float>> row_scores;  // [num_rows]
  std::vector<int32_t> scored_len;             // [num_rows]
  absl::Time step_start;                       // when RunStep began
  int32_t num_spec_rows = 0;                   // rows with drafts this step
  // The policy's step (ChooseStrategies): whether it decided, its estimate, and per row its
  // method (-1: not a decode it described).
  bool policy_decided = false;
  bool policy_switched = false;
  bool policy_searched = false;
  bool policy_decode_only = false;   // no prefill chunk in the step (the profile models it all)
  double policy_seconds = 0;         // ChooseStrategies' time this step
  std::vector<uint64_t> policy_ids;  // the requests of the last decision, in its order
  double policy_tokens_per_second = 0;
  std::vector<int32_t> row_policy_method;  // [num_rows] PolicyMethod, or -1
  // [num_chunks] FeedEagle3: whether the chunk's sequence drafts with the EAGLE-3 head.
  std::vector<uint8_t> eagle3_wanted;
};

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
