// The NSA kernels (kernels/cuda/nsa.h) against their references (kernels/ref/nsa.h) over
// NsaProblems (kernels/check/nsa_problem.h: shuffled paged caches, NaN wherever no query may
// read): compression bit for bit over a prefill's every block; the selection equal to the
// reference's up to near ties (counted and printed) up to 128K tokens; SSV grouped attend in mode
// exact equal to the per-query kernel (C = 1) to two bf16 ulps of each head row's largest value
// and both within the flash-attention rule, over selections with adjacent overlap 0.5 / 0.7 / 0.9;
// mode shared against its reference; the launchers' argument checks. Exits 77 (ctest: skipped)
// where no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/check/nsa_problem.h"
#include "kernels/cuda/nsa.h"
#include "kernels/ref/bf16.h"
#include "kernels/ref/nsa.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;
using check::NsaDevice;
using check::NsaProblem;
using check::NsaProblemSpec;

NsaShape Shape(int32_t q_heads, int32_t kv_heads, int32_t d, int32_t page, int32_t block,
               int32_t count, int32_t window) {
  return {q_heads, kv_heads, d,      page,
          block,   count,    window, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)))};
}
NsaShape Nsa8b(int32_t page) { return Shape(32, 2, 128, page, 64, 16, 512); }
NsaShape Codepair() { return Shape(16, 1, 32, 16, 32, 8, 64); }
NsaShape Dim64() { return Shape(8, 2, 64, 32, 16, 4, 40); }

int NumSms() {
  int device = 0, num_sms = 0;
  SPECD_CUDA_CHECK(cudaGetDevice(&device));
  SPECD_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  return num_sms;
}

NsaProblemSpec Spec(const NsaShape& shape, int32_t batch, int32_t context, int32_t queries,
                    int32_t group_size = 1, bool shared = false, double overlap = 0.7) {
  NsaProblemSpec s;
  s.shape = shape;
  s.batch = batch;
  s.context = context;
  s.context_step = 29;
  s.queries = queries;
  s.group_size = group_size;
  s.shared = shared;
  s.overlap = overlap;
  s.padding_tokens = 1;
  return s;
}

int64_t Row(const NsaProblem& p) {
  return int64_t{p.spec.shape.num_q_heads} * p.spec.shape.head_dim;
}

