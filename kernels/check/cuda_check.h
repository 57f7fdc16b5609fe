// Host helpers for checking CUDA kernels (the GPU test and tools/kernel_check): CUDA error
// checks that abort, device buffers, random bf16 data, and the flash-attention error rule.
// Test and tool code only: the engine returns errors instead of aborting. One thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

// Aborts with the call, location and CUDA error name unless `expr` returns cudaSuccess. Use it on
// every CUDA call and every launcher, whose return value carries the launch's last error.
#define SPECD_CUDA_CHECK(expr)                                                              \
  do {                                                                                      \
    const cudaError_t specd_cuda_err_ = (expr);                                             \
    if (specd_cuda_err_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr,        \
                   cudaGetErrorName(specd_cuda_err_), cudaGetErrorString(specd_cuda_err_)); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace specd::kernels::check {

// Exit status ctest reads as "skipped" (SKIP_RETURN_CODE of gpu-labelled tests).
constexpr int kSkipExitCode = 77;

// Visible CUDA devices; 0 when there is no device or no driver.
int CudaDeviceCount();

// cudaMalloc'd bytes, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

  // Synchronous copies of the whole buffer.
  void Upload(const void* src);
  void Download(void* dst) const;
  template <typename T>
  void Upload(const std::vector<T>& src) {
    CheckSize(src.size() * sizeof(T));
    Upload(src.data());
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> dst(bytes_ / sizeof(T));
    Download(dst.data());
    return dst;
  }
  // Fills every byte with 0xff: each bf16 (0xffff) and fp32 reads as NaN, so an element a kernel
  // fails to write shows up as an infinite error.
  void Poison();

 private:
  void CheckSize(size_t bytes) const;

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// n bf16 values uniform in [lo, hi) (bits), rounded to nearest even.
std::vector<uint16_t> RandomBf16(size_t n, float lo, float hi, std::mt19937_64& rng);

// Exact widening of bf16 bits to float or double.
std::vector<float> WidenToFloat(const std::vector<uint16_t>& bits);
std::vector<double> WidenToDouble(const std::vector<uint16_t>& bits);
// Values as a bf16 store would keep them, widened to double: the baseline's output storage.
std::vector<double> RoundToBf16(const std::vector<float>& values);

// One output of one op at one shape under the flash-attention rule
// (hopper/test_flash_attn.py): with ref64 the reference in fp64 on the kernel's own bf16
// inputs, and the same-precision baseline the reference in fp32 on those inputs with each
// output rounded to bf16 as the kernel stores it,
//   max|kernel - ref64| <= 2 * max|baseline - ref64| + atol,  atol = 2^-22 * max|ref64|
// (a few fp32 ulps at the output's scale, so exact ops such as a gather pass at zero error).
// A non-finite kernel value (a poisoned, unwritten element) counts as an infinite error.
struct ErrorCheck {
  std::string output;
  double kernel_error = 0;
  double baseline_error = 0;
  double tolerance = 0;
  bool passed = false;
};
ErrorCheck CompareWithReference(std::string output, const std::vector<double>& kernel,
                                const std::vector<double>& baseline,
                                const std::vector<double>& ref64);

}  // namespace specd::kernels::check
