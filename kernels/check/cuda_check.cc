#include "kernels/check/cuda_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "kernels/ref/bf16.h"

namespace specd::kernels::check {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the error, report none
    return 0;
  }
  return count;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  SPECD_CUDA_CHECK(cudaMalloc(&data_, std::max<size_t>(bytes, 1)));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) SPECD_CUDA_CHECK(cudaFree(data_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

void DeviceBuffer::Upload(const void* src) {
  SPECD_CUDA_CHECK(cudaMemcpy(data_, src, bytes_, cudaMemcpyHostToDevice));
}

void DeviceBuffer::Download(void* dst) const {
  SPECD_CUDA_CHECK(cudaMemcpy(dst, data_, bytes_, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::Poison() { SPECD_CUDA_CHECK(cudaMemset(data_, 0xff, bytes_)); }

void DeviceBuffer::CheckSize(size_t bytes) const {
  if (bytes != bytes_) {
    std::fprintf(stderr, "DeviceBuffer: %zu host bytes for a %zu-byte buffer\n", bytes, bytes_);
    std::abort();
  }
}

std::vector<uint16_t> RandomBf16(size_t n, float lo, float hi, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> bits(n);
  for (uint16_t& b : bits) b = FloatToBf16(dist(rng));
  return bits;
}

std::vector<float> WidenToFloat(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  std::transform(bits.begin(), bits.end(), out.begin(), Bf16ToFloat);
  return out;
}

std::vector<double> WidenToDouble(const std::vector<uint16_t>& bits) {
  std::vector<double> out(bits.size());
  std::transform(bits.begin(), bits.end(), out.begin(),
                 [](uint16_t b) { return static_cast<double>(Bf16ToFloat(b)); });
  return out;
}

std::vector<double> RoundToBf16(const std::vector<float>& values) {
  std::vector<double> out(values.size());
  std::transform(values.begin(), values.end(), out.begin(),
                 [](float v) { return static_cast<double>(kernels::RoundToBf16(v)); });
  return out;
}

namespace {

double MaxAbsError(const std::vector<double>& values, const std::vector<double>& ref64) {
  double max_error = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double error = std::abs(values[i] - ref64[i]);
    max_error =
        std::isfinite(error) ? std::max(max_error, error) : std::numeric_limits<double>::infinity();
  }
  return max_error;
}

}  // namespace

ErrorCheck CompareWithReference(std::string output, const std::vector<double>& kernel,
                                const std::vector<double>& baseline,
                                const std::vector<double>& ref64) {
  ErrorCheck check;
  check.output = std::move(output);
  if (kernel.size() != ref64.size() || baseline.size() != ref64.size()) {
    check.kernel_error = std::numeric_limits<double>::infinity();
    return check;
  }
  double ref_scale = 0;
  for (double r : ref64) ref_scale = std::max(ref_scale, std::abs(r));
  check.kernel_error = MaxAbsError(kernel, ref64);
  check.baseline_error = MaxAbsError(baseline, ref64);
  check.tolerance = 2 * check.baseline_error + std::ldexp(ref_scale, -22);
  check.passed = check.kernel_error <= check.tolerance;
  return check;
}

}  // namespace specd::kernels::check