// NsaSelect on the problem's tokens (one group per sequence); the outputs land in dev.o_cmp and
// dev.selections_out.
void RunSelect(const NsaProblem& p, NsaDevice& dev) {
  const NsaShape& s = p.spec.shape;
  const NsaGroups groups = dev.SelectGroups();
  const int32_t splits =
      NsaSelectSplits(groups.num_groups, groups.max_group_size, p.max_context(), NumSms(), s);
  DeviceBuffer ws(NsaSelectWorkspaceBytes(p.num_tokens(), splits, p.max_context(), s));
  ws.Poison();
  SPECD_CUDA_CHECK(NsaSelect(dev.q.as<__nv_bfloat16>(), Row(p), dev.Cache(), dev.Tokens(), groups,
                             s, p.max_context(), splits, dev.o_cmp.as<__nv_bfloat16>(), Row(p),
                             dev.selections_out.as<int32_t>(), ws.as<void>(), ws.bytes(), nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
}

// NsaAttend over dev.selections with the problem's groups and mode; returns out's bits.
std::vector<uint16_t> RunAttend(const NsaProblem& p, NsaDevice& dev, int32_t splits = 0) {
  const NsaShape& s = p.spec.shape;
  const NsaGroups groups = dev.AttendGroups();
  if (splits == 0) {
    splits =
        NsaAttendSplits(groups.num_groups, groups.max_group_size, p.max_context(), NumSms(), s);
  }
  DeviceBuffer ws(NsaAttendWorkspaceBytes(p.num_tokens(), groups.num_groups, groups.max_group_size,
                                          splits, p.max_context(), s));
  ws.Poison();
  dev.out.Poison();
  SPECD_CUDA_CHECK(
      NsaAttend(dev.q.as<__nv_bfloat16>(), Row(p), dev.Cache(), dev.Tokens(), groups,
                dev.selections.as<int32_t>(), p.spec.shared, dev.o_cmp.as<__nv_bfloat16>(), Row(p),
                dev.gates.as<__nv_bfloat16>(), 3 * int64_t{s.num_q_heads}, s, p.max_context(),
                splits, dev.out.as<__nv_bfloat16>(), Row(p), ws.as<void>(), ws.bytes(), nullptr));
  SPECD_CUDA_CHECK(cudaDeviceSynchronize());
  return dev.out.Download<uint16_t>();
}

// Rows of non-padding tokens as doubles (padding rows are unspecified).
std::vector<double> Rows(const NsaProblem& p, const std::vector<uint16_t>& bits) {
  std::vector<double> out = check::WidenToDouble(bits);
  for (int64_t t = 0; t < p.num_tokens(); ++t) {
    if (p.token_seqs[t] < 0) std::fill_n(out.begin() + t * Row(p), Row(p), 0.0);
  }
  return out;
}

// A problem whose attend cache holds NaN wherever no group of its mode reads.
std::unique_ptr<NsaDevice> PoisonedDevice(const NsaProblem& p) {
  auto dev = std::make_unique<NsaDevice>(p);
  std::vector<uint16_t> k = p.k, v = p.v;
  p.PoisonUnread(&k, &v);
  dev->k.Upload(k);
  dev->v.Upload(v);
  return dev;
}

TEST(NsaCudaTest, CompressMatchesTheReferenceBitForBitOverAPrefill) {
  for (const NsaShape& shape : {Codepair(), Dim64(), Nsa8b(16), Nsa8b(64)}) {
    const NsaProblem p = check::MakeNsaProblem(Spec(shape, 3, 1500, 1));
    NsaDevice dev(p);
    // Every position of every sequence, one padding token between sequences.
    std::vector<int32_t> positions, seqs;
    for (int32_t s = 0; s < p.spec.batch; ++s) {
      for (int32_t j = 0; j < p.lens[s]; ++j) positions.push_back(j), seqs.push_back(s);
      positions.push_back(shape.block_size - 1), seqs.push_back(-1);
    }
    DeviceBuffer pos_dev(positions.size() * 4), seq_dev(seqs.size() * 4);
    pos_dev.Upload(positions);
    seq_dev.Upload(seqs);
    dev.cmp_k.Poison();
    dev.cmp_v.Poison();
    const NsaTokens tokens{pos_dev.as<int32_t>(), seq_dev.as<int32_t>(),
                           static_cast<int64_t>(positions.size())};
    SPECD_CUDA_CHECK(NsaCompress(dev.Cache(), tokens, shape, nullptr));
    SPECD_CUDA_CHECK(cudaDeviceSynchronize());
    // p.cmp_k / cmp_v: every complete block's fp32 means rounded to bf16, NaN bits elsewhere.
    EXPECT_EQ(dev.cmp_k.Download<uint16_t>(), p.cmp_k) << shape.head_dim << " " << shape.page_size;
    EXPECT_EQ(dev.cmp_v.Download<uint16_t>(), p.cmp_v) << shape.head_dim << " " << shape.page_size;
  }
}

TEST(NsaCudaTest, SelectMatchesTheReferenceUpToNearTies) {
  struct Case {
    NsaShape shape;
    int32_t batch, context, queries;
  };
  const Case cases[] = {{Codepair(), 2, 1000, 8},   {Dim64(), 3, 777, 5},
                        {Nsa8b(64), 1, 3001, 8},    {Nsa8b(16), 2, 200, 8},
                        {Nsa8b(16), 1, 32768, 8},   {Nsa8b(32), 1, 131072, 1},
                        {Codepair(), 1, 131072, 2}, {Dim64(), 4, 5000, 16}};
  for (const Case& c : cases) {
    const NsaProblem p = check::MakeNsaProblem(Spec(c.shape, c.batch, c.context, c.queries));
    NsaDevice dev(p);
    dev.o_cmp.Poison();
    RunSelect(p, dev);
    const check::NsaSelectReference ref = check::RunSelectReference(p);
    const check::ErrorCheck o = check::CompareWithReference(
        "o_cmp", Rows(p, dev.o_cmp.Download<uint16_t>()), ref.o_cmp_baseline, ref.o_cmp64);
    EXPECT_TRUE(o.passed) << c.context << ": " << o.kernel_error << " > " << o.tolerance;
    const check::SelectionComparison sel =
        check::CompareSelections(p, dev.selections_out.Download<int32_t>(), ref, 1e-4);
    EXPECT_EQ(sel.mismatches, 0) << c.context;
    std::printf("select d=%d B=%d ctx=%d: %lld of %lld selections equal, %lld near ties\n",
                c.shape.head_dim, c.shape.block_size, c.context, static_cast<long long>(sel.equal),
                static_cast<long long>(sel.compared), static_cast<long long>(sel.near_ties));
  }
}

// |a - b| <= two bf16 ulps of the largest magnitude of the element's head row (`row` elements):
// the same keys per row, but in other tiles and splits, so the fp32 sums run in another order and
// each probability is rounded to bf16 (for P.V) against another running maximum. Those errors
// scale with the row's values, not with each element's: an output element near zero (the three
// gated branches cancelling) may differ by hundreds of its own ulps. Prints the largest difference
// in ulps of its row's maximum.
void ExpectEqualToRounding(const std::vector<double>& a, const std::vector<double>& b, size_t row,
                           const char* what) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size() % row, 0u);
  int64_t bad = 0;
  double worst = 0;
  for (size_t r = 0; r < a.size(); r += row) {
    double top = 0;
    for (size_t i = r; i < r + row; ++i) top = std::max({top, std::abs(a[i]), std::abs(b[i])});
    const double ulp = std::ldexp(top, -7) + 1e-30;
    for (size_t i = r; i < r + row; ++i) {
      const double diff = std::abs(a[i] - b[i]);
      worst = std::max(worst, diff / ulp);
      bad += !(diff <= 2 * ulp + 1e-6);
    }
  }
  std::printf(" [%s: worst %.2f row ulps]", what, worst);
  EXPECT_EQ(bad, 0) << what << ": worst " << worst << " ulps of the row's largest value";
}

