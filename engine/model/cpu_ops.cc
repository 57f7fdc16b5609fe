#include "engine/model/cpu_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace specd {

void ConfigureBlas(int num_threads) { openblas_set_num_threads(std::max(1, num_threads)); }

void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out,
            const float* bias, float* y) {
  if (rows == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, w,
                static_cast<int>(in), x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(in), w,
                static_cast<int>(in), 0.0f, y, static_cast<int>(out));
  }
  if (bias == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * out;
    for (int64_t o = 0; o < out; ++o) row[o] += bias[o];
  }
}

void RmsNorm(const float* x, const float* weight, int64_t rows, int32_t dim, int64_t stride,
             double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    float* yr = out + r * stride;
    double sum_sq = 0.0;
    for (int32_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float variance = static_cast<float>(sum_sq / dim);
    const float inv_rms = 1.0f / std::sqrt(variance + static_cast<float>(eps));
    for (int32_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
  }
}

void SiluMul(const float* gate_up, int64_t rows, int32_t ffn, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + r * 2 * ffn;
    const float* up = gate + ffn;
    float* o = out + r * ffn;
    for (int32_t i = 0; i < ffn; ++i) {
      const float g = gate[i];
      o[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

std::vector<float> RopeInvFreq(const RopeConfig& rope, int32_t head_dim) {
  // transformers: 1 / base ** (arange(0, dim, 2).float() / dim), all float32.
  const int32_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int32_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    const float power = static_cast<float>(std::pow(rope.theta, static_cast<double>(exponent)));
    inv_freq[i] = 1.0f / power;
  }
  if (rope.type == RopeType::kLinear) {
    for (float& f : inv_freq) f /= static_cast<float>(rope.factor);
  } else if (rope.type == RopeType::kLlama3) {
    // Llama 3.1 smoothing: keep high frequencies, divide low ones by factor, interpolate
    // in between. Float32 like transformers (x / t is reciprocal(t) * x there).
    const float factor = static_cast<float>(rope.factor);
    const float low = static_cast<float>(rope.low_freq_factor);
    const float high = static_cast<float>(rope.high_freq_factor);
    const float old_len = static_cast<float>(rope.original_max_position_embeddings);
    const float low_freq_wavelen = static_cast<float>(
        static_cast<double>(rope.original_max_position_embeddings) / rope.low_freq_factor);
    const float high_freq_wavelen = static_cast<float>(
        static_cast<double>(rope.original_max_position_embeddings) / rope.high_freq_factor);
    for (float& f : inv_freq) {
      const float wavelen = (1.0f / f) * static_cast<float>(2.0 * std::numbers::pi);
      const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = ((1.0f / wavelen) * old_len - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : scaled;
    }
  }
  return inv_freq;
}

void RopeCosSin(std::span<const float> inv_freq, int32_t position, float* cos, float* sin) {
  // transformers forms freqs = inv_freq * position in float32, then cos/sin in float32.
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float freq = inv_freq[i] * static_cast<float>(position);
    cos[i] = static_cast<float>(std::cos(static_cast<double>(freq)));
    sin[i] = static_cast<float>(std::sin(static_cast<double>(freq)));
  }
}

void ApplyRope(float* x, const float* cos, const float* sin, int32_t head_dim) {
  const int32_t half = head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float x1 = x[i];
    const float x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace specd
