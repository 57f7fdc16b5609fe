// Every CUDA kernel against its fp64 reference (the op table in kernels/check), plus the
// launchers' contracts: aliasing, the scalar fallback, graph capture, rejected sizes. Exits 77
// (ctest: skipped) where no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/check/op_table.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/ref/bf16.h"

namespace specd::kernels {
namespace {

using check::DeviceBuffer;

struct CheckCase {
  const check::OpSpec* op;
  check::OpShape shape;
};

std::vector<CheckCase> AllCheckCases() {
  std::vector<CheckCase> cases;
  for (const check::OpSpec& op : check::OpTable()) {
    for (const check::OpShape& shape : op.check_shapes) cases.push_back({&op, shape});
  }
  return cases;
}

class OpTableTest : public ::testing::TestWithParam<CheckCase> {};

TEST_P(OpTableTest, MatchesFp64ReferenceWithinTwiceTheBf16Baseline) {
  const CheckCase& c = GetParam();
  for (const check::ErrorCheck& e : c.op->make(c.shape)->Check()) {
    EXPECT_TRUE(e.passed) << c.op->name << " " << c.shape.ToString() << " " << e.output
                          << ": max|kernel-ref64| " << e.kernel_error << " > tolerance "
                          << e.tolerance << " (baseline " << e.baseline_error << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpTableTest, ::testing::ValuesIn(AllCheckCases()),
                         [](const ::testing::TestParamInfo<CheckCase>& info) {
                           const check::OpShape& s = info.param.shape;
                           return info.param.op->name + "_" + std::to_string(s.num_tokens) + "x" +
                                  std::to_string(s.width);
                         });

std::vector<uint16_t> RandomRows(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return check::RandomBf16(n, -2.0f, 2.0f, rng);
}

// bf16 elements of a device buffer from `offset` on (__nv_bfloat16 is incomplete here).
__nv_bfloat16* Bf16(const DeviceBuffer& b, int64_t offset = 0) {
  return reinterpret_cast<__nv_bfloat16*>(b.as<uint16_t>() + offset);
}

TEST(FusedAddRmsNormTest, InPlaceOnInputMatchesSeparateOutput) {
  const int64_t tokens = 4, hidden = 4096, n = tokens * hidden;
  const auto x = RandomRows(n, 1), r = RandomRows(n, 2), w = RandomRows(hidden, 3);
  DeviceBuffer input(n * 2), residual(n * 2), weight(hidden * 2), out(n * 2);
  weight.Upload(w);
  input.Upload(x);
  residual.Upload(r);
  out.Poison();
  ASSERT_EQ(FusedAddRmsNorm(Bf16(input), Bf16(residual), Bf16(weight), tokens, hidden, 1e-5f,
                            Bf16(out), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto separate_out = out.Download<uint16_t>();
  const auto separate_residual = residual.Download<uint16_t>();

  residual.Upload(r);
  ASSERT_EQ(FusedAddRmsNorm(Bf16(input), Bf16(residual), Bf16(weight), tokens, hidden, 1e-5f,
                            Bf16(input), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(input.Download<uint16_t>(), separate_out);
  EXPECT_EQ(residual.Download<uint16_t>(), separate_residual);
}

// A pointer off 16-byte alignment must take the scalar path, not fault or misread. The two
// paths sum squares in different orders, so outputs may differ by a bf16 rounding flip.
TEST(RmsNormTest, MisalignedRowsFallBackToScalarPath) {
  const int64_t tokens = 3, hidden = 4096, n = tokens * hidden;
  const auto x = RandomRows(n, 4), w = RandomRows(hidden, 5);
  DeviceBuffer input(n * 2), weight(hidden * 2), out(n * 2), shifted_in((n + 1) * 2),
      shifted_out((n + 1) * 2);
  input.Upload(x);
  weight.Upload(w);
  std::vector<uint16_t> shifted_x(n + 1, 0x3f80);
  std::copy(x.begin(), x.end(), shifted_x.begin() + 1);
  shifted_in.Upload(shifted_x);
  out.Poison();
  shifted_out.Poison();
  ASSERT_EQ(RmsNorm(Bf16(input), Bf16(weight), tokens, hidden, 1e-5f, Bf16(out), nullptr),
            cudaSuccess);
  ASSERT_EQ(RmsNorm(Bf16(shifted_in, 1), Bf16(weight), tokens, hidden, 1e-5f, Bf16(shifted_out, 1),
                    nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto aligned = out.Download<uint16_t>();
  const auto scalar = shifted_out.Download<uint16_t>();
  for (int64_t i = 0; i < n; ++i) {
    const float a = Bf16ToFloat(aligned[i]), s = Bf16ToFloat(scalar[i + 1]);
    // One bf16 ulp is at most 2^-7 of the larger magnitude.
    ASSERT_LE(std::abs(a - s), std::ldexp(std::max(std::abs(a), std::abs(s)), -7)) << i;
  }
}

// Launchers only queue work (no allocation, no sync), so a decode step can be a CUDA graph.
TEST(LauncherTest, LaunchCapturedInACudaGraphMatchesADirectLaunch) {
  const int64_t tokens = 8, d = 4096;
  DeviceBuffer gate_up(tokens * 2 * d * 2), out(tokens * d * 2);
  gate_up.Upload(RandomRows(tokens * 2 * d, 6));
  out.Poison();
  ASSERT_EQ(SiluAndMul(Bf16(gate_up), tokens, d, Bf16(out), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto direct = out.Download<uint16_t>();

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(SiluAndMul(Bf16(gate_up), tokens, d, Bf16(out), stream), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  out.Poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(out.Download<uint16_t>(), direct);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(LauncherTest, RejectsSizesTheKernelsCannotRunWithoutStickyErrors) {
  DeviceBuffer a(64), b(64), c(64);
  EXPECT_EQ(RmsNorm(Bf16(a), Bf16(b), 1, 0, 1e-5f, Bf16(c), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(RmsNorm(Bf16(a), Bf16(b), 1, kMaxRmsNormHidden + 1, 1e-5f, Bf16(c), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(FusedAddRmsNorm(Bf16(a), Bf16(b), Bf16(b), -1, 8, 1e-5f, Bf16(c), nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SiluAndMul(Bf16(a), 1, 0, Bf16(c), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(EmbeddingGather(a.as<int32_t>(), 1, Bf16(b), 0, -1, 8, Bf16(c), nullptr),
            cudaErrorInvalidValue);
  // An empty batch is valid and launches nothing.
  EXPECT_EQ(RmsNorm(Bf16(a), Bf16(b), 0, 8, 1e-5f, Bf16(c), nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specd::kernels

int main(int argc, char** argv) {
  if (specd::kernels::check::CudaDeviceCount() == 0) {
    std::fprintf(stderr, "kernels_cuda_test: no CUDA device visible; skipping\n");
    return specd::kernels::check::kSkipExitCode;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
