// Reference for the one-shot all-reduce kernel (kernels/cuda/allreduce_oneshot.h): what every
// rank's buffer holds afterwards. The sum runs in rank order in fp32 (acc = x_0; acc += x_1; ...)
// and is rounded once, so it matches the kernel bit for bit. Pure functions, any thread.
#pragma once

#include <cstdint>
#include <span>

namespace specd::kernels::ref {

// out[i] = sum over r of inputs[r][i], fp32 accumulation in rank order.
//   inputs  [num_ranks] pointers to [count] f32, host, in
//   out     [count] f32, host, out; may alias any input
void AllReduceSumF32(std::span<const float* const> inputs, int64_t count, float* out);

// As AllReduceSumF32 on bf16 bits (uint16_t), widened exactly and rounded to nearest even once.
//   inputs  [num_ranks] pointers to [count] bf16 bits, host, in
//   out     [count] bf16 bits, host, out; may alias any input
void AllReduceSumBf16(std::span<const uint16_t* const> inputs, int64_t count, uint16_t* out);

}  // namespace specd::kernels::ref
