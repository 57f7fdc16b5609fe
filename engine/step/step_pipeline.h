// One engine step as four stages (docs/architecture.md, "The step pipeline"):
// - Prepare: the scheduler's plan (admissions, chunked prefill, preemption) and the sample rows:
//   the chunks whose sequence has all its tokens computed after this step draw a token; then
//   each row's method and K for the step (LiveRequest::step: pinned, or AutoStrategy's choice for
//   `auto` requests).
// - Speculate: each speculating decode's speculator (SpeculatorSet) proposes up to K drafts (K
//   limited by the lookahead slots the scheduler reserved, the context and max_tokens).
// - Verify: the first verifier that fits these rows and drafts (engine/verification: greedy on
//   the runner, sampled on the device, exact on the host) runs ONE target pass over the whole
//   ragged batch, built once for it: prefill chunks, plain decodes and drafted decodes (the
//   sequence's last token, then its drafts). A plain step is the zero-draft case. Then token
//   trees' accepted paths are compacted in the KV and the EAGLE-3 head (in process, or in SSD's
//   speculator) gets the pass's hidden states.
// - Apply: the one commit path. Each speculator is told its rows' outcomes, then every row's
//   tokens (a plain row's one token; a drafted row's accepted drafts and the correction or bonus
//   token) are committed in order (stop strings, max_tokens, logprobs) and the accepted drafts'
//   KV is marked computed. Rejected drafts' KV slots stay reserved and are overwritten next step.
// The pipeline owns the engine thread's state: the KV block manager, the scheduler, the live
// requests (LiveRequest) and the step's scratch. Engine thread (or the offline caller) only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/base/draft_method.h"
#include "engine/kv/block_manager.h"
#include "engine/runner/model_runner.h"
#include "engine/sched/scheduler.h"
#include "engine/speculation/speculator.h"
#include "engine/step/live_request.h"
#include "engine/step/metrics.h"
#include "engine/verification/verifier.h"

namespace specd {

class AutoStrategy;
class SpeculatorSet;
class Tokenizer;

struct StepPipelineOptions {
  int32_t num_kv_blocks = 0;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_model_len = 0;
  std::vector<int32_t> eos_ids;        // the model's (generation config and tokenizer)
  EngineObserver* observer = nullptr;  // metrics sink; may be null
};

class StepPipeline {
 public:
  // `runner`, `speculators`, `strategy` and `tokenizer` (may be null) outlive the pipeline.
  StepPipeline(const StepPipelineOptions& options, ModelRunner* runner, SpeculatorSet* speculators,
               AutoStrategy* strategy, const Tokenizer* tokenizer);
  ~StepPipeline();

  // One step: Prepare -> Speculate -> Verify -> Apply. False when there was nothing to run.
  // `on_scheduled` runs once the plan admitted requests and before any token is committed (the
  // engine publishes its stats then). A failed target pass ends every request of the step with
  // the error (the group's, when a tensor-parallel rank was lost) and returns it.
  absl::StatusOr<bool> Run(const std::function<void()>& on_scheduled);

  // ---- The live requests. ----
  LiveRequest& Add(RequestId id, GenerateRequest request, const ResolvedSpeculation& spec,
                   OutputCallback on_output, absl::Time arrival);
  LiveRequest* Find(RequestId id);
  // Frees the request's KV, sends its last update, reports it, and destroys it.
  void Finish(LiveRequest& r, FinishReason reason, absl::Status status, absl::Time now,
              std::vector<GeneratedToken> tokens = {}, std::string text = {});
  // Finishes every live request (in id order) with kAbort and `status`.
  void FinishAll(const absl::Status& status);
  void SetPaused(RequestId id, bool paused);
  const absl::flat_hash_map<RequestId, std::unique_ptr<LiveRequest>>& live() const { return live_; }
  bool empty() const { return live_.empty(); }
  // Offline GenerateBatch's token callback (null: none).
  void set_on_token(const TokenCallback* on_token) { on_token_ = on_token; }

  const Scheduler& scheduler() const { return scheduler_; }
  const BlockManager& blocks() const { return blocks_; }

