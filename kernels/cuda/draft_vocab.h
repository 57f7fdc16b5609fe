// Draft-vocabulary launchers for the CUDA backend. An EAGLE-3 draft head (Li et al. 2025, arXiv
// 2503.01840) has an LM head over a reduced "draft vocabulary" of dv ids, each standing for one
// target id (the checkpoint's d2t, made absolute: engine/model/eagle3_head.h). MapIds turns the
// head's draws into target ids; ExpandColumns writes its [rows, dv] logits or probabilities out
// over the target's vocabulary, where verification and the target's sampling expect them.
// References: kernels/ref/draft_vocab.h. Any host thread; queued on `stream`, no allocation, no
// synchronisation; graph-capturable. Launchers return cudaErrorInvalidValue for sizes they cannot
// run (and queue nothing); they cannot check device contents (ids, columns), which the caller
// guarantees where stated.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t; no runtime functions

#include <cstdint>

namespace specd::kernels {

// out[i] = map[ids[i]] for i < n when 0 <= ids[i] < map_size, else -1 (a draft head's draft ids
// mapped to target ids; a negative id -- "no draw" -- stays negative). out may equal ids (in
// place): each element is read and written by one thread. One thread per id.
//   ids  [n] int32, device, in
//   map  [map_size] int32, device, in: target id of each draft id
//   out  [n] int32, device, out
// cudaErrorInvalidValue unless n >= 0 and map_size >= 1. n == 0 launches nothing.
cudaError_t MapIds(const int32_t* ids, int32_t n, const int32_t* map, int32_t map_size,
                   int32_t* out, cudaStream_t stream);

// Rows over a sub-vocabulary written out over the full one: dst[i, :num_dst_cols] = fill, then
// dst[i, cols[c]] = src[i, c] for c < num_src_cols, for every i < num_rows (fill is -INFINITY for
// logits, 0 for probabilities). Elements past num_dst_cols in dst's row stride are left alone.
// Algorithm, one launch: block (i, y) owns columns [y * chunk, (y + 1) * chunk) of row i. It
// fills a shared-memory copy of them, passes a barrier, reads all of cols and copies in the source
// values whose column it owns, then writes the chunk out once, coalesced (16-byte stores when dst
// is 16-byte aligned and dst_stride % 4 == 0). Each element of dst is written by one block, once,
// so no fill can land on a copied value and blocks need no ordering. A chunk holds at most 48K
// columns (192 KiB of shared memory; less where the device allows less), and a row is cut into
// more chunks, of at least 4096 columns, while num_rows * chunks stays within one block per SM:
// few rows still spread over the GPU, while many rows reread cols (from L2) only as often as the
// stage requires. Staging keeps the copies from scattering partial writes over lines the fill
// already wrote out: writing the fill to dst and then scattering into it ran at half the speed
// from 128 rows (H200: 256 x 128256 in 128 us vs 62 us).
//   src   [num_rows, num_src_cols] f32, device, in; row stride src_stride
//   cols  [num_src_cols] int32, device, in: distinct columns in [0, num_dst_cols) (caller's
//         promise, unchecked)
//   dst   [num_rows, num_dst_cols] f32, device, out; row stride dst_stride; must not overlap src
// cudaErrorInvalidValue unless num_rows >= 0, 1 <= num_src_cols <= num_dst_cols,
// src_stride >= num_src_cols and dst_stride >= num_dst_cols. num_rows == 0 launches nothing.
cudaError_t ExpandColumns(const float* src, int64_t src_stride, int32_t num_rows,
                          int32_t num_src_cols, const int32_t* cols, float* dst, int64_t dst_stride,
                          int32_t num_dst_cols, float fill, cudaStream_t stream);

}  // namespace specd::kernels
