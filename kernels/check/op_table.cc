#include "kernels/check/op_table.h"

#include <cstdio>
#include <random>
#include <utility>

#include "kernels/check/op_families.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/ref/activation.h"
#include "kernels/ref/embedding.h"
#include "kernels/ref/rmsnorm.h"

namespace specd::kernels::check {
namespace {

constexpr float kRmsNormEps = 1e-5f;
constexpr int64_t kBf16Bytes = 2;

std::mt19937_64 RngFor(const OpShape& shape, uint64_t op_salt) {
  return std::mt19937_64(
      0x5eedULL ^ (op_salt * 1000003ULL) ^
      static_cast<uint64_t>(shape.num_tokens * 7919 + shape.width * 31 + shape.table_rows));
}

__nv_bfloat16* Bf16(const DeviceBuffer& buffer) { return buffer.as<__nv_bfloat16>(); }

// rms_norm and fused_add_rms_norm.
class RmsNormCase : public OpCase {
 public:
  RmsNormCase(const OpShape& shape, bool add_residual)
      : shape_(shape),
        add_residual_(add_residual),
        num_values_(shape.num_tokens * shape.width),
        input_(num_values_ * kBf16Bytes),
        residual_(add_residual ? num_values_ * kBf16Bytes : 0),
        weight_(shape.width * kBf16Bytes),
        out_(num_values_ * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(shape, add_residual ? 2 : 1);
    input_bits_ = RandomBf16(num_values_, -2.0f, 2.0f, rng);
    weight_bits_ = RandomBf16(shape.width, -1.5f, 1.5f, rng);
    if (add_residual_) residual_bits_ = RandomBf16(num_values_, -4.0f, 4.0f, rng);
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    if (add_residual_) {
      return FusedAddRmsNorm(Bf16(input_), Bf16(residual_), Bf16(weight_), shape_.num_tokens,
                             shape_.width, kRmsNormEps, Bf16(out_), stream);
    }
    return RmsNorm(Bf16(input_), Bf16(weight_), shape_.num_tokens, shape_.width, kRmsNormEps,
                   Bf16(out_), stream);
  }

  int64_t BytesMoved() const override {
    const int64_t row_passes = add_residual_ ? 4 : 2;  // fused: read input, residual; write both
    return (row_passes * num_values_ + shape_.width) * kBf16Bytes;
  }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t t = shape_.num_tokens, h = shape_.width;
    const double eps = kRmsNormEps;

    std::vector<double> out64(num_values_), res64 = WidenToDouble(residual_bits_);
    std::vector<float> out32(num_values_), res32 = WidenToFloat(residual_bits_);
    const auto in64 = WidenToDouble(input_bits_), w64 = WidenToDouble(weight_bits_);
    const auto in32 = WidenToFloat(input_bits_), w32 = WidenToFloat(weight_bits_);
    if (add_residual_) {
      ref::FusedAddRmsNorm(in64.data(), res64.data(), w64.data(), t, h, eps, out64.data());
      ref::FusedAddRmsNorm(in32.data(), res32.data(), w32.data(), t, h, eps, out32.data());
    } else {
      ref::RmsNorm(in64.data(), w64.data(), t, h, eps, out64.data());
      ref::RmsNorm(in32.data(), w32.data(), t, h, eps, out32.data());
    }
    std::vector<ErrorCheck> checks = {CompareWithReference(
        "out", WidenToDouble(out_.Download<uint16_t>()), RoundToBf16(out32), out64)};
    if (add_residual_) {
      checks.push_back(CompareWithReference(
          "residual", WidenToDouble(residual_.Download<uint16_t>()), RoundToBf16(res32), res64));
    }
    return checks;
  }

 private:
  void Reset() {
    input_.Upload(input_bits_);
    weight_.Upload(weight_bits_);
    if (add_residual_) residual_.Upload(residual_bits_);
    out_.Poison();
  }

  OpShape shape_;
  bool add_residual_;
  int64_t num_values_;
  std::vector<uint16_t> input_bits_, residual_bits_, weight_bits_;
  DeviceBuffer input_;     // [num_tokens, hidden] bf16
  DeviceBuffer residual_;  // [num_tokens, hidden] bf16, in/out; empty without add_residual
  DeviceBuffer weight_;    // [hidden] bf16
  DeviceBuffer out_;       // [num_tokens, hidden] bf16
};

class SiluAndMulCase : public OpCase {
 public:
  explicit SiluAndMulCase(const OpShape& shape)
      : shape_(shape),
        gate_up_(shape.num_tokens * 2 * shape.width * kBf16Bytes),
        out_(shape.num_tokens * shape.width * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(shape, 3);
    // [-6, 6] spans silu's saturated, curved and linear regions.
    gate_up_bits_ = RandomBf16(shape.num_tokens * 2 * shape.width, -6.0f, 6.0f, rng);
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return SiluAndMul(Bf16(gate_up_), shape_.num_tokens, shape_.width, Bf16(out_), stream);
  }

  int64_t BytesMoved() const override { return 3 * shape_.num_tokens * shape_.width * kBf16Bytes; }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t n = shape_.num_tokens * shape_.width;
    std::vector<double> out64(n);
    std::vector<float> out32(n);
    ref::SiluAndMul(WidenToDouble(gate_up_bits_).data(), shape_.num_tokens, shape_.width,
                    out64.data());
    ref::SiluAndMul(WidenToFloat(gate_up_bits_).data(), shape_.num_tokens, shape_.width,
                    out32.data());
    return {CompareWithReference("out", WidenToDouble(out_.Download<uint16_t>()),
                                 RoundToBf16(out32), out64)};
  }

 private:
  void Reset() {
    gate_up_.Upload(gate_up_bits_);
    out_.Poison();
  }

