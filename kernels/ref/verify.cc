#include "kernels/ref/verify.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace specd::kernels::ref {
namespace {

// q_x of a draft row: the row itself, or a point mass at the draft for deterministic drafts.
float DraftProb(const float* q_row, int32_t draft, int64_t x) {
  if (q_row != nullptr) return q_row[x];
  return x == draft ? 1.0f : 0.0f;
}

// Inverse-CDF draw of u over weight(x), x in [0, vocab), whose exact sum is `total`: the first id
// whose inclusive prefix sum exceeds DrawThreshold(total, u); -1 when total is zero.
template <typename Weight>
int32_t DrawWithTotal(int64_t vocab, uint64_t total, float u, Weight weight) {
  if (total == 0) return -1;
  const uint64_t threshold = DrawThreshold(total, UniformToFixed(u));
  uint64_t prefix = 0;
  for (int64_t x = 0; x < vocab; ++x) {
    prefix += weight(x);
    if (prefix > threshold) return static_cast<int32_t>(x);
  }
  return -1;  // unreachable: threshold < total
}

// Inverse-CDF draw over the row's fixed-point weights; -1 when they sum to zero.
int32_t Draw(const float* p_row, const float* q_row, int32_t draft, bool residual, int64_t vocab,
             float u) {
  auto weight = [&](int64_t x) {
    return ResidualWeight(p_row[x], DraftProb(q_row, draft, x), residual);
  };
  uint64_t total = 0;
  for (int64_t x = 0; x < vocab; ++x) total += weight(x);
  return DrawWithTotal(vocab, total, u, weight);
}

uint64_t RowTotal(const float* p_row, int64_t vocab) {
  uint64_t total = 0;
  for (int64_t x = 0; x < vocab; ++x) total += ProbToFixed(p_row[x]);
  return total;
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

void VerifyTreeGreedy(const DraftLayout& layout, const int32_t* draft_tokens,
                      const int32_t* parents, const int32_t* target_tokens, int32_t* accepted_lens,
                      int32_t* next_tokens, int32_t* paths) {
  for (int64_t i = 0; i < layout.batch; ++i) {
    const int64_t draft_start = layout.DraftStart(i);
    const int32_t* drafts = draft_tokens + draft_start;
    const int32_t* parent = parents + draft_start;
    const int32_t* targets = target_tokens + layout.PositionStart(i);
    const int64_t num_drafts = layout.NumDrafts(i);
    // A node's children have larger indices than the node, so one scan finds the first matching
    // child of every node on the path: after descending to j it goes on at j + 1.
    int64_t node = -1, k = 0;
    for (int64_t j = 0; j < num_drafts; ++j) {
      if (parent[j] == node && drafts[j] == targets[node + 1]) {
        paths[draft_start + k++] = static_cast<int32_t>(j);
        node = j;
      }
    }
    accepted_lens[i] = static_cast<int32_t>(k);
    next_tokens[i] = targets[node + 1];
  }
}

void VerifyTreeStochastic(const DraftLayout& layout, const int32_t* draft_tokens,
                          const int32_t* parents, const float* target_probs, int64_t vocab,
                          const float* uniforms, int32_t* accepted_lens, int32_t* next_tokens,
                          int32_t* paths) {
  std::vector<int32_t> rejected;  // the node's rejected valid tokens, sorted
  for (int64_t i = 0; i < layout.batch; ++i) {
    const int64_t draft_start = layout.DraftStart(i);
    const int64_t position = layout.PositionStart(i);
    const int64_t num_drafts = layout.NumDrafts(i);
    const int32_t* drafts = draft_tokens + draft_start;
    const int32_t* parent = parents + draft_start;
    int64_t node = -1, k = 0;
    const float* p_row = nullptr;
    uint64_t total = 0, left = 0;
    for (;;) {
      p_row = target_probs + (position + node + 1) * vocab;
      total = left = RowTotal(p_row, vocab);
      rejected.clear();
      int64_t kept = -1;
      for (int64_t j = node + 1; j < num_drafts; ++j) {
        if (parent[j] != node) continue;
        const int32_t x = drafts[j];
        const bool valid = x >= 0 && x < vocab;
        const auto at = std::lower_bound(rejected.begin(), rejected.end(), x);
        const bool counted = valid && (at == rejected.end() || *at != x);
        const uint64_t w = counted ? ProbToFixed(p_row[x]) : 0;
        if (AcceptTreeChild(uniforms[position + j], left, w)) {
          kept = j;
          break;
        }
        if (counted) {
          left -= w;
          rejected.insert(at, x);
        }
      }
      if (kept < 0) break;
      paths[draft_start + k++] = static_cast<int32_t>(kept);
      node = kept;
    }
    const float u = uniforms[position + num_drafts];
    int32_t next = -1;
    if (left > 0) {
      next = DrawWithTotal(vocab, left, u, [&](int64_t x) -> uint64_t {
        const bool out = std::binary_search(rejected.begin(), rejected.end(), x);
        return out ? 0 : ProbToFixed(p_row[x]);
      });
    } else {
      next = DrawWithTotal(vocab, total, u, [&](int64_t x) { return ProbToFixed(p_row[x]); });
    }
    accepted_lens[i] = static_cast<int32_t>(k);
    next_tokens[i] = next;
  }
}

}  // namespace specd::kernels::ref
