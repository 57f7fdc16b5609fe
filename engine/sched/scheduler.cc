#include "engine/sched/scheduler.h"

#include <algorithm>

#include "engine/base/log.h"

namespace specd {

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager* blocks)
    : config_(config), blocks_(blocks), admission_(config.max_num_seqs) {}

void Scheduler::Add(Sequence* seq) {
  seq->status_ = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

StepPlan Scheduler::Schedule() {
  StepPlan plan;
  TokenBudget budget(config_.max_num_batched_tokens);
  ScheduleDecodes(budget, plan);
  SchedulePartialPrefills(budget, plan);
  // Sequences preempted this step would only be taken back in (and preempted again):
  // admissions wait for a step that needed no preemption, as in vLLM.
  if (plan.preempted.empty()) Admit(budget, plan);
  plan.num_batched_tokens = budget.used();
  return plan;
}

void Scheduler::ScheduleDecodes(TokenBudget& budget, StepPlan& plan) {
  for (size_t i = 0; i < running_.size() && budget.remaining() > 0; ++i) {
    Sequence* seq = running_[i];
    if (seq->paused_ || seq->num_uncomputed() != 1) continue;
    // Victims are paused, newer than seq (not yet scheduled this step), or seq itself.
    bool self_preempted = false;
    while (!blocks_->CanAppend(seq->blocks(), seq->num_tokens())) {
      Sequence* victim = running_[preemption_.SelectVictim(running_)];
      Preempt(victim, plan);
      if (victim == seq) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) break;  // seq was the newest: nothing left behind it
    blocks_->MayAppend(seq->blocks_, seq->num_tokens()).IgnoreError();  // CanAppend held
    const int32_t num_decodes_behind = static_cast<int32_t>(running_.size() - i - 1);
    const int32_t lookahead = LookaheadSlots(*seq, budget.remaining() - 1, num_decodes_behind);
    if (lookahead > 0) {  // checked to fit
      blocks_->MayAppend(seq->blocks_, seq->num_tokens() + lookahead).IgnoreError();
    }
    plan.chunks.push_back({seq, budget.Take(1), budget.Take(lookahead)});
  }
}

int32_t Scheduler::LookaheadSlots(const Sequence& seq, int32_t budget,
                                  int32_t num_decodes_behind) const {
  const int32_t wanted = std::min(seq.num_lookahead_tokens(), budget);
  if (wanted <= 0) return 0;
  // Leave one free block for every decode still to be scheduled this step, so that lookahead
  // never forces a preemption (the drafts are an optimisation; a decode is not).
  const int32_t extra = BlockTable::BlocksFor(seq.num_tokens() + wanted, blocks_->block_size()) -
                        seq.blocks().num_blocks();
  return extra <= blocks_->num_free_blocks() - num_decodes_behind ? wanted : 0;
}

void Scheduler::SchedulePartialPrefills(TokenBudget& budget, StepPlan& plan) {
  for (Sequence* seq : running_) {
    if (budget.remaining() == 0) break;
    if (seq->paused_ || seq->num_uncomputed() <= 1) continue;
    plan.chunks.push_back({seq, budget.Take(seq->num_uncomputed())});
  }
}

// First come first served among the sequences that are not paused: when the first of them
// does not fit, nothing behind it is admitted (unless preempting a paused sequence makes room).
void Scheduler::Admit(TokenBudget& budget, StepPlan& plan) {
  size_t i = 0;
  while (i < waiting_.size() && budget.remaining() > 0) {
    Sequence* seq = waiting_[i];
    if (seq->paused_) {
      ++i;
      continue;
    }
    if (TryAdmit(seq, budget, plan)) {
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (!PreemptPaused(plan)) break;
    ++i;  // the victim went to the front of the queue
  }
}

bool Scheduler::TryAdmit(Sequence* seq, TokenBudget& budget, StepPlan& plan) {
  if (!admission_.CanAdmit(*seq, num_running(), budget, *blocks_)) return false;
  const int64_t queried = blocks_->num_queried_blocks();
  const int64_t hit = blocks_->num_hit_blocks();
  absl::StatusOr<int32_t> cached =
      blocks_->Allocate(seq->tokens(), seq->blocks_, seq->prefix_use());
  if (!cached.ok()) {  // unreachable after CanAllocate; leave it queued
    SPECD_LOG_ERROR("scheduler: admission failed: {}", cached.status().ToString());
    return false;
  }
  plan.num_queried_blocks += blocks_->num_queried_blocks() - queried;
  plan.num_hit_blocks += blocks_->num_hit_blocks() - hit;
  seq->num_computed_ = *cached;
  if (seq->num_cached_prompt_tokens_ < 0) {
    seq->num_cached_prompt_tokens_ = std::min(*cached, seq->num_prompt_tokens_);
  }
  seq->status_ = SequenceStatus::kRunning;
  running_.push_back(seq);
  plan.admitted.push_back(seq);
  plan.chunks.push_back({seq, budget.Take(seq->num_uncomputed())});
  return true;
}

bool Scheduler::PreemptPaused(StepPlan& plan) {
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i]->paused_) {
      Preempt(running_[i], plan);
      return true;
    }
  }
  return false;
}

void Scheduler::Preempt(Sequence* seq, StepPlan& plan) {
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  blocks_->Deallocate(seq->blocks_).IgnoreError();  // tables only hold allocated blocks
  seq->num_computed_ = 0;
  seq->status_ = SequenceStatus::kWaiting;
  ++seq->num_preemptions_;
  // Preemptions of one step go newest first, so pushing each to the front keeps the
  // older sequence ahead.
  waiting_.push_front(seq);
  plan.preempted.push_back(seq);
}

int32_t Scheduler::num_paused() const {
  auto paused = [](const Sequence* seq) { return seq->paused_; };
  return static_cast<int32_t>(std::count_if(running_.begin(), running_.end(), paused) +
                              std::count_if(waiting_.begin(), waiting_.end(), paused));
}

void Scheduler::Postprocess(const StepPlan& plan) {
  for (const ScheduledChunk& c : plan.chunks) {
    c.seq->num_computed_ += c.num_new_tokens;
    blocks_->CacheComputedBlocks(c.seq->blocks_, c.seq->tokens(),
                                 std::min(c.seq->num_computed_, c.seq->num_shareable_tokens_),
                                 c.seq->head_kv_);
  }
}

void Scheduler::AcceptSpeculated(Sequence* seq, int32_t num_accepted) {
  seq->num_computed_ = std::min(seq->num_computed_ + num_accepted, seq->num_tokens());
  blocks_->CacheComputedBlocks(seq->blocks_, seq->tokens(),
                               std::min(seq->num_computed_, seq->num_shareable_tokens_),
                               seq->head_kv_);
}

void Scheduler::Finish(Sequence* seq) {
  if (seq->status_ == SequenceStatus::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    if (it != running_.end()) running_.erase(it);
  } else if (seq->status_ == SequenceStatus::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), seq);
    if (it != waiting_.end()) waiting_.erase(it);
  }
  blocks_->Deallocate(seq->blocks_).IgnoreError();
  seq->status_ = SequenceStatus::kFinished;
}

}  // namespace specd
