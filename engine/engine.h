// The engine facade: loads a model directory (weights, tokenizer, chat template) and
// generates tokens on a ModelRunner (the CPU backend, or one GPU). This is the only engine header
// server/ includes (plus the Tokenizer / ChatTemplate types it hands out and base/ status and
// logging).
//
// Two ways to drive it:
// - Serving (thread-safe): Start() launches the engine thread, which owns the continuous-
//   batching scheduler, the KV block manager and every sequence. Front-end threads call
//   Submit / Abort / SetPaused / BeginDrain / WaitIdle / Stop / Stats; they never touch
//   engine state.
//   Submit hands the request over through one MPSC queue; the request's OutputCallback is
//   called on the engine thread with each update, and exactly once with finished = true.
// - Offline (single caller, engine thread not started): Generate / GenerateBatch run the
//   same scheduler inline on the caller's thread until the given requests finish (CLI,
//   goldens). Do not mix the two on one Engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/base/device_options.h"
#include "engine/parallel/tp_options.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/batch_options.h"
#include "engine/speculation/spec_config.h"
#include "engine/speculation/spec_options.h"
#include "engine/speculation/ssd/ssd_stats.h"

namespace specd {

class ModelRunner;
class StrategyPolicy;
class Tokenizer;
struct RunnerOptions;
struct ModelConfig;
class EngineObserver;
class Speculator;
class Eagle3Speculator;
class DraftReplay;
class Verifier;
struct StepPlan;
struct ScheduledChunk;
enum class PolicyMethod : int8_t;  // engine/policy/cost_profile.h

// The engine's options, composed of the leaf option structs (each field declared once, each
// leaf's flags registered by one function in server/flags.h): DeviceOptions (device, weights,
// threads, KV pool; engine/base/device_options.h), SchedulerOptions (continuous batching;
// engine/sched/batch_options.h), SpeculativeOptions (`--speculative-config`, `--cost-profile`;
// engine/speculation/spec_options.h) and TensorParallelOptions (engine/parallel/tp_options.h).
struct EngineOptions : DeviceOptions, SchedulerOptions, SpeculativeOptions {
  // The library's device stays "cpu" so that embedders and tests get the exact fp32 backend
  // unless they ask; the CLI (specd serve / generate) defaults to "auto".
  EngineOptions() { device = "cpu"; }

  std::string model_dir;
  TensorParallelOptions tensor_parallel;
  std::shared_ptr<EngineObserver> observer;  // metrics sink; may be null
};

struct GenerateRequest {
  std::vector<int32_t> prompt_ids;  // [num_prompt_tokens], BOS included if wanted
  SamplingParams params;
  SpeculationParams speculation;  // method and K for this request (default: the server's)
  // Serving only: past it the request ends with DeadlineExceeded wherever it is.
  absl::Time deadline = absl::InfiniteFuture();
  std::string request_id;  // the front end's id, for logs (optional)
};

// kAbort: cancelled by Abort(), a deadline, Stop(), or an engine error (see the status).
enum class FinishReason { kStop, kLength, kAbort };
const char* FinishReasonName(FinishReason r);

struct GeneratedToken {
  int32_t id = 0;
  float logprob = 0.0f;           // when params.logprobs >= 0
  std::vector<TokenLogprob> top;  // [params.logprobs]
};

// Token counts of a request, as OpenAI's `usage` reports them.
struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  // Speculative decoding: verification rounds that carried drafts, draft tokens proposed,
  // and drafts the target accepted (every committed token is the target's either way).
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  // SSD: rounds whose drafts came from the speculation cache, and their draft / accepted
  // tokens (the rest came from a fallback).
  int64_t num_cache_hit_drafts = 0;
  int64_t num_cache_hit_draft_tokens = 0;
  int64_t num_cache_hit_accepted_tokens = 0;
  bool ssd = false;  // the request's speculation resolved to method ssd
  // The same three counts per method that drafted (`auto` may use several), in the order
  // draft_model, ngram, ssd, vegas, streaming, eagle3; methods without rounds are left out.
  struct MethodUsage {
    const char* method = "";  // SpeculationMethodName
    int64_t num_drafts = 0;
    int64_t num_draft_tokens = 0;
    int64_t num_accepted_tokens = 0;
  };
  std::vector<MethodUsage> by_method = {};
  // Tokens committed per verification round: 1 + accepted / drafts (vLLM's "mean acceptance
  // length"); 0 without rounds.
  double mean_accepted_length() const {
    return num_drafts > 0 ? 1.0 + static_cast<double>(num_accepted_tokens) / num_drafts : 0.0;
  }
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<GeneratedToken> tokens;  // generated, EOS included when it ended the request
  std::string text;                    // detokenized output, stop string removed
  FinishReason finish_reason = FinishReason::kLength;
  RequestUsage usage;  // token counts and speculation stats

