#include "kernels/ref/nsa.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/ref/bf16.h"

namespace specd::kernels::ref {
namespace {

// Offset of position `pos`'s row (kv head `kv_head`) in a paged cache of page_size rows.
int64_t CacheRow(const int32_t* table, int64_t pos, int64_t kv_head, const NsaShape& s) {
  const int64_t page = table[pos / s.page_size];
  return ((page * s.num_kv_heads + kv_head) * s.page_size + pos % s.page_size) * s.head_dim;
}

// out = softmax(scale q.k_j) v_j over the rows at `offsets` (into k / v); zeros when empty.
// Returns the probabilities (normalised) when `probs` is not null.
template <typename T>
void Attend(const T* q, const T* k, const T* v, const std::vector<int64_t>& offsets,
            const NsaShape& s, ProbRounding rounding, T* out, std::vector<T>* probs = nullptr) {
  const int64_t d = s.head_dim, n = static_cast<int64_t>(offsets.size());
  std::vector<T> scores(n);
  T max_score = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    T dot = 0;
    for (int64_t x = 0; x < d; ++x) dot += q[x] * k[offsets[i] + x];
    scores[i] = dot * static_cast<T>(s.scale);
    max_score = std::max(max_score, scores[i]);
  }
  T sum = 0;
  for (T& p : scores) {
    p = std::exp(p - max_score);
    sum += p;
  }
  std::vector<T> acc(d, T{0});
  for (int64_t i = 0; i < n; ++i) {
    const T w = rounding == ProbRounding::kBf16
                    ? static_cast<T>(RoundToBf16(static_cast<float>(scores[i])))
                    : scores[i];
    for (int64_t x = 0; x < d; ++x) acc[x] += w * v[offsets[i] + x];
  }
  for (int64_t x = 0; x < d; ++x) out[x] = sum > 0 ? acc[x] / sum : T{0};
  if (probs != nullptr) {
    probs->resize(n);
    for (int64_t i = 0; i < n; ++i) (*probs)[i] = scores[i] / sum;
  }
}

template <typename T>
T Sigmoid(T x) {
  return T{1} / (T{1} + std::exp(-x));
}

}  // namespace

int64_t NsaEntriesPerPage(const NsaShape& shape) {
  return std::max<int64_t>(1, shape.page_size / shape.block_size);
}

int64_t NsaEntryOffset(const int32_t* block_table, int64_t c, int64_t kv_head,
                       const NsaShape& shape) {
  const int64_t e = (c + 1) * shape.block_size - 1;
  const int64_t page = block_table[e / shape.page_size];
  const int64_t row = (e % shape.page_size) / shape.block_size;
  return ((page * shape.num_kv_heads + kv_head) * NsaEntriesPerPage(shape) + row) * shape.head_dim;
}

template <typename T>
std::vector<int32_t> NsaTopBlocks(T* scores, int64_t own_block, int64_t group, int64_t count) {
  for (int64_t forced : {int64_t{0}, own_block - 1, own_block}) {
    if (forced >= 0) scores[forced] = static_cast<T>(group);
  }
  std::vector<int32_t> order(own_block + 1);
  std::iota(order.begin(), order.end(), 0);
  if (static_cast<int64_t>(order.size()) > count) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return scores[a] > scores[b]; });
    order.resize(count);
    std::sort(order.begin(), order.end());
  }
  return order;
}

template <typename T>
void NsaCompress(const T* k_cache, const T* v_cache, const int32_t* block_tables,
                 int64_t max_blocks_per_seq, const int32_t* positions, const int32_t* token_seqs,
                 int64_t num_tokens, const NsaShape& shape, T* cmp_k, T* cmp_v) {
  const int64_t bs = shape.block_size, d = shape.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t p = positions[t];
    if (token_seqs[t] < 0 || p < 0 || (p + 1) % bs != 0) continue;
    const int32_t* table = block_tables + token_seqs[t] * max_blocks_per_seq;
    for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
      const int64_t entry = NsaEntryOffset(table, p / bs, g, shape);
      for (int64_t x = 0; x < d; ++x) {
        T key = 0, value = 0;
        for (int64_t j = p + 1 - bs; j <= p; ++j) {
          key += k_cache[CacheRow(table, j, g, shape) + x];
          value += v_cache[CacheRow(table, j, g, shape) + x];
        }
        cmp_k[entry + x] = key / static_cast<T>(bs);
        cmp_v[entry + x] = value / static_cast<T>(bs);
      }
    }
  }
}

