// Block manager with prefix caching over the paged KV pool, in the spirit of nano-vllm's
// block_manager.py and vLLM's KV cache manager: each FULL block whose KV has been computed
// gets a hash chained over the token ids of every block before it, so a later sequence
// starting with the same tokens shares those blocks (ref-counted) instead of recomputing
// them. A cached block whose last user freed it stays findable until the allocator hands
// it out again (freed blocks are reused oldest first, so that is as late as possible).
// Not thread-safe: engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv/block_allocator.h"

namespace specd {

// How a sequence uses the prefix cache (Sequence::reuses_cached_prefix, Sequence::head_kv).
struct PrefixCacheUse {
  bool reuse = true;     // false: no cached block serves it
  bool head_kv = false;  // only blocks marked as holding a draft head's entries serve it
};

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return allocator_.num_blocks(); }
  int32_t num_free_blocks() const { return allocator_.num_free(); }
  int32_t num_used_blocks() const { return num_blocks() - num_free_blocks(); }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks findable by hash right now (in use or free).
  int32_t num_cached_blocks() const { return static_cast<int32_t>(cached_.size()); }
  // Running totals of prefix-cache lookups at Allocate, in blocks.
  int64_t num_queried_blocks() const { return num_queried_blocks_; }
  int64_t num_hit_blocks() const { return num_hit_blocks_; }
  int32_t ref_count(BlockId id) const { return allocator_.ref_count(id); }

  // Admission of a sequence with no blocks: tokens are all of its tokens so far (the
  // prompt, plus the generated ones after a preemption); each needs a KV slot.
  bool CanAllocate(std::span<const int32_t> tokens, PrefixCacheUse use = {}) const;
  // Fills the empty table with blocks for tokens.size() positions, sharing the longest
  // cached prefix of full blocks that `use` allows. The last token is never served from the
  // cache (its logits are needed). Returns how many leading tokens already have their KV (a
  // multiple of block_size). ResourceExhausted, with nothing changed, when !CanAllocate.
  absl::StatusOr<int32_t> Allocate(std::span<const int32_t> tokens, BlockTable& table,
                                   PrefixCacheUse use = {});

  // Growth while decoding: whether the table can be grown to num_tokens positions.
  bool CanAppend(const BlockTable& table, int32_t num_tokens) const;
  // Grows the table to num_tokens positions (at most one block per decode step).
  // ResourceExhausted, with nothing changed, when !CanAppend.
  absl::Status MayAppend(BlockTable& table, int32_t num_tokens);

  // After the KV of tokens[0, num_computed) was written: makes every full block in that
  // range findable by later sequences. tokens: the sequence's tokens (at least
  // num_computed of them). head_kv: a draft head writes its entries into these blocks too
  // (the EAGLE-3 head on a GPU), so they are marked as serving PrefixCacheUse::head_kv sequences;
  // such a block replaces an unmarked one of equal content as the one hits find.
  void CacheComputedBlocks(const BlockTable& table, std::span<const int32_t> tokens,
                           int32_t num_computed, bool head_kv = false);

  // Releases every block of the table (shared ones lose one reference); cached blocks
  // stay findable until reused. The table ends empty.
  absl::Status Deallocate(BlockTable& table);

 private:
  static constexpr uint64_t kNoHash = 0;

  // Hash of a full block given the hash of the block before it (kNoHash for the first).
  static uint64_t HashBlock(uint64_t parent, std::span<const int32_t> block_tokens);
  // Cached blocks holding the longest prefix of tokens[0, tokens.size() - 1) (full blocks)
  // that `use` allows.
  std::vector<BlockId> MatchPrefix(std::span<const int32_t> tokens, PrefixCacheUse use) const;
  // Allocates a fresh block, forgetting any cached content it had.
  absl::StatusOr<BlockId> AllocateFresh();
  void Forget(BlockId id);

  BlockAllocator allocator_;
  int32_t block_size_;
  bool prefix_caching_;
  // Per block: its chain hash once full and computed (kNoHash otherwise), the hash of
  // the block before it, and its token ids (to rule out hash collisions).
  std::vector<uint64_t> block_hash_;               // [num_blocks]
  std::vector<uint64_t> parent_hash_;              // [num_blocks]
  std::vector<int32_t> block_tokens_;              // [num_blocks, block_size]
  std::vector<uint8_t> head_kv_;                   // [num_blocks] cached with a head's entries
  absl::flat_hash_map<uint64_t, int32_t> cached_;  // chain hash -> block id
  int64_t num_queried_blocks_ = 0;
  int64_t num_hit_blocks_ = 0;
};

}  // namespace specd
