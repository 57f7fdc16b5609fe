// The Vegas CUDA kernels (kernels/cuda/vegas.h) against their references (kernels/ref/vegas.h):
// the score-collecting verification attention (outputs under the flash-attention rule, fp16 logits
// against the fp64 head averages and split statistics against the logits, for groups that
// straddle warps too), the top-k selection (exactly the reference's indices, up to 128K tokens),
// the head-averaged prefix weights (against the host's, up to 128 heads and 128K tokens), and the
// sparse attention over index lists (the flash-attention rule, with every unselected slot NaN).
// Exits 77 (ctest: skipped) where no GPU is visible.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/vegas.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/vegas.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

constexpr uint16_t kNaNBits = 0xffff;

__nv_bfloat16* Bf16(const DeviceBuffer& b) { return b.as<__nv_bfloat16>(); }

int NumSms() {
  int device = 0, num_sms = 0;
  SPECD_CUDA_CHECK(cudaGetDevice(&device));
  SPECD_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  return num_sms;
}

AttentionShape Shape(int hq, int hkv, int d, int block) {
  AttentionShape s;
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.block_size = block;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  return s;
}

ref::AttentionShape RefShape(const AttentionShape& a) {
  return {a.num_q_heads,   a.num_kv_heads, a.head_dim, a.block_size, static_cast<double>(a.scale),
          a.sliding_window};
}

// A bf16 paged cache behind shuffled block tables. Token `pos` of sequence s holds random data
// where readable(s, pos); every other slot (unreadable tokens, slots past each length, blocks
// nobody owns) is NaN, so a read the attention must not make poisons its output.
struct PagedKv {
  int32_t max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  std::vector<uint16_t> k_bits, v_bits;

  PagedKv(const AttentionShape& a, const std::vector<int32_t>& seq_lens,
          const std::function<bool(size_t, int32_t)>& readable, std::mt19937_64& rng) {
    int64_t num_blocks = 2;  // owned by nobody
    for (int32_t len : seq_lens) {
      const int32_t blocks = (len + a.block_size - 1) / a.block_size;
      max_blocks_per_seq = std::max(max_blocks_per_seq, blocks + 1);
      num_blocks += blocks;
    }
    std::vector<int32_t> pool(num_blocks);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    block_tables.assign(seq_lens.size() * max_blocks_per_seq, -1);
    const int64_t tile = static_cast<int64_t>(a.block_size) * a.head_dim;
    k_bits.assign(num_blocks * a.num_kv_heads * tile, kNaNBits);
    v_bits = k_bits;
    size_t next = 0;
    for (size_t s = 0; s < seq_lens.size(); ++s) {
      for (int32_t pos = 0; pos < seq_lens[s]; ++pos) {
        int32_t& block = block_tables[s * max_blocks_per_seq + pos / a.block_size];
        if (pos % a.block_size == 0) block = pool[next++];
        if (!readable(s, pos)) continue;
        const auto k = check::RandomBf16(a.num_kv_heads * a.head_dim, -2.0f, 2.0f, rng);
        const auto v = check::RandomBf16(a.num_kv_heads * a.head_dim, -2.0f, 2.0f, rng);
        for (int32_t h = 0; h < a.num_kv_heads; ++h) {
          const int64_t dst =
              (block * a.num_kv_heads + h) * tile + (pos % a.block_size) * a.head_dim;
          std::copy_n(k.begin() + h * a.head_dim, a.head_dim, k_bits.begin() + dst);
          std::copy_n(v.begin() + h * a.head_dim, a.head_dim, v_bits.begin() + dst);
        }
      }
    }
  }
};

std::vector<int32_t> SeqLens(int batch, int context) {
  std::vector<int32_t> lens(batch);
  for (int i = 0; i < batch; ++i) lens[i] = context - i * (context / (2 * batch + 1));
  return lens;
}

// IEEE half <-> float on the host (the kernels' fp16 logits), round to nearest even.
float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), exp - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits |= sign;
  std::memcpy(&v, &bits, 4);
  return v;
}

uint16_t FloatToHalfBits(float f) {  // finite |f| < 65520; what __float2half_rn gives
  const uint16_t sign = std::signbit(f) ? 0x8000u : 0u;
  const float a = std::abs(f);
  int e;
  std::frexp(a, &e);                           // a = m 2^e, m in [0.5, 1)
  const int step_exp = std::max(e - 11, -24);  // the spacing of halves near a
  const double q = std::nearbyint(std::ldexp(static_cast<double>(a), -step_exp));  // ties even
  const double v = std::ldexp(q, step_exp);
  if (v == 0) return sign;
  int ve;
  const double vm = std::frexp(v, &ve);                      // v = vm 2^ve
  if (ve - 1 < -14) return sign | static_cast<uint16_t>(q);  // subnormal: q units of 2^-24
  const int biased = ve - 1 + 15;
  const auto mant = static_cast<uint16_t>(std::ldexp(vm * 2 - 1, 10));
  return sign | static_cast<uint16_t>(biased << 10) | mant;
}