template <typename T>
void NsaSelect(const T* q, int64_t q_stride, const T* cmp_k, const T* cmp_v,
               const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* positions,
               const int32_t* token_seqs, int64_t num_tokens, const NsaShape& shape, T* o_cmp,
               int64_t o_cmp_stride, int32_t* selections, T* block_scores, int64_t score_stride,
               ProbRounding rounding) {
  const int64_t bs = shape.block_size, d = shape.head_dim, count = shape.block_counts;
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  for (int64_t t = 0; t < num_tokens; ++t) {
    int32_t* sel = selections + t * shape.num_kv_heads * count;
    std::fill(sel, sel + shape.num_kv_heads * count, -1);
    if (token_seqs[t] < 0) continue;
    const int64_t p = positions[t], own = p / bs, visible = (p + 1) / bs;
    const int32_t* table = block_tables + token_seqs[t] * max_blocks_per_seq;
    for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
      std::vector<int64_t> offsets(visible);
      for (int64_t c = 0; c < visible; ++c) offsets[c] = NsaEntryOffset(table, c, g, shape);
      std::vector<T> scores(own + 1, T{0}), probs;
      for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t h = g * group + hh;
        Attend(q + t * q_stride + h * d, cmp_k, cmp_v, offsets, shape, rounding,
               o_cmp + t * o_cmp_stride + h * d, &probs);
        for (int64_t c = 0; c < visible; ++c) scores[c] += probs[c];
      }
      const std::vector<int32_t> chosen = NsaTopBlocks(scores.data(), own, group, count);
      std::copy(chosen.begin(), chosen.end(), sel + g * count);
      if (block_scores != nullptr) {
        T* dst = block_scores + (t * shape.num_kv_heads + g) * score_stride;
        std::copy_n(scores.begin(), std::min<int64_t>(own + 1, score_stride), dst);
      }
    }
  }
}

template <typename T>
void NsaAttend(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
               const int32_t* block_tables, int64_t max_blocks_per_seq, const int32_t* positions,
               const int32_t* token_seqs, const int32_t* groups, int64_t num_groups,
               const int32_t* selections, bool shared_selection, const T* o_cmp,
               int64_t o_cmp_stride, const T* gate_logits, int64_t gate_stride,
               const NsaShape& shape, T* out, int64_t out_stride, ProbRounding rounding) {
  const int64_t bs = shape.block_size, d = shape.head_dim, count = shape.block_counts;
  const int64_t group = shape.num_q_heads / shape.num_kv_heads;
  std::vector<T> slc(d), swa(d);
  for (int64_t gi = 0; gi < num_groups; ++gi) {
    const int64_t first = groups[2 * gi], n = groups[2 * gi + 1];
    for (int64_t t = first; t < first + n; ++t) {
      if (token_seqs[t] < 0) continue;
      const int64_t p = positions[t];
      const int32_t* table = block_tables + token_seqs[t] * max_blocks_per_seq;
      const int64_t source = shared_selection ? first : t;
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        const int32_t* sel = selections + (source * shape.num_kv_heads + g) * count;
        std::vector<int64_t> blocks;
        for (int64_t k = 0; k < count; ++k) {
          if (sel[k] >= 0) blocks.push_back(sel[k]);
        }
        std::sort(blocks.begin(), blocks.end());
        blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
        std::vector<int64_t> selected, window;
        for (int64_t b : blocks) {
          for (int64_t j = b * bs; j < (b + 1) * bs && j <= p; ++j) {
            selected.push_back(CacheRow(table, j, g, shape));
          }
        }
        for (int64_t j = std::max<int64_t>(0, p - shape.window_size + 1); j <= p; ++j) {
          window.push_back(CacheRow(table, j, g, shape));
        }
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t h = g * group + hh;
          Attend(q + t * q_stride + h * d, k_cache, v_cache, selected, shape, rounding, slc.data());
          Attend(q + t * q_stride + h * d, k_cache, v_cache, window, shape, rounding, swa.data());
          const T* gate = gate_logits + t * gate_stride + 3 * h;
          const T g_cmp = Sigmoid(gate[0]), g_slc = Sigmoid(gate[1]), g_swa = Sigmoid(gate[2]);
          const T* cmp = o_cmp + t * o_cmp_stride + h * d;
          T* o = out + t * out_stride + h * d;
          for (int64_t x = 0; x < d; ++x) o[x] = g_slc * slc[x] + g_cmp * cmp[x] + g_swa * swa[x];
        }
      }
    }
  }
}

#define SPECD_NSA_REF_INSTANTIATE(T)                                                         \
  template std::vector<int32_t> NsaTopBlocks<T>(T*, int64_t, int64_t, int64_t);              \
  template void NsaCompress<T>(const T*, const T*, const int32_t*, int64_t, const int32_t*,  \
                               const int32_t*, int64_t, const NsaShape&, T*, T*);            \
  template void NsaSelect<T>(const T*, int64_t, const T*, const T*, const int32_t*, int64_t, \
                             const int32_t*, const int32_t*, int64_t, const NsaShape&, T*,   \
                             int64_t, int32_t*, T*, int64_t, ProbRounding);                  \
  template void NsaAttend<T>(const T*, int64_t, const T*, const T*, const int32_t*, int64_t, \
                             const int32_t*, const int32_t*, const int32_t*, int64_t,        \
                             const int32_t*, bool, const T*, int64_t, const T*, int64_t,     \
                             const NsaShape&, T*, int64_t, ProbRounding);
SPECD_NSA_REF_INSTANTIATE(float)
SPECD_NSA_REF_INSTANTIATE(double)
#undef SPECD_NSA_REF_INSTANTIATE

}  // namespace specd::kernels::ref
