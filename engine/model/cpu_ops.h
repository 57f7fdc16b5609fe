// fp32 building blocks of the CPU forward pass: projections (OpenBLAS), RMSNorm, the
// SiLU-gated MLP activation and RoPE, with the numerics of HF transformers' float32
// path (RMSNorm statistics and RoPE frequencies as transformers computes them).
// Called by Model::Forward on the engine thread; Linear fans out to OpenBLAS's threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/model/model_config.h"

namespace specd {

// Sets OpenBLAS's thread count, which the projections use. Process-wide: OpenBLAS has
// one setting (a second model in the process shares it).
//
// Why OpenBLAS threads and not our pool: on the 2-core CI machine a ThreadPool::ParallelFor
// dispatch costs ~60 us (condition-variable wake-up), and a decode step makes ~37 GEMV
// calls, so splitting them over the pool (single-threaded OpenBLAS per slice) decoded the
// codepair target at ~310 tokens/s against ~500-640 with OpenBLAS's spinning threads (and
// ~400 single-threaded). See model_bench.cc.
void ConfigureBlas(int num_threads);

// y = x · wᵀ + bias.
// x: [rows, in] f32; w: [out, in] f32 (HF Linear layout); bias: [out] f32 or nullptr;
// y: [rows, out] f32, must not alias x.
void Linear(const float* x, int64_t rows, int64_t in, const float* w, int64_t out,
            const float* bias, float* y);

// out = weight * (x / sqrt(mean(x²) + eps)) per row, as transformers' LlamaRMSNorm.
// x, out: [rows, stride] f32 using the first dim columns (out may alias x); weight: [dim].
void RmsNorm(const float* x, const float* weight, int64_t rows, int32_t dim, int64_t stride,
             double eps, float* out);

// out = silu(gate) * up. gate_up: [rows, 2 * ffn] f32 (gate columns first);
// out: [rows, ffn] f32.
void SiluMul(const float* gate_up, int64_t rows, int32_t ffn, float* out);

// RoPE inverse frequencies, computed in float32 as transformers does at load
// (default / linear / llama3 rope types). Returns [head_dim / 2] f32.
std::vector<float> RopeInvFreq(const RopeConfig& rope, int32_t head_dim);

// cos / sin of position * inv_freq: cos, sin: [head_dim / 2] f32 each.
void RopeCosSin(std::span<const float> inv_freq, int32_t position, float* cos, float* sin);

// Rotates one head in place the HF way (rotate_half: pairs are (i, i + head_dim / 2)).
// x: [head_dim] f32; cos, sin: [head_dim / 2] f32.
void ApplyRope(float* x, const float* cos, const float* sin, int32_t head_dim);

}  // namespace specd
