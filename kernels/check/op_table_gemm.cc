// GEMM ops of the table through kernels/cuda/gemm.h: "gemm_bf16" (bf16 output: the qkv, o,
// gate_up and down projections) and "gemm_f32out" (fp32 output: lm_head); and "gemv_bf16", the
// small-m kernel of kernels/cuda/gemv.h (both outputs; perf lines labelled as the gemm ones at
// m = 1 and 8, so the two compare line by line). The reference is the
// dot product in fp64 over the bf16 inputs; the baseline accumulates in fp32 (and rounds to bf16
// for bf16 output). Check shapes cover biases (epilogue and the rank-1 fallback), padded row
// strides and sub-buffers off 256-byte alignment; perf shapes are Llama-3.1-8B's at
// m = 1, 8, 64, 4096.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "kernels/check/op_families.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/ref/bf16.h"

namespace specd::kernels::check {
namespace {

constexpr int64_t kBf16Bytes = 2;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Buffers up to this many elements get their own random values (and a host copy for the
// reference); larger ones (perf shapes) repeat a random tile of kTile elements.
constexpr int64_t kMaxHostElements = int64_t{1} << 24;
constexpr int64_t kTile = int64_t{1} << 20;

// What a gemm case needs beyond OpShape; looked up by the shape's label.
struct GemmParams {
  int64_t m = 0, n = 0, k = 0;
  bool bias = false;
  int64_t pad = 0;     // ldx = k + pad, ldy = n + pad
  bool rank1 = false;  // f32 output: force the rank-1 bias update instead of the epilogue
  int64_t offset = 0;  // operands start this many elements into their buffers
  std::string name;    // shown in the label (qkv, o, ...)
  GemmOut out = GemmOut::kBf16;
};

// Which launcher a case runs: cuBLASLt through Gemm::Run, or GemvBf16.
enum class GemmImpl { kCublasLt, kGemv };

GemmParams P(int64_t m, int64_t n, int64_t k, bool bias = false, int64_t pad = 0,
             bool rank1 = false, int64_t offset = 0, std::string name = "") {
  return GemmParams{m, n, k, bias, pad, rank1, offset, std::move(name), GemmOut::kBf16};
}

// Random bf16 in [lo, hi) at `dst`; returns the values when n <= kMaxHostElements.
std::vector<uint16_t> FillBf16(uint16_t* dst, int64_t n, float lo, float hi, std::mt19937_64& rng) {
  if (n <= kMaxHostElements) {
    std::vector<uint16_t> bits = RandomBf16(n, lo, hi, rng);
    SPECD_CUDA_CHECK(cudaMemcpy(dst, bits.data(), n * kBf16Bytes, cudaMemcpyHostToDevice));
    return bits;
  }
  const std::vector<uint16_t> tile = RandomBf16(kTile, lo, hi, rng);
  for (int64_t offset = 0; offset < n; offset += kTile) {
    SPECD_CUDA_CHECK(cudaMemcpy(dst + offset, tile.data(), std::min(kTile, n - offset) * kBf16Bytes,
                                cudaMemcpyHostToDevice));
  }
  return {};
}

// y[i, j] = sum_l x[i, l] w[j, l] (+ bias[j]), accumulated in T, y dense [m, n].
template <typename T>
std::vector<T> GemmRef(const std::vector<T>& x, int64_t ldx, const std::vector<T>& w,
                       const std::vector<T>& bias, int64_t m, int64_t n, int64_t k) {
  std::vector<T> y(m * n);
  for (int64_t i = 0; i < m; ++i) {
    const T* xr = x.data() + i * ldx;
    for (int64_t j = 0; j < n; ++j) {
      const T* wr = w.data() + j * k;
      T acc = 0;
      for (int64_t l = 0; l < k; ++l) acc += xr[l] * wr[l];
      if (!bias.empty()) acc += bias[j];
      y[i * n + j] = acc;
    }
  }
  return y;
}

// The params with every output set to `out`.
std::vector<GemmParams> WithOut(std::vector<GemmParams> params, GemmOut out) {
  for (GemmParams& p : params) p.out = out;
  return params;
}

class GemmCase : public OpCase {
 public:
  GemmCase(const GemmParams& p, GemmImpl impl)
      : p_(p),
        impl_(impl),
        out_(p.out),
        ldx_(p.k + p.pad),
        ldy_(p.n + p.pad),
        out_bytes_(p.out == GemmOut::kBf16 ? 2 : 4),
        x_((p.offset + p.m * ldx_) * kBf16Bytes),
        w_((p.offset + p.n * p.k) * kBf16Bytes),
        bias_(p.bias ? (p.offset + p.n) * kBf16Bytes : 0),
        y_((p.offset + p.m * ldy_) * out_bytes_) {
    if (impl == GemmImpl::kCublasLt) {
      std::string error;
      gemm_ = Gemm::Create(kWorkspaceBytes, &error);
      if (gemm_ == nullptr) {
        std::fprintf(stderr, "Gemm::Create: %s\n", error.c_str());
        std::abort();
      }
      if (p.rank1) gemm_->set_f32_bias_epilogue(false);
      gemm_->set_small_m_gemv(false);  // the cuBLASLt path; gemv_bf16 is the small-m one
    }
    std::mt19937_64 rng(0x6e33ULL ^ static_cast<uint64_t>(p.m * 7919 + p.n * 31 + p.k * 131 +
                                                          p.pad + p.offset * 17));
    x_bits_ = FillBf16(x_.as<uint16_t>() + p.offset, p.m * ldx_, -1.0f, 1.0f, rng);
    w_bits_ = FillBf16(w_.as<uint16_t>() + p.offset, p.n * p.k, -1.0f, 1.0f, rng);
    if (p.bias) bias_bits_ = FillBf16(bias_.as<uint16_t>() + p.offset, p.n, -1.0f, 1.0f, rng);
    y_.Poison();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    std::string error;
    const auto* bias = p_.bias ? Bf16Offset(bias_) : nullptr;
    void* y = y_.as<uint8_t>() + p_.offset * out_bytes_;
    if (impl_ == GemmImpl::kGemv) {
      return GemvBf16(Bf16Offset(x_), ldx_, Bf16Offset(w_), bias, p_.m, p_.n, p_.k, y, ldy_, out_,
                      stream);
    }
    if (!gemm_->Run(Bf16Offset(x_), ldx_, Bf16Offset(w_), bias, p_.m, p_.n, p_.k, y, ldy_, out_,
                    stream, &error)) {
      std::fprintf(stderr, "Gemm::Run: %s\n", error.c_str());
      return cudaErrorNotSupported;
    }
    return cudaGetLastError();
  }

  int64_t BytesMoved() const override {
    return (p_.m * p_.k + p_.n * p_.k + (p_.bias ? p_.n : 0)) * kBf16Bytes +
           p_.m * p_.n * out_bytes_;
  }

  std::vector<ErrorCheck> Check() override {
    if (x_bits_.empty() || w_bits_.empty()) {
      ErrorCheck too_large;
      too_large.output = "y (shape too large for the host reference)";
      return {too_large};
    }
    y_.Poison();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const auto y64 = GemmRef(WidenToDouble(x_bits_), ldx_, WidenToDouble(w_bits_),
                             WidenToDouble(bias_bits_), p_.m, p_.n, p_.k);
    const auto y32 = GemmRef(WidenToFloat(x_bits_), ldx_, WidenToFloat(w_bits_),
                             WidenToFloat(bias_bits_), p_.m, p_.n, p_.k);
    std::vector<double> kernel(p_.m * p_.n);
    int64_t padding_written = 0;
    if (out_ == GemmOut::kBf16) {
      const auto y = y_.Download<uint16_t>();
      for (int64_t i = 0; i < p_.m; ++i) {
        for (int64_t j = 0; j < ldy_; ++j) {
          const uint16_t bits = y[p_.offset + i * ldy_ + j];
          if (j < p_.n) kernel[i * p_.n + j] = Bf16ToFloat(bits);
          if (j >= p_.n && bits != 0xffff) ++padding_written;
        }
      }
    } else {
      const auto y = y_.Download<uint32_t>();
      for (int64_t i = 0; i < p_.m; ++i) {
        for (int64_t j = 0; j < ldy_; ++j) {
          const uint32_t bits = y[p_.offset + i * ldy_ + j];
          float v;
          std::memcpy(&v, &bits, sizeof(v));
          if (j < p_.n) kernel[i * p_.n + j] = v;
          if (j >= p_.n && bits != 0xffffffffu) ++padding_written;
        }
      }
    }
    const std::vector<double> baseline =
        out_ == GemmOut::kBf16 ? RoundToBf16(y32) : std::vector<double>(y32.begin(), y32.end());
    ErrorCheck padding;
    padding.output = "y_padding";
    padding.kernel_error = static_cast<double>(padding_written);
    padding.passed = padding_written == 0;
    return {CompareWithReference("y", kernel, baseline, y64), padding};
  }

 private:
  __nv_bfloat16* Bf16Offset(const DeviceBuffer& b) const {
    return reinterpret_cast<__nv_bfloat16*>(b.as<uint16_t>() + p_.offset);
  }

  GemmParams p_;
  GemmImpl impl_;
  GemmOut out_;
  int64_t ldx_, ldy_, out_bytes_;
  std::unique_ptr<Gemm> gemm_;
  std::vector<uint16_t> x_bits_, w_bits_, bias_bits_;
  DeviceBuffer x_;     // [offset + m * ldx] bf16
  DeviceBuffer w_;     // [offset + n * k] bf16
  DeviceBuffer bias_;  // [offset + n] bf16, or empty
  DeviceBuffer y_;     // [offset + m * ldy] bf16 or f32
};

// The test name is op_numtokens x width: keep (m, k) unique per op.
OpShape ShapeOf(const GemmParams& p) {
  OpShape s;
  s.num_tokens = p.m;
  s.width = p.k;
  s.n = p.n;
  s.label = "m=" + std::to_string(p.m) + " n=" + std::to_string(p.n) + " k=" + std::to_string(p.k);
  if (p.bias) s.label += p.rank1 ? " +bias(rank-1)" : " +bias";
  if (p.pad > 0) s.label += " pad=" + std::to_string(p.pad);
  if (p.offset > 0) s.label += " off=" + std::to_string(p.offset);
  if (!p.name.empty()) s.label += " " + p.name;
  return s;
}

OpSpec MakeSpec(std::string name, GemmImpl impl, const std::vector<GemmParams>& check,
                const std::vector<GemmParams>& perf) {
  return MakeLabelledSpec<GemmParams>(std::move(name), check, perf, ShapeOf,
                                      [impl](const GemmParams& p) -> std::unique_ptr<OpCase> {
                                        return std::make_unique<GemmCase>(p, impl);
                                      });
}

// Llama-3.1-8B projections (n, k) at decode, small-batch and prefill m (lm_head: f32 output).
std::vector<GemmParams> Llama8bPerf(bool lm_head,
                                    const std::vector<int64_t>& ms = {1, 8, 64, 4096}) {
  struct Weight {
    int64_t n, k;
    const char* name;
  };
  const std::vector<Weight> weights = lm_head ? std::vector<Weight>{{128256, 4096, "lm_head"}}
                                              : std::vector<Weight>{{6144, 4096, "qkv"},
                                                                    {4096, 4096, "o"},
                                                                    {28672, 4096, "gate_up"},
                                                                    {4096, 14336, "down"}};
  std::vector<GemmParams> shapes;
  for (const Weight& w : weights) {
    for (int64_t m : ms) shapes.push_back(P(m, w.n, w.k, false, 0, false, 0, w.name));
  }
  return lm_head ? WithOut(shapes, GemmOut::kF32) : shapes;
}

}  // namespace

void AddGemmOps(std::vector<OpSpec>* table) {
  // P(m, n, k, bias, pad, rank1, offset)
  table->push_back(MakeSpec(
      "gemm_bf16", GemmImpl::kCublasLt,
      {P(1, 384, 256), P(8, 1000, 512, true), P(64, 768, 1024, false, 8), P(33, 1024, 4096, true),
       P(5, 2048, 1000), P(128, 512, 2048, false, 0, false, 8), P(3, 4096, 128, true, 8, false, 8)},
      Llama8bPerf(false)));
  table->push_back(
      MakeSpec("gemm_f32out", GemmImpl::kCublasLt,
               WithOut({P(1, 1000, 512), P(8, 4096, 256, true), P(64, 2048, 1024, true, 0, true),
                        P(17, 3000, 640, false, 8), P(65600, 16, 16, true, 0, true),
                        P(2, 128256, 64, true), P(9, 512, 4096, true, 0, false, 8)},
                       GemmOut::kF32),
               Llama8bPerf(true)));
  // m <= kMaxGemvRows; (m, k) unique per op. f32 outputs are named "f32" in the label.
  std::vector<GemmParams> gemv_check = {P(1, 384, 256),
                                        P(8, 1000, 512, true),
                                        P(3, 1000, 24, true),
                                        P(5, 2048, 1000, false, 8),
                                        P(2, 4096, 4096, true, 8, false, 8),
                                        P(7, 777, 2048, true, 8)};
  for (GemmParams p : {P(1, 1000, 640), P(4, 3000, 1024, true, 8), P(6, 128256, 64, true),
                       P(8, 512, 4096, true, 0, false, 8)}) {
    p.out = GemmOut::kF32;
    p.name = "f32";
    gemv_check.push_back(p);
  }
  std::vector<GemmParams> gemv_perf = Llama8bPerf(false, {1, 8});
  for (const GemmParams& p : Llama8bPerf(true, {1, 8})) gemv_perf.push_back(p);
  table->push_back(MakeSpec("gemv_bf16", GemmImpl::kGemv, gemv_check, gemv_perf));
}

}  // namespace specd::kernels::check
