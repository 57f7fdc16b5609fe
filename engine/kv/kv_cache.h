// Paged KV cache storage for the CPU backend. The cache is a pool of fixed-size blocks per
// layer (vLLM-style paging): a sequence's positions map to (block, slot) through its block
// table, so sequences grow, share prefixes and roll back without copying.
// Not thread-safe: the engine thread owns it. Model::Forward writes new K/V on the engine
// thread and reads it from pool workers while the engine thread waits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specd {

struct KvCacheSpec {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  // tokens per block
  int32_t num_blocks = 0;
  // NSA models: tokens per compression block (NsaConfig::block_size); 0: none. The cache then
  // keeps, beside the paged K/V, each complete compression block's mean key and value in the
  // page holding the block's last position (its compressed entry), so a page carries the means
  // of the blocks it completes wherever it goes (prefix-cache reuse, preemption). A multiple of
  // block_size or a divisor of it.
  int32_t compressed_block_size = 0;

  // Floats of one token's K (or V) in one layer: num_kv_heads * head_dim.
  int64_t slot_floats() const { return int64_t{num_kv_heads} * head_dim; }
  // Floats of one block's K (or V) in one layer.
  int64_t block_floats() const { return slot_floats() * block_size; }
  // Compressed entries per page: one per compression block ending in it (0 without them).
  int32_t compressed_per_block() const {
    if (compressed_block_size <= 0) return 0;
    return compressed_block_size < block_size ? block_size / compressed_block_size : 1;
  }
  // Floats of one compressed entry: [num_kv_heads, 2, head_dim], the mean key then the mean
  // value of each KV head.
  int64_t compressed_floats() const { return 2 * slot_floats(); }
  // Bytes of the whole cache (K and V, and the compressed entries, every layer).
  int64_t total_bytes() const {
    return int64_t{num_layers} * num_blocks *
           (2 * block_floats() + compressed_per_block() * compressed_floats()) *
           int64_t{sizeof(float)};
  }

  // InvalidArgument unless every field is positive.
  absl::Status Validate() const;
};

bool operator==(const KvCacheSpec& a, const KvCacheSpec& b);

// One token's K/V moving between two slots of a sequence (positions in its block table): a
// token tree's accepted path moving to consecutive slots after verification
// (engine/model/token_tree.h).
struct KvSlotMove {
  std::span<const int32_t> block_table;
  int32_t from = 0;
  int32_t to = 0;
};

class CpuKvCache {
 public:
  static absl::StatusOr<std::unique_ptr<CpuKvCache>> Create(const KvCacheSpec& spec);

  const KvCacheSpec& spec() const { return spec_; }

  // One token's keys / values: [num_kv_heads, head_dim] f32. Bounds are the caller's
  // contract (Model::Forward validates block tables before touching the cache).
  float* KeySlot(int32_t layer, int32_t block, int32_t slot) {
    return keys_[layer].data() + Offset(block, slot);
  }
  float* ValueSlot(int32_t layer, int32_t block, int32_t slot) {
    return values_[layer].data() + Offset(block, slot);
  }
  const float* KeySlot(int32_t layer, int32_t block, int32_t slot) const {
    return keys_[layer].data() + Offset(block, slot);
  }
  const float* ValueSlot(int32_t layer, int32_t block, int32_t slot) const {
    return values_[layer].data() + Offset(block, slot);
  }

  // Compressed entry `entry` (< spec().compressed_per_block()) of a page in one layer:
  // [num_kv_heads, 2, head_dim] f32. Only when spec().compressed_block_size > 0.
  float* CompressedEntry(int32_t layer, int32_t block, int32_t entry) {
    return compressed_[layer].data() + CompressedOffset(block, entry);
  }
  const float* CompressedEntry(int32_t layer, int32_t block, int32_t entry) const {
    return compressed_[layer].data() + CompressedOffset(block, entry);
  }

  // Copies every layer's K and V of each move's `from` slot to its `to` slot, moves in order.
  // InvalidArgument (before copying anything) for a slot past the block table or a block id
  // outside the cache.
  absl::Status MoveSlots(std::span<const KvSlotMove> moves);

  // A whole layer: [num_blocks, block_size, num_kv_heads, head_dim] f32.
  std::span<float> keys(int32_t layer) { return keys_[layer]; }
  std::span<float> values(int32_t layer) { return values_[layer]; }

 private:
  explicit CpuKvCache(const KvCacheSpec& spec);
  int64_t Offset(int32_t block, int32_t slot) const {
    return (int64_t{block} * spec_.block_size + slot) * spec_.slot_floats();
  }

  int64_t CompressedOffset(int32_t block, int32_t entry) const {
    return (int64_t{block} * spec_.compressed_per_block() + entry) * spec_.compressed_floats();
  }

  KvCacheSpec spec_;
  // Per layer: [num_blocks, block_size, num_kv_heads, head_dim] f32.
  std::vector<std::vector<float>> keys_;    // [num_layers]
  std::vector<std::vector<float>> values_;  // [num_layers]
  // Per layer: [num_blocks, compressed_per_block, num_kv_heads, 2, head_dim] f32 (empty without
  // compressed entries).
  std::vector<std::vector<float>> compressed_;  // [num_layers]
};

}  // namespace specd
