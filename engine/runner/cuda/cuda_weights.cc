#include "engine/runner/cuda/cuda_weights.h"

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

// p + elems for bf16 pointers (the type is incomplete outside nvcc).
__nv_bfloat16* Offset(__nv_bfloat16* p, int64_t elems) {
  return reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<uint16_t*>(p) + elems);
}

// One checkpoint tensor, or the rank's slice of it, copied into part of a fused device tensor.
// The tensor is viewed as [shape[0], product of the other dims] (a vector: [n, 1]); the slice is
// rows [row_begin, row_begin + num_rows) x columns [col_begin, col_begin + num_cols), stored
// densely as [num_rows, num_cols].
struct Part {
  std::string name;
  std::vector<int64_t> shape;  // the whole checkpoint tensor's
  int64_t row_begin = 0, num_rows = 0;
  int64_t col_begin = 0, num_cols = 0;
  int64_t offset = 0;         // elements into the slot
  int64_t global_offset = 0;  // elements into the world-size-1 slot where the whole tensor starts

  int64_t full_cols() const {
    int64_t n = 1;
    for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
    return n;
  }
  int64_t count() const { return num_rows * num_cols; }
  int64_t full_count() const { return shape.empty() ? 0 : shape[0] * full_cols(); }
  // Rows are whole, so the slice is one contiguous range of the tensor.
  bool contiguous() const { return col_begin == 0 && num_cols == full_cols(); }
  // The slice's first element in the tensor.
  int64_t first() const { return row_begin * full_cols() + col_begin; }
};

// The whole tensor.
Part Whole(std::string name, std::vector<int64_t> shape) {
  Part p{std::move(name), std::move(shape)};
  p.num_rows = p.shape[0];
  p.num_cols = p.full_cols();
  return p;
}
// Rows [begin, begin + n) (column-parallel layers, vocabulary shards, their biases).
Part Rows(std::string name, std::vector<int64_t> shape, int64_t begin, int64_t n) {
  Part p = Whole(std::move(name), std::move(shape));
  p.row_begin = begin;
  p.num_rows = n;
  return p;
}
// Columns [begin, begin + n) of a matrix (row-parallel layers: their input features).
Part Cols(std::string name, std::vector<int64_t> shape, int64_t begin, int64_t n) {
  Part p = Whole(std::move(name), std::move(shape));
  p.col_begin = begin;
  p.num_cols = n;
  return p;
}

// One device tensor: where it lives in the allocation and what fills it.
struct Slot {
  Init init = Init::kMatrix;
  int64_t count = 0;   // bf16 elements
  int64_t offset = 0;  // bytes into the allocation
  std::vector<Part> parts;
  const __nv_bfloat16** dest = nullptr;
  uint64_t seed_index = 0;  // the slot's index in the world-size-1 plan (dummy seeds)
};

