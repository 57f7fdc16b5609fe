#include "kernels/ref/activation.h"

#include <cmath>

namespace specd::kernels::ref {

template <typename T>
void SiluAndMul(const T* gate_up, int64_t num_tokens, int64_t d, T* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const T* gate = gate_up + t * 2 * d;
    const T* up = gate + d;
    for (int64_t j = 0; j < d; ++j) {
      const T silu = gate[j] / (T{1} + std::exp(-gate[j]));
      out[t * d + j] = silu * up[j];
    }
  }
}

template void SiluAndMul<float>(const float*, int64_t, int64_t, float*);
template void SiluAndMul<double>(const double*, int64_t, int64_t, double*);

}  // namespace specd::kernels::ref
