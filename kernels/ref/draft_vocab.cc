#include "kernels/ref/draft_vocab.h"

#include <algorithm>

namespace specd::kernels::ref {

void MapIds(const int32_t* ids, int32_t n, const int32_t* map, int32_t map_size, int32_t* out) {
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = ids[i];
    out[i] = id >= 0 && id < map_size ? map[id] : -1;
  }
}

template <typename T>
void ExpandColumns(const T* src, int64_t src_stride, int32_t num_rows, int32_t num_src_cols,
                   const int32_t* cols, T* dst, int64_t dst_stride, int32_t num_dst_cols, T fill) {
  for (int64_t r = 0; r < num_rows; ++r) {
    T* row = dst + r * dst_stride;
    std::fill(row, row + num_dst_cols, fill);
    for (int32_t c = 0; c < num_src_cols; ++c) row[cols[c]] = src[r * src_stride + c];
  }
}

template void ExpandColumns<float>(const float*, int64_t, int32_t, int32_t, const int32_t*, float*,
                                   int64_t, int32_t, float);
template void ExpandColumns<double>(const double*, int64_t, int32_t, int32_t, const int32_t*,
                                    double*, int64_t, int32_t, double);

}  // namespace specd::kernels::ref
