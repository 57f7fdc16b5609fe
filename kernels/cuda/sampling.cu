// Sampling launchers (layer 2): validate, pick the load width, launch, report.
#include <algorithm>
#include <climits>

#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/topk.cuh"

namespace specd::kernels {
namespace {

// Every row starts 16 bytes aligned.
bool RowsVec4(const float* logits, int64_t stride) {
  return IsAligned(logits, 16) && stride % 4 == 0;
}

bool ValidRows(int64_t stride, int32_t num_rows, int32_t vocab) {
  return vocab >= 1 && stride >= vocab && num_rows >= 0;
}

// Stage-1 blocks per row of TopKRows.
int64_t TopKChunks(int32_t vocab) { return CeilDiv(vocab, kTopKChunk); }

}  // namespace

cudaError_t ArgmaxRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                       int32_t* out_ids, cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab)) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  ArgmaxRowsKernel<<<static_cast<unsigned>(num_rows), kArgmaxThreads, 0, stream>>>(
      logits, stride, vocab, RowsVec4(logits, stride), out_ids);
  return cudaGetLastError();
}

cudaError_t LogSoftmaxAt(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                         const int32_t* ids, int32_t k, float* out, cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) || k < 1 || k > kMaxTopK) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  LogSoftmaxAtKernel<<<static_cast<unsigned>(num_rows), kArgmaxThreads, 0, stream>>>(
      logits, stride, vocab, RowsVec4(logits, stride), ids, k, out);
  return cudaGetLastError();
}

size_t TopKWorkspaceBytes(int32_t num_rows, int32_t vocab, int32_t k) {
  if (num_rows <= 0 || vocab <= kTopKChunk || k <= 0) return 0;  // one chunk: no merge
  return static_cast<size_t>(num_rows) * static_cast<size_t>(TopKChunks(vocab)) *
         static_cast<size_t>(k) * sizeof(uint64_t);
}

cudaError_t TopKRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                     int32_t k, int32_t* out_ids, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) || k < 1 || k > std::min(kMaxTopK, vocab)) {
    return cudaErrorInvalidValue;
  }
  const size_t needed = TopKWorkspaceBytes(num_rows, vocab, k);
  const int64_t num_chunks = TopKChunks(vocab), num_blocks = num_rows * num_chunks;
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr) ||
      !IsAligned(workspace, alignof(uint64_t)) || num_blocks > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  auto* candidates = static_cast<uint64_t*>(workspace);
  const auto grid = static_cast<unsigned>(num_blocks);
  const auto chunks = static_cast<int>(num_chunks);
  if (RowsVec4(logits, stride)) {
    TopKChunksKernel<true>
        <<<grid, kTopKThreads, 0, stream>>>(logits, stride, vocab, chunks, k, candidates, out_ids);
  } else {
    TopKChunksKernel<false>
        <<<grid, kTopKThreads, 0, stream>>>(logits, stride, vocab, chunks, k, candidates, out_ids);
  }
  if (num_chunks == 1) return cudaGetLastError();
  const cudaError_t stage1 = cudaGetLastError();
  if (stage1 != cudaSuccess) return stage1;
  TopKMergeKernel<<<static_cast<unsigned>(num_rows), kWarpSize, 0, stream>>>(candidates, chunks * k,
                                                                             k, out_ids);
  return cudaGetLastError();
}

size_t PenaltyWorkspaceBytes(int32_t num_rows, int32_t vocab) {
  if (num_rows <= 0 || vocab <= 0) return 0;
  return static_cast<size_t>(num_rows) * static_cast<size_t>(vocab) * sizeof(uint32_t);
}

