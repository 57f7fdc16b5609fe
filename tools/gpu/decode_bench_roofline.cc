#include "tools/gpu/decode_bench_roofline.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/gemm.h"

namespace specd::decode_bench {
namespace {

namespace kc = kernels::check;

class GpuTimer {
 public:
  GpuTimer() {
    SPECD_CUDA_CHECK(cudaEventCreate(&start_));
    SPECD_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~GpuTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Milliseconds of the work `launch` enqueues on the default stream.
  double TimeMs(const std::function<void()>& launch) {
    SPECD_CUDA_CHECK(cudaEventRecord(start_, nullptr));
    launch();
    SPECD_CUDA_CHECK(cudaEventRecord(stop_, nullptr));
    SPECD_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    SPECD_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

ModelCosts CountCosts(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), layers = c.num_layers;
  const int64_t matmul = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size;
  int64_t small = 2 * h;  // input and post-attention RMSNorm weights
  if (c.qkv_bias) small += q + 2 * kv;
  if (c.o_bias) small += h;
  if (c.qk_norm) small += 2 * c.head_dim;
  ModelCosts costs;
  costs.layer_matmul_params = layers * matmul;
  costs.lm_head_params = int64_t{c.vocab_size} * h;
  // The lm_head is read whole; a tied embedding is that same matrix, else one row is gathered.
  const int64_t embedding_rows = c.tie_word_embeddings ? 0 : h;
  costs.step_weight_bytes =
      2 * (layers * (matmul + small) + h + costs.lm_head_params + embedding_rows);
  costs.embedding_row_bytes = 2 * embedding_rows;
  costs.kv_bytes_per_token = 2 * 2 * layers * kv;
  costs.sliding_window = c.sliding_window;
  costs.attention_width = layers * q;
  return costs;
}

int64_t KeysRead(const ModelCosts& costs, int64_t position) {
  return costs.sliding_window > 0 ? std::min<int64_t>(position + 1, costs.sliding_window)
                                  : position + 1;
}

double RooflineMs(const ModelCosts& costs, int32_t batch, double keys_per_step, double bw) {
  const double bytes = static_cast<double>(costs.step_weight_bytes) +
                       static_cast<double>(batch - 1) * costs.embedding_row_bytes +
                       keys_per_step * costs.kv_bytes_per_token;
  return bytes / bw * 1e3;
}

double MeasureCopyBandwidth(size_t bytes, int32_t repeats) {
  kc::DeviceBuffer src(bytes), dst(bytes);
  SPECD_CUDA_CHECK(cudaMemset(src.as<void>(), 0x3c, bytes));
  GpuTimer timer;
  std::vector<double> ms;
  for (int32_t i = -2; i < repeats; ++i) {  // two warm-ups
    const double t = timer.TimeMs([&] {
      SPECD_CUDA_CHECK(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes,
                                       cudaMemcpyDeviceToDevice, nullptr));
    });
    if (i >= 0) ms.push_back(t);
  }
  return 2.0 * static_cast<double>(bytes) / (Median(ms) * 1e-3);
}

absl::StatusOr<double> MeasureGemmRate(int64_t n, int32_t repeats) {
  std::mt19937_64 rng(2024);
  const size_t elems = static_cast<size_t>(n * n);
  kc::DeviceBuffer x(2 * elems), w(2 * elems), y(2 * elems);
  x.Upload(kc::RandomBf16(elems, -1.0f, 1.0f, rng));
  w.Upload(kc::RandomBf16(elems, -1.0f, 1.0f, rng));
  y.Poison();
  std::string error;
  std::unique_ptr<kernels::Gemm> gemm = kernels::Gemm::Create(size_t{32} << 20, &error);
  if (gemm == nullptr) return absl::InternalError("Gemm::Create: " + error);
  bool ok = true;
  GpuTimer timer;
  std::vector<double> ms;
  for (int32_t i = -3; i < repeats && ok; ++i) {  // three warm-ups (the first picks the algorithm)
    const double t = timer.TimeMs([&] {
      ok = gemm->Run(x.as<const __nv_bfloat16>(), n, w.as<const __nv_bfloat16>(), nullptr, n, n, n,
                     y.as<void>(), n, kernels::GemmOut::kBf16, nullptr, &error);
    });
    if (i >= 0) ms.push_back(t);
  }
  if (!ok) return absl::InternalError("Gemm::Run: " + error);
  SPECD_CUDA_CHECK(cudaGetLastError());
  return 2.0 * static_cast<double>(n) * n * n / (Median(ms) * 1e-3);
}

}  // namespace specd::decode_bench
