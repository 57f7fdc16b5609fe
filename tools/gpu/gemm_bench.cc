// gemm_bench: the bf16 GEMM rate (TFLOP/s) through kernels::Gemm (cuBLASLt), the reference rate
// prefill is compared against: 8192^3, then Llama-3.1-8B's prefill projections at m = 4096
// (qkv, o, gate_up, down with bf16 output; lm_head with f32 output). Per shape: three warm-ups
// (the first picks and caches the algorithm), then the median of --iters calls, each timed with
// CUDA events, on random non-zero data (a random tile repeated, so setup stays fast); a few
// outputs are spot-checked against an fp64 dot product so a layout bug cannot pass as a rate.
//   gemm_bench [--iters N]
// Exit status: 0 when every shape ran and passed its spot check, 1 otherwise, 2 on bad flags,
// 77 when no GPU is visible. One thread.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/check/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/ref/bf16.h"

namespace specd {
namespace {

namespace kc = kernels::check;

constexpr int64_t kTile = int64_t{1} << 20;  // random bf16 values repeated through each operand
constexpr int kWarmup = 3;
constexpr int kSpotChecks = 16;

struct Shape {
  const char* name;
  int64_t m, n, k;
  kernels::GemmOut out;
};

// n bf16 values at dst: tile[e % kTile] for element e.
std::vector<uint16_t> FillTiled(uint16_t* dst, int64_t n, std::mt19937_64& rng) {
  std::vector<uint16_t> tile = kc::RandomBf16(kTile, -1.0f, 1.0f, rng);
  for (int64_t offset = 0; offset < n; offset += kTile) {
    SPECD_CUDA_CHECK(cudaMemcpy(dst + offset, tile.data(),
                                std::min(kTile, n - offset) * sizeof(uint16_t),
                                cudaMemcpyHostToDevice));
  }
  return tile;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Output (i, j) read back from the device, as a double.
double ReadOutput(const kc::DeviceBuffer& y, const Shape& s, int64_t i, int64_t j) {
  const int64_t index = i * s.n + j;
  if (s.out == kernels::GemmOut::kBf16) {
    uint16_t bits;
    SPECD_CUDA_CHECK(
        cudaMemcpy(&bits, y.as<uint16_t>() + index, sizeof(bits), cudaMemcpyDeviceToHost));
    return kernels::Bf16ToFloat(bits);
  }
  float v;
  SPECD_CUDA_CHECK(cudaMemcpy(&v, y.as<float>() + index, sizeof(v), cudaMemcpyDeviceToHost));
  return v;
}

// Spot checks: |y - ref| <= 2^-8 |ref| + 1e-4 sum_l |x w| (bf16 output rounding plus fp32
// accumulation), with ref the fp64 dot product of the tiled inputs.
bool SpotCheck(const kc::DeviceBuffer& y, const Shape& s, const std::vector<uint16_t>& x_tile,
               const std::vector<uint16_t>& w_tile, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> row(0, s.m - 1), col(0, s.n - 1);
  for (int c = 0; c < kSpotChecks; ++c) {
    const int64_t i = row(rng), j = col(rng);
    double ref = 0, magnitude = 0;
    for (int64_t l = 0; l < s.k; ++l) {
      const double term = static_cast<double>(kernels::Bf16ToFloat(x_tile[(i * s.k + l) % kTile])) *
                          kernels::Bf16ToFloat(w_tile[(j * s.k + l) % kTile]);
      ref += term;
      magnitude += std::abs(term);
    }
    const double got = ReadOutput(y, s, i, j);
    if (!(std::abs(got - ref) <= std::ldexp(std::abs(ref), -8) + 1e-4 * magnitude)) {
      std::printf("  spot check failed at (%lld, %lld): got %.6g, fp64 reference %.6g\n",
                  static_cast<long long>(i), static_cast<long long>(j), got, ref);
      return false;
    }
  }
  return true;
}

struct Result {
  bool ok = false;
  double ms = 0;
};

Result Bench(kernels::Gemm& gemm, const Shape& s, int iters, cudaStream_t stream) {
  std::mt19937_64 rng(0x9e77 + s.m * 31 + s.n * 7 + s.k);
  const int64_t out_bytes = s.out == kernels::GemmOut::kBf16 ? 2 : 4;
  kc::DeviceBuffer x(s.m * s.k * 2), w(s.n * s.k * 2), y(s.m * s.n * out_bytes);
  const std::vector<uint16_t> x_tile = FillTiled(x.as<uint16_t>(), s.m * s.k, rng);
  const std::vector<uint16_t> w_tile = FillTiled(w.as<uint16_t>(), s.n * s.k, rng);
  y.Poison();
  cudaEvent_t start, stop;
  SPECD_CUDA_CHECK(cudaEventCreate(&start));
  SPECD_CUDA_CHECK(cudaEventCreate(&stop));
  Result result;
  std::vector<double> ms;
  std::string error;
  bool ok = true;
  for (int i = -kWarmup; i < iters && ok; ++i) {
    SPECD_CUDA_CHECK(cudaEventRecord(start, stream));
    ok = gemm.Run(x.as<const __nv_bfloat16>(), s.k, w.as<const __nv_bfloat16>(), nullptr, s.m, s.n,
                  s.k, y.as<void>(), s.n, s.out, stream, &error);
    SPECD_CUDA_CHECK(cudaEventRecord(stop, stream));
    SPECD_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    SPECD_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (i >= 0) ms.push_back(elapsed);
  }
  SPECD_CUDA_CHECK(cudaEventDestroy(start));
  SPECD_CUDA_CHECK(cudaEventDestroy(stop));
  if (!ok) {
    std::printf("  %s: Gemm::Run failed: %s\n", s.name, error.c_str());
    return result;
  }
  SPECD_CUDA_CHECK(cudaGetLastError());
  result.ok = SpotCheck(y, s, x_tile, w_tile, rng);
  result.ms = Median(ms);
  return result;
}

double Tflops(const Shape& s, double ms) {
  return 2.0 * static_cast<double>(s.m) * s.n * s.k / (ms * 1e-3) * 1e-12;
}

int Main(int argc, char** argv) {
  int iters = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      iters = 0;
      break;
    }
  }
  if (iters < 1) {
    std::fprintf(stderr, "usage: gemm_bench [--iters N]\n");
    return 2;
  }
  if (kc::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "gemm_bench: no CUDA device visible\n");
    return kc::kSkipExitCode;
  }
  cudaDeviceProp prop;
  SPECD_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gemm_bench: device 0: %s, sm_%d%d, %d SMs; median of %d calls per shape\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, iters);
  std::string error;
  std::unique_ptr<kernels::Gemm> gemm = kernels::Gemm::Create(size_t{32} << 20, &error);
  if (gemm == nullptr) {
    std::fprintf(stderr, "Gemm::Create: %s\n", error.c_str());
    return 1;
  }
  cudaStream_t stream;
  SPECD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  using kernels::GemmOut;
  const Shape shapes[] = {
      {"square", 8192, 8192, 8192, GemmOut::kBf16}, {"qkv", 4096, 6144, 4096, GemmOut::kBf16},
      {"o", 4096, 4096, 4096, GemmOut::kBf16},      {"gate_up", 4096, 28672, 4096, GemmOut::kBf16},
      {"down", 4096, 4096, 14336, GemmOut::kBf16},  {"lm_head", 4096, 128256, 4096, GemmOut::kF32},
  };
  std::printf("%-8s %6s %7s %6s %5s %10s %8s\n", "gemm", "m", "n", "k", "out", "median_ms",
              "TFLOP/s");
  bool all_ok = true;
  double layer_ms = 0, layer_flops = 0;
  for (const Shape& s : shapes) {
    const Result r = Bench(*gemm, s, iters, stream);
    all_ok = all_ok && r.ok;
    if (r.ms <= 0) continue;
    std::printf("%-8s %6lld %7lld %6lld %5s %10.3f %8.1f%s\n", s.name, static_cast<long long>(s.m),
                static_cast<long long>(s.n), static_cast<long long>(s.k),
                s.out == GemmOut::kBf16 ? "bf16" : "f32", r.ms, Tflops(s, r.ms),
                r.ok ? "" : "  (spot check FAILED)");
    const std::string name = s.name;
    if (name == "qkv" || name == "o" || name == "gate_up" || name == "down") {
      layer_ms += r.ms;
      layer_flops += 2.0 * static_cast<double>(s.m) * s.n * s.k;
    }
  }
  if (layer_ms > 0) {
    std::printf(
        "8B layer GEMMs at m=4096 (qkv+o+gate_up+down): %.3f ms, %.1f TFLOP/s; x32 layers: "
        "%.1f ms\n",
        layer_ms, layer_flops / (layer_ms * 1e-3) * 1e-12, 32 * layer_ms);
  }
  SPECD_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("gemm_bench: %s\n", all_ok ? "ok" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