class Plan {
 public:
  // A tensor made of `parts` in order (their offsets are assigned here).
  void Add(Init init, std::vector<Part> parts, const __nv_bfloat16** dest) {
    int64_t count = 0, global = 0;
    for (Part& p : parts) {
      p.offset = count;
      p.global_offset = global;
      count += p.count();
      global += p.full_count();
    }
    slots_.push_back({init, count, bytes_, std::move(parts), dest, next_seed_index_++});
    bytes_ += (count * 2 + kAlign - 1) / kAlign * kAlign;
  }
  // A tensor of the world-size-1 model this rank does not hold: later slots keep their seeds.
  void Skip() { ++next_seed_index_; }
  const std::vector<Slot>& slots() const { return slots_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<Slot> slots_;
  int64_t bytes_ = 0;
  uint64_t next_seed_index_ = 0;
};

void PlanLayer(const ModelConfig& c, const TpShard& s, int32_t i, CudaLayerWeights& w, Plan& plan) {
  const TensorNames names = TensorNamesOf(c.family);
  const std::string p = absl::StrCat("model.layers.", i, ".");
  const std::string a = p + names.attn;
  const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size(), hd = c.head_dim;
  const int64_t ffn = c.intermediate_size;
  const int64_t q0 = s.head_begin * hd, qn = s.q_size(c.head_dim);
  const int64_t k0 = s.kv_head_begin * hd, kn = s.kv_size(c.head_dim);
  const int64_t f0 = s.intermediate_begin, fn = s.intermediate;
  plan.Add(Init::kNorm, {Whole(p + names.input_norm, {hidden})}, &w.input_norm);
  std::vector<Part> qkv = {Rows(a + "q_proj.weight", {q, hidden}, q0, qn),
                           Rows(a + "k_proj.weight", {kv, hidden}, k0, kn),
                           Rows(a + "v_proj.weight", {kv, hidden}, k0, kn)};
  // NSA's gate logits (3 rows per query head) follow v, so one GEMM gives q, k, v and the gates
  // (the CPU loader's layout too). Tensor parallelism refuses NSA: the rank holds every head.
  if (const int64_t gates = c.gate_size(); gates > 0) {
    qkv.push_back(Rows(a + "g_proj.weight", {gates, hidden}, 0, gates));
  }
  plan.Add(Init::kMatrix, std::move(qkv), &w.qkv);
  if (c.qkv_bias) {
    plan.Add(Init::kBias,
             {Rows(a + "q_proj.bias", {q}, q0, qn), Rows(a + "k_proj.bias", {kv}, k0, kn),
              Rows(a + "v_proj.bias", {kv}, k0, kn)},
             &w.qkv_bias);
  }
  if (c.qk_norm) {
    plan.Add(Init::kNorm, {Whole(a + "q_norm.weight", {c.head_dim})}, &w.q_norm);
    plan.Add(Init::kNorm, {Whole(a + "k_norm.weight", {c.head_dim})}, &w.k_norm);
  }
  plan.Add(Init::kMatrix, {Cols(a + "o_proj.weight", {hidden, q}, q0, qn)}, &w.o_proj);
  if (c.o_bias) {  // added once, before the all-reduce: rank 0 holds it
    if (s.rank == 0) {
      plan.Add(Init::kBias, {Whole(a + "o_proj.bias", {hidden})}, &w.o_bias);
    } else {
      plan.Skip();
    }
  }
  plan.Add(Init::kNorm, {Whole(p + names.post_norm, {hidden})}, &w.post_norm);
  plan.Add(Init::kMatrix,
           {Rows(p + "mlp.gate_proj.weight", {ffn, hidden}, f0, fn),
            Rows(p + "mlp.up_proj.weight", {ffn, hidden}, f0, fn)},
           &w.gate_up);
  plan.Add(Init::kMatrix, {Cols(p + "mlp.down_proj.weight", {hidden, ffn}, f0, fn)}, &w.down);
}

// The plan's dest pointers point into `w`, which must not move until the plan is filled.
Plan MakePlan(const ModelConfig& c, const TpShard& s, bool tied, CudaWeights& w) {
  Plan plan;
  const int64_t vocab = c.vocab_size, hidden = c.hidden_size;
  w.layers.assign(c.num_layers, CudaLayerWeights{});
  w.tied = tied;
  w.vocab_begin = s.vocab_begin;
  w.vocab_rows = s.vocab_local;
  plan.Add(Init::kMatrix,
           {Rows(TensorNamesOf(c.family).embed, {vocab, hidden}, s.vocab_begin, s.vocab_local)},
           &w.embed);
  for (int32_t i = 0; i < c.num_layers; ++i) PlanLayer(c, s, i, w.layers[i], plan);
  plan.Add(Init::kNorm, {Whole("model.norm.weight", {hidden})}, &w.final_norm);
  if (!tied) {
    plan.Add(Init::kMatrix, {Rows("lm_head.weight", {vocab, hidden}, s.vocab_begin, s.vocab_local)},
             &w.lm_head);
  }
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

// Converts `part`'s slice of `t` to bf16 through `staging` and uploads it, densely, to `dest`.
// A slice of whole rows is one range of the mapped file; a column slice is one range per row
// (only those pages of the mapping are read).
absl::Status UploadSlice(const TensorInfo& t, const Part& part, uint8_t* dest,
                         const cuda::PinnedMemory& staging) {
  const int64_t total = part.count(), full_cols = part.full_cols();
  // Contiguous: one run of `total` elements; else num_rows runs of num_cols.
  const int64_t run = part.contiguous() ? total : part.num_cols;
  uint16_t* host = staging.as<uint16_t>();
  for (int64_t done = 0; done < total;) {
    const int64_t n = std::min(kStagingElems, total - done);
    for (int64_t filled = 0; filled < n;) {
      const int64_t d = done + filled, r = d / run, c = d % run;
      const int64_t len = std::min(run - c, n - filled);
      const int64_t src = part.contiguous() ? part.first() + d
                                            : (part.row_begin + r) * full_cols + part.col_begin + c;
      ConvertToBf16(t, src, len, host + filled);
      filled += len;
    }
    SPECD_RETURN_IF_ERROR(
        cuda::Check(cudaMemcpy(dest + done * 2, host, n * 2, cudaMemcpyHostToDevice),
                    absl::StrCat("upload of ", part.name)));
    done += n;
  }
  return absl::OkStatus();
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
      SPECD_RETURN_IF_ERROR(
          UploadSlice(*ckpt.Find(part.name), part, base + slot.offset + part.offset * 2, staging));
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
// Each random value is a hash of (slot of the world-size-1 model, element index in it), so a
// shard holds exactly its slice of the world-size-1 dummy model.
absl::Status FillDummy(const Plan& plan, uint8_t* base, uint64_t seed) {
  for (const Slot& slot : plan.slots()) {
    auto* dest = reinterpret_cast<__nv_bfloat16*>(base + slot.offset);
    const bool residual =
        slot.parts.size() == 1 && (absl::EndsWith(slot.parts[0].name, ".o_proj.weight") ||
                                   absl::EndsWith(slot.parts[0].name, ".down_proj.weight"));
    if (slot.init == Init::kNorm || residual) {
      SPECD_RETURN_IF_ERROR(cuda::Check(
          kernels::FillBf16(dest, slot.count, slot.init == Init::kNorm ? 1.0f : 0.0f, nullptr),
          "dummy weight fill"));
      continue;
    }
    const uint64_t slot_seed = kernels::SplitMix64(seed + slot.seed_index);
    for (const Part& part : slot.parts) {
      // Contiguous: one launch; a column slice: one per row.
      const int64_t runs = part.contiguous() ? 1 : part.num_rows;
      const int64_t run = part.contiguous() ? part.count() : part.num_cols;
      for (int64_t r = 0; r < runs; ++r) {
        const int64_t first = part.global_offset + part.first() + r * part.full_cols();
        const cudaError_t e = kernels::FillUniformBf16At(Offset(dest, part.offset + r * run), run,
                                                         slot_seed, static_cast<uint64_t>(first),
                                                         -kDummyRange, kDummyRange, nullptr);
        SPECD_RETURN_IF_ERROR(cuda::Check(e, "dummy weight fill"));
      }
    }
  }
  return cuda::Check(cudaStreamSynchronize(nullptr), "dummy weight fill");
}

}  // namespace

int64_t CudaWeightBytes(const ModelConfig& config, const TpShard& shard, bool tied) {
  CudaWeights scratch;
  return MakePlan(config, shard, tied, scratch).bytes();
}

absl::StatusOr<bool> OutputIsTied(const ModelConfig& config, const WeightSource& source) {
  if (config.tie_word_embeddings || source.dummy) return config.tie_word_embeddings;
  SPECD_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt,
                         SafetensorsCheckpoint::OpenDir(source.model_dir));
  return !ckpt.Contains("lm_head.weight");
}

absl::StatusOr<CudaWeights> LoadCudaWeights(const ModelConfig& config, const TpShard& shard,
                                            const WeightSource& source, bool tied) {
  CudaWeights w;
  const Plan plan = MakePlan(config, shard, tied, w);
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