  OpShape shape_;
  std::vector<uint16_t> gate_up_bits_;
  DeviceBuffer gate_up_;  // [num_tokens, 2 * d] bf16
  DeviceBuffer out_;      // [num_tokens, d] bf16
};

class EmbeddingCase : public OpCase {
 public:
  // The shard starts past id 0 so ids below it exist; a few ids fall on each side of it.
  static constexpr int64_t kVocabStart = 1000;
  static constexpr int64_t kOutside = 8;

  explicit EmbeddingCase(const OpShape& shape)
      : shape_(shape),
        token_ids_(shape.num_tokens * sizeof(int32_t)),
        table_(shape.table_rows * shape.width * kBf16Bytes),
        out_(shape.num_tokens * shape.width * kBf16Bytes) {
    std::mt19937_64 rng = RngFor(shape, 4);
    table_bits_ = RandomBf16(shape.table_rows * shape.width, -1.0f, 1.0f, rng);
    std::uniform_int_distribution<int32_t> id_dist(
        static_cast<int32_t>(kVocabStart - kOutside),
        static_cast<int32_t>(kVocabStart + shape.table_rows + kOutside - 1));
    ids_.resize(shape.num_tokens);
    for (int32_t& id : ids_) id = id_dist(rng);
    Reset();
  }

  cudaError_t Launch(cudaStream_t stream) override {
    return EmbeddingGather(token_ids_.as<int32_t>(), shape_.num_tokens, Bf16(table_), kVocabStart,
                           shape_.table_rows, shape_.width, Bf16(out_), stream);
  }

  int64_t BytesMoved() const override {
    return shape_.num_tokens *
           (static_cast<int64_t>(sizeof(int32_t)) + 2 * shape_.width * kBf16Bytes);
  }

  std::vector<ErrorCheck> Check() override {
    Reset();
    SPECD_CUDA_CHECK(Launch(nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t n = shape_.num_tokens * shape_.width;
    std::vector<double> out64(n);
    std::vector<float> out32(n);
    ref::EmbeddingGather(ids_.data(), shape_.num_tokens, WidenToDouble(table_bits_).data(),
                         kVocabStart, shape_.table_rows, shape_.width, out64.data());
    ref::EmbeddingGather(ids_.data(), shape_.num_tokens, WidenToFloat(table_bits_).data(),
                         kVocabStart, shape_.table_rows, shape_.width, out32.data());
    return {CompareWithReference("out", WidenToDouble(out_.Download<uint16_t>()),
                                 RoundToBf16(out32), out64)};
  }

 private:
  void Reset() {
    token_ids_.Upload(ids_);
    table_.Upload(table_bits_);
    out_.Poison();
  }

  OpShape shape_;
  std::vector<int32_t> ids_;
  std::vector<uint16_t> table_bits_;
  DeviceBuffer token_ids_;  // [num_tokens] int32
  DeviceBuffer table_;      // [table_rows, hidden] bf16
  DeviceBuffer out_;        // [num_tokens, hidden] bf16
};

// Widths: tiny (64), small (384), not a power of two (1000), not a multiple of 8 (1001, 77,
// 30001: scalar path), Llama-8B/13B (4096, 5120, 14336) and the register limit (32768).
std::vector<OpShape> NormCheckShapes() {
  return {{1, 64},   {3, 384},   {5, 1000},  {7, 1001}, {16, 4096},
          {9, 5120}, {2, 32768}, {3, 30001}, {130, 77}};
}

std::vector<OpShape> NormPerfShapes() {
  return {{1, 4096}, {256, 4096}, {8192, 4096}, {8192, 5120}};
}

}  // namespace

std::string OpShape::ToString() const {
  if (!label.empty()) return label;
  char buf[64];
  if (table_rows > 0) {
    std::snprintf(buf, sizeof(buf), "%lldx%lld rows=%lld", static_cast<long long>(num_tokens),
                  static_cast<long long>(width), static_cast<long long>(table_rows));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldx%lld", static_cast<long long>(num_tokens),
                  static_cast<long long>(width));
  }
  return buf;
}

namespace {

std::vector<OpSpec> BaseOps() {
  return std::vector<OpSpec>{
      {"rms_norm", NormCheckShapes(), NormPerfShapes(),
       [](const OpShape& s) { return std::make_unique<RmsNormCase>(s, false); }},
      {"fused_add_rms_norm", NormCheckShapes(), NormPerfShapes(),
       [](const OpShape& s) { return std::make_unique<RmsNormCase>(s, true); }},
      {"silu_and_mul",
       {{1, 64}, {3, 384}, {5, 1000}, {7, 1001}, {16, 4096}, {9, 5120}, {4, 14336}, {33, 77}},
       {{1, 14336}, {256, 14336}, {4096, 14336}},
       [](const OpShape& s) { return std::make_unique<SiluAndMulCase>(s); }},
      {"embedding",
       {{1, 64, 50},
        {17, 384, 300},
        {33, 1000, 100},
        {7, 1001, 64},
        {16, 4096, 500},
        {9, 5120, 40},
        {64, 77, 1000}},
       {{1, 4096, 4096}, {256, 4096, 4096}, {8192, 4096, 32000}},
       [](const OpShape& s) { return std::make_unique<EmbeddingCase>(s); }},
  };
}

}  // namespace

const std::vector<OpSpec>& OpTable() {
  static const auto* table = [] {
    auto* t = new std::vector<OpSpec>(BaseOps());
    AddRopeOps(t);
    AddAttentionOps(t);
    AddSamplingOps(t);
    AddGemmOps(t);
    AddVerifyOps(t);
    AddDraftOps(t);
    AddNsaOps(t);
    return t;
  }();
  return *table;
}

}  // namespace specd::kernels::check
