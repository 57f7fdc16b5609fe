#include "kernels/ref/vocab_merge.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "kernels/ref/sampling.h"

namespace specd::kernels::ref {

void ShardCandidates(const float* logits, int64_t stride, int32_t num_rows, int32_t local_vocab,
                     int32_t k, int32_t id_base, int32_t* pairs) {
  const int32_t kept = std::min(k, local_vocab);
  std::vector<int32_t> ids(static_cast<size_t>(std::max(kept, 1)));
  const auto empty = std::bit_cast<int32_t>(-std::numeric_limits<float>::infinity());
  for (int32_t r = 0; r < num_rows; ++r) {
    int32_t* out = pairs + int64_t{r} * k * 2;
    const float* row = logits + r * stride;
    if (kept > 0) TopKRows(row, stride, 1, local_vocab, kept, ids.data());
    for (int32_t j = 0; j < k; ++j) {
      out[2 * j] = j < kept ? std::bit_cast<int32_t>(row[ids[j]]) : empty;
      out[2 * j + 1] = j < kept ? id_base + ids[j] : kVocabMergeNoId;
    }
  }
}

void ScatterCandidates(const int32_t* pairs, int32_t world, int32_t num_rows, int32_t k,
                       int32_t vocab, float* out, int64_t stride) {
  for (int32_t r = 0; r < num_rows; ++r) {
    std::fill(out + r * stride, out + r * stride + vocab, -std::numeric_limits<float>::infinity());
  }
  for (int32_t w = 0; w < world; ++w) {
    for (int32_t r = 0; r < num_rows; ++r) {
      const int32_t* p = pairs + (int64_t{w} * num_rows + r) * k * 2;
      for (int32_t j = 0; j < k; ++j) {
        const int32_t id = p[2 * j + 1];
        if (id >= 0 && id < vocab) out[r * stride + id] = std::bit_cast<float>(p[2 * j]);
      }
    }
  }
}

}  // namespace specd::kernels::ref
