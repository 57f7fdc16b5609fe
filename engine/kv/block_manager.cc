#include "engine/kv/block_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : allocator_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      block_hash_(allocator_.num_blocks(), kNoHash),
      parent_hash_(allocator_.num_blocks(), kNoHash),
      block_tokens_(static_cast<size_t>(allocator_.num_blocks()) * block_size, -1),
      head_kv_(allocator_.num_blocks(), 0) {}

uint64_t BlockManager::HashBlock(uint64_t parent, std::span<const int32_t> block_tokens) {
  // splitmix64 finalizer over (parent, tokens...): deterministic across runs, so tests
  // and logs are reproducible. Collisions are ruled out by comparing tokens on a hit.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (int32_t t : block_tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h == kNoHash ? 1 : h;
}

std::vector<BlockId> BlockManager::MatchPrefix(std::span<const int32_t> tokens,
                                               PrefixCacheUse use) const {
  std::vector<BlockId> hits;
  if (!prefix_caching_ || !use.reuse || tokens.empty()) return hits;
  const int32_t num_full = static_cast<int32_t>(tokens.size() - 1) / block_size_;
  uint64_t parent = kNoHash;
  for (int32_t i = 0; i < num_full; ++i) {
    std::span<const int32_t> block = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = HashBlock(parent, block);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    const int32_t id = it->second;
    if (parent_hash_[id] != parent ||
        !std::equal(block.begin(), block.end(), block_tokens_.begin() + id * block_size_) ||
        (use.head_kv && !head_kv_[id])) {
      break;
    }
    hits.push_back(BlockId{id});
    parent = h;
  }
  return hits;
}

bool BlockManager::CanAllocate(std::span<const int32_t> tokens, PrefixCacheUse use) const {
  const int32_t total = BlockTable::BlocksFor(static_cast<int32_t>(tokens.size()), block_size_);
  int32_t shared_in_use = 0;
  for (BlockId id : MatchPrefix(tokens, use)) {
    shared_in_use += allocator_.ref_count(id) > 0 ? 1 : 0;
  }
  return total - shared_in_use <= allocator_.num_free();
}

void BlockManager::Forget(BlockId id) {
  uint64_t& h = block_hash_[id.value];
  if (h == kNoHash) return;
  auto it = cached_.find(h);
  if (it != cached_.end() && it->second == id.value) cached_.erase(it);
  h = kNoHash;
  parent_hash_[id.value] = kNoHash;
  head_kv_[id.value] = 0;
}

absl::StatusOr<BlockId> BlockManager::AllocateFresh() {
  absl::StatusOr<BlockId> id = allocator_.Allocate();
  if (id.ok()) Forget(*id);
  return id;
}

absl::StatusOr<int32_t> BlockManager::Allocate(std::span<const int32_t> tokens, BlockTable& table,
                                               PrefixCacheUse use) {
  if (table.num_blocks() != 0) {
    return absl::FailedPreconditionError("Allocate needs an empty block table");
  }
  if (!CanAllocate(tokens, use)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", tokens.size(), " tokens, ",
                                                     num_free_blocks(), " free blocks"));
  }
  const std::vector<BlockId> hits = MatchPrefix(tokens, use);
  if (prefix_caching_ && use.reuse && !tokens.empty()) {
    num_queried_blocks_ += static_cast<int32_t>(tokens.size() - 1) / block_size_;
    num_hit_blocks_ += static_cast<int64_t>(hits.size());
  }
  for (BlockId id : hits) {
    // A hit on a free block takes it off the free list; one in use gains a reference.
    absl::Status s = allocator_.ref_count(id) > 0 ? allocator_.AddRef(id) : allocator_.Revive(id);
    if (!s.ok()) return s;  // unreachable: MatchPrefix returns only valid ids
    table.Append(id);
  }
  if (absl::Status s = MayAppend(table, static_cast<int32_t>(tokens.size())); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("KV allocation failed after CanAllocate: ", s.message()));
  }
  return static_cast<int32_t>(hits.size()) * block_size_;
}

bool BlockManager::CanAppend(const BlockTable& table, int32_t num_tokens) const {
  return BlockTable::BlocksFor(num_tokens, block_size_) - table.num_blocks() <=
         allocator_.num_free();
}

absl::Status BlockManager::MayAppend(BlockTable& table, int32_t num_tokens) {
  if (!CanAppend(table, num_tokens)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: need ", BlockTable::BlocksFor(num_tokens, block_size_) - table.num_blocks(),
        " blocks, ", num_free_blocks(), " free"));
  }
  while (table.capacity() < num_tokens) {
    absl::StatusOr<BlockId> id = AllocateFresh();
    if (!id.ok()) return id.status();  // unreachable after CanAppend
    table.Append(*id);
  }
  return absl::OkStatus();
}

void BlockManager::CacheComputedBlocks(const BlockTable& table, std::span<const int32_t> tokens,
                                       int32_t num_computed, bool head_kv) {
  if (!prefix_caching_) return;
  const int32_t num_full = std::min(num_computed / block_size_, table.num_blocks());
  // Blocks are hashed in order, so the first unhashed one is found from the end.
  int32_t first = num_full;
  while (first > 0 && block_hash_[table.block(first - 1).value] == kNoHash) --first;
  uint64_t parent = first > 0 ? block_hash_[table.block(first - 1).value] : kNoHash;
  for (int32_t i = first; i < num_full; ++i) {
    const int32_t id = table.block(i).value;
    std::span<const int32_t> block = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = HashBlock(parent, block);
    block_hash_[id] = h;
    parent_hash_[id] = parent;
    std::copy(block.begin(), block.end(), block_tokens_.begin() + id * block_size_);
    // An equal block computed by another sequence keeps serving hits (unless this one holds
    // a head's entries and it does not); this one is still hashed so that the chain of the
    // blocks after it can be computed.
    head_kv_[id] = head_kv ? 1 : 0;
    auto [it, inserted] = cached_.try_emplace(h, id);
    if (!inserted && head_kv && !head_kv_[it->second]) it->second = id;
    parent = h;
  }
}

absl::Status BlockManager::Deallocate(BlockTable& table) {
  // Last blocks first: the free list is FIFO, so a prefix's first blocks (the ones most
  // likely shared again) are reused last.
  for (int32_t i = table.num_blocks() - 1; i >= 0; --i) {
    if (absl::Status s = allocator_.Free(table.block(i)); !s.ok()) return s;
  }
  BlockTable empty(table.block_size());
  table = std::move(empty);
  return absl::OkStatus();
}

}  // namespace specd
