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
#include "engine/step/generate_types.h"
#include "engine/step/metrics.h"

namespace specd {

class AutoStrategy;
class ModelRunner;
class SpeculatorSet;
class StepPipeline;
class Tokenizer;
struct RunnerOptions;
struct ModelConfig;

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
  bool has_draft_model() const;
  bool has_ssd() const;
  bool has_eagle3() const;
  // Methods vegas and streaming run here (the CPU or CUDA backend, on one rank).
  bool has_sparse_drafting() const;
  // The target is an NSA model: requests may set speculation.ssv.
  bool target_is_nsa() const;
  // `auto` speculation's cost profile as JSON (CostProfile::ToJson), and where it came from
  // ("file PATH" or "default: ..."). Fixed at Create; any thread.
  const std::string& cost_profile_json() const;
  const std::string& cost_profile_source() const;
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
  struct Shared;  // the inbox and the stats snapshot: all front-end threads touch
  struct Inbox;   // what the engine thread takes from Shared's inbox at once

  Engine();
  absl::Status CreateSsd(const RunnerOptions& target);  // engine_ssd.cc
  // Validate's checks; the request's speculation resolved (the only place it is: Submit and
  // GenerateBatch call it once per request).
  absl::StatusOr<ResolvedSpeculation> Admit(const GenerateRequest& request) const;
  // engine_serving.cc: the engine thread.
  void ServeLoop();
  void ApplyInbox(Inbox& inbox, absl::Time now);
  void WaitWhileStalled();
  void ExpireDeadlines(absl::Time now);
  void PublishStats(bool step_ran);

  EngineOptions options_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<SpeculatorSet> speculators_;  // engine/step/speculator_set.h
  std::unique_ptr<AutoStrategy> strategy_;      // what `auto` runs
  // The engine thread's state: KV blocks, scheduler, live requests, the step's stages.
  std::unique_ptr<StepPipeline> pipeline_;
  std::vector<int32_t> eos_ids_;
  int32_t max_model_len_ = 0;
  bool serving_ = false;           // inside ServeLoop (engine thread)
  RequestId next_offline_id_ = 1;  // GenerateBatch's request ids
  std::unique_ptr<Shared> shared_;
};

// `specd speculator`: the SSD speculator process. Connects to the verifier at `connect`
// (HOST:PORT), receives its settings in the SsdInit after the authenticated handshake (the draft,
// its device and runner, the batch and context limits; engine/speculation/ssd/ssd_init.h), loads
// the draft and serves the verifier until it shuts down (OK) or the link breaks (Unavailable);
// with `reconnect` it then connects again (a speculator on another host outlives verifier
// restarts). What is set here is local to the process.
struct SpeculatorProcessOptions {
  std::string connect;  // the verifier's HOST:PORT
  absl::Duration connect_timeout = absl::Seconds(60);
  bool reconnect = false;
  // The link secret's file (mode 0600) when not launched by the verifier (which hands its
  // secret over in $SPECD_SPECULATOR_SECRET).
  std::string secret_file;
  // TLS 1.3 for a speculator on another host: its certificate and key, and the CA both ends
  // trust (all three or none).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  // Overrides of the verifier's choice for a speculator started by hand: "" and -1 keep what its
  // SsdInit says (its speculator_device, else its own device; its thread count).
  std::string device;
  int32_t num_threads = -1;
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