  std::vector<int32_t> ids() const;
};

// Called for each generated token with the request's index in the batch and the text that
// became safe to stream (may be empty).
using TokenCallback = std::function<void(size_t index, const GeneratedToken&, std::string_view)>;

using RequestId = uint64_t;

// One update of a serving request. tokens/text are what is new since the previous update.
struct RequestOutput {
  RequestId id = 0;
  std::vector<GeneratedToken> tokens;
  std::string text;       // text that became safe to stream (stop strings held back, cut)
  bool finished = false;  // last update of this request
  FinishReason finish_reason = FinishReason::kLength;  // when finished
  // When finished: OK, or why the request failed: Cancelled (Abort), DeadlineExceeded,
  // Unavailable (Stop() before it finished), Internal (engine error). Tokens already
  // streamed stay valid.
  absl::Status status;
  RequestUsage usage;  // running totals; final when finished
};

// Called on the engine thread; must be quick and must not block or call back into the
// engine except Abort (e.g. post to an I/O loop, or push into a queue and notify).
using OutputCallback = std::function<void(RequestOutput&&)>;

// What /metrics and /ready need; a consistent snapshot, any thread.
struct EngineStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_paused = 0;  // of the running and waiting ones: paused by SetPaused
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_total = 0;
  bool draining = false;
  bool running = false;  // engine thread started and not stopped
  // The tensor-parallel group lost a rank (for good): every request ended with `failure`, new
  // ones are refused, and the server should report not ready and exit non-zero.
  bool failed = false;
  std::string failure;
  // SSD's counters as the engine thread last published them (at start and after every
  // step), for metrics scraped while idle; none without SSD.
  std::optional<SsdStats> ssd;
};

// Outcome of a finished request, for metrics.
enum class RequestOutcome { kStop, kLength, kAbort, kDeadline, kError };
const char* RequestOutcomeName(RequestOutcome o);

struct FinishedRequestMetrics {
  RequestOutcome outcome = RequestOutcome::kStop;
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  double queue_seconds = 0;  // arrival -> first scheduled
  double ttft_seconds = -1;  // arrival -> first token; < 0 when none was produced
  double e2e_seconds = 0;    // arrival -> finished
};

// One engine step's speculation, for metrics.
struct SpeculationStepMetrics {
  std::vector<int32_t> num_draft_tokens;  // [num_rounds] drafts each verified sequence carried
  std::vector<int32_t> num_accepted;      // [num_rounds] how many of them the target accepted
  double draft_seconds = 0;               // the speculators' Propose calls
  double verify_seconds = 0;              // the target's verification pass and acceptance
  std::vector<uint8_t> from_cache;        // [num_rounds] 1: SSD drafts from the cache
  std::vector<const char*> methods;       // [num_rounds] SpeculationMethodName of each round
  std::vector<uint8_t> trees;             // [num_rounds] 1: a token tree (its drafts: nodes)
  // [num_sparse_rounds] vegas / streaming rounds: prefix tokens each draft step attended per
  // layer (the selection plus the tokens committed since it was scored); dense rounds not listed.
  std::vector<int32_t> sparse_kept_tokens;
  // NSA targets (SSV, engine/model/ssv.h): what this step's verification chunks read, and the
  // strategy of each verified row ([num_rounds], SsvStrategyName); empty for dense targets.
  SsvLoadStats ssv;
  std::vector<std::string> ssv_strategies;
  const SsdStats* ssd = nullptr;  // SSD's cumulative counters (null without SSD)
  // Per method whose speculator drafted this step: its Propose time, and its share of the
  // verification pass and of the rest of the step (scheduling, batch building, commit), split
  // by the positions its rows verified (drafts + 1 per drafted row).
  struct MethodSeconds {
    const char* method = "";  // SpeculationMethodName
    double draft = 0, verify = 0, other = 0;
  };
  std::vector<MethodSeconds> by_method;
};

// One engine step's `auto` decision (StrategyPolicy), for metrics: after every step in which
// some running decode had method auto.
struct PolicyStepMetrics {
  struct MethodRows {
    const char* method = "";  // SpeculationMethodName; "none" for plain rows
    int32_t num_rows = 0;     // decodes the policy gave this method this step (auto and pinned)
  };
  std::vector<MethodRows> rows = {};  // methods with rows only
  // The cost model's tokens per second for the step's decodes (the profile's units: nominal
  // for the default profile), and the step's committed tokens over its wall time.
  double estimated_tokens_per_second = 0;
  double realized_tokens_per_second = 0;
  bool switched = false;    // hysteresis let a new assignment replace the held one
  bool searched = false;    // the policy searched this step (else it held: PolicyOptions)
  double host_seconds = 0;  // the engine thread's time choosing this step's strategies
};