 private:
  // Prepare.
  void NoteScheduled(const StepPlan& plan, absl::Time now);
  // The step's sample rows: the chunks whose sequence has all its tokens computed after this
  // step draw their next token.
  void PlanSampling(const StepPlan& plan);
  // Speculate: drafts for the step's speculating decodes, one Draft per sample row (empty:
  // plain).
  void Speculate(const StepPlan& plan);
  // Verify: the first of verifiers_ whose Fits holds for this step's rows and drafts.
  Verifier& ChooseVerifier();
  // The step's batch, once: each chunk's new tokens; a drafted decode's chunk is its last
  // committed token and its drafts (every position's logits when `all_logits`).
  void BuildBatch(const StepPlan& plan, bool all_logits);
  // Moves each verified tree's accepted path's KV to consecutive slots (before Apply marks it
  // computed). The runner's error, when it fails.
  absl::Status CompactTreeKv();
  // After a successful target pass: the EAGLE-3 head gets the pass's hidden states of the
  // sequences that draft with it.
  void FeedEagle3();
  // ... and SSD's speculator, when an EAGLE-3 head drafts there, those of the sequences that
  // may draft with SSD.
  void FeedSsd();
  // Whether `spec` may draft with an SSD speculator that wants the target's hidden states:
  // method ssd, or auto when the policy may pick ssd (hidden states a pass does not hand over
  // cannot be had later).
  bool SsdHeadMayDraft(const ResolvedSpeculation& spec) const;
  // Ends every request of the step with `failed`.
  void FailStep(const StepPlan& plan, const absl::Status& failed);
  // Apply: tells each speculator its rows' outcomes, then commits every row's tokens.
  void Apply(const StepPlan& plan);
  // Speculator::OnVerified for each method's verified rows; adds the positions each method's
  // rows verified (drafts + 1 per drafted row).
  void TellSpeculators(double (&positions)[kNumDraftMethods]);
  // Commits one drawn token; true when it finished (and destroyed) the request.
  bool CommitToken(LiveRequest& r, SampleResult sampled, absl::Time now);
  // Fills metrics.by_method (see SpeculationStepMetrics) at the end of a speculative step, from
  // the positions each method's rows verified (counted before Apply's commits).
  void AttributeStepTime(const double (&positions)[kNumDraftMethods],
                         SpeculationStepMetrics& metrics);

  StepPipelineOptions options_;
  ModelRunner* runner_;
  SpeculatorSet* speculators_;
  AutoStrategy* strategy_;  // never null
  const Tokenizer* tokenizer_;
  // The Verify stage's implementations in the order they are tried: greedy on the runner,
  // sampled on the device, exact on the host (takes anything).
  std::vector<std::unique_ptr<Verifier>> verifiers_;
  BlockManager blocks_;
  Scheduler scheduler_;
  absl::flat_hash_map<RequestId, std::unique_ptr<LiveRequest>> live_;
  const TokenCallback* on_token_ = nullptr;  // offline GenerateBatch's callback

  // ---- The step's scratch. ----
  std::vector<SequenceInput> batch_;          // [num_chunks]
  std::vector<SampleRow> rows_;               // [num_rows]: chunks drawing a token
  std::vector<LiveRequest*> row_requests_;    // [num_rows]
  std::vector<std::vector<int32_t>> banned_;  // [num_rows] (min_tokens)
  // The step's stages, per sample row: the draft (empty: plain decode), the chunk's tokens of a
  // drafted decode (the sequence's last token, then the drafts), the request's acceptor (host
  // verification), and what verification gave.
  std::vector<Draft> drafts_;                      // [num_rows]
  std::vector<std::vector<int32_t>> spec_tokens_;  // [num_rows]
  // Tree rows' chunks: the tree's parents over the chunk (the root, then the drafts) and the
  // chunk's TokenTree (SequenceInput::tree points at it).
  std::vector<std::vector<int32_t>> spec_parents_;  // [num_rows]
  std::vector<TokenTree> spec_trees_;               // [num_rows]
  std::vector<KvSlotMove> kv_moves_;                // trees' accepted paths
  std::vector<Acceptor*> acceptors_;                // [num_rows]
  std::vector<RowOutcome> outcomes_;                // [num_rows]
  std::vector<int32_t> chunk_row_;                  // [num_chunks] its drafted row, or -1
  std::vector<DraftInput> draft_inputs_;            // [num_inputs] one speculator's batch
  std::vector<int32_t> draft_rows_;                 // [num_inputs] their sample rows
  std::vector<Draft> proposed_;                     // [num_inputs]
  std::vector<VerifiedRound> rounds_;               // one speculator's outcomes
  double verify_seconds_ = 0;                       // this step's verification pass
  double draft_seconds_ = 0;                        // this step's Propose time
  SsvLoadStats ssv_reported_;  // the runner's SSV totals as the last step's metrics had them
  // Per method (DraftMethodIndex): its Propose time this step.
  SpeculationStepMetrics::MethodSeconds method_seconds_[kNumDraftMethods];
  // Vegas rows' verification chunks: the attention options asking for scores and their buffers
  // ([num_layers, 2, scored_len]); scored_len -1 when the row collects none.
  std::vector<ChunkAttention> row_attention_;   // [num_rows]
  std::vector<std::vector<float>> row_scores_;  // [num_rows]
  std::vector<int32_t> scored_len_;             // [num_rows]
  absl::Time step_start_;                       // when Run began
  int64_t step_start_ns_ = 0;                   // ... in MonotonicNanos (SSD's round timeline)
  int32_t num_spec_rows_ = 0;                   // rows with drafts this step
  bool ssd_proposed_ = false;                   // SSD's speculator proposed this step
  // [num_chunks] FeedEagle3: whether the chunk's sequence drafts with the EAGLE-3 head; FeedSsd:
  // with SSD's speculator's head.
  std::vector<uint8_t> eagle3_wanted_;
  std::vector<uint8_t> ssd_wanted_;
};

}  // namespace specd