TEST(NsaCudaTest, GroupedExactEqualsPerQueryAndTheReference) {
  for (const NsaShape& shape : {Nsa8b(16), Codepair(), Dim64()}) {
    for (double overlap : {0.5, 0.7, 0.9}) {
      const NsaProblem per_query =
          check::MakeNsaProblem(Spec(shape, 2, 5000, 8, 1, false, overlap));
      auto dev1 = PoisonedDevice(per_query);
      const std::vector<double> out1 = Rows(per_query, RunAttend(per_query, *dev1));
      const check::NsaAttendReference ref =
          check::RunAttendReference(per_query, per_query.selections, per_query.o_cmp);
      const check::ErrorCheck e1 =
          check::CompareWithReference("out", out1, ref.out_baseline, ref.out64);
      EXPECT_TRUE(e1.passed) << overlap << ": " << e1.kernel_error << " > " << e1.tolerance;
      std::printf("attend d=%d overlap %.1f (measured %.2f): C=1 reads %lld bytes", shape.head_dim,
                  overlap, check::MeasuredOverlap(per_query),
                  static_cast<long long>(per_query.AttendBytes()));
      for (int32_t c : {2, 4, 8}) {
        // The same seed: the same data and selections, grouped by c.
        const NsaProblem grouped =
            check::MakeNsaProblem(Spec(shape, 2, 5000, 8, c, false, overlap));
        ASSERT_EQ(grouped.selections, per_query.selections);
        auto dev = PoisonedDevice(grouped);
        const std::vector<double> out = Rows(grouped, RunAttend(grouped, *dev));
        ExpectEqualToRounding(out, out1, static_cast<size_t>(shape.head_dim),
                              "grouped vs per-query");
        const check::ErrorCheck e =
            check::CompareWithReference("out", out, ref.out_baseline, ref.out64);
        EXPECT_TRUE(e.passed) << c << ": " << e.kernel_error << " > " << e.tolerance;
        std::printf(", C=%d %lld", c, static_cast<long long>(grouped.AttendBytes()));
        // One split: the whole union in one CTA per row tile.
        ExpectEqualToRounding(Rows(grouped, RunAttend(grouped, *dev, 1)), out1,
                              static_cast<size_t>(shape.head_dim), "one split");
      }
      std::printf("\n");
    }
  }
}

