// RoPE ops of the table: "rope" (BuildRopeCache, then ApplyRope on the q and k heads of a fused
// qkv buffer, whose v heads and row padding must come back untouched) and "head_rms_norm"
// (Qwen3's per-head q/k norm on a strided buffer), each against kernels/ref/rope.h.
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "kernels/check/op_families.h"
#include "kernels/cuda/rope.h"
#include "kernels/ref/bf16.h"
#include "kernels/ref/rope.h"

namespace specd::kernels::check {
namespace {

constexpr int64_t kBf16Bytes = 2;
constexpr float kHeadNormEps = 1e-6f;

__nv_bfloat16* Bf16(const DeviceBuffer& buffer) { return buffer.as<__nv_bfloat16>(); }

// What a rope case needs beyond OpShape; looked up by the shape's label.
struct RopeParams {
  int64_t num_tokens = 0;
  int32_t num_heads = 0;     // q heads (rope) or normalized heads (head_rms_norm)
  int32_t num_kv_heads = 0;  // rope only
  int32_t head_dim = 0;
  int32_t rot_dim = 0;        // rope only
  int64_t max_positions = 0;  // rope only: table rows
  ref::RopeScaling scaling = ref::RopeScaling::kDefault;
  double theta = 10000.0;
  int64_t pad = 0;  // extra elements per row: odd values force the scalar path
};

// Row stride of the fused buffer: q heads, k heads and v heads, then padding.
int64_t RowStride(const RopeParams& p) {
  return int64_t{p.num_heads + 2 * p.num_kv_heads} * p.head_dim + p.pad;
}

std::mt19937_64 RngFor(const RopeParams& p, uint64_t salt) {
  return std::mt19937_64(0x7095ULL ^ (salt * 1000003ULL) ^
                         static_cast<uint64_t>(p.num_tokens * 7919 + p.head_dim * 31 +
                                               p.num_heads * 131 + p.rot_dim + p.pad * 17));
}

ref::RopeFrequencyParams FrequencyParams(const RopeParams& p) {
  ref::RopeFrequencyParams f;
  f.scaling = p.scaling;
  f.theta = p.theta;
  if (p.scaling == ref::RopeScaling::kLlama3) f.factor = 8.0;  // Llama 3.1's rope_scaling
  if (p.scaling == ref::RopeScaling::kLinear) f.factor = 4.0;
  return f;
}

class RopeCase : public OpCase {
 public:
  explicit RopeCase(const RopeParams& p)
      : p_(p),
        stride_(RowStride(p)),
        inv_freq_(ref::RopeInvFreq(FrequencyParams(p), p.rot_dim)),
        inv_freq_dev_(inv_freq_.size() * sizeof(float)),
        positions_dev_(p.num_tokens * sizeof(int32_t)),
        cos_sin_(p.max_positions * p.rot_dim * sizeof(float)),
        qkv_(p.num_tokens * stride_ * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(p, 1);
    qkv_bits_ = RandomBf16(p.num_tokens * stride_, -3.0f, 3.0f, rng);
    std::uniform_int_distribution<int32_t> pos(0, static_cast<int32_t>(p.max_positions - 1));
    positions_.resize(p.num_tokens);
    for (int32_t& x : positions_) x = pos(rng);
    positions_[0] = static_cast<int32_t>(p.max_positions - 1);  // the largest angles
    if (p.num_tokens > 1) positions_[1] = 0;
    inv_freq_dev_.Upload(inv_freq_);
    positions_dev_.Upload(positions_);
    cos_sin_.Poison();
    SPECD_CUDA_CHECK(BuildRopeCache(inv_freq_dev_.as<float>(), p.rot_dim, p.max_positions,
                                    cos_sin_.as<float>(), nullptr));
    qkv_.Upload(qkv_bits_);
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  }

  cudaError_t Launch(cudaStream_t stream) override {
    __nv_bfloat16* q = Bf16(qkv_);
    __nv_bfloat16* k =
        reinterpret_cast<__nv_bfloat16*>(qkv_.as<uint16_t>() + int64_t{p_.num_heads} * p_.head_dim);
    return ApplyRope(positions_dev_.as<int32_t>(), p_.num_tokens, q, stride_, p_.num_heads, k,
                     stride_, p_.num_kv_heads, p_.head_dim, p_.rot_dim, cos_sin_.as<float>(),
                     stream);
  }

  // The rotated dims read and written, plus positions and the table rows used.
  int64_t BytesMoved() const override {
    return p_.num_tokens * (int64_t{p_.num_heads + p_.num_kv_heads} * p_.rot_dim * 2 * kBf16Bytes +
                            static_cast<int64_t>(sizeof(int32_t)) +
                            p_.rot_dim * static_cast<int64_t>(sizeof(float)));
  }

