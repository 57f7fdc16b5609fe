#include "engine/kv/block_allocator.h"

#include "absl/strings/str_cat.h"

namespace specd {

BlockAllocator::BlockAllocator(int32_t num_blocks)
    : ref_counts_(num_blocks > 0 ? num_blocks : 0, 0),
      next_free_(ref_counts_.size(), -1),
      prev_free_(ref_counts_.size(), -1) {
  for (int32_t i = 0; i < this->num_blocks(); ++i) PushFree(i);
}

void BlockAllocator::PushFree(int32_t id) {
  prev_free_[id] = free_tail_;
  next_free_[id] = -1;
  if (free_tail_ >= 0) {
    next_free_[free_tail_] = id;
  } else {
    free_head_ = id;
  }
  free_tail_ = id;
  ++num_free_;
}

void BlockAllocator::Unlink(int32_t id) {
  const int32_t prev = prev_free_[id];
  const int32_t next = next_free_[id];
  if (prev >= 0) {
    next_free_[prev] = next;
  } else {
    free_head_ = next;
  }
  if (next >= 0) {
    prev_free_[next] = prev;
  } else {
    free_tail_ = prev;
  }
  prev_free_[id] = next_free_[id] = -1;
  --num_free_;
}

absl::StatusOr<BlockId> BlockAllocator::Allocate() {
  if (free_head_ < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: all ", num_blocks(), " blocks in use"));
  }
  const int32_t id = free_head_;
  Unlink(id);
  ref_counts_[id] = 1;
  return BlockId{id};
}

absl::Status BlockAllocator::Revive(BlockId id) {
  if (id.value < 0 || id.value >= num_blocks()) {
    return absl::OutOfRangeError(
        absl::StrCat("block id ", id.value, " outside [0, ", num_blocks(), ")"));
  }
  if (ref_counts_[id.value] != 0) {
    return absl::FailedPreconditionError(absl::StrCat("block ", id.value, " is in use"));
  }
  Unlink(id.value);
  ref_counts_[id.value] = 1;
  return absl::OkStatus();
}

absl::Status BlockAllocator::CheckAllocated(BlockId id) const {
  if (id.value < 0 || id.value >= num_blocks()) {
    return absl::OutOfRangeError(
        absl::StrCat("block id ", id.value, " outside [0, ", num_blocks(), ")"));
  }
  if (ref_counts_[id.value] == 0) {
    return absl::FailedPreconditionError(absl::StrCat("block ", id.value, " is not allocated"));
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::AddRef(BlockId id) {
  if (absl::Status s = CheckAllocated(id); !s.ok()) return s;
  ++ref_counts_[id.value];
  return absl::OkStatus();
}

absl::Status BlockAllocator::Free(BlockId id) {
  if (absl::Status s = CheckAllocated(id); !s.ok()) return s;
  if (--ref_counts_[id.value] == 0) PushFree(id.value);
  return absl::OkStatus();
}

int32_t BlockAllocator::ref_count(BlockId id) const {
  if (id.value < 0 || id.value >= num_blocks()) return 0;
  return ref_counts_[id.value];
}

absl::Status BlockTable::EnsureCapacity(int32_t num_tokens, BlockAllocator& allocator) {
  const int32_t needed = BlocksFor(num_tokens, block_size_) - num_blocks();
  if (needed <= 0) return absl::OkStatus();
  if (!allocator.CanAllocate(needed)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache full: need ", needed, " blocks, ", allocator.num_free(), " free"));
  }
  for (int32_t i = 0; i < needed; ++i) {
    absl::StatusOr<BlockId> id = allocator.Allocate();
    if (!id.ok()) return id.status();  // unreachable after CanAllocate
    ids_.push_back(id->value);
  }
  return absl::OkStatus();
}

absl::Status BlockTable::Truncate(int32_t num_tokens, BlockAllocator& allocator) {
  const int32_t keep = BlocksFor(num_tokens < 0 ? 0 : num_tokens, block_size_);
  while (num_blocks() > keep) {
    if (absl::Status s = allocator.Free(BlockId{ids_.back()}); !s.ok()) return s;
    ids_.pop_back();
  }
  return absl::OkStatus();
}

}  // namespace specd
