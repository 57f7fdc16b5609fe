// One sequence as the scheduler sees it: its token ids (prompt, then generated), how many
// of them have KV in the cache, and its block table. Sampling, stop strings and streaming
// live in the engine's per-request state; the scheduler only moves tokens through KV.
// Engine thread only.
#pragma once

#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/kv/block_manager.h"

namespace specd {

// Engine-assigned id of a sequence (one per request for now).
struct SeqId {
  uint64_t value = 0;
  friend bool operator==(SeqId a, SeqId b) { return a.value == b.value; }
};

enum class SequenceStatus { kWaiting, kRunning, kFinished };

class Sequence {
 public:
  Sequence(SeqId id, std::vector<int32_t> prompt_ids, int32_t block_size)
      : id_(id),
        tokens_(std::move(prompt_ids)),
        num_prompt_tokens_(static_cast<int32_t>(tokens_.size())),
        blocks_(block_size) {}

  SeqId id() const { return id_; }
  SequenceStatus status() const { return status_; }
  // [num_tokens] prompt ids then generated ids.
  std::span<const int32_t> tokens() const { return tokens_; }
  int32_t num_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t num_prompt_tokens() const { return num_prompt_tokens_; }
  int32_t num_generated() const { return num_tokens() - num_prompt_tokens_; }
  // Positions [0, num_computed) have their KV in the cache.
  int32_t num_computed() const { return num_computed_; }
  int32_t num_uncomputed() const { return num_tokens() - num_computed_; }
  // Prompt tokens whose KV came from the prefix cache at the first admission (-1 before).
  int32_t num_cached_prompt_tokens() const { return num_cached_prompt_tokens_; }
  int32_t num_preemptions() const { return num_preemptions_; }
  const BlockTable& blocks() const { return blocks_; }
  // Draft tokens a decode of this sequence may verify per step (speculation's K; 0: none).
  // The scheduler reserves KV slots and token budget for them when it can spare them.
  int32_t num_lookahead_tokens() const { return num_lookahead_tokens_; }
  void set_num_lookahead_tokens(int32_t n) { num_lookahead_tokens_ = n; }
  // Paused by its front end (its client stopped reading): the scheduler neither runs nor
  // admits it, but it keeps its KV and place until resumed (Scheduler::SetPaused).
  bool paused() const { return paused_; }
  // Positions [0, n) may reach the prefix cache once computed; later ones stay private. A
  // request whose KV past its prompt is not the model's own (lossy SSV verification) sets its
  // prompt length. Default: all.
  int32_t num_shareable_tokens() const { return num_shareable_tokens_; }
  void set_num_shareable_tokens(int32_t n) { num_shareable_tokens_ = n; }
  // Whether admission may serve its leading positions from the prefix cache. False: every
  // position is computed (a drafter that needs the target's hidden states at every position
  // and keeps them nowhere else: the CPU EAGLE-3 head). Its blocks still join the cache.
  bool reuses_cached_prefix() const { return reuses_cached_prefix_; }
  void set_reuses_cached_prefix(bool reuse) { reuses_cached_prefix_ = reuse; }
  // A draft head keeps its entries in this sequence's blocks (the EAGLE-3 head on a GPU drafts
  // for it): its prefix matches only cached blocks holding the head's entries, and the blocks it
  // computes are cached as holding them (PrefixCacheUse::head_kv).
  bool head_kv() const { return head_kv_; }
  void set_head_kv(bool head_kv) { head_kv_ = head_kv; }
  PrefixCacheUse prefix_use() const { return {reuses_cached_prefix_, head_kv_}; }

  // A sampled token; its KV is computed by the next step.
  void AppendToken(int32_t id) { tokens_.push_back(id); }

 private:
  friend class Scheduler;

  SeqId id_;
  std::vector<int32_t> tokens_;
  int32_t num_prompt_tokens_;
  int32_t num_computed_ = 0;
  int32_t num_cached_prompt_tokens_ = -1;
  int32_t num_preemptions_ = 0;
  int32_t num_lookahead_tokens_ = 0;
  int32_t num_shareable_tokens_ = INT32_MAX;
  bool reuses_cached_prefix_ = true;
  bool head_kv_ = false;
  bool paused_ = false;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  BlockTable blocks_;
};

}  // namespace specd
