#include "kernels/ref/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

namespace specd::kernels::ref {
namespace {

template <typename T>
T NanAsNegInf(T v) {
  return std::isnan(v) ? -std::numeric_limits<T>::infinity() : v;
}

template <typename T>
int32_t ArgmaxRow(const T* row, int32_t vocab) {
  int32_t best = 0;
  T best_value = NanAsNegInf(row[0]);
  for (int32_t i = 1; i < vocab; ++i) {
    const T v = NanAsNegInf(row[i]);
    if (v > best_value) {
      best_value = v;
      best = i;
    }
  }
  return best;
}

template <typename T>
T RowMax(const T* row, int32_t vocab) {
  T m = -std::numeric_limits<T>::infinity();
  for (int32_t i = 0; i < vocab; ++i) m = std::max(m, NanAsNegInf(row[i]));
  return m;
}

bool Greedy(const SampleParams& params) { return !(params.temperature > 0.0f); }

// Smallest |p / threshold - 1| over p not equal to threshold (1 when there is none).
template <typename T>
double RelativeMargin(const std::vector<T>& p, T threshold) {
  double margin = 1.0;
  if (!(threshold > 0)) return margin;
  for (T v : p) {
    if (v != threshold) {
      margin = std::min(margin, std::abs(static_cast<double>(v) / threshold - 1.0));
    }
  }
  return margin;
}

// Top-p over the survivors (kept > 0 or kept tokens of probability 0): zeroes the tokens whose
// strictly-more-probable mass is >= top_p * M (unless it is 0), and records the margin.
template <typename T>
void ApplyTopP(float top_p, const std::vector<bool>& in_s, FilteredRow<T>* row) {
  std::vector<T> values;
  for (size_t i = 0; i < in_s.size(); ++i) {
    if (in_s[i]) values.push_back(row->kept[i]);
  }
  std::sort(values.begin(), values.end(), std::greater<T>());
  T mass = 0;
  for (T v : values) mass += v;
  const T target = static_cast<T>(top_p) * mass;
  // Walk the distinct values downwards; G is the mass strictly above the current value.
  T above = 0;
  T cut = values.empty() ? T{0} : values.front();
  for (size_t i = 0; i < values.size();) {
    size_t j = i;
    T group = 0;
    while (j < values.size() && values[j] == values[i]) group += values[j++];
    if (mass > 0) {
      row->filter_margin =
          std::min(row->filter_margin,
                   std::abs(static_cast<double>(above - target) / static_cast<double>(mass)));
    }
    if (above < target || above == 0) cut = values[i];
    above += group;
    i = j;
  }
  for (size_t i = 0; i < in_s.size(); ++i) {
    if (!in_s[i] || row->kept[i] < cut) row->kept[i] = 0;
  }
}

}  // namespace

template <typename T>
void ArgmaxRows(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                int32_t* out_ids) {
  for (int32_t r = 0; r < num_rows; ++r) out_ids[r] = ArgmaxRow(logits + r * stride, vocab);
}

template <typename T>
void TopKRows(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab, int32_t k,
              int32_t* out_ids) {
  std::vector<int32_t> ids(vocab);
  for (int32_t r = 0; r < num_rows; ++r) {
    const T* row = logits + r * stride;
    std::iota(ids.begin(), ids.end(), 0);
    // (value desc, id asc) is a strict total order once NaN is -inf.
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [row](int32_t a, int32_t b) {
      const T va = NanAsNegInf(row[a]), vb = NanAsNegInf(row[b]);
      return va > vb || (va == vb && a < b);
    });
    std::copy(ids.begin(), ids.begin() + k, out_ids + static_cast<int64_t>(r) * k);
  }
}

template <typename T>
void LogSoftmaxAt(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                  const int32_t* ids, int32_t k, T* out) {
  const T inf = std::numeric_limits<T>::infinity();
  for (int32_t r = 0; r < num_rows; ++r) {
    const T* row = logits + r * stride;
    T max = -inf;
    for (int32_t v = 0; v < vocab; ++v) max = std::max(max, NanAsNegInf(row[v]));
    T sum = 0;
    for (int32_t v = 0; v < vocab && max > -inf; ++v) {
      const T x = NanAsNegInf(row[v]);
      if (x > -inf) sum += std::exp(x - max);
    }
    const T lse = max + std::log(sum);
    for (int32_t j = 0; j < k; ++j) {
      const int32_t id = ids[static_cast<int64_t>(r) * k + j];
      const T x = id >= 0 && id < vocab ? NanAsNegInf(row[id]) : -inf;
      out[static_cast<int64_t>(r) * k + j] = max > -inf && x > -inf ? x - lse : -inf;
    }
  }
}