  std::vector<ErrorCheck> Check() override {
    cos_sin_.Poison();
    SPECD_CUDA_CHECK(BuildRopeCache(inv_freq_dev_.as<float>(), p_.rot_dim, p_.max_positions,
                                    cos_sin_.as<float>(), nullptr));
    qkv_.Upload(qkv_bits_);
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());

    const int64_t table_size = p_.max_positions * p_.rot_dim;
    std::vector<double> table64(table_size);
    std::vector<float> table32(table_size);
    ref::BuildRopeCache(inv_freq_.data(), p_.rot_dim, p_.max_positions, table64.data());
    ref::BuildRopeCache(inv_freq_.data(), p_.rot_dim, p_.max_positions, table32.data());
    const auto kernel_table = cos_sin_.Download<float>();

    std::vector<double> qkv64 = WidenToDouble(qkv_bits_);
    std::vector<float> qkv32 = WidenToFloat(qkv_bits_);
    const int64_t k_offset = int64_t{p_.num_heads} * p_.head_dim;
    ref::ApplyRope(positions_.data(), p_.num_tokens, qkv64.data(), stride_, p_.num_heads,
                   qkv64.data() + k_offset, stride_, p_.num_kv_heads, p_.head_dim, p_.rot_dim,
                   table64.data());
    ref::ApplyRope(positions_.data(), p_.num_tokens, qkv32.data(), stride_, p_.num_heads,
                   qkv32.data() + k_offset, stride_, p_.num_kv_heads, p_.head_dim, p_.rot_dim,
                   table32.data());
    return {CompareWithReference("cos_sin",
                                 std::vector<double>(kernel_table.begin(), kernel_table.end()),
                                 std::vector<double>(table32.begin(), table32.end()), table64),
            CompareWithReference("qkv", WidenToDouble(qkv_.Download<uint16_t>()),
                                 RoundToBf16(qkv32), qkv64)};
  }

 private:
  RopeParams p_;
  int64_t stride_;
  std::vector<float> inv_freq_;
  std::vector<int32_t> positions_;
  std::vector<uint16_t> qkv_bits_;
  DeviceBuffer inv_freq_dev_;   // [rot_dim / 2] f32
  DeviceBuffer positions_dev_;  // [num_tokens] int32
  DeviceBuffer cos_sin_;        // [max_positions, rot_dim] f32
  DeviceBuffer qkv_;            // [num_tokens, stride] bf16: q, k, v heads, padding
};

class HeadRmsNormCase : public OpCase {
 public:
  explicit HeadRmsNormCase(const RopeParams& p)
      : p_(p),
        stride_(RowStride(p)),
        x_(p.num_tokens * stride_ * kBf16Bytes),
        weight_(p.head_dim * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(p, 2);
    x_bits_ = RandomBf16(p.num_tokens * stride_, -4.0f, 4.0f, rng);
    weight_bits_ = RandomBf16(p.head_dim, -1.5f, 1.5f, rng);
    x_.Upload(x_bits_);
    weight_.Upload(weight_bits_);
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return HeadRmsNorm(Bf16(x_), stride_, p_.num_tokens, p_.num_heads, p_.head_dim, Bf16(weight_),
                       kHeadNormEps, stream);
  }

  int64_t BytesMoved() const override {
    return (2 * p_.num_tokens * p_.num_heads + 1) * p_.head_dim * kBf16Bytes;
  }

  std::vector<ErrorCheck> Check() override {
    x_.Upload(x_bits_);
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> x64 = WidenToDouble(x_bits_);
    std::vector<float> x32 = WidenToFloat(x_bits_);
    const auto w64 = WidenToDouble(weight_bits_);
    const auto w32 = WidenToFloat(weight_bits_);
    ref::HeadRmsNorm(x64.data(), stride_, p_.num_tokens, p_.num_heads, p_.head_dim, w64.data(),
                     kHeadNormEps);
    ref::HeadRmsNorm(x32.data(), stride_, p_.num_tokens, p_.num_heads, p_.head_dim, w32.data(),
                     kHeadNormEps);
    return {
        CompareWithReference("x", WidenToDouble(x_.Download<uint16_t>()), RoundToBf16(x32), x64)};
  }

