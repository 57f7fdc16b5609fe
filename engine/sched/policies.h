// The scheduler's small policies, each tested on its own (as TensorRT-LLM splits capacity
// and micro-batch scheduling): how a step's token budget is shared out (decodes whole,
// prefills in chunks), who may be admitted, and who loses its KV when blocks run out.
// Engine thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "engine/kv/block_manager.h"
#include "engine/sched/sequence.h"

namespace specd {

// Tokens one step may run (vLLM's max_num_batched_tokens). A decode takes one token; a
// prefill takes what is left, so a long prompt is prefilled over several steps.
class TokenBudget {
 public:
  explicit TokenBudget(int32_t max_tokens) : remaining_(std::max(0, max_tokens)) {}
  int32_t remaining() const { return remaining_; }
  int32_t used() const { return used_; }
  // Grants min(wanted, remaining) tokens.
  int32_t Take(int32_t wanted) {
    const int32_t granted = std::clamp(wanted, 0, remaining_);
    remaining_ -= granted;
    used_ += granted;
    return granted;
  }

 private:
  int32_t remaining_;
  int32_t used_ = 0;
};

// Whether the head of the waiting queue may start running now: a free running slot, a
// share of the token budget, and KV blocks for all its tokens (after prefix-cache hits).
// First come first served: when the head does not fit, nothing behind it is admitted.
class AdmissionPolicy {
 public:
  explicit AdmissionPolicy(int32_t max_num_seqs) : max_num_seqs_(max_num_seqs) {}
  bool CanAdmit(const Sequence& seq, int32_t num_running, const TokenBudget& budget,
                const BlockManager& blocks) const {
    return num_running < max_num_seqs_ && budget.remaining() > 0 &&
           blocks.CanAllocate(seq.tokens(), seq.prefix_use());
  }

 private:
  int32_t max_num_seqs_;
};

// Preemption by recompute picks the most recently admitted running sequence (vLLM and
// nano-vllm): it has the least work to redo and the oldest requests keep their latency.
// Paused sequences go first (newest of them first): their clients are not reading.
class PreemptNewest {
 public:
  // running: oldest first, non-empty. Index of the victim.
  size_t SelectVictim(std::span<Sequence* const> running) const {
    for (size_t i = running.size(); i-- > 0;) {
      if (running[i]->paused()) return i;
    }
    return running.size() - 1;
  }
};

}  // namespace specd
