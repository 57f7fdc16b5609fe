#include "kernels/ref/verify.h"

#include <cstring>

namespace specd::kernels::ref {
namespace {

// q_x of a draft row: the row itself, or a point mass at the draft for deterministic drafts.
float DraftProb(const float* q_row, int32_t draft, int64_t x) {
  if (q_row != nullptr) return q_row[x];
  return x == draft ? 1.0f : 0.0f;
}

// Inverse-CDF draw over the row's fixed-point weights; -1 when they sum to zero.
int32_t Draw(const float* p_row, const float* q_row, int32_t draft, bool residual, int64_t vocab,
             float u) {
  uint64_t total = 0;
  for (int64_t x = 0; x < vocab; ++x) {
    total += ResidualWeight(p_row[x], DraftProb(q_row, draft, x), residual);
  }
  if (total == 0) return -1;
  const uint64_t threshold = DrawThreshold(total, UniformToFixed(u));
  uint64_t prefix = 0;
  for (int64_t x = 0; x < vocab; ++x) {
    prefix += ResidualWeight(p_row[x], DraftProb(q_row, draft, x), residual);
    if (prefix > threshold) return static_cast<int32_t>(x);
  }
  return -1;  // unreachable: threshold < total
}

}  // namespace

void VerifyGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                  const int32_t* target_tokens, int32_t* accepted_lens, int32_t* next_tokens) {
  for (int64_t i = 0; i < layout.batch; ++i) {
    const int32_t* drafts = draft_tokens + layout.DraftStart(i);
    const int32_t* targets = target_tokens + layout.PositionStart(i);
    const int64_t num_drafts = layout.NumDrafts(i);
    int64_t k = 0;
    while (k < num_drafts && drafts[k] == targets[k]) ++k;
    accepted_lens[i] = static_cast<int32_t>(k);
    next_tokens[i] = targets[k];
  }
}

void PackAccepted(const DraftLayout& layout, const int32_t* draft_tokens,
                  const int32_t* accepted_lens, const int32_t* next_tokens, const PackArgs& pack) {
  const auto* kv = static_cast<const unsigned char*>(pack.kv);
  auto* packed_kv = static_cast<unsigned char*>(pack.packed_kv);
  const size_t row_bytes = static_cast<size_t>(pack.kv_row_bytes);
  int32_t offset = 0;
  for (int64_t i = 0; i < layout.batch; ++i) {
    pack.cu_committed[i] = offset;
    const int32_t k = accepted_lens[i];
    const int64_t position = layout.PositionStart(i);
    for (int32_t j = 0; j <= k; ++j) {
      const int64_t out = offset + j;
      pack.committed_tokens[out] = j < k ? draft_tokens[layout.DraftStart(i) + j] : next_tokens[i];
      if (pack.slot_mapping != nullptr) {
        pack.committed_slots[out] = pack.slot_mapping[position + j];
      }
      if (kv != nullptr && row_bytes > 0) {
        std::memcpy(packed_kv + out * row_bytes, kv + (position + j) * row_bytes, row_bytes);
      }
    }
    offset += k + 1;
  }
  pack.cu_committed[layout.batch] = offset;
}

void VerifyStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                      const float* draft_probs, const float* target_probs, int64_t vocab,
                      const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens) {
  for (int64_t i = 0; i < layout.batch; ++i) {
    const int64_t draft_start = layout.DraftStart(i);
    const int64_t position = layout.PositionStart(i);
    const int64_t num_drafts = layout.NumDrafts(i);
    int64_t k = 0;
    for (; k < num_drafts; ++k) {
      const int32_t d = draft_tokens[draft_start + k];
      if (d < 0 || d >= vocab) break;
      const float p = target_probs[(position + k) * vocab + d];
      const float q = draft_probs ? draft_probs[(draft_start + k) * vocab + d] : 1.0f;
      if (!AcceptDraft(uniforms[position + k], p, q)) break;
    }
    const float* p_row = target_probs + (position + k) * vocab;
    const float u = uniforms[position + num_drafts];  // never used by a test
    int32_t next = -1;
    if (k < num_drafts) {
      const float* q_row = draft_probs ? draft_probs + (draft_start + k) * vocab : nullptr;
      next = Draw(p_row, q_row, draft_tokens[draft_start + k], /*residual=*/true, vocab, u);
    }
    if (next < 0) next = Draw(p_row, nullptr, -1, /*residual=*/false, vocab, u);
    accepted_lens[i] = static_cast<int32_t>(k);
    next_tokens[i] = next;
  }
}

}  // namespace specd::kernels::ref