 private:
  RopeParams p_;
  int64_t stride_;
  std::vector<uint16_t> x_bits_, weight_bits_;
  DeviceBuffer x_;       // [num_tokens, stride] bf16: the normalized heads first, then the rest
  DeviceBuffer weight_;  // [head_dim] bf16
};

std::string ScalingName(ref::RopeScaling s) {
  switch (s) {
    case ref::RopeScaling::kLinear:
      return " linear";
    case ref::RopeScaling::kLlama3:
      return " llama3";
    default:
      return "";
  }
}

// The test name is op_numtokens x width: keep (num_tokens, width) unique per op.
OpShape RopeShape(const RopeParams& p) {
  OpShape s;
  s.num_tokens = p.num_tokens;
  s.width = p.rot_dim;
  s.num_heads = p.num_heads;
  s.num_kv_heads = p.num_kv_heads;
  s.head_dim = p.head_dim;
  s.context = p.max_positions;
  s.label = "t=" + std::to_string(p.num_tokens) + " h=" + std::to_string(p.num_heads) + "/" +
            std::to_string(p.num_kv_heads) + " d=" + std::to_string(p.head_dim) +
            " rot=" + std::to_string(p.rot_dim) + " pos=" + std::to_string(p.max_positions) +
            ScalingName(p.scaling) + (p.pad > 0 ? " pad=" + std::to_string(p.pad) : "");
  return s;
}

OpShape HeadNormShape(const RopeParams& p) {
  OpShape s;
  s.num_tokens = p.num_tokens;
  s.width = p.head_dim;
  s.num_heads = p.num_heads;
  s.head_dim = p.head_dim;
  s.label = "t=" + std::to_string(p.num_tokens) + " h=" + std::to_string(p.num_heads) +
            " d=" + std::to_string(p.head_dim) + (p.pad > 0 ? " pad=" + std::to_string(p.pad) : "");
  return s;
}

using RopeScaling = ref::RopeScaling;

// {tokens, q heads, kv heads, head_dim, rot_dim, max_positions, scaling, theta, pad}
std::vector<RopeParams> RopeCheckParams() {
  return {
      {1, 32, 8, 128, 128, 131072, RopeScaling::kLlama3, 500000.0, 0},  // Llama 3.1 8B
      {7, 28, 4, 128, 128, 4096, RopeScaling::kDefault, 1000000.0, 0},  // Qwen2.5 7B
      {5, 16, 8, 64, 64, 2048, RopeScaling::kDefault, 10000.0, 0},
      {33, 8, 2, 80, 40, 1024, RopeScaling::kDefault, 10000.0, 0},  // partial, half 20: scalar
      {3, 4, 4, 256, 256, 512, RopeScaling::kDefault, 10000.0, 8},
      {130, 2, 1, 96, 96, 8192, RopeScaling::kLinear, 10000.0, 3},   // odd stride: scalar
      {17, 32, 8, 128, 64, 300, RopeScaling::kDefault, 10000.0, 0},  // partial, half 32
  };
}

std::vector<RopeParams> RopePerfParams() {
  return {{1, 32, 8, 128, 128, 8192, RopeScaling::kLlama3, 500000.0, 0},
          {256, 32, 8, 128, 128, 8192, RopeScaling::kLlama3, 500000.0, 0},
          {8192, 32, 8, 128, 128, 8192, RopeScaling::kLlama3, 500000.0, 0}};
}

// {tokens, heads, -, head_dim, -, -, -, -, pad}
std::vector<RopeParams> HeadNormCheckParams() {
  const auto p = [](int64_t t, int32_t h, int32_t d, int64_t pad) {
    return RopeParams{t, h, 0, d, 0, 0, RopeScaling::kDefault, 0.0, pad};
  };
  return {p(1, 32, 128, 0), p(9, 8, 128, 16), p(17, 40, 128, 0), p(5, 16, 64, 0), p(3, 4, 256, 0),
          p(7, 2, 512, 0),  p(11, 3, 100, 0), p(4, 2, 128, 3),   p(130, 1, 30, 0)};
}

std::vector<RopeParams> HeadNormPerfParams() {
  const auto p = [](int64_t t) {
    return RopeParams{t, 32, 0, 128, 0, 0, RopeScaling::kDefault, 0.0, 2048};  // Qwen3 8B q
  };
  return {p(1), p(256), p(8192)};
}

OpSpec MakeSpec(std::string name, const std::vector<RopeParams>& check,
                const std::vector<RopeParams>& perf, OpShape (*shape_of)(const RopeParams&),
                std::function<std::unique_ptr<OpCase>(const RopeParams&)> make) {
  return MakeLabelledSpec<RopeParams>(std::move(name), check, perf, shape_of, std::move(make));
}

}  // namespace

void AddRopeOps(std::vector<OpSpec>* table) {
  table->push_back(MakeSpec("rope", RopeCheckParams(), RopePerfParams(), RopeShape,
                            [](const RopeParams& p) { return std::make_unique<RopeCase>(p); }));
  table->push_back(
      MakeSpec("head_rms_norm", HeadNormCheckParams(), HeadNormPerfParams(), HeadNormShape,
               [](const RopeParams& p) { return std::make_unique<HeadRmsNormCase>(p); }));
}

}  // namespace specd::kernels::check
