#include "engine/kv/kv_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace specd {

absl::Status KvCacheSpec::Validate() const {
  const struct {
    const char* name;
    int32_t value;
  } fields[] = {{"num_layers", num_layers},
                {"num_kv_heads", num_kv_heads},
                {"head_dim", head_dim},
                {"block_size", block_size},
                {"num_blocks", num_blocks}};
  for (const auto& f : fields) {
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCacheSpec: ", f.name, " must be positive, got ", f.value));
    }
  }
  const int32_t c = compressed_block_size;
  if (c < 0 || (c > 0 && block_size % c != 0 && c % block_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("KvCacheSpec: compressed_block_size ", c,
                                                   " must be 0, a multiple of ", "block_size ",
                                                   block_size, " or a divisor of it"));
  }
  return absl::OkStatus();
}

bool operator==(const KvCacheSpec& a, const KvCacheSpec& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.block_size == b.block_size && a.num_blocks == b.num_blocks &&
         a.compressed_block_size == b.compressed_block_size;
}

absl::StatusOr<std::unique_ptr<CpuKvCache>> CpuKvCache::Create(const KvCacheSpec& spec) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  return std::unique_ptr<CpuKvCache>(new CpuKvCache(spec));
}

CpuKvCache::CpuKvCache(const KvCacheSpec& spec) : spec_(spec) {
  const size_t layer_floats = static_cast<size_t>(spec.num_blocks) * spec.block_floats();
  keys_.assign(spec.num_layers, std::vector<float>(layer_floats, 0.0f));
  values_.assign(spec.num_layers, std::vector<float>(layer_floats, 0.0f));
  const size_t compressed_floats =
      static_cast<size_t>(spec.num_blocks) * spec.compressed_per_block() * spec.compressed_floats();
  if (compressed_floats > 0) {
    compressed_.assign(spec.num_layers, std::vector<float>(compressed_floats, 0.0f));
  }
}

absl::Status CpuKvCache::MoveSlots(std::span<const KvSlotMove> moves) {
  const int32_t bs = spec_.block_size;
  auto block_of = [&](const KvSlotMove& m, int32_t slot) -> int32_t {
    if (slot < 0 || slot / bs >= static_cast<int32_t>(m.block_table.size())) return -1;
    const int32_t block = m.block_table[slot / bs];
    return block >= 0 && block < spec_.num_blocks ? block : -1;
  };
  for (const KvSlotMove& m : moves) {
    if (block_of(m, m.from) < 0 || block_of(m, m.to) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV move ", m.from, " -> ", m.to, ": slot outside the sequence's blocks"));
    }
  }
  const size_t bytes = sizeof(float) * spec_.slot_floats();
  for (const KvSlotMove& m : moves) {
    if (m.from == m.to) continue;
    const int32_t from = block_of(m, m.from), to = block_of(m, m.to);
    for (int32_t layer = 0; layer < spec_.num_layers; ++layer) {
      std::memmove(KeySlot(layer, to, m.to % bs), KeySlot(layer, from, m.from % bs), bytes);
      std::memmove(ValueSlot(layer, to, m.to % bs), ValueSlot(layer, from, m.from % bs), bytes);
    }
  }
  return absl::OkStatus();
}

}  // namespace specd
