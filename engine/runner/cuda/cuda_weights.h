// The model's parameters in bf16 on one GPU, in one allocation, laid out for the CUDA forward:
// q/k/v fused into one [q + 2 kv, hidden] matrix and gate/up into one [2 inter, hidden] (as vLLM
// does), so each is a single GEMM; a tied lm_head is the embedding table itself. Loaded from
// safetensors (f32 / f16 / bf16, converted to bf16 on the host) or, for load_format "dummy",
// generated on the device from config.json alone (uniform random matrices, norms 1).
// Under tensor parallelism a rank loads only its shard (engine/model/tensor_parallel.h): its
// heads' q/k/v rows, o_proj columns, intermediate rows of gate/up and columns of down, its
// vocabulary rows; a dummy shard equals the same slice of the world-size-1 dummy model.
// Engine thread only; immutable after loading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/base/cuda/cuda_util.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"

struct __nv_bfloat16;

namespace specd {

// Shapes are the rank's (TpShard): q_size, kv_size and intermediate count its heads and columns
// only; world size 1 holds the whole model.
struct CudaLayerWeights {
  const __nv_bfloat16* input_norm = nullptr;  // [hidden]
  // [q_size + 2 kv_size + gate_size, hidden] rows: q, k, v, then NSA's gate logits (none for
  // other families)
  const __nv_bfloat16* qkv = nullptr;
  const __nv_bfloat16* qkv_bias = nullptr;   // [q_size + 2 kv_size] or null
  const __nv_bfloat16* q_norm = nullptr;     // [head_dim] or null (Qwen3)
  const __nv_bfloat16* k_norm = nullptr;     // [head_dim] or null (Qwen3)
  const __nv_bfloat16* o_proj = nullptr;     // [hidden, q_size]
  const __nv_bfloat16* o_bias = nullptr;     // [hidden] or null (and null on ranks > 0)
  const __nv_bfloat16* post_norm = nullptr;  // [hidden]
  const __nv_bfloat16* gate_up = nullptr;    // [2 intermediate, hidden] rows: gate, up
  const __nv_bfloat16* down = nullptr;       // [hidden, intermediate]
};

// Every pointer is device memory inside `storage`, bf16.
struct CudaWeights {
  cuda::DeviceMemory storage;
  const __nv_bfloat16* embed = nullptr;       // [vocab_rows, hidden]: ids vocab_begin + row
  const __nv_bfloat16* lm_head = nullptr;     // [vocab_rows, hidden]; == embed when tied
  const __nv_bfloat16* final_norm = nullptr;  // [hidden]
  std::vector<CudaLayerWeights> layers;       // [num_layers]
  bool tied = false;
  int64_t vocab_begin = 0;  // the rank's first vocabulary id (TpShard::vocab_begin)
  int64_t vocab_rows = 0;   // vocabulary rows held (TpShard::vocab_local; vocab at world size 1)
};

struct WeightSource {
  std::string model_dir;
  bool dummy = false;       // random weights (no safetensors read)
  uint64_t dummy_seed = 0;  // seeds the random weights
};

// Bytes LoadCudaWeights will allocate for `shard` of `config` (the whole model's config; tied: no
// separate lm_head).
int64_t CudaWeightBytes(const ModelConfig& config, const TpShard& shard, bool tied);

// Whether the output matrix is the embedding: the config says so, or (safetensors) the checkpoint
// has no lm_head.weight, as the CPU loader decides.
absl::StatusOr<bool> OutputIsTied(const ModelConfig& config, const WeightSource& source);

// Allocates and fills `shard` of the weights on the current device (synchronously), reading only
// its slices from the memory-mapped checkpoint. ResourceExhausted when the allocation fails;
// InvalidArgument for a missing tensor, a wrong shape or dtype.
absl::StatusOr<CudaWeights> LoadCudaWeights(const ModelConfig& config, const TpShard& shard,
                                            const WeightSource& source, bool tied);

}  // namespace specd
