#include "kernels/ref/embedding.h"

namespace specd::kernels::ref {

template <typename T>
void EmbeddingGather(const int32_t* token_ids, int64_t num_tokens, const T* table,
                     int64_t vocab_start, int64_t num_rows, int64_t hidden, T* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t row = static_cast<int64_t>(token_ids[t]) - vocab_start;
    const bool in_shard = row >= 0 && row < num_rows;
    for (int64_t i = 0; i < hidden; ++i) {
      out[t * hidden + i] = in_shard ? table[row * hidden + i] : T{0};
    }
  }
}

template void EmbeddingGather<float>(const int32_t*, int64_t, const float*, int64_t, int64_t,
                                     int64_t, float*);
template void EmbeddingGather<double>(const int32_t*, int64_t, const double*, int64_t, int64_t,
                                      int64_t, double*);

template <typename T>
void CopyRows(const int32_t* src, const int32_t* dst, int64_t count, T* table, int64_t row_elems) {
  for (int64_t i = 0; i < count; ++i) {
    const T* from = table + int64_t{src[i]} * row_elems;
    T* to = table + int64_t{dst[i]} * row_elems;
    if (from == to) continue;
    for (int64_t j = 0; j < row_elems; ++j) to[j] = from[j];
  }
}

template void CopyRows<float>(const int32_t*, const int32_t*, int64_t, float*, int64_t);
template void CopyRows<uint16_t>(const int32_t*, const int32_t*, int64_t, uint16_t*, int64_t);

}  // namespace specd::kernels::ref
