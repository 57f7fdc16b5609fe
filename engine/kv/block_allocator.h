// Block bookkeeping for the paged KV cache, in the spirit of nano-vllm's block_manager:
// a free list of block ids with reference counts (so prefix caching can later share a
// block between sequences), and a per-sequence BlockTable that grows with the sequence
// and shrinks when rejected speculative tokens are rolled back.
// Not thread-safe: engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

// Index of a block in the KV pool (CpuKvCache's first dimension).
struct BlockId {
  int32_t value = -1;
  friend bool operator==(BlockId a, BlockId b) { return a.value == b.value; }
  friend bool operator!=(BlockId a, BlockId b) { return a.value != b.value; }
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return num_free_; }
  bool CanAllocate(int32_t n) const { return n <= num_free(); }

  // Takes the oldest free block (FIFO, so recently freed blocks, whose contents a prefix
  // cache may still want, are reused last); its ref count becomes 1.
  // ResourceExhausted when none is free.
  absl::StatusOr<BlockId> Allocate();
  // Takes one particular free block off the free list (a prefix-cache hit on a block
  // whose last user freed it); its ref count becomes 1. FailedPrecondition when the block
  // is in use, OutOfRange for a bad id. O(1).
  absl::Status Revive(BlockId id);
  // Adds a reference to an allocated block (a second sequence sharing it).
  absl::Status AddRef(BlockId id);
  // Drops one reference; the block returns to the free list at zero.
  // FailedPrecondition for a block that is not allocated, OutOfRange for a bad id.
  absl::Status Free(BlockId id);
  int32_t ref_count(BlockId id) const;

 private:
  absl::Status CheckAllocated(BlockId id) const;
  void PushFree(int32_t id);
  void Unlink(int32_t id);

  std::vector<int32_t> ref_counts_;  // [num_blocks]
  // The free list, oldest free first, as an intrusive doubly linked list so that Revive
  // can take a block out of its middle in O(1). -1 ends the list.
  std::vector<int32_t> next_free_;  // [num_blocks]
  std::vector<int32_t> prev_free_;  // [num_blocks]
  int32_t free_head_ = -1;
  int32_t free_tail_ = -1;
  int32_t num_free_ = 0;
};

// The blocks of one sequence, in position order: position p lives in block
// ids()[p / block_size] at slot p % block_size.
class BlockTable {
 public:
  explicit BlockTable(int32_t block_size) : block_size_(block_size) {}

  static int32_t BlocksFor(int32_t num_tokens, int32_t block_size) {
    return (num_tokens + block_size - 1) / block_size;
  }

  int32_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return static_cast<int32_t>(ids_.size()); }
  int32_t capacity() const { return num_blocks() * block_size_; }
  // Raw block ids, the form Model::Forward's SequenceInput::block_table takes.
  std::span<const int32_t> ids() const { return ids_; }
  BlockId block(int32_t i) const { return BlockId{ids_[i]}; }
  // Appends a block the caller already holds a reference to (BlockManager: a shared
  // prefix-cache block or one it allocated itself).
  void Append(BlockId id) { ids_.push_back(id.value); }

  // Allocates blocks until num_tokens positions fit. All or nothing: on
  // ResourceExhausted the table and the allocator are unchanged.
  absl::Status EnsureCapacity(int32_t num_tokens, BlockAllocator& allocator);
  // Frees the blocks not needed for the first num_tokens positions (rollback of rejected
  // speculative tokens, or preemption with num_tokens = 0).
  absl::Status Truncate(int32_t num_tokens, BlockAllocator& allocator);
  absl::Status Release(BlockAllocator& allocator) { return Truncate(0, allocator); }

 private:
  int32_t block_size_;
  std::vector<int32_t> ids_;  // [num_blocks] BlockId values
};

}  // namespace specd
