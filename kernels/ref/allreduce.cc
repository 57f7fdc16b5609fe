#include "kernels/ref/allreduce.h"

#include "kernels/ref/bf16.h"

namespace specd::kernels::ref {

void AllReduceSumF32(std::span<const float* const> inputs, int64_t count, float* out) {
  if (inputs.empty()) return;
  for (int64_t i = 0; i < count; ++i) {
    float acc = inputs[0][i];
    for (size_t r = 1; r < inputs.size(); ++r) acc += inputs[r][i];
    out[i] = acc;
  }
}

void AllReduceSumBf16(std::span<const uint16_t* const> inputs, int64_t count, uint16_t* out) {
  if (inputs.empty()) return;
  for (int64_t i = 0; i < count; ++i) {
    float acc = Bf16ToFloat(inputs[0][i]);
    for (size_t r = 1; r < inputs.size(); ++r) acc += Bf16ToFloat(inputs[r][i]);
    out[i] = FloatToBf16(acc);
  }
}

}  // namespace specd::kernels::ref
