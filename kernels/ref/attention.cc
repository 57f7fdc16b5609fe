#include "kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/ref/bf16.h"

namespace specd::kernels::ref {
namespace {

// Offset of token `pos`'s row for kv head `kv_head` in a cache of the layout above.
int64_t CacheRow(const int32_t* block_table, int64_t pos, int64_t kv_head,
                 const AttentionShape& s) {
  const int64_t block = block_table[pos / s.block_size];
  return ((block * s.num_kv_heads + kv_head) * s.block_size + pos % s.block_size) * s.head_dim;
}

// Which of a query's keys a tree mask leaves visible: every key before `start`, and key j >=
// start where bit j - start of `row` is set (none past words * 64). row null: every key.
struct TreeRow {
  const uint64_t* row = nullptr;
  int64_t start = 0, words = 0;

  bool Visible(int64_t key) const {
    if (row == nullptr || key < start) return true;
    const int64_t bit = key - start;
    return bit < words * 64 && ((row[bit / 64] >> (bit % 64)) & 1) != 0;
  }
};

// out[d] = sum_j p_j v_j[d] / sum_j p_j over the visible keys j in [first, pos], p_j =
// exp(scale q.k_j - max); zeros where no key is visible.
template <typename T>
void AttendOneQuery(const T* q, const T* k_cache, const T* v_cache, const int32_t* block_table,
                    int64_t pos, int64_t kv_head, const AttentionShape& s, ProbRounding rounding,
                    const TreeRow& tree, T* out) {
  const int64_t first = s.sliding_window > 0 ? std::max<int64_t>(0, pos - s.sliding_window + 1) : 0;
  const int64_t d = s.head_dim;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  std::vector<T> scores(pos - first + 1, neg_inf);
  T max_score = neg_inf;
  for (int64_t j = first; j <= pos; ++j) {
    if (!tree.Visible(j)) continue;
    const T* k = k_cache + CacheRow(block_table, j, kv_head, s);
    T dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
    scores[j - first] = dot * static_cast<T>(s.scale);
    max_score = std::max(max_score, scores[j - first]);
  }
  std::vector<T> acc(d, T{0});
  T sum = 0;
  for (int64_t j = first; j <= pos; ++j) {
    if (!tree.Visible(j)) continue;
    const T p = std::exp(scores[j - first] - max_score);
    sum += p;
    const T weight =
        rounding == ProbRounding::kBf16 ? static_cast<T>(RoundToBf16(static_cast<float>(p))) : p;
    const T* v = v_cache + CacheRow(block_table, j, kv_head, s);
    for (int64_t i = 0; i < d; ++i) acc[i] += weight * v[i];
  }
  for (int64_t i = 0; i < d; ++i) out[i] = sum > 0 ? acc[i] / sum : T{0};
}

}  // namespace

template <typename T>
void WriteKvCache(const T* key, int64_t key_stride, const T* value, int64_t value_stride,
                  const int64_t* slot_mapping, int64_t num_tokens, const AttentionShape& shape,
                  T* k_cache, T* v_cache) {
  const int64_t d = shape.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;
    const int64_t block = slot / shape.block_size, row = slot % shape.block_size;
    for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
      const int64_t dst = ((block * shape.num_kv_heads + h) * shape.block_size + row) * d;
      std::copy_n(key + t * key_stride + h * d, d, k_cache + dst);
      std::copy_n(value + t * value_stride + h * d, d, v_cache + dst);
    }
  }
}

template <typename T>
void PagedDecodeAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                          const int32_t* block_tables, int64_t max_blocks_per_seq,
                          const int32_t* seq_lens, int64_t num_seqs, const AttentionShape& shape,
                          T* out, int64_t out_stride, ProbRounding rounding) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  for (int64_t s = 0; s < num_seqs; ++s) {
    for (int64_t h = 0; h < shape.num_q_heads; ++h) {
      AttendOneQuery(q + s * q_stride + h * shape.head_dim, k_cache, v_cache,
                     block_tables + s * max_blocks_per_seq, seq_lens[s] - 1, h / group, shape,
                     rounding, TreeRow{}, out + s * out_stride + h * shape.head_dim);
    }
  }
}

