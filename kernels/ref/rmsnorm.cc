#include "kernels/ref/rmsnorm.h"

#include <cmath>

namespace specd::kernels::ref {
namespace {

// Writes the normalised row x to out (x may alias out).
template <typename T>
void NormalizeRow(const T* x, const T* weight, int64_t hidden, double eps, T* out) {
  T sum_sq = 0;
  for (int64_t i = 0; i < hidden; ++i) sum_sq += x[i] * x[i];
  const T inv_rms = T{1} / std::sqrt(sum_sq / static_cast<T>(hidden) + static_cast<T>(eps));
  for (int64_t i = 0; i < hidden; ++i) out[i] = x[i] * inv_rms * weight[i];
}

}  // namespace

template <typename T>
void RmsNorm(const T* input, const T* weight, int64_t num_tokens, int64_t hidden, double eps,
             T* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    NormalizeRow(input + t * hidden, weight, hidden, eps, out + t * hidden);
  }
}

template <typename T>
void FusedAddRmsNorm(const T* input, T* residual, const T* weight, int64_t num_tokens,
                     int64_t hidden, double eps, T* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    T* res = residual + t * hidden;
    const T* in = input + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) res[i] = in[i] + res[i];
    NormalizeRow<T>(res, weight, hidden, eps, out + t * hidden);
  }
}

template void RmsNorm<float>(const float*, const float*, int64_t, int64_t, double, float*);
template void RmsNorm<double>(const double*, const double*, int64_t, int64_t, double, double*);
template void FusedAddRmsNorm<float>(const float*, float*, const float*, int64_t, int64_t, double,
                                     float*);
template void FusedAddRmsNorm<double>(const double*, double*, const double*, int64_t, int64_t,
                                      double, double*);

}  // namespace specd::kernels::ref
