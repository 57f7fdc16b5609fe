#include "engine/runner/cuda_weights.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/base/float16.h"
#include "engine/base/status.h"
#include "engine/model/safetensors.h"
#include "kernels/cuda/init.h"

namespace specd {
namespace {

constexpr int64_t kAlign = 256;                       // bytes; every tensor starts 256-aligned
constexpr int64_t kStagingElems = int64_t{16} << 20;  // bf16 elements per host->device copy
// Dummy weights: U(-a, a) for matrices and biases. With RMSNorm before every sublayer, a
// projection's output has std ~ a / sqrt(3) * sqrt(fan_in) (0.74 for hidden 4096), so the
// residual stream grows like a random walk (~4 after 32 layers) and logits stay O(1).
constexpr float kDummyRange = 0.02f;

enum class Init { kMatrix, kNorm, kBias };

// One checkpoint tensor copied into part of a fused device tensor.
struct Part {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the slot
};

// One device tensor: where it lives in the allocation and what fills it.
struct Slot {
  Init init = Init::kMatrix;
  int64_t count = 0;   // bf16 elements
  int64_t offset = 0;  // bytes into the allocation
  std::vector<Part> parts;
  const __nv_bfloat16** dest = nullptr;
};

class Plan {
 public:
  void Add(Init init, int64_t count, std::vector<Part> parts, const __nv_bfloat16** dest) {
    slots_.push_back({init, count, bytes_, std::move(parts), dest});
    bytes_ += (count * 2 + kAlign - 1) / kAlign * kAlign;
  }
  // A tensor that is one checkpoint tensor of `shape`.
  void AddOne(Init init, const std::string& name, std::vector<int64_t> shape,
              const __nv_bfloat16** dest) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    Add(init, count, {{name, std::move(shape), 0}}, dest);
  }
  const std::vector<Slot>& slots() const { return slots_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<Slot> slots_;
  int64_t bytes_ = 0;
};

void PlanLayer(const ModelConfig& c, int32_t i, CudaLayerWeights& w, Plan& plan) {
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const std::string a = p + "self_attn.";
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
  const int64_t ffn = c.intermediate_size;
  plan.AddOne(Init::kNorm, p + "input_layernorm.weight", {hidden}, &w.input_norm);
  plan.Add(Init::kMatrix, (q + 2 * kv) * hidden,
           {{a + "q_proj.weight", {q, hidden}, 0},
            {a + "k_proj.weight", {kv, hidden}, q * hidden},
            {a + "v_proj.weight", {kv, hidden}, (q + kv) * hidden}},
           &w.qkv);
  if (c.qkv_bias) {
    plan.Add(Init::kBias, q + 2 * kv,
             {{a + "q_proj.bias", {q}, 0},
              {a + "k_proj.bias", {kv}, q},
              {a + "v_proj.bias", {kv}, q + kv}},
             &w.qkv_bias);
  }
  if (c.qk_norm) {
    plan.AddOne(Init::kNorm, a + "q_norm.weight", {c.head_dim}, &w.q_norm);
    plan.AddOne(Init::kNorm, a + "k_norm.weight", {c.head_dim}, &w.k_norm);
  }
  plan.AddOne(Init::kMatrix, a + "o_proj.weight", {hidden, q}, &w.o_proj);
  if (c.o_bias) plan.AddOne(Init::kBias, a + "o_proj.bias", {hidden}, &w.o_bias);
  plan.AddOne(Init::kNorm, p + "post_attention_layernorm.weight", {hidden}, &w.post_norm);
  plan.Add(Init::kMatrix, 2 * ffn * hidden,
           {{p + "mlp.gate_proj.weight", {ffn, hidden}, 0},
            {p + "mlp.up_proj.weight", {ffn, hidden}, ffn * hidden}},
           &w.gate_up);
  plan.AddOne(Init::kMatrix, p + "mlp.down_proj.weight", {hidden, ffn}, &w.down);
}

// The plan's dest pointers point into `w`, which must not move until the plan is filled.
Plan MakePlan(const ModelConfig& c, bool tied, CudaWeights& w) {
  Plan plan;
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size;
  w.layers.assign(c.num_layers, CudaLayerWeights{});
  w.tied = tied;
  plan.AddOne(Init::kMatrix, "model.embed_tokens.weight", {vocab, hidden}, &w.embed);
  for (int32_t i = 0; i < c.num_layers; ++i) PlanLayer(c, i, w.layers[i], plan);
  plan.AddOne(Init::kNorm, "model.norm.weight", {hidden}, &w.final_norm);
  if (!tied) plan.AddOne(Init::kMatrix, "lm_head.weight", {vocab, hidden}, &w.lm_head);
  return plan;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status CheckTensor(const TensorInfo* t, const Part& part, const std::string& dir) {
  if (t == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: tensor '", part.name, "' is missing from ", dir));
  }
  if (t->shape != part.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: tensor '", part.name, "' in ", *t->file, " has shape ",
                     ShapeString(t->shape), ", the model expects ", ShapeString(part.shape)));
  }
  if (t->dtype != TensorDtype::kF32 && t->dtype != TensorDtype::kF16 &&
      t->dtype != TensorDtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("weights: tensor '", part.name, "' in ",
                                                   *t->file, ": dtype ", t->dtype_name,
                                                   " is not supported (F32, F16, BF16)"));
  }
  return absl::OkStatus();
}