template <typename T>
void ApplyPenalties(T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                    const int32_t* prompt_ids, const int32_t* prompt_offsets,
                    const int32_t* output_ids, const int32_t* output_offsets,
                    const float* penalties) {
  std::vector<int32_t> counts(vocab);
  std::vector<bool> seen(vocab);
  for (int32_t r = 0; r < num_rows; ++r) {
    T* row = logits + r * stride;
    const T repetition = penalties[3 * r], presence = penalties[3 * r + 1],
            frequency = penalties[3 * r + 2];
    std::fill(counts.begin(), counts.end(), 0);
    std::fill(seen.begin(), seen.end(), false);
    for (int32_t j = output_offsets[r]; j < output_offsets[r + 1]; ++j) {
      if (output_ids[j] >= 0 && output_ids[j] < vocab) ++counts[output_ids[j]];
    }
    auto penalize = [&](int32_t id) {
      if (id < 0 || id >= vocab || seen[id]) return;
      seen[id] = true;
      T v = row[id];
      v = v > 0 ? v / repetition : v * repetition;
      if (counts[id] > 0) v -= frequency * static_cast<T>(counts[id]) + presence;
      row[id] = v;
    };
    for (int32_t j = prompt_offsets[r]; j < prompt_offsets[r + 1]; ++j) penalize(prompt_ids[j]);
    for (int32_t j = output_offsets[r]; j < output_offsets[r + 1]; ++j) penalize(output_ids[j]);
  }
}

template <typename T>
FilteredRow<T> FilterRow(const T* logits, int32_t vocab, const SampleParams& params) {
  FilteredRow<T> row;
  row.kept.resize(vocab);
  const T m = RowMax(logits, vocab);
  const T temperature = static_cast<T>(params.temperature);
  for (int32_t i = 0; i < vocab; ++i) {
    const T l = NanAsNegInf(logits[i]);
    row.kept[i] = l == -std::numeric_limits<T>::infinity() ? T{0} : std::exp((l - m) / temperature);
  }
  const std::vector<T> p = row.kept;
  T threshold = 0;
  if (params.min_p > 0.0f) {
    const T min_p = static_cast<T>(std::min(params.min_p, 1.0f));
    row.filter_margin = std::min(row.filter_margin, RelativeMargin(p, min_p));
    threshold = min_p;
  }
  if (params.top_k > 0 && params.top_k < vocab) {
    std::vector<T> sorted = p;
    std::nth_element(sorted.begin(), sorted.begin() + (params.top_k - 1), sorted.end(),
                     std::greater<T>());
    const T kth = sorted[params.top_k - 1];
    row.filter_margin = std::min(row.filter_margin, RelativeMargin(p, kth));
    threshold = std::max(threshold, kth);
  }
  std::vector<bool> in_s(vocab);
  for (int32_t i = 0; i < vocab; ++i) {
    in_s[i] = p[i] >= threshold;
    if (!in_s[i]) row.kept[i] = 0;
  }
  if (params.top_p < 1.0f) ApplyTopP(params.top_p, in_s, &row);
  for (T v : row.kept) row.kept_mass += v;
  return row;
}

template <typename T>
int32_t InverseCdf(const T* weights, int32_t vocab, double u) {
  T total = 0;
  for (int32_t i = 0; i < vocab; ++i) total += weights[i];
  const T target = static_cast<T>(u) * total;
  T cumulative = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (!(weights[i] > 0)) continue;
    cumulative += weights[i];
    last = i;
    if (target < cumulative) return i;
  }
  return last;  // u * total rounded up to the total: the last positive weight
}

template <typename T>
int32_t SampleRow(const T* logits, int32_t vocab, const SampleParams& params, double u) {
  if (Greedy(params) || !std::isfinite(RowMax(logits, vocab))) return ArgmaxRow(logits, vocab);
  // The most probable token (p = 1) survives every filter, so the draw finds a kept token.
  return InverseCdf(FilterRow(logits, vocab, params).kept.data(), vocab, u);
}

