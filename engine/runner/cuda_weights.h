// The model's parameters in bf16 on one GPU, in one allocation, laid out for the CUDA forward:
// q/k/v fused into one [q + 2 kv, hidden] matrix and gate/up into one [2 inter, hidden] (as vLLM
// does), so each is a single GEMM; a tied lm_head is the embedding table itself. Loaded from
// safetensors (f32 / f16 / bf16, converted to bf16 on the host) or, for load_format "dummy",
// generated on the device from config.json alone (uniform random matrices, norms 1).
// Engine thread only; immutable after loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/runner/cuda_util.h"

struct __nv_bfloat16;

namespace specd {

struct CudaLayerWeights {
  const __nv_bfloat16* input_norm = nullptr;  // [hidden]
  const __nv_bfloat16* qkv = nullptr;         // [q_size + 2 kv_size, hidden] rows: q, k, v
  const __nv_bfloat16* qkv_bias = nullptr;    // [q_size + 2 kv_size] or null
  const __nv_bfloat16* q_norm = nullptr;      // [head_dim] or null (Qwen3)
  const __nv_bfloat16* k_norm = nullptr;      // [head_dim] or null (Qwen3)
  const __nv_bfloat16* o_proj = nullptr;      // [hidden, q_size]
  const __nv_bfloat16* o_bias = nullptr;      // [hidden] or null
  const __nv_bfloat16* post_norm = nullptr;   // [hidden]
  const __nv_bfloat16* gate_up = nullptr;     // [2 intermediate, hidden] rows: gate, up
  const __nv_bfloat16* down = nullptr;        // [hidden, intermediate]
};

// Every pointer is device memory inside `storage`, bf16.
struct CudaWeights {
  cuda::DeviceMemory storage;
  const __nv_bfloat16* embed = nullptr;       // [vocab, hidden]
  const __nv_bfloat16* lm_head = nullptr;     // [vocab, hidden]; == embed when tied
  const __nv_bfloat16* final_norm = nullptr;  // [hidden]
  std::vector<CudaLayerWeights> layers;       // [num_layers]
  bool tied = false;
};

struct WeightSource {
  std::string model_dir;
  bool dummy = false;       // random weights (no safetensors read)
  uint64_t dummy_seed = 0;  // seeds the random weights
};

// Bytes LoadCudaWeights will allocate for `config` (tied: no separate lm_head).
int64_t CudaWeightBytes(const ModelConfig& config, bool tied);

// Whether the output matrix is the embedding: the config says so, or (safetensors) the checkpoint
// has no lm_head.weight, as the CPU loader decides.
absl::StatusOr<bool> OutputIsTied(const ModelConfig& config, const WeightSource& source);

// Allocates and fills the weights on the current device (synchronously). ResourceExhausted when
// the allocation fails; InvalidArgument for a missing tensor, a wrong shape or dtype.
absl::StatusOr<CudaWeights> LoadCudaWeights(const ModelConfig& config, const WeightSource& source,
                                            bool tied);

}  // namespace specd
