#include "kernels/ref/rope.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::ref {
namespace {

// Llama 3.1 8B's rope_scaling (config.json): rope_theta 500000, factor 8, low_freq_factor 1,
// high_freq_factor 4, original_max_position_embeddings 8192.
RopeFrequencyParams Llama31Params() {
  RopeFrequencyParams p;
  p.scaling = RopeScaling::kLlama3;
  p.theta = 500000.0;
  p.factor = 8.0;
  p.low_freq_factor = 1.0;
  p.high_freq_factor = 4.0;
  p.original_max_position_embeddings = 8192;
  return p;
}

TEST(RopeInvFreqTest, DefaultMatchesThetaPowerWithinOneUlp) {
  const std::vector<float> f = RopeInvFreq(RopeFrequencyParams{}, 64);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double expected = std::pow(10000.0, -2.0 * i / 64.0);
    EXPECT_NEAR(f[i], expected, expected * 0x1.0p-23) << i;
  }
  // float32 values transformers' _compute_default_rope_parameters gives (each step rounded to
  // float32, computed independently in Python).
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 0.7498942017555237f);
  EXPECT_EQ(f[5], 0.23713736236095428f);
  EXPECT_EQ(f[31], 0.0001333521504420787f);
}

TEST(RopeInvFreqTest, LinearDividesByFactor) {
  RopeFrequencyParams p;
  p.scaling = RopeScaling::kLinear;
  p.factor = 4.0;
  const std::vector<float> f = RopeInvFreq(p, 64);
  const std::vector<float> base = RopeInvFreq(RopeFrequencyParams{}, 64);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(f[i], base[i] / 4.0f) << i;
  EXPECT_EQ(f[0], 0.25f);
  EXPECT_EQ(f[31], 3.333803761051968e-05f);
}

// Values of transformers' _compute_llama3_parameters for Llama 3.1 8B (head_dim 128), each
// operation rounded to float32 as torch does, evaluated independently in Python.
TEST(RopeInvFreqTest, Llama3MatchesTransformersFloat32Values) {
  const std::vector<float> f = RopeInvFreq(Llama31Params(), 128);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 0.8146172165870667f);
  EXPECT_EQ(f[20], 0.016560440883040428f);
  EXPECT_EQ(f[30], 0.0013718936825171113f);  // medium band: smoothed
  EXPECT_EQ(f[40], 3.428102354519069e-05f);  // low band: divided by 8
  EXPECT_EQ(f[45], 1.2297638932068367e-05f);
  EXPECT_EQ(f[50], 4.411534519022098e-06f);
  EXPECT_EQ(f[63], 3.068925877869333e-07f);
}

// The three bands of Llama 3.1 scaling, against the formula evaluated in double.
TEST(RopeInvFreqTest, Llama3KeepsHighScalesLowAndSmoothsTheMiddle) {
  const RopeFrequencyParams p = Llama31Params();
  const std::vector<float> f = RopeInvFreq(p, 128);
  const std::vector<float> base = RopeInvFreq(RopeFrequencyParams{.theta = 500000.0}, 128);
  int num_high = 0, num_low = 0, num_medium = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    double expected;
    if (wavelen < 8192.0 / 4.0) {
      expected = base[i];
      ++num_high;
    } else if (wavelen > 8192.0) {
      expected = base[i] / 8.0;
      ++num_low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      expected = (1 - smooth) * base[i] / 8.0 + smooth * base[i];
      ++num_medium;
    }
    EXPECT_NEAR(f[i], expected, expected * 1e-6) << i;
  }
  EXPECT_GT(num_high, 0);
  EXPECT_GT(num_low, 0);
  EXPECT_GT(num_medium, 0);
}

TEST(BuildRopeCacheTest, CosAndSinOfTheFloat32Angle) {
  const std::vector<float> inv_freq = RopeInvFreq(Llama31Params(), 128);
  const int64_t positions = 1001;
  std::vector<double> table(positions * 128);
  std::vector<float> table32(positions * 128);
  BuildRopeCache(inv_freq.data(), 128, positions, table.data());
  BuildRopeCache(inv_freq.data(), 128, positions, table32.data());
  // Position 0: cos 1, sin 0 everywhere.
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(table[i], 1.0);
    EXPECT_EQ(table[64 + i], 0.0);
  }
  // Position 1000, i = 3: the angle is the float32 product 540.5809936523438.
  const float angle = inv_freq[3] * 1000.0f;
  EXPECT_EQ(angle, 540.5809936523438f);
  EXPECT_DOUBLE_EQ(table[1000 * 128 + 3], 0.9743330624296554);
  EXPECT_DOUBLE_EQ(table[1000 * 128 + 64 + 3], 0.22511126905699116);
  for (size_t j = 0; j < table.size(); ++j) {
    EXPECT_EQ(table32[j], static_cast<float>(table[j])) << j;
  }
}

