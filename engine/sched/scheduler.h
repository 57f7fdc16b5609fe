// Continuous-batching scheduler (nano-vllm's scheduler.py, vLLM's V1 scheduler): every
// step it picks which sequences run and how many of their tokens, under a cap on running
// sequences and a per-step token budget. Decodes are scheduled first; prefills (new,
// resumed or partial) share the rest of the budget, so a long prompt is prefilled in
// chunks over several steps. When a decode needs a KV block and none is free, the newest
// running sequence is preempted by recompute: it drops its blocks and goes back to the
// front of the waiting queue (its prefix may come back from the prefix cache). A decode of
// a speculating sequence also gets lookahead slots for its drafts when KV and budget allow
// (never at the price of a preemption).
// A paused sequence (its client stopped reading) is skipped: it keeps its KV and its place
// but runs no tokens and is not admitted. Paused sequences are the first victims of
// preemption, and one is preempted to admit a waiting sequence that has no running slot or KV,
// so that paused requests never hold the batch.
// The scheduler does not own sequences; the caller keeps them alive until Finish.
// Engine thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/kv/block_manager.h"
#include "engine/sched/policies.h"
#include "engine/sched/sequence.h"

namespace specd {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running sequences
  int32_t max_num_batched_tokens = 2048;  // tokens run per step
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;  // tokens [num_computed, num_computed + num_new_tokens) run
  // Decodes only: draft tokens this step may verify after the new token, with their KV slots
  // and token budget reserved (at most seq->num_lookahead_tokens()).
  int32_t num_lookahead_tokens = 0;
};

// One step: what Model::Forward runs, plus what happened to the queues.
struct StepPlan {
  std::vector<ScheduledChunk> chunks;  // decodes first, then prefill chunks
  std::vector<Sequence*> admitted;     // moved from waiting to running this step
  std::vector<Sequence*> preempted;    // lost their KV this step; back in waiting
  int32_t num_batched_tokens = 0;
  int64_t num_queried_blocks = 0;  // prefix-cache lookups of this step's admissions
  int64_t num_hit_blocks = 0;
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager* blocks);

  const SchedulerConfig& config() const { return config_; }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  bool empty() const { return waiting_.empty() && running_.empty(); }
  // Paused sequences, running (with KV) or waiting.
  int32_t num_paused() const;

  // Queues a new sequence at the back of the waiting queue.
  void Add(Sequence* seq);
  // Plans the next step and reserves its KV. Empty only when nothing is queued or running,
  // or everything is paused.
  StepPlan Schedule();
  // Pauses or resumes a sequence wherever it is (see above); idempotent.
  void SetPaused(Sequence* seq, bool paused) { seq->paused_ = paused; }
  // After the forward pass ran the plan: the chunks' tokens now have KV. A sequence with
  // num_uncomputed() == 0 afterwards needs its next token sampled (then AppendToken).
  void Postprocess(const StepPlan& plan);
  // After Postprocess, for a decode that verified drafts: the sequence appended its
  // num_accepted accepted drafts (and then the token that follows them), and the step already
  // wrote the drafts' KV into the slots reserved for them: they count as computed now.
  void AcceptSpeculated(Sequence* seq, int32_t num_accepted);
  // Removes a sequence wherever it is (finished, aborted, expired) and frees its KV.
  void Finish(Sequence* seq);

 private:
  void ScheduleDecodes(TokenBudget& budget, StepPlan& plan);
  // Draft slots a decode of seq gets: its lookahead, within `budget` tokens, when the extra
  // KV blocks fit beside one block for each of num_decodes_behind later decodes.
  int32_t LookaheadSlots(const Sequence& seq, int32_t budget, int32_t num_decodes_behind) const;
  void SchedulePartialPrefills(TokenBudget& budget, StepPlan& plan);
  void Admit(TokenBudget& budget, StepPlan& plan);
  // Admits seq if it can run now; false otherwise.
  bool TryAdmit(Sequence* seq, TokenBudget& budget, StepPlan& plan);
  // Preempts the newest paused running sequence; false when none is.
  bool PreemptPaused(StepPlan& plan);
  void Preempt(Sequence* seq, StepPlan& plan);

  SchedulerConfig config_;
  BlockManager* blocks_;
  AdmissionPolicy admission_;
  PreemptNewest preemption_;
  std::deque<Sequence*> waiting_;   // front is next
  std::vector<Sequence*> running_;  // admission order, oldest first
};

}  // namespace specd
