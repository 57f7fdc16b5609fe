#include "kernels/ref/vegas.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/ref/bf16.h"

namespace specd::kernels::ref {
namespace {

// Offset of token `pos`'s row for kv head `kv_head` (the layout of kernels/ref/attention.h).
int64_t CacheRow(const int32_t* block_table, int64_t pos, int64_t kv_head,
                 const AttentionShape& s) {
  const int64_t block = block_table[pos / s.block_size];
  return ((block * s.num_kv_heads + kv_head) * s.block_size + pos % s.block_size) * s.head_dim;
}

bool Visible(int64_t key, int64_t pos, const AttentionShape& s) {
  return key <= pos && (s.sliding_window == 0 || key > pos - s.sliding_window);
}

// One query over the keys `keys` (ascending positions, already filtered to those it sees):
// out = softmax(scale q.K) V as kernels/ref/attention.cc's two-pass loop. raw_scores, when
// given, receives scale q.k per key, in `keys` order.
template <typename T>
void AttendKeys(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_table,
                const std::vector<int64_t>& keys, int64_t kv_head, const AttentionShape& s,
                ProbRounding rounding, T* out, std::vector<T>* raw_scores) {
  const int64_t d = s.head_dim;
  std::vector<T> scores(keys.size());
  T max_score = -std::numeric_limits<T>::infinity();
  for (size_t i = 0; i < keys.size(); ++i) {
    const T* k = k_cache + CacheRow(block_table, keys[i], kv_head, s);
    T dot = 0;
    for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
    scores[i] = dot * static_cast<T>(s.scale);
    max_score = std::max(max_score, scores[i]);
  }
  std::vector<T> acc(d, T{0});
  T sum = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const T p = std::exp(scores[i] - max_score);
    sum += p;
    const T weight =
        rounding == ProbRounding::kBf16 ? static_cast<T>(RoundToBf16(static_cast<float>(p))) : p;
    const T* v = v_cache + CacheRow(block_table, keys[i], kv_head, s);
    for (int64_t c = 0; c < d; ++c) acc[c] += weight * v[c];
  }
  for (int64_t c = 0; c < d; ++c) out[c] = sum > 0 ? acc[c] / sum : T{0};
  if (raw_scores != nullptr) *raw_scores = std::move(scores);
}

// The keys a query at `pos` sees among `candidates` (ascending).
std::vector<int64_t> VisibleKeys(const std::vector<int64_t>& candidates, int64_t pos,
                                 const AttentionShape& s) {
  std::vector<int64_t> keys;
  for (int64_t key : candidates) {
    if (Visible(key, pos, s)) keys.push_back(key);
  }
  return keys;
}

// The float's total order as an unsigned key (as the CUDA kernel's OrderedKey).
uint32_t OrderedKey(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

template <typename T>
void PagedVerifyAttentionWithScores(const T* q, int64_t q_stride, const T* k_cache,
                                    const T* v_cache, const int32_t* block_tables,
                                    int64_t max_blocks_per_seq, const int32_t* cu_q_lens,
                                    const int32_t* seq_lens, int64_t num_seqs,
                                    const AttentionShape& shape, T* out, int64_t out_stride,
                                    T* scores, int64_t score_stride, ProbRounding rounding) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t* table = block_tables + s * max_blocks_per_seq;
    const int64_t q_len = cu_q_lens[s + 1] - cu_q_lens[s];
    const int64_t first_pos = seq_lens[s] - q_len;  // also the scored prefix's length
    const int64_t scored = std::min(first_pos, score_stride);
    std::vector<int64_t> all(seq_lens[s]);
    std::iota(all.begin(), all.end(), int64_t{0});
    // Head sums of the two rows; -inf where the row does not see the key.
    std::vector<T> sums[2] = {std::vector<T>(std::max<int64_t>(scored, 0), T{0}),
                              std::vector<T>(std::max<int64_t>(scored, 0), T{0})};
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t token = cu_q_lens[s] + i, pos = first_pos + i;
      const std::vector<int64_t> keys = VisibleKeys(all, pos, shape);
      for (int64_t h = 0; h < shape.num_q_heads; ++h) {
        std::vector<T> raw;
        AttendKeys(q + token * q_stride + h * shape.head_dim, k_cache, v_cache, table, keys,
                   h / group, shape, rounding, out + token * out_stride + h * shape.head_dim, &raw);
        for (int row = 0; row < 2; ++row) {
          if (i != (row == 0 ? 0 : q_len - 1)) continue;
          for (int64_t j = 0; j < scored; ++j) {
            if (!Visible(j, pos, shape)) continue;
            sums[row][j] += raw[j - keys.front()];  // keys are contiguous from keys.front()
          }
        }
      }
      for (int row = 0; row < 2; ++row) {
        if (i != (row == 0 ? 0 : q_len - 1)) continue;
        T* dst = scores + (s * 2 + row) * score_stride;
        for (int64_t j = 0; j < scored; ++j) {
          dst[j] = Visible(j, pos, shape) ? sums[row][j] / static_cast<T>(shape.num_q_heads)
                                          : -std::numeric_limits<T>::infinity();
        }
      }
    }
  }
}