template <typename T>
void ProcessedProbs(const T* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                    const SampleParams* params, T* out, int64_t out_stride) {
  for (int32_t r = 0; r < num_rows; ++r) {
    const T* row = logits + r * stride;
    std::vector<T> probs(vocab, T{0});
    const T m = RowMax(row, vocab);
    if (m == -std::numeric_limits<T>::infinity()) {
      // No token at all: zeros.
    } else if (Greedy(params[r]) || !std::isfinite(m)) {
      probs[ArgmaxRow(row, vocab)] = 1;
    } else {
      const FilteredRow<T> f = FilterRow(row, vocab, params[r]);
      for (int32_t i = 0; i < vocab; ++i) probs[i] = f.kept[i] / f.kept_mass;
    }
    std::copy(probs.begin(), probs.end(), out + r * out_stride);  // after every read: in place
  }
}

template <typename T>
void ScatterRows(const T* src, int64_t src_stride, int32_t num_rows, int32_t cols,
                 const int32_t* dst_rows, T* dst, int64_t dst_stride) {
  for (int32_t r = 0; r < num_rows; ++r) {
    std::copy(src + r * src_stride, src + r * src_stride + cols, dst + dst_rows[r] * dst_stride);
  }
}

template <typename T>
T RawLogprob(const T* logits, int32_t vocab, int32_t id) {
  const T m = RowMax(logits, vocab);
  T sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(NanAsNegInf(logits[i]) - m);
  return NanAsNegInf(logits[id]) - m - std::log(sum);
}

void SaguaroDownweightRows(float* probs, int64_t stride, int32_t num_rows, int32_t vocab,
                           const int32_t* ids, int32_t ids_stride, const int32_t* fan_out,
                           const float* c) {
  for (int32_t r = 0; r < num_rows; ++r) {
    const float down = c[r];
    if (fan_out[r] <= 0 || std::isnan(down) || down >= 1.0f) continue;
    const double cr = std::max(0.0f, down);
    float* row = probs + r * stride;
    // The distinct in-range cached ids, in order.
    std::vector<int32_t> cached;
    for (int32_t j = 0; j < fan_out[r]; ++j) {
      const int32_t id = ids[int64_t{r} * ids_stride + j];
      if (id < 0 || id >= vocab || std::find(cached.begin(), cached.end(), id) != cached.end()) {
        continue;
      }
      cached.push_back(id);
    }
    // Take the cached entries out of the row; what remains is the rest's mass.
    std::vector<float> kept(cached.size());
    double cached_mass = 0, other_mass = 0;
    for (size_t j = 0; j < cached.size(); ++j) {
      kept[j] = row[cached[j]];
      cached_mass += kept[j];
      row[cached[j]] = 0.0f;
    }
    for (int32_t v = 0; v < vocab; ++v) other_mass += row[v];
    const double total = cr * cached_mass + other_mass;
    if (!(total > 0)) {
      for (size_t j = 0; j < cached.size(); ++j) row[cached[j]] = kept[j];
      continue;
    }
    const double scale = 1.0 / total;
    for (int32_t v = 0; v < vocab; ++v) row[v] = static_cast<float>(row[v] * scale);
    for (size_t j = 0; j < cached.size(); ++j) {
      row[cached[j]] = static_cast<float>(cr * kept[j] * scale);
    }
  }
}

#define SPECD_SAMPLING_REF_INSTANTIATE(T)                                                          \
  template void ArgmaxRows<T>(const T*, int64_t, int32_t, int32_t, int32_t*);                      \
  template void TopKRows<T>(const T*, int64_t, int32_t, int32_t, int32_t, int32_t*);               \
  template void LogSoftmaxAt<T>(const T*, int64_t, int32_t, int32_t, const int32_t*, int32_t, T*); \
  template void ApplyPenalties<T>(T*, int64_t, int32_t, int32_t, const int32_t*, const int32_t*,   \
                                  const int32_t*, const int32_t*, const float*);                   \
  template FilteredRow<T> FilterRow<T>(const T*, int32_t, const SampleParams&);                    \
  template int32_t InverseCdf<T>(const T*, int32_t, double);                                       \
  template int32_t SampleRow<T>(const T*, int32_t, const SampleParams&, double);                   \
  template void ProcessedProbs<T>(const T*, int64_t, int32_t, int32_t, const SampleParams*, T*,    \
                                  int64_t);                                                        \
  template void ScatterRows<T>(const T*, int64_t, int32_t, int32_t, const int32_t*, T*, int64_t);  \
  template T RawLogprob<T>(const T*, int32_t, int32_t);
SPECD_SAMPLING_REF_INSTANTIATE(float)
SPECD_SAMPLING_REF_INSTANTIATE(double)
#undef SPECD_SAMPLING_REF_INSTANTIATE

}  // namespace specd::kernels::ref