template <typename T>
void PagedPrefillAttention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                           const int32_t* block_tables, int64_t max_blocks_per_seq,
                           const int32_t* cu_q_lens, const int32_t* seq_lens, int64_t num_seqs,
                           const AttentionShape& shape, T* out, int64_t out_stride,
                           ProbRounding rounding, const AttentionTreeMask* tree) {
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = cu_q_lens[s + 1] - cu_q_lens[s];
    const int64_t first_pos = seq_lens[s] - q_len;
    const bool has_tree = tree != nullptr && tree->tree_starts[s] < seq_lens[s];
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t token = cu_q_lens[s] + i;
      TreeRow row;
      if (has_tree) {
        row = {tree->masks + token * tree->mask_words, std::max<int64_t>(0, tree->tree_starts[s]),
               tree->mask_words};
      }
      for (int64_t h = 0; h < shape.num_q_heads; ++h) {
        AttendOneQuery(q + token * q_stride + h * shape.head_dim, k_cache, v_cache,
                       block_tables + s * max_blocks_per_seq, first_pos + i, h / group, shape,
                       rounding, row, out + token * out_stride + h * shape.head_dim);
      }
    }
  }
}

template <typename T>
void MoveKvSlots(const int64_t* from_slots, const int64_t* to_slots, int64_t num_moves, T* kv,
                 int64_t num_layers, int64_t layer_stride, int64_t v_offset,
                 const AttentionShape& shape) {
  const int64_t d = shape.head_dim;
  auto row = [&](int64_t slot, int64_t head) {  // in one layer's K or V cache
    return ((slot / shape.block_size * shape.num_kv_heads + head) * shape.block_size +
            slot % shape.block_size) *
           d;
  };
  for (int64_t m = 0; m < num_moves; ++m) {
    const int64_t from = from_slots[m], to = to_slots[m];
    if (from < 0 || to < 0) continue;
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      for (T* cache : {kv + layer * layer_stride, kv + layer * layer_stride + v_offset}) {
        for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
          std::copy_n(cache + row(from, h), d, cache + row(to, h));
        }
      }
    }
  }
}

template void WriteKvCache<float>(const float*, int64_t, const float*, int64_t, const int64_t*,
                                  int64_t, const AttentionShape&, float*, float*);
template void WriteKvCache<double>(const double*, int64_t, const double*, int64_t, const int64_t*,
                                   int64_t, const AttentionShape&, double*, double*);
template void PagedDecodeAttention<float>(const float*, int64_t, const float*, const float*,
                                          const int32_t*, int64_t, const int32_t*, int64_t,
                                          const AttentionShape&, float*, int64_t, ProbRounding);
template void PagedDecodeAttention<double>(const double*, int64_t, const double*, const double*,
                                           const int32_t*, int64_t, const int32_t*, int64_t,
                                           const AttentionShape&, double*, int64_t, ProbRounding);
template void PagedPrefillAttention<float>(const float*, int64_t, const float*, const float*,
                                           const int32_t*, int64_t, const int32_t*, const int32_t*,
                                           int64_t, const AttentionShape&, float*, int64_t,
                                           ProbRounding, const AttentionTreeMask*);
template void PagedPrefillAttention<double>(const double*, int64_t, const double*, const double*,
                                            const int32_t*, int64_t, const int32_t*, const int32_t*,
                                            int64_t, const AttentionShape&, double*, int64_t,
                                            ProbRounding, const AttentionTreeMask*);
template void MoveKvSlots<float>(const int64_t*, const int64_t*, int64_t, float*, int64_t, int64_t,
                                 int64_t, const AttentionShape&);
template void MoveKvSlots<double>(const int64_t*, const int64_t*, int64_t, double*, int64_t,
                                  int64_t, int64_t, const AttentionShape&);
template void MoveKvSlots<uint16_t>(const int64_t*, const int64_t*, int64_t, uint16_t*, int64_t,
                                    int64_t, int64_t, const AttentionShape&);

}  // namespace specd::kernels::ref