TEST(NsaCudaTest, SharedModeMatchesItsReference) {
  for (const NsaShape& shape : {Nsa8b(64), Codepair(), Dim64()}) {
    for (int32_t c : {2, 4, 8}) {
      const NsaProblem p = check::MakeNsaProblem(Spec(shape, 2, 4000, 8, c, true, 0.5));
      auto dev = PoisonedDevice(p);
      const std::vector<double> out = Rows(p, RunAttend(p, *dev));
      const check::NsaAttendReference ref = check::RunAttendReference(p, p.selections, p.o_cmp);
      const check::ErrorCheck e =
          check::CompareWithReference("out", out, ref.out_baseline, ref.out64);
      EXPECT_TRUE(e.passed) << c << ": " << e.kernel_error << " > " << e.tolerance;
    }
  }
}

TEST(NsaCudaTest, SelectThenAttendMatchesTheReference) {
  const NsaProblem p = check::MakeNsaProblem(Spec(Nsa8b(16), 2, 9000, 8, 4));
  NsaDevice dev(p);
  RunSelect(p, dev);
  SPECD_CUDA_CHECK(cudaMemcpy(dev.selections.as<void>(), dev.selections_out.as<void>(),
                              dev.selections.bytes(), cudaMemcpyDeviceToDevice));
  const std::vector<uint16_t> o_cmp = dev.o_cmp.Download<uint16_t>();
  const std::vector<double> out = Rows(p, RunAttend(p, dev));
  const check::NsaAttendReference ref =
      check::RunAttendReference(p, dev.selections_out.Download<int32_t>(), o_cmp);
  const check::ErrorCheck e = check::CompareWithReference("out", out, ref.out_baseline, ref.out64);
  EXPECT_TRUE(e.passed) << e.kernel_error << " > " << e.tolerance;
}

TEST(NsaCudaTest, LaunchersRejectBadArguments) {
  const NsaProblem p = check::MakeNsaProblem(Spec(Codepair(), 1, 300, 4));
  NsaDevice dev(p);
  NsaShape bad = p.spec.shape;
  bad.head_dim = 48;
  EXPECT_EQ(NsaCompress(dev.Cache(), dev.Tokens(), bad, nullptr), cudaErrorInvalidValue);
  DeviceBuffer ws(1 << 20);
  const NsaShape& s = p.spec.shape;
  NsaGroups big = dev.SelectGroups();
  big.max_group_size = kNsaMaxGroupSize + 1;
  EXPECT_EQ(NsaSelect(dev.q.as<__nv_bfloat16>(), Row(p), dev.Cache(), dev.Tokens(), big, s, 300, 1,
                      dev.o_cmp.as<__nv_bfloat16>(), Row(p), dev.selections_out.as<int32_t>(),
                      ws.as<void>(), ws.bytes(), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      NsaAttend(dev.q.as<__nv_bfloat16>(), Row(p), dev.Cache(), dev.Tokens(), dev.AttendGroups(),
                dev.selections.as<int32_t>(), false, dev.o_cmp.as<__nv_bfloat16>(), Row(p),
                dev.gates.as<__nv_bfloat16>(), 3 * int64_t{s.num_q_heads}, s, 300, 1,
                dev.out.as<__nv_bfloat16>(), Row(p), ws.as<void>(), 16, nullptr),
      cudaErrorInvalidValue);  // workspace too small
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "nsa_cuda_test: no CUDA device visible; skipping\n");
    return specd::kernels::check::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