// Metrics sink the engine calls on its own thread (implementations must be thread-safe
// against their readers and quick). server/ implements it with prometheus-cpp. Every callback
// does nothing by default, so an observer overrides only the ones it needs.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnRequestFinished(const FinishedRequestMetrics& /*m*/) {}
  // Gap between consecutive tokens of one request (one call per token after the first).
  virtual void OnInterTokenLatency(double /*seconds*/) {}
  // After every engine step.
  virtual void OnStep(const EngineStats& /*stats*/) {}
  // Counters: prefix-cache lookups and hits (in blocks), sequences preempted.
  virtual void OnPrefixCache(int64_t /*queried_blocks*/, int64_t /*hit_blocks*/) {}
  virtual void OnPreemption(int32_t /*num_sequences*/) {}
  // After a step that verified drafts.
  virtual void OnSpeculation(const SpeculationStepMetrics& /*m*/) {}
  // After a step in which the strategy policy decided (some decode had method auto).
  virtual void OnPolicy(const PolicyStepMetrics& /*m*/) {}
};

// Speculators the step pipeline drives, by method: draft model, n-gram, SSD, vegas, streaming,
// eagle3.
inline constexpr int kNumSpeculatorSlots = 6;

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  // Null when the model directory has no tokenizer.json (token ids only).
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const ModelConfig& model_config() const;
  // What runs the model: "cpu (N threads)", "cuda:0 NVIDIA H100 80GB HBM3", ...
  std::string device_name() const;
  int32_t max_model_len() const { return max_model_len_; }
  // EOS ids of the model: generation_config.json's merged with the tokenizer's.
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // BOS id from config.json / generation_config.json, for prompts given as nothing.
  std::optional<int32_t> model_bos_id() const;
  const SpeculativeConfig& speculative_config() const { return options_.speculative; }
  bool has_draft_model() const { return draft_ != nullptr; }
  bool has_ssd() const { return ssd_ != nullptr; }
  bool has_eagle3() const { return eagle3_ != nullptr; }
  // Methods vegas and streaming run here (the CPU or CUDA backend, on one rank).
  bool has_sparse_drafting() const { return vegas_ != nullptr; }
  // The target is an NSA model: requests may set speculation.ssv.
  bool target_is_nsa() const;
  // `auto` speculation's cost profile as JSON (CostProfile::ToJson), and where it came from
  // ("file PATH" or "default: ..."). Fixed at Create; any thread.
  const std::string& cost_profile_json() const { return cost_profile_json_; }
  const std::string& cost_profile_source() const { return cost_profile_source_; }
  // The SSD speculator process the engine launched, or -1 (none running, or not launched by
  // us). Any thread (fault tests signal it).
  int32_t ssd_speculator_pid() const;

  // Checks a request before any work is done: InvalidArgument for bad params, prompts or
  // speculation (naming the field: FieldOf, engine/base/status.h).
  absl::Status Validate(const GenerateRequest& request) const;

  absl::StatusOr<std::vector<GenerateResult>> GenerateBatch(
      std::span<const GenerateRequest> requests, const TokenCallback& on_token = {});
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& request,
                                          const TokenCallback& on_token = {});

  // Offline calls return FailedPrecondition once Start() was called; KV exhaustion is
  // handled by preemption (recompute), never an error.

  // ---- Serving API: thread-safe once Start() returned OK. ----
  // Launches the engine thread. FailedPrecondition when called twice.
  absl::Status Start();
  // Validates and queues a request. InvalidArgument: bad request (HTTP 400);
  // ResourceExhausted: waiting queue full (429); Unavailable: draining, stopped or never
  // started (503).
  // On OK, on_output is called as documented at OutputCallback.
  absl::StatusOr<RequestId> Submit(GenerateRequest request, OutputCallback on_output);
  // Cancels the request wherever it is (queued, prefilling, decoding); its KV is freed by
  // the next step and it finishes with kAbort / Cancelled. Unknown or finished ids: no-op.
  void Abort(RequestId id);
  // Stops scheduling the request (it keeps its KV and place) until SetPaused(id, false);
  // for front ends whose client stopped reading. Any thread. Unknown/finished ids: no-op.
  // A paused request still counts as running or waiting (WaitIdle and a drain wait for it;
  // its deadline, Abort and Stop still end it). It is the first to be preempted (KV freed,
  // recomputed after it resumes) when KV runs out or a waiting request needs its slot, so it
  // never holds the batch. Resumed, it continues exactly where it was.
  void SetPaused(RequestId id, bool paused);
  // Admits nothing more (Submit -> Unavailable); queued and running requests go on.
  void BeginDrain();
  // Blocks until no request is queued or running, or the timeout passes; true if idle.
  bool WaitIdle(absl::Duration timeout);
  // Finishes every remaining request with kAbort / Unavailable and joins the engine thread.
  // Idempotent; also done by the destructor. Must not be called from an OutputCallback.
  void Stop();
  EngineStats Stats() const;

 private:
  struct Request;  // one request's sampling / streaming state and its Sequence
  struct Core;     // engine-thread state: block manager, scheduler, live requests
  struct Shared;   // the inbox and the stats snapshot: all front-end threads touch
  struct Inbox;    // what the engine thread takes from Shared's inbox at once

  Engine();
  absl::Status CreateSpeculators(const RunnerOptions& target);
  absl::Status CreateSsd(const RunnerOptions& target);  // engine_ssd.cc
  // Method eagle3: loads the head and has the target's runner capture the layers it reads;
  // `replay` (benchmarks, may be null): the recorded trajectories its greedy drafts follow.
  absl::Status CreateEagle3(std::shared_ptr<const DraftReplay> replay);
  // The speculator of slot m (kSpeculatorMethods' order), or null when the server has none.
  Speculator* SpeculatorAt(int m) const;
  // engine_policy.cc: the strategy policy `auto` runs (its cost profile loaded or defaulted).
  absl::Status CreatePolicy();
  // Prepare, after PlanSampling: each sample row's method and K for this step (Request::step),
  // the policy's choice for requests whose method is auto.
  void ChooseStrategies(const StepPlan& plan);  // times DecideStrategies (policy host time)
  void DecideStrategies(const StepPlan& plan);
  // The longest K a decode of `r` can draft this step (lookahead slots, max_model_len,
  // max_tokens), as Speculate limits it.
  int32_t DraftRoom(const Request& r, const ScheduledChunk& chunk) const;
  // Row `row`'s strategy for this step, and the lookahead its request reserves for the next.
  void ApplyStrategy(Request& r, int32_t row, PolicyMethod method, int32_t k, bool reserve_longest);
  // A hold step over the last decision's decodes: each keeps its strategy without the batch
  // being described to the policy again. False (nothing done) when anything differs.
  bool KeepStrategies(const StepPlan& plan);
  // Whether auto requests reserve their longest K of lookahead for the next step.
  bool ReserveLongestK() const;
  // Apply: the policy's acceptance estimates from the step's rounds (before any commit).
  void ReportToPolicy();
  // End of Apply: the step's policy metrics (`committed` tokens in the step).
  void FinishPolicyStep(int64_t committed);
  // Validate's checks; the request's speculation resolved (the only place it is: Submit and
  // GenerateBatch call it once per request).
  absl::StatusOr<ResolvedSpeculation> Admit(const GenerateRequest& request) const;
  Request& AddRequest(RequestId id, GenerateRequest request, const ResolvedSpeculation& spec,
                      OutputCallback on_output, absl::Time arrival);
  // One step (engine_step.cc): Prepare (schedule, PlanSampling) -> Speculate -> Verify
  // (ChooseVerifier, BuildBatch) -> Apply. False when there was nothing to run.
  absl::StatusOr<bool> RunStep();
  void NoteScheduled(const StepPlan& plan, absl::Time now);
  // Builds the step's sample rows: the chunks whose sequence has all its tokens computed
  // after this step draw their next token.
  void PlanSampling(const StepPlan& plan);
  // Drafts for the step's speculating decodes, one Draft per sample row (empty: plain).
  void Speculate(const StepPlan& plan);
  // The first of verifiers_ whose Fits holds for this step's rows and drafts.
  Verifier& ChooseVerifier();
  // The step's batch, once: each chunk's new tokens; a drafted decode's chunk is its last
  // committed token and its drafts (every position's logits when `all_logits`).
  void BuildBatch(const StepPlan& plan, bool all_logits);
  // Tells each speculator its rows' outcomes, then commits every row's tokens.
  void Apply(const StepPlan& plan);
  // After a successful target pass: the EAGLE-3 head gets the pass's hidden states of the
  // sequences that draft with it.
  void FeedEagle3();
  // Moves each verified tree's accepted path's KV to consecutive slots (before Apply marks it
  // computed). The runner's error, when it fails.
  absl::Status CompactTreeKv();
  // Speculator::OnVerified for each speculator's verified rows; adds the positions each of
  // kSpeculatorMethods' rows verified (drafts + 1 per drafted row).
  void TellSpeculators(double (&positions)[kNumSpeculatorSlots]);
  // Commits one drawn token; true when it finished (and destroyed) the request.
  bool CommitToken(Request& r, SampleResult sampled, absl::Time now);
  // Fills metrics.by_method (see SpeculationStepMetrics) at the end of a speculative step, from
  // the positions each of kSpeculatorMethods' rows verified (counted before Apply's commits).
  void AttributeStepTime(const double (&positions)[kNumSpeculatorSlots],
                         SpeculationStepMetrics& metrics);
  void FinishRequest(Request& r, FinishReason reason, absl::Status status, absl::Time now,
                     std::vector<GeneratedToken> tokens = {}, std::string text = {});
  void FinishAll(const absl::Status& status);
  void ServeLoop();
  void ApplyInbox(Inbox& inbox, absl::Time now);
  void WaitWhileStalled();
  void ExpireDeadlines(absl::Time now);
  void PublishStats(bool step_ran);

  EngineOptions options_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Speculator> ngram_;  // always there (free to run)
  std::unique_ptr<Speculator> draft_;  // when options.speculative names a draft model
  std::unique_ptr<Speculator> ssd_;    // method ssd: the speculator process's client
  // Methods vegas and streaming: the target drafts for itself (one rank only).
  std::unique_ptr<Speculator> vegas_;
  // Method eagle3: a draft head reading the target's hidden states (this process, rank 0).
  std::unique_ptr<Eagle3Speculator> eagle3_;
  // The target runner verifies token trees (ModelRunner::SupportsTokenTrees); without, a tree
  // request drafts a chain of its tree's depth.
  bool trees_ok_ = false;
  // The Verify stage's implementations in the order they are tried: greedy on the runner,
  // sampled on the device, exact on the host (takes anything).
  std::vector<std::unique_ptr<Verifier>> verifiers_;
  const SsdStats* ssd_stats_ = nullptr;
  std::unique_ptr<StrategyPolicy> policy_;  // what `auto` runs
  std::string cost_profile_json_;
  std::string cost_profile_source_;
  std::vector<int32_t> eos_ids_;
  int32_t max_model_len_ = 0;
  int32_t block_size_ = 16;
  std::unique_ptr<Core> core_;
  std::unique_ptr<Shared> shared_;
};