cudaError_t ApplyPenalties(float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                           const int32_t* prompt_ids, const int32_t* prompt_offsets,
                           const int32_t* output_ids, const int32_t* output_offsets,
                           const float* penalties, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) ||
      workspace_bytes < PenaltyWorkspaceBytes(num_rows, vocab) ||
      !IsAligned(workspace, alignof(uint32_t))) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  ApplyPenaltiesKernel<<<static_cast<unsigned>(num_rows), kPenaltyThreads, 0, stream>>>(
      logits, stride, vocab, prompt_ids, prompt_offsets, output_ids, output_offsets, penalties,
      static_cast<uint32_t*>(workspace));
  return cudaGetLastError();
}

size_t SampleWorkspaceBytes(int32_t /*num_rows*/, int32_t /*vocab*/) { return 0; }

cudaError_t SampleRows(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                       const SamplingRow* rows, int32_t* out_ids, float* out_logprobs,
                       void* /*workspace*/, size_t workspace_bytes, cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) || vocab > kMaxSampleVocab ||
      workspace_bytes < SampleWorkspaceBytes(num_rows, vocab)) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  SampleRowsKernel<<<static_cast<unsigned>(num_rows), kSampleThreads, 0, stream>>>(
      logits, stride, vocab, RowsVec4(logits, stride), rows, out_ids, out_logprobs);
  return cudaGetLastError();
}

cudaError_t SampleUniforms(const SamplingRow* rows, int32_t num_rows, double* out,
                           cudaStream_t stream) {
  if (num_rows < 0) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  constexpr int kThreads = 128;
  SampleUniformsKernel<<<static_cast<unsigned>(CeilDiv(num_rows, kThreads)), kThreads, 0, stream>>>(
      rows, num_rows, out);
  return cudaGetLastError();
}

cudaError_t ProcessedProbs(const float* logits, int64_t stride, int32_t num_rows, int32_t vocab,
                           const SamplingRow* rows, float* out, int64_t out_stride,
                           cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) || out_stride < vocab || vocab > kMaxSampleVocab) {
    return cudaErrorInvalidValue;
  }
  if (num_rows == 0) return cudaSuccess;
  ProcessedProbsKernel<<<static_cast<unsigned>(num_rows), kSampleThreads, 0, stream>>>(
      logits, stride, vocab, RowsVec4(logits, stride), rows, out, out_stride);
  return cudaGetLastError();
}

cudaError_t SaguaroDownweightRows(float* probs, int64_t stride, int32_t num_rows, int32_t vocab,
                                  const int32_t* ids, int32_t ids_stride, const int32_t* fan_out,
                                  const float* c, cudaStream_t stream) {
  if (!ValidRows(stride, num_rows, vocab) || ids_stride < 1) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  SaguaroDownweightKernel<<<static_cast<unsigned>(num_rows), kSaguaroThreads, 0, stream>>>(
      probs, stride, vocab, ids, ids_stride, fan_out, c);
  return cudaGetLastError();
}

cudaError_t ScatterRows(const float* src, int64_t src_stride, int32_t num_rows, int32_t cols,
                        const int32_t* dst_rows, float* dst, int64_t dst_stride,
                        cudaStream_t stream) {
  if (!ValidRows(src_stride, num_rows, cols) || dst_stride < cols) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  const bool vec4 = RowsVec4(src, src_stride) && RowsVec4(dst, dst_stride);
  // About kRowUnroll accesses per thread, within gridDim.y's limit (the kernel strides over it).
  const int64_t units = vec4 ? CeilDiv(cols, 4) : cols;
  const auto blocks_per_row =
      static_cast<unsigned>(std::min<int64_t>(CeilDiv(units, kScatterThreads * kRowUnroll), 65535));
  const dim3 grid(static_cast<unsigned>(num_rows), blocks_per_row);
  if (vec4) {
    ScatterRowsKernel<true>
        <<<grid, kScatterThreads, 0, stream>>>(src, src_stride, cols, dst_rows, dst, dst_stride);
  } else {
    ScatterRowsKernel<false>
        <<<grid, kScatterThreads, 0, stream>>>(src, src_stride, cols, dst_rows, dst, dst_stride);
  }
  return cudaGetLastError();
}

}  // namespace specd::kernels