// Elements [begin, begin + n) of `t` as bf16 bits.
void ConvertToBf16(const TensorInfo& t, int64_t begin, int64_t n, uint16_t* out) {
  const uint8_t* src = t.data.data();
  switch (t.dtype) {
    case TensorDtype::kBF16:
      std::memcpy(out, src + begin * 2, n * 2);
      return;
    case TensorDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + (begin + i) * 2, 2);
        out[i] = FloatToBf16(Fp16ToFloat(h));
      }
      return;
    default:  // kF32 (CheckTensor allows nothing else)
      for (int64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, src + (begin + i) * 4, 4);
        out[i] = FloatToBf16(f);
      }
      return;
  }
}

absl::Status FillFromCheckpoint(const Plan& plan, uint8_t* base, const std::string& dir) {
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::OpenDir(dir));
  for (const Slot& slot : plan.slots()) {  // validate everything before any copy
    for (const Part& part : slot.parts) {
      SPECD_RETURN_IF_ERROR(CheckTensor(ckpt.Find(part.name), part, dir));
    }
  }
  SPECD_ASSIGN_OR_RETURN(cuda::PinnedMemory staging,
                         cuda::PinnedMemory::Allocate(kStagingElems * 2, "weight staging"));
  for (const Slot& slot : plan.slots()) {
    for (const Part& part : slot.parts) {
      const TensorInfo& t = *ckpt.Find(part.name);
      const int64_t count =
          static_cast<int64_t>(t.data.size()) / (t.dtype == TensorDtype::kF32 ? 4 : 2);
      uint8_t* dest = base + slot.offset + part.offset * 2;
      for (int64_t begin = 0; begin < count; begin += kStagingElems) {
        const int64_t n = std::min(kStagingElems, count - begin);
        ConvertToBf16(t, begin, n, staging.as<uint16_t>());
        SPECD_RETURN_IF_ERROR(
            cuda::Check(cudaMemcpy(dest + begin * 2, staging.as(), n * 2, cudaMemcpyHostToDevice),
                        absl::StrCat("upload of ", part.name)));
      }
    }
  }
  return absl::OkStatus();
}

// Uniform random weights in [-kDummyRange, kDummyRange] and norms of 1, except the two
// projections that write into the residual stream (o_proj, down_proj), which are zero: the
// stream is then exactly the token's embedding, the logits a fixed random function of the last
// token, and greedy decoding of a dummy model the same whatever kernels compute it (decode
// steps, verification chunks, any batch). With random values there instead, a random 8B
// target's greedy output depended on those paths (docs/benchmarks.md, 2026-11-24), which breaks
// benchmarks that replay a recorded greedy continuation (spec_bench --replay-alpha). Every GEMM
// and attention kernel still reads and computes as much as with any other values.
absl::Status FillDummy(const Plan& plan, uint8_t* base, uint64_t seed) {
  uint64_t index = 0;
  for (const Slot& slot : plan.slots()) {
    auto* dest = reinterpret_cast<__nv_bfloat16*>(base + slot.offset);
    const bool residual =
        slot.parts.size() == 1 && (absl::EndsWith(slot.parts[0].name, ".o_proj.weight") ||
                                   absl::EndsWith(slot.parts[0].name, ".down_proj.weight"));
    const cudaError_t e =
        slot.init == Init::kNorm ? kernels::FillBf16(dest, slot.count, 1.0f, nullptr)
        : residual               ? kernels::FillBf16(dest, slot.count, 0.0f, nullptr)
                   : kernels::FillUniformBf16(dest, slot.count, kernels::SplitMix64(seed + index),
                                              -kDummyRange, kDummyRange, nullptr);
    SPECD_RETURN_IF_ERROR(cuda::Check(e, "dummy weight fill"));
    ++index;
  }
  return cuda::Check(cudaStreamSynchronize(nullptr), "dummy weight fill");
}

}  // namespace

int64_t CudaWeightBytes(const ModelConfig& config, bool tied) {
  CudaWeights scratch;
  return MakePlan(config, tied, scratch).bytes();
}

absl::StatusOr<bool> OutputIsTied(const ModelConfig& config, const WeightSource& source) {
  if (config.tie_word_embeddings || source.dummy) return config.tie_word_embeddings;
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt,
                         SafetensorsCheckpoint::OpenDir(source.model_dir));
  return !ckpt.Contains("lm_head.weight");
}

absl::StatusOr<CudaWeights> LoadCudaWeights(const ModelConfig& config, const WeightSource& source,
                                            bool tied) {
  CudaWeights w;
  const Plan plan = MakePlan(config, tied, w);
  SPECD_ASSIGN_OR_RETURN(w.storage, cuda::DeviceMemory::Allocate(plan.bytes(), "model weights"));
  uint8_t* base = w.storage.as<uint8_t>();
  for (const Slot& slot : plan.slots()) {
    *slot.dest = reinterpret_cast<const __nv_bfloat16*>(base + slot.offset);
  }
  if (tied) w.lm_head = w.embed;
  if (source.dummy) {
    SPECD_RETURN_IF_ERROR(FillDummy(plan, base, source.dummy_seed));
  } else {
    SPECD_RETURN_IF_ERROR(FillFromCheckpoint(plan, base, source.model_dir));
  }
  return w;
}

}  // namespace specd