// `specd speculator`: the SSD speculator process. Loads the draft model named by
// speculative.draft_model on `device`, connects to the verifier at `connect` (HOST:PORT)
// and serves it until it shuts down (OK) or the link breaks (Unavailable); with `reconnect` it
// then connects again (a speculator on another host outlives verifier restarts).
// DeviceOptions: the draft's runner (device "cpu" by default; its KV pool is
// speculative.draft_kv_cache_bytes, max_model_len the verifier's: 0, the draft's). BatchLimits:
// the verifier's max_num_seqs (the wire limits must match) and the tokens of one draft pass.
struct SpeculatorProcessOptions : DeviceOptions, BatchLimits {
  SpeculatorProcessOptions() { device = "cpu"; }

  std::string connect;  // the verifier's HOST:PORT
  SpeculativeConfig speculative;
  absl::Duration connect_timeout = absl::Seconds(60);
  bool reconnect = false;
  // The link secret's file (mode 0600) when not launched by the verifier (which hands its
  // secret over in $SPECD_SPECULATOR_SECRET); "": speculative.ssd.secret_file.
  std::string secret_file;
};
absl::Status RunSpeculatorProcess(const SpeculatorProcessOptions& options);

// `specd worker`: one rank (or, without --rank, one node's ranks) of a tensor-parallel group.
// Of TensorParallelOptions it reads the group (size: 0 unless given, nnodes, node_rank), the
// rendezvous (master_addr, master_port) and secret_file; the timeout and the model's settings
// come from rank 0 (TpInit), and worker_binary / communicator are rank 0's alone.
struct WorkerProcessOptions : TensorParallelOptions {
  WorkerProcessOptions() { size = 0; }

  int32_t rank = -1;  // -1: all of this node's ranks (needs size, nnodes, node_rank)
  std::string device = "auto";
  int32_t num_threads = 0;
  absl::Duration connect_timeout = absl::Seconds(120);
  // Called once this process's rank loaded its shard and joined (a node process: once its
  // ranks started), e.g. to turn a readiness probe on. Any thread.
  std::function<void()> on_ready;
};
absl::Status RunWorkerProcess(const WorkerProcessOptions& options);

}  // namespace specd