int64_t VegasKeepCount(int64_t n, const VegasBudget& budget) {
  const double scaled = budget.ratio * static_cast<double>(n);
  int64_t k = static_cast<int64_t>(std::ceil(scaled * (1.0 - 1e-9)));
  k = std::clamp(k, budget.min_tokens, budget.max_tokens);
  return std::min(k, n);
}

void VegasSelectTopK(const float* scores, int64_t num_parts, int64_t score_stride,
                     const int32_t* lengths, int64_t num_seqs, int64_t num_pairs,
                     const VegasBudget& budget, int32_t* indices, int64_t index_stride,
                     int32_t* counts) {
  for (int64_t pair = 0; pair < num_pairs; ++pair) {
    const int64_t n = std::clamp<int64_t>(lengths[pair % num_seqs], 0, score_stride);
    const float* src = scores + pair * 2 * num_parts * score_stride;
    std::vector<uint32_t> keys(n);
    for (int64_t j = 0; j < n; ++j) {
      float row0 = 0.0f, row1 = 0.0f;
      for (int64_t p = 0; p < num_parts; ++p) row0 += src[p * score_stride + j];
      for (int64_t p = 0; p < num_parts; ++p) row1 += src[(num_parts + p) * score_stride + j];
      keys[j] = OrderedKey((row0 + row1) * 0.5f);
    }
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = VegasKeepCount(n, budget);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return keys[a] != keys[b] ? keys[a] > keys[b] : a < b;
    });
    std::sort(order.begin(), order.begin() + k);
    std::copy_n(order.begin(), k, indices + pair * index_stride);
    counts[pair] = static_cast<int32_t>(k);
  }
}

void HeadAveragedPrefixWeights(const float* scores, int64_t heads, int64_t stride, int64_t n,
                               float to_raw, float* out) {
  std::vector<double> weights(n, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    const float* x = scores + h * stride;
    const float max = n > 0 ? *std::max_element(x, x + n) : 0.0f;
    if (!std::isfinite(max)) continue;  // every key masked (outside a sliding window)
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(double{to_raw} * (double{x[j]} - max));
    for (int64_t j = 0; j < n; ++j) {
      weights[j] += std::exp(double{to_raw} * (double{x[j]} - max)) / sum;
    }
  }
  for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(weights[j] / double(heads));
}

template <typename T>
void PagedSparseAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                          const int32_t* block_tables, int64_t max_blocks_per_seq,
                          const int32_t* cu_q_lens, const int32_t* seq_lens,
                          const int32_t* token_indices, int64_t index_stride,
                          const int32_t* index_counts, const int32_t* recent_starts,
                          int64_t num_seqs, const AttentionShape& shape, T* out, int64_t out_stride,
                          ProbRounding rounding) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t count = std::clamp<int64_t>(index_counts[s], 0, index_stride);
    const int64_t recent = std::clamp<int64_t>(recent_starts[s], 0, seq_lens[s]);
    std::vector<int64_t> candidates(token_indices + s * index_stride,
                                    token_indices + s * index_stride + count);
    std::sort(candidates.begin(), candidates.end());
    for (int64_t pos = recent; pos < seq_lens[s]; ++pos) candidates.push_back(pos);
    const int64_t q_len = cu_q_lens[s + 1] - cu_q_lens[s];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t token = cu_q_lens[s] + i, pos = seq_lens[s] - q_len + i;
      const std::vector<int64_t> keys = VisibleKeys(candidates, pos, shape);
      for (int64_t h = 0; h < shape.num_q_heads; ++h) {
        AttendKeys(q + token * q_stride + h * shape.head_dim, k_cache, v_cache,
                   block_tables + s * max_blocks_per_seq, keys, h / group, shape, rounding,
                   out + token * out_stride + h * shape.head_dim,
                   static_cast<std::vector<T>*>(nullptr));
      }
    }
  }
}

template void PagedVerifyAttentionWithScores<float>(const float*, int64_t, const float*,
                                                    const float*, const int32_t*, int64_t,
                                                    const int32_t*, const int32_t*, int64_t,
                                                    const AttentionShape&, float*, int64_t, float*,
                                                    int64_t, ProbRounding);
template void PagedVerifyAttentionWithScores<double>(const double*, int64_t, const double*,
                                                     const double*, const int32_t*, int64_t,
                                                     const int32_t*, const int32_t*, int64_t,
                                                     const AttentionShape&, double*, int64_t,
                                                     double*, int64_t, ProbRounding);
template void PagedSparseAttention<float>(const float*, int64_t, const float*, const float*,
                                          const int32_t*, int64_t, const int32_t*, const int32_t*,
                                          const int32_t*, int64_t, const int32_t*, const int32_t*,
                                          int64_t, const AttentionShape&, float*, int64_t,
                                          ProbRounding);
template void PagedSparseAttention<double>(const double*, int64_t, const double*, const double*,
                                           const int32_t*, int64_t, const int32_t*, const int32_t*,
                                           const int32_t*, int64_t, const int32_t*, const int32_t*,
                                           int64_t, const AttentionShape&, double*, int64_t,
                                           ProbRounding);

}  // namespace specd::kernels::ref
