// References for the draft-vocabulary kernels (kernels/cuda/draft_vocab.h). An EAGLE-3 draft
// head's LM head covers a reduced "draft vocabulary" of dv ids, each standing for one target id
// (the checkpoint's d2t, made absolute: engine/model/eagle3_head.h). MapIds turns the head's
// draft ids into target ids; ExpandColumns writes its [rows, dv] logits or probabilities out over
// the target's vocabulary (fill everywhere else), where verification and sampling expect them.
// They define what the kernels compute. Pure functions, any thread.
#pragma once

#include <cstdint>

namespace specd::kernels::ref {

// out[i] = map[ids[i]] when 0 <= ids[i] < map_size, else -1 (a negative id, "no draw", stays
// negative). out may equal ids (in place).
//   ids [n] int32, host, in;  map [map_size] int32, host, in;  out [n] int32, host, out
void MapIds(const int32_t* ids, int32_t n, const int32_t* map, int32_t map_size, int32_t* out);

// dst[i, :num_dst_cols] = fill, then dst[i, cols[c]] = src[i, c] for c < num_src_cols, for every
// i < num_rows (kernels/cuda/draft_vocab.h ExpandColumns). Elements past num_dst_cols in a row's
// stride are left alone.
//   src  [num_rows, num_src_cols] T, host, in; row stride `src_stride`
//   cols [num_src_cols] int32, host, in: distinct columns in [0, num_dst_cols)
//   dst  [num_rows, num_dst_cols] T, host, out; row stride `dst_stride`; must not overlap src
template <typename T>
void ExpandColumns(const T* src, int64_t src_stride, int32_t num_rows, int32_t num_src_cols,
                   const int32_t* cols, T* dst, int64_t dst_stride, int32_t num_dst_cols, T fill);

extern template void ExpandColumns<float>(const float*, int64_t, int32_t, int32_t, const int32_t*,
                                          float*, int64_t, int32_t, float);
extern template void ExpandColumns<double>(const double*, int64_t, int32_t, int32_t, const int32_t*,
                                           double*, int64_t, int32_t, double);

}  // namespace specd::kernels::ref