std::vector<int32_t> CuLens(int batch, int q_len) {
  std::vector<int32_t> cu(batch + 1);
  for (int i = 0; i <= batch; ++i) cu[i] = i * q_len;
  return cu;
}

// ---------------------------------------------------------------------------------------------
// Verification with score collection.

struct VerifyCase {
  int batch, q_len, hq, hkv, d, block, context, splits;  // splits 0: ChooseVerifySplits
};

class VerifyWithScoresTest : public ::testing::TestWithParam<VerifyCase> {};

TEST_P(VerifyWithScoresTest, OutputsAndScoresMatchTheReference) {
  const VerifyCase c = GetParam();
  const AttentionShape a = Shape(c.hq, c.hkv, c.d, c.block);
  std::mt19937_64 rng(c.context * 31 + c.q_len);
  const std::vector<int32_t> lens = SeqLens(c.batch, c.context);
  const std::vector<int32_t> cu = CuLens(c.batch, c.q_len);
  const PagedKv kv(
      a, lens, [](size_t, int32_t) { return true; }, rng);
  const int64_t tokens = cu.back(), row = static_cast<int64_t>(c.hq) * c.d;
  const std::vector<uint16_t> q_bits = check::RandomBf16(tokens * row, -2.0f, 2.0f, rng);
  const int32_t splits =  // a scored run takes at most kVegasScoreSplits (as the runner clamps)
      c.splits > 0 ? c.splits
                   : std::min(kVegasScoreSplits,
                              ChooseVerifySplits(c.batch, c.q_len, c.context, NumSms(), a));
  const int64_t stride = (c.context + 7) / 8 * 8;  // >= every prefix; even
  DeviceBuffer k(kv.k_bits.size() * 2), v(kv.v_bits.size() * 2), q(q_bits.size() * 2);
  DeviceBuffer tables(kv.block_tables.size() * 4), seq_lens(lens.size() * 4), cu_q(cu.size() * 4);
  const int parts_per_row = VegasScoreParts(a);
  const int64_t head_rows = int64_t{c.batch} * 2 * parts_per_row;
  DeviceBuffer out(tokens * row * 2), logits(head_rows * stride * 2);
  DeviceBuffer stats(head_rows * kVegasScoreSplits * 2 * 4);
  DeviceBuffer workspace(std::max<size_t>(16, PagedVerifyWorkspaceBytes(tokens, splits, a)));
  k.Upload(kv.k_bits);
  v.Upload(kv.v_bits);
  q.Upload(q_bits);
  tables.Upload(kv.block_tables);
  seq_lens.Upload(lens);
  cu_q.Upload(cu);
  out.Poison();
  logits.Poison();
  stats.Poison();
  workspace.Poison();
  SPECD_CUDA_CHECK(PagedVerifyAttentionWithScores(
      Bf16(q), row, Bf16(k), Bf16(v), tables.as<int32_t>(), kv.max_blocks_per_seq,
      cu_q.as<int32_t>(), seq_lens.as<int32_t>(), c.batch, tokens, c.q_len, splits, a, Bf16(out),
      row, logits.as<__half>(), stats.as<float>(), stride, workspace.as<void>(), workspace.bytes(),
      nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());

  const ref::AttentionShape r = RefShape(a);
  std::vector<double> out64(tokens * row), scores64(c.batch * 2 * stride);
  std::vector<float> out32(tokens * row), scores32(c.batch * 2 * stride);
  ref::PagedVerifyAttentionWithScores(
      check::WidenToDouble(q_bits).data(), row, check::WidenToDouble(kv.k_bits).data(),
      check::WidenToDouble(kv.v_bits).data(), kv.block_tables.data(), kv.max_blocks_per_seq,
      cu.data(), lens.data(), c.batch, r, out64.data(), row, scores64.data(), stride);
  ref::PagedVerifyAttentionWithScores(
      check::WidenToFloat(q_bits).data(), row, check::WidenToFloat(kv.k_bits).data(),
      check::WidenToFloat(kv.v_bits).data(), kv.block_tables.data(), kv.max_blocks_per_seq,
      cu.data(), lens.data(), c.batch, r, out32.data(), row, scores32.data(), stride,
      ref::ProbRounding::kBf16);
  const check::ErrorCheck e = check::CompareWithReference(
      "out", check::WidenToDouble(out.Download<uint16_t>()), check::RoundToBf16(out32), out64);
  EXPECT_TRUE(e.passed) << "out: max|kernel-ref64| " << e.kernel_error << " > tolerance "
                        << e.tolerance << " (baseline " << e.baseline_error << ")";

  // Logits: each q head's fp16 log2-domain logit; their mean over the heads, back in the natural
  // domain, against the fp64 head averages. Each logit is within half an fp16 ulp (2^-11
  // relative) of its fp32 value, whose own error is the fp32 reference's; a wrong key or row is
  // off by O(1) (a wrong head shows in cuda_vegas_test's per-head weights). Every head of every
  // prefix key must be written, nothing past the prefix.
  EXPECT_EQ(parts_per_row, c.hq);
  const std::vector<uint16_t> bits = logits.Download<uint16_t>();
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) x[i] = HalfBitsToFloat(bits[i]);
  const double to_natural = 1.0 / (static_cast<double>(c.hq) * M_LOG2E);
  double max_ref = 0, max_excess = -INFINITY;
  for (int s = 0; s < c.batch; ++s) {
    const int64_t prefix = lens[s] - c.q_len;
    for (int row_i = 0; row_i < 2; ++row_i) {
      const float* first = x.data() + ((s * 2 + row_i) * parts_per_row) * stride;
      for (int64_t j = 0; j < stride; ++j) {
        if (j >= prefix) {  // past the prefix: never written (still the 0xffff poison)
          for (int h = 0; h < parts_per_row; ++h) {
            ASSERT_EQ(bits[((s * 2 + row_i) * parts_per_row + h) * stride + j], 0xffffu)
                << "seq " << s << " row " << row_i << " key " << j;
          }
          continue;
        }
        double sum = 0, abs_sum = 0;
        for (int h = 0; h < parts_per_row; ++h) {
          sum += first[h * stride + j];
          abs_sum += std::abs(first[h * stride + j]);
        }
        const double want = scores64[(s * 2 + row_i) * stride + j];
        const double err = std::isnan(sum) ? INFINITY : std::abs(sum * to_natural - want);
        const double bound = abs_sum * to_natural * std::ldexp(1.0, -11) +
                             4 * std::abs(scores32[(s * 2 + row_i) * stride + j] - want) + 1e-6;
        max_ref = std::max(max_ref, std::abs(want));
        max_excess = std::max(max_excess, err - bound);
      }
    }
  }
  EXPECT_LE(max_excess, 0.0) << "logits: the worst key is off by that much more than its bound ("
                             << "max|ref64| " << max_ref << ")";

  // Split statistics: merged on the host, each (sequence, row, head)'s log2-sum-exp over its
  // prefix, of the fp32 scores the logits were rounded from: against the stored logits' within
  // half an fp16 ulp of the largest |logit| (plus fp32 sums); the splits the launch did not run
  // are (-inf, 0).
  const std::vector<float> st = stats.Download<float>();
  double max_lse_err = -INFINITY;
  for (int64_t hr = 0; hr < head_rows; ++hr) {
    const int s = static_cast<int>(hr / (2 * parts_per_row));
    const int64_t prefix = lens[s] - c.q_len;
    const float* split = st.data() + hr * kVegasScoreSplits * 2;
    double m = -INFINITY;
    for (int i = 0; i < kVegasScoreSplits; ++i) {
      ASSERT_FALSE(std::isnan(split[2 * i]) || std::isnan(split[2 * i + 1])) << "unwritten";
      if (i >= splits) {
        EXPECT_TRUE(split[2 * i] == -INFINITY && split[2 * i + 1] == 0.0f) << "split " << i;
      }
      m = std::max(m, static_cast<double>(split[2 * i]));
    }
    double sum = 0, want_m = -INFINITY, want_sum = 0, max_abs = 0;
    for (int i = 0; i < kVegasScoreSplits; ++i) {
      if (split[2 * i + 1] > 0) sum += split[2 * i + 1] * std::exp2(split[2 * i] - m);
    }
    for (int64_t j = 0; j < prefix; ++j) {
      want_m = std::max<double>(want_m, x[hr * stride + j]);
      max_abs = std::max<double>(max_abs, std::abs(x[hr * stride + j]));
    }
    for (int64_t j = 0; j < prefix; ++j) want_sum += std::exp2(x[hr * stride + j] - want_m);
    if (prefix == 0) {
      EXPECT_EQ(sum, 0.0);
      continue;
    }
    const double err = std::abs(m + std::log2(sum) - want_m - std::log2(want_sum));
    max_lse_err = std::max(max_lse_err, err - max_abs * std::ldexp(1.0, -11) - 1e-5);
  }
  EXPECT_LE(max_lse_err, 0.0) << "log2-sum-exp of the split statistics past its bound";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, VerifyWithScoresTest,
    ::testing::Values(
        //          batch q_len hq hkv  d   bs  context splits
        VerifyCase{1, 8, 32, 8, 128, 16, 3000, 0},   // K+1 = 8, Llama-3.1-8B heads
        VerifyCase{1, 8, 32, 8, 128, 16, 32768, 0},  // 32K context
        VerifyCase{4, 7, 32, 8, 128, 16, 4100, 13},  // batch 4, 13 splits
        VerifyCase{3, 4, 16, 2, 128, 32, 1000, 5},   // group 8, block 32
        VerifyCase{2, 1, 8, 8, 128, 16, 700, 3},     // one query: both rows the same
        VerifyCase{2, 16, 32, 2, 128, 16, 2000, 7},  // group 16: query 0 and the last in two CTAs
        VerifyCase{1, 6, 4, 2, 16, 16, 300, 1},      // head_dim 16, one split (direct output)
        VerifyCase{2, 5, 8, 4, 16, 64, 500, 2},      // head_dim 16, block 64
        VerifyCase{5, 8, 32, 8, 128, 16, 40, 24},    // short contexts: empty splits
        VerifyCase{1, 5, 6, 2, 64, 16, 9000, 0},     // codepair-long: group 3, head_dim 64
        VerifyCase{3, 6, 6, 2, 64, 16, 2100, 5},     // group 3: the last query's rows 15-17
        VerifyCase{2, 11, 6, 2, 64, 16, 1500, 3},    //   straddle warps (q 6) or CTAs (q 11)
        VerifyCase{2, 1, 6, 2, 64, 16, 600, 2},      // group 3, one query
        VerifyCase{2, 8, 12, 4, 128, 16, 3000, 0},   // group 3 at head_dim 128
        VerifyCase{2, 4, 16, 4, 32, 32, 1200, 4},    // head_dim 32, group 4
        VerifyCase{1, 7, 20, 4, 64, 16, 800, 2}),    // group 5, head_dim 64
    [](const ::testing::TestParamInfo<VerifyCase>& info) {
      const VerifyCase& c = info.param;
      return "b" + std::to_string(c.batch) + "_q" + std::to_string(c.q_len) + "_h" +
             std::to_string(c.hq) + "_" + std::to_string(c.hkv) + "_d" + std::to_string(c.d) +
             "_ctx" + std::to_string(c.context) + "_s" + std::to_string(c.splits);
    });

