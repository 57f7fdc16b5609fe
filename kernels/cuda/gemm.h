// Dense GEMMs of the CUDA backend through cuBLASLt (decode-sized m through the GEMV of gemv.h):
// y = x W^T (+ bias) with W in Hugging Face's
// nn.Linear layout [out_features, in_features], bf16 operands, fp32 accumulation, bf16 or fp32
// output. Plain C++ (no nvcc needed). One Gemm object per stream; not thread-safe. kernels/
// depends on the CUDA libraries alone, so errors are strings, not absl::Status.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct __nv_bfloat16;

namespace specd::kernels {

enum class GemmOut { kBf16, kF32 };

class Gemm {
 public:
  // Creates the cuBLASLt handle and owns a workspace of workspace_bytes (cuBLASLt's algorithms
  // need one to be graph-capturable; 32 MiB is what PyTorch uses on Hopper).
  // Null on failure, with the reason in *error.
  static std::unique_ptr<Gemm> Create(size_t workspace_bytes, std::string* error);
  ~Gemm();

  // y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]), rounded once to the output type.
  //   x     [m, k] bf16 row-major, device; row stride ldx elements (>= k)
  //   w     [n, k] bf16 row-major, device
  //   bias  [n] bf16, device, or null
  //   y     [m, n] bf16 or f32 (out_type) row-major, device; row stride ldy (>= n)
  // Algorithms are chosen by cuBLASLt's heuristic once per shape (m, n, k, ldx, ldy, out_type,
  // bias or not, and the pointers' alignments: the heuristic assumes 256 bytes unless told, so
  // sub-buffers at any offset are fine) and cached; the first call for a shape must not be
  // inside stream capture (warm shapes up first). With a bias and f32 output
  // cuBLASLt may reject a bf16 bias vector in the epilogue; the bias is then added by a second,
  // rank-1 GEMM (y += ones[m] bias^T) into the same y.
  // m == 0 does nothing. False on failure (bad sizes, no algorithm, a cuBLASLt error), with the
  // reason in *error.
  bool Run(const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* w, const __nv_bfloat16* bias,
           int64_t m, int64_t n, int64_t k, void* y, int64_t ldy, GemmOut out_type,
           cudaStream_t stream, std::string* error);

  // Tests: false routes f32-output biases through the rank-1 update even where cuBLASLt
  // accepts the epilogue, so both paths can be checked. Affects plans built afterwards.
  void set_f32_bias_epilogue(bool enabled);
  // m <= kMaxGemvRows (decode) runs the tensor-core GEMV of gemv.h when its alignment and size
  // preconditions hold (true, the default), else cuBLASLt; false: always cuBLASLt (tests,
  // benchmarks comparing the two).
  void set_small_m_gemv(bool enabled);

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace specd::kernels