// One head, head_dim 4 (x1 = x[0:2], x2 = x[2:4]) at a position with known cos / sin.
TEST(ApplyRopeTest, RotatesHalvesAsHuggingFaceRotateHalf) {
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  std::vector<double> table(3 * 4);
  BuildRopeCache(inv_freq.data(), 4, 3, table.data());
  const int32_t position = 2;
  std::vector<double> q = {1, 2, 3, 4};
  ApplyRope<double>(&position, 1, q.data(), 4, 1, nullptr, 4, 0, 4, 4, table.data());
  const double c0 = std::cos(2.0), s0 = std::sin(2.0), c1 = std::cos(1.0), s1 = std::sin(1.0);
  EXPECT_NEAR(q[0], 1 * c0 - 3 * s0, 1e-15);
  EXPECT_NEAR(q[1], 2 * c1 - 4 * s1, 1e-15);
  EXPECT_NEAR(q[2], 3 * c0 + 1 * s0, 1e-15);
  EXPECT_NEAR(q[3], 4 * c1 + 2 * s1, 1e-15);
}

// Partial rotary (rot_dim < head_dim) leaves the tail of each head alone; strided rows leave
// the gap between q, k and v alone; position 0 is the identity.
TEST(ApplyRopeTest, TouchesOnlyTheRotaryDimsOfQAndKHeads) {
  const int32_t head_dim = 8, rot_dim = 4, q_heads = 2, kv_heads = 1;
  const int64_t stride = (q_heads + 2 * kv_heads) * head_dim + 3;  // fused qkv row + padding
  const std::vector<float> inv_freq = RopeInvFreq(RopeFrequencyParams{}, rot_dim);
  std::vector<double> table(5 * rot_dim);
  BuildRopeCache(inv_freq.data(), rot_dim, 5, table.data());
  const std::vector<int32_t> positions = {0, 4};
  std::vector<double> qkv(2 * stride);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.25 * static_cast<double>(i) - 3.0;
  const std::vector<double> before = qkv;
  ApplyRope<double>(positions.data(), 2, qkv.data(), stride, q_heads,
                    qkv.data() + q_heads * head_dim, stride, kv_heads, head_dim, rot_dim,
                    table.data());
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t j = 0; j < stride; ++j) {
      const int64_t head = j / head_dim, dim = j % head_dim;
      const bool rotated = t == 1 && head < q_heads + kv_heads && dim < rot_dim;
      const double b = before[t * stride + j], a = qkv[t * stride + j];
      if (rotated) {
        EXPECT_NE(a, b) << t << " " << j;
      } else {
        EXPECT_EQ(a, b) << t << " " << j;
      }
    }
  }
  // A rotation keeps the norm of each (x1, x2) pair.
  for (int64_t head = 0; head < q_heads + kv_heads; ++head) {
    for (int i = 0; i < rot_dim / 2; ++i) {
      const int64_t j = stride + head * head_dim + i;
      EXPECT_NEAR(std::hypot(qkv[j], qkv[j + rot_dim / 2]),
                  std::hypot(before[j], before[j + rot_dim / 2]), 1e-12);
    }
  }
}

TEST(HeadRmsNormTest, NormalizesEachHeadSeparately) {
  // Two heads of dim 2 with a row stride of 5 (one padding element).
  std::vector<double> x = {3, 4, 1, 1, 99, 0, 2, -6, 8, 99};
  const std::vector<double> weight = {1, 2};
  HeadRmsNorm(x.data(), 5, 2, 2, 2, weight.data(), 0.0);
  EXPECT_NEAR(x[0], 3 / std::sqrt(12.5), 1e-12);
  EXPECT_NEAR(x[1], 2 * 4 / std::sqrt(12.5), 1e-12);
  EXPECT_NEAR(x[2], 1.0, 1e-12);
  EXPECT_NEAR(x[3], 2.0, 1e-12);
  EXPECT_EQ(x[4], 99);
  EXPECT_NEAR(x[5], 0.0, 1e-12);
  EXPECT_NEAR(x[6], 2 * 2 / std::sqrt(2.0), 1e-12);
  EXPECT_NEAR(x[7], -6 / std::sqrt(50.0), 1e-12);
  EXPECT_NEAR(x[8], 2 * 8 / std::sqrt(50.0), 1e-12);
  EXPECT_EQ(x[9], 99);
}

TEST(HeadRmsNormTest, EpsilonAddsToMeanSquare) {
  std::vector<float> x = {1, -1};
  const std::vector<float> weight = {1, 3};
  HeadRmsNorm(x.data(), 2, 1, 1, 2, weight.data(), 1.0);
  EXPECT_NEAR(x[0], 0.70710678f, 1e-6);
  EXPECT_NEAR(x[1], -2.12132034f, 1e-6);
}

}  // namespace
}  // namespace specd::kernels::ref