// ---------------------------------------------------------------------------------------------
// Top-k selection.

struct SelectCase {
  int num_seqs, num_layers, num_parts;
  int64_t stride;
  std::vector<int32_t> lengths;
  double ratio;
  int min_tokens, max_tokens;
  int grid;  // > 0: scores on a grid of that many values (ties); 0: continuous
};

class VegasSelectTopKTest : public ::testing::TestWithParam<SelectCase> {};

TEST_P(VegasSelectTopKTest, KeepsExactlyTheReferencesIndices) {
  const SelectCase& c = GetParam();
  const int pairs = c.num_seqs * c.num_layers;
  std::mt19937_64 rng(c.stride + c.grid);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> grid(0, std::max(1, c.grid) - 1);
  std::vector<float> scores(static_cast<size_t>(pairs) * 2 * c.num_parts * c.stride);
  for (float& x : scores) x = c.grid > 0 ? 0.5f * static_cast<float>(grid(rng)) : normal(rng);
  const int64_t index_stride = c.max_tokens;
  DeviceBuffer d_scores(scores.size() * 4), d_lengths(c.lengths.size() * 4);
  DeviceBuffer d_indices(pairs * index_stride * 4), d_counts(pairs * 4);
  DeviceBuffer workspace(std::max<size_t>(16, VegasSelectWorkspaceBytes(pairs, c.stride)));
  d_scores.Upload(scores);
  d_lengths.Upload(c.lengths);
  d_indices.Poison();
  d_counts.Poison();
  workspace.Poison();
  const VegasBudget budget{c.ratio, c.min_tokens, c.max_tokens};
  SPECD_CUDA_CHECK(VegasSelectTopK(d_scores.as<float>(), c.num_parts, c.stride,
                                   d_lengths.as<int32_t>(), c.num_seqs, pairs, budget,
                                   d_indices.as<int32_t>(), index_stride, d_counts.as<int32_t>(),
                                   workspace.as<void>(), workspace.bytes(), nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> want(pairs * index_stride, -1), want_counts(pairs);
  ref::VegasSelectTopK(scores.data(), c.num_parts, c.stride, c.lengths.data(), c.num_seqs, pairs,
                       ref::VegasBudget{c.ratio, c.min_tokens, c.max_tokens}, want.data(),
                       index_stride, want_counts.data());
  const std::vector<int32_t> got = d_indices.Download<int32_t>();
  const std::vector<int32_t> got_counts = d_counts.Download<int32_t>();
  for (int p = 0; p < pairs; ++p) {
    ASSERT_EQ(got_counts[p], want_counts[p]) << "pair " << p;
    const auto begin = static_cast<int64_t>(p) * index_stride;
    EXPECT_TRUE(
        std::equal(got.begin() + begin, got.begin() + begin + want_counts[p], want.begin() + begin))
        << "pair " << p << " (n " << c.lengths[p % c.num_seqs] << ", k " << want_counts[p] << ")";
    if (want_counts[p] < index_stride) {
      EXPECT_EQ(got[begin + want_counts[p]], -1) << "pair " << p << ": wrote past its count";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, VegasSelectTopKTest,
    ::testing::Values(
        // 8 kv-head parts (Llama-3.1-8B); 4 sequences x 3 layers; lengths incl. n < min, 0
        SelectCase{4, 3, 8, 32768, {32768, 20001, 100, 0}, 0.07, 256, 32768, 0},
        SelectCase{1, 2, 8, 131072, {131072}, 0.07, 256, 131072, 0},       // 128K tokens
        SelectCase{2, 2, 8, 131072, {131072, 70000}, 0.07, 256, 8192, 7},  // ties, the cap
        SelectCase{3, 2, 1, 5000, {5000, 4999, 1}, 0.2, 16, 5000, 3},      // heavy ties
        SelectCase{2, 1, 4, 4096, {4096, 3000}, 0.0, 64, 4096, 0},         // ratio 0: the floor
        SelectCase{2, 1, 4, 4096, {4096, 3000}, 1.0, 64, 4096, 0}),        // ratio 1: everything
    [](const ::testing::TestParamInfo<SelectCase>& info) {
      return "n" + std::to_string(info.param.stride) + "_" + std::to_string(info.index);
    });

// ---------------------------------------------------------------------------------------------
// Head-averaged prefix weights.

struct WeightsCase {
  int num_seqs, num_layers, num_heads;
  int64_t stride;
  std::vector<int32_t> lengths;
  float sigma;  // standard deviation of the raw logits (8: softmaxes peaked on a few keys)
  bool masked;  // one row with a head whose every split is empty
};

class VegasWeightsTest : public ::testing::TestWithParam<WeightsCase> {};

// The kernel against the fp64 reference the CPU Model runs (ref::HeadAveragedPrefixWeights of the
// same fp16 logits, to_raw ln 2 since they are log2-domain, rounded to float), per entry within
// 2e-5 relative + 1e-9 absolute: the kernel's exponent x - lse is an fp32 difference of values up
// to ~100 in magnitude (1e-5 absolute, so ~7e-6 relative in 2^(x - lse)), and a wrong key, head or
// row is off by O(1). The statistics are what PagedVerifyAttentionWithScores writes, (max, sum)
// over contiguous splits (1 to kVegasScoreSplits of them, some empty). Entries past each prefix
// stay poisoned; a second run gives the same bits.
TEST_P(VegasWeightsTest, MatchesTheHostWeightsAndWritesOnlyThePrefix) {
  const WeightsCase& c = GetParam();
  const int pairs = c.num_seqs * c.num_layers, heads = c.num_heads;
  const int64_t head_rows = int64_t{pairs} * 2 * heads;
  std::mt19937_64 rng(c.stride * 7 + heads);
  std::normal_distribution<float> normal(0.0f, c.sigma);
  std::vector<uint16_t> bits(static_cast<size_t>(head_rows * c.stride));
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bits[i] = FloatToHalfBits(normal(rng) * static_cast<float>(M_LOG2E));
    x[i] = HalfBitsToFloat(bits[i]);
  }
  std::vector<float> stats(static_cast<size_t>(head_rows) * kVegasScoreSplits * 2);
  for (int64_t hr = 0; hr < head_rows; ++hr) {
    const int64_t n = std::clamp<int64_t>(c.lengths[(hr / (2 * heads)) % c.num_seqs], 0, c.stride);
    const int64_t splits = 1 + hr % kVegasScoreSplits, per = (n + splits - 1) / splits;
    const bool masked = c.masked && hr / heads == 1 && hr % heads == heads - 1;
    for (int64_t i = 0; i < kVegasScoreSplits; ++i) {
      double m = -INFINITY, l = 0;
      const int64_t lo = std::min(n, i * per), hi = i < splits ? std::min(n, lo + per) : lo;
      for (int64_t j = lo; j < hi && !masked; ++j) m = std::max<double>(m, x[hr * c.stride + j]);
      for (int64_t j = lo; j < hi && !masked; ++j) l += std::exp2(x[hr * c.stride + j] - m);
      stats[(hr * kVegasScoreSplits + i) * 2] = l > 0 ? static_cast<float>(m) : -INFINITY;
      stats[(hr * kVegasScoreSplits + i) * 2 + 1] = static_cast<float>(l);
    }
  }
  DeviceBuffer d_logits(bits.size() * 2), d_stats(stats.size() * 4);
  DeviceBuffer d_lengths(c.lengths.size() * 4);
  DeviceBuffer d_weights(static_cast<size_t>(pairs) * 2 * c.stride * 4);
  d_logits.Upload(bits);
  d_stats.Upload(stats);
  d_lengths.Upload(c.lengths);
  auto run = [&] {
    d_weights.Poison();
    SPECD_CUDA_CHECK(VegasPrefixWeights(d_logits.as<__half>(), d_stats.as<float>(), heads, c.stride,
                                        d_lengths.as<int32_t>(), c.num_seqs, pairs,
                                        d_weights.as<float>(), nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    return d_weights.Download<float>();
  };
  const std::vector<float> got = run();
  std::vector<float> want(c.stride), row_x(static_cast<size_t>(heads * c.stride));
  double max_abs = 0, max_rel = 0;  // max_rel over weights above 1e-6
  for (int64_t r = 0; r < pairs * 2; ++r) {
    const int64_t n = std::clamp<int64_t>(c.lengths[(r / 2) % c.num_seqs], 0, c.stride);
    std::copy_n(x.begin() + r * heads * c.stride, row_x.size(), row_x.begin());
    if (c.masked && r == 1) {
      std::fill_n(row_x.begin() + (heads - 1) * c.stride, c.stride, -INFINITY);
    }
    ref::HeadAveragedPrefixWeights(row_x.data(), heads, c.stride, n, static_cast<float>(M_LN2),
                                   want.data());
    const float* row = got.data() + r * c.stride;
    for (int64_t j = 0; j < c.stride; ++j) {
      if (j >= n) {
        uint32_t word;
        std::memcpy(&word, row + j, 4);
        ASSERT_EQ(word, 0xffffffffu) << "row " << r << " key " << j << " past n " << n;
        continue;
      }
      const double err = std::abs(double{row[j]} - double{want[j]});
      ASSERT_LE(err, 2e-5 * std::abs(double{want[j]}) + 1e-9)
          << "row " << r << " key " << j << " of " << n << ": kernel " << row[j] << ", host "
          << want[j];
      max_abs = std::max(max_abs, err);
      if (want[j] > 1e-6f) max_rel = std::max(max_rel, err / want[j]);
    }
  }
  std::printf("heads %d stride %lld: max |kernel - host| %.3g, relative %.3g\n", heads,
              static_cast<long long>(c.stride), max_abs, max_rel);
  const std::vector<float> again = run();
  EXPECT_EQ(std::memcmp(got.data(), again.data(), got.size() * 4), 0) << "not deterministic";
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, VegasWeightsTest,
    ::testing::Values(
        // codepair-long's 6 heads: 4 sequences x 3 layers, lengths 8K, one, none, odd
        WeightsCase{4, 3, 6, 8192, {8192, 1, 0, 4097}, 1.0f, false},
        WeightsCase{3, 2, 32, 8192, {8192, 777, 3}, 1.0f, false},    // Llama-3.1-8B's 32 heads
        WeightsCase{2, 2, 6, 131072, {131072, 99999}, 1.0f, false},  // 128K tokens
        WeightsCase{1, 1, 32, 131072, {131071}, 2.0f, false},        // 128K, 32 heads
        WeightsCase{2, 2, 128, 2048, {2048, 1023}, 4.0f, false},     // the most heads
        WeightsCase{3, 1, 1, 300, {257, 256, 255}, 1.0f, false},     // one head: a softmax
        WeightsCase{2, 2, 32, 4096, {4096, 2501}, 8.0f, true},       // peaked, a masked head
        WeightsCase{3, 2, 6, 1000, {999, 1, 500}, 3.0f, true}),      // masked, a 1-key row
    [](const ::testing::TestParamInfo<WeightsCase>& info) {
      return "h" + std::to_string(info.param.num_heads) + "_n" + std::to_string(info.param.stride) +
             "_" + std::to_string(info.index);
    });

// ---------------------------------------------------------------------------------------------
// Sparse attention over index lists.

struct SparseCase {
  int batch, q_len, hq, hkv, d, block, context;
  double keep;  // fraction of the prefix listed (0: only the recent tokens)
  int recent;   // tokens from recent_start to the first query
  int splits;   // 0: ChooseVerifySplits over the longest key count
};

class SparseAttentionTest : public ::testing::TestWithParam<SparseCase> {};

TEST_P(SparseAttentionTest, MatchesTheReferenceAndReadsNoUnlistedSlot) {
  const SparseCase& c = GetParam();
  const AttentionShape a = Shape(c.hq, c.hkv, c.d, c.block);
  std::mt19937_64 rng(c.context * 17 + c.q_len);
  const std::vector<int32_t> lens = SeqLens(c.batch, c.context);
  const std::vector<int32_t> cu = CuLens(c.batch, c.q_len);
  std::vector<int32_t> recent(c.batch), counts(c.batch);
  const int64_t index_stride = static_cast<int64_t>(c.context * c.keep) + 8;
  std::vector<int32_t> indices(c.batch * index_stride, -1);
  std::vector<std::vector<bool>> listed(c.batch);
  int32_t max_keys = 1;
  for (int s = 0; s < c.batch; ++s) {
    recent[s] = lens[s] - c.q_len - c.recent;
    std::vector<int32_t> all(recent[s]);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    counts[s] = static_cast<int32_t>(recent[s] * c.keep);
    std::sort(all.begin(), all.begin() + counts[s]);
    std::copy_n(all.begin(), counts[s], indices.begin() + s * index_stride);
    listed[s].assign(lens[s], false);
    for (int32_t i = 0; i < counts[s]; ++i) listed[s][all[i]] = true;
    for (int32_t pos = recent[s]; pos < lens[s]; ++pos) listed[s][pos] = true;
    max_keys = std::max(max_keys, counts[s] + lens[s] - recent[s]);
  }
  const PagedKv kv(
      a, lens, [&](size_t s, int32_t pos) { return static_cast<bool>(listed[s][pos]); }, rng);
  const int64_t tokens = cu.back(), row = static_cast<int64_t>(c.hq) * c.d;
  const std::vector<uint16_t> q_bits = check::RandomBf16(tokens * row, -2.0f, 2.0f, rng);
  const int32_t splits =
      c.splits > 0 ? c.splits : ChooseVerifySplits(c.batch, c.q_len, max_keys, NumSms(), a);
  DeviceBuffer k(kv.k_bits.size() * 2), v(kv.v_bits.size() * 2), q(q_bits.size() * 2);
  DeviceBuffer tables(kv.block_tables.size() * 4), seq_lens(lens.size() * 4), cu_q(cu.size() * 4);
  DeviceBuffer d_indices(indices.size() * 4), d_counts(counts.size() * 4);
  DeviceBuffer d_recent(recent.size() * 4), out(tokens * row * 2);
  DeviceBuffer workspace(std::max<size_t>(16, PagedVerifyWorkspaceBytes(tokens, splits, a)));
  k.Upload(kv.k_bits);
  v.Upload(kv.v_bits);
  q.Upload(q_bits);
  tables.Upload(kv.block_tables);
  seq_lens.Upload(lens);
  cu_q.Upload(cu);
  d_indices.Upload(indices);
  d_counts.Upload(counts);
  d_recent.Upload(recent);
  out.Poison();
  workspace.Poison();
  SPECD_CUDA_CHECK(PagedSparseAttention(
      Bf16(q), row, Bf16(k), Bf16(v), tables.as<int32_t>(), kv.max_blocks_per_seq,
      cu_q.as<int32_t>(), seq_lens.as<int32_t>(), d_indices.as<int32_t>(), index_stride,
      d_counts.as<int32_t>(), d_recent.as<int32_t>(), c.batch, tokens, c.q_len, splits, a,
      Bf16(out), row, workspace.as<void>(), workspace.bytes(), nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  const ref::AttentionShape r = RefShape(a);
  std::vector<double> out64(tokens * row);
  std::vector<float> out32(tokens * row);
  ref::PagedSparseAttention(
      check::WidenToDouble(q_bits).data(), row, check::WidenToDouble(kv.k_bits).data(),
      check::WidenToDouble(kv.v_bits).data(), kv.block_tables.data(), kv.max_blocks_per_seq,
      cu.data(), lens.data(), indices.data(), index_stride, counts.data(), recent.data(), c.batch,
      r, out64.data(), row);
  ref::PagedSparseAttention(
      check::WidenToFloat(q_bits).data(), row, check::WidenToFloat(kv.k_bits).data(),
      check::WidenToFloat(kv.v_bits).data(), kv.block_tables.data(), kv.max_blocks_per_seq,
      cu.data(), lens.data(), indices.data(), index_stride, counts.data(), recent.data(), c.batch,
      r, out32.data(), row, ref::ProbRounding::kBf16);
  const check::ErrorCheck e = check::CompareWithReference(
      "out", check::WidenToDouble(out.Download<uint16_t>()), check::RoundToBf16(out32), out64);
  EXPECT_TRUE(e.passed) << "out: max|kernel-ref64| " << e.kernel_error << " > tolerance "
                        << e.tolerance << " (baseline " << e.baseline_error << ")";
  if (c.q_len != 1) return;
  // One query per sequence: the decode kernel over the same lists, their rows in reverse order
  // behind index_rows (as a runner's selection slots hold them).
  std::vector<int32_t> reversed(indices.size()), reversed_counts(c.batch), rows(c.batch);
  for (int s = 0; s < c.batch; ++s) {
    rows[s] = c.batch - 1 - s;
    std::copy_n(indices.begin() + s * index_stride, index_stride,
                reversed.begin() + rows[s] * index_stride);
    reversed_counts[rows[s]] = counts[s];
  }
  const int32_t decode_splits =
      c.splits > 0 ? c.splits : ChooseDecodeSplits(c.batch, max_keys, NumSms(), a);
  DeviceBuffer d_rows(rows.size() * 4), decode_out(tokens * row * 2);
  DeviceBuffer decode_ws(
      std::max<size_t>(16, PagedDecodeWorkspaceBytes(c.batch, decode_splits, a)));
  d_indices.Upload(reversed);
  d_counts.Upload(reversed_counts);
  d_rows.Upload(rows);
  decode_out.Poison();
  decode_ws.Poison();
  SPECD_CUDA_CHECK(PagedSparseDecodeAttention(
      Bf16(q), row, Bf16(k), Bf16(v), tables.as<int32_t>(), kv.max_blocks_per_seq,
      seq_lens.as<int32_t>(), d_indices.as<int32_t>(), index_stride, d_counts.as<int32_t>(),
      d_recent.as<int32_t>(), d_rows.as<int32_t>(), c.batch, decode_splits, a, Bf16(decode_out),
      row, decode_ws.as<void>(), decode_ws.bytes(), nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  const check::ErrorCheck d = check::CompareWithReference(
      "decode out", check::WidenToDouble(decode_out.Download<uint16_t>()),
      check::RoundToBf16(out32), out64);
  EXPECT_TRUE(d.passed) << "decode out: max|kernel-ref64| " << d.kernel_error << " > tolerance "
                        << d.tolerance << " (baseline " << d.baseline_error << ", " << decode_splits
                        << " splits)";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SparseAttentionTest,
    ::testing::Values(
        //          batch q_len hq hkv  d   bs context keep recent splits
        SparseCase{3, 1, 32, 8, 128, 16, 4000, 0.07, 16, 0},    // draft step, 8B heads
        SparseCase{1, 1, 32, 8, 128, 16, 32768, 0.07, 7, 0},    // 32K context, 7%
        SparseCase{2, 1, 32, 8, 128, 16, 16384, 0.07, 30, 16},  // 16 splits
        SparseCase{2, 4, 16, 2, 64, 32, 1500, 0.2, 5, 3},       // a few queries, group 8
        SparseCase{2, 1, 8, 8, 128, 16, 600, 0.0, 40, 2},       // empty lists: recent only
        SparseCase{3, 2, 4, 2, 16, 16, 300, 0.3, 3, 1},         // head_dim 16, one split
        SparseCase{2, 3, 8, 4, 32, 64, 900, 0.1, 0, 4},         // head_dim 32, recent = run
        SparseCase{8, 1, 6, 2, 64, 16, 8192, 0.07, 16, 0},      // codepair-long: group 3, 8K
        SparseCase{2, 6, 6, 2, 64, 16, 3000, 0.05, 4, 3}),      //   a run of 6 queries
    [](const ::testing::TestParamInfo<SparseCase>& info) {
      const SparseCase& c = info.param;
      return "b" + std::to_string(c.batch) + "_q" + std::to_string(c.q_len) + "_d" +
             std::to_string(c.d) + "_ctx" + std::to_string(c.context) + "_" +
             std::to_string(info.index);
    });

TEST(VegasLauncherTest, RejectsWhatTheKernelsCannotRunWithoutStickyErrors) {
  DeviceBuffer buf(1 << 16);
  auto* bf = Bf16(buf);
  auto* ints = buf.as<int32_t>();
  float* f = buf.as<float>();
  AttentionShape a = Shape(32, 8, 128, 16);
  auto verify = [&](const AttentionShape& s, int64_t stride, int32_t splits = 1) {
    return PagedVerifyAttentionWithScores(bf, 4096, bf, bf, ints, 4, ints, ints, 1, 8, 8, splits, s,
                                          bf, 4096, buf.as<__half>(), f, stride, buf.as<void>(),
                                          buf.bytes(), nullptr);
  };
  AttentionShape windowed = a;
  windowed.sliding_window = 64;
  EXPECT_EQ(verify(windowed, 64), cudaErrorInvalidValue);
  EXPECT_EQ(verify(Shape(32, 1, 128, 16), 64), cudaErrorInvalidValue);     // group 32 > 16
  EXPECT_EQ(verify(a, 63), cudaErrorInvalidValue);                         // odd score stride
  EXPECT_EQ(verify(a, 64, kVegasScoreSplits + 1), cudaErrorInvalidValue);  // too many splits
  const VegasBudget budget{0.07, 256, 4096};
  auto select = [&](const VegasBudget& b, int64_t index_stride) {
    return VegasSelectTopK(f, 8, 1024, ints, 1, 1, b, ints, index_stride, ints, buf.as<void>(),
                           buf.bytes(), nullptr);
  };
  EXPECT_EQ(select(budget, 4095), cudaErrorInvalidValue);                  // cap past the row
  EXPECT_EQ(select(VegasBudget{1.5, 0, 64}, 64), cudaErrorInvalidValue);   // ratio > 1
  EXPECT_EQ(select(VegasBudget{0.1, 65, 64}, 64), cudaErrorInvalidValue);  // floor > cap
  EXPECT_EQ(PagedSparseAttention(bf, 4096, bf, bf, ints, 4, ints, ints, nullptr, 16, ints, ints, 1,
                                 1, 1, 1, a, bf, 4096, nullptr, 0, nullptr),
            cudaErrorInvalidValue);  // no index list
  auto weights = [&](int32_t heads, int64_t stride) {
    return VegasPrefixWeights(buf.as<__half>(), f, heads, stride, ints, 1, 1, f, nullptr);
  };
  EXPECT_EQ(weights(129, 64), cudaErrorInvalidValue);  // more heads than 128
  EXPECT_EQ(weights(0, 64), cudaErrorInvalidValue);
  EXPECT_EQ(weights(8, 66), cudaErrorInvalidValue);  // stride not a multiple of 4
  EXPECT_EQ(VegasPrefixWeights(nullptr, f, 8, 64, ints, 1, 1, f, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "vegas_cuda_test: no CUDA device visible; skipping\n");
    return specd::kernels::check::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
