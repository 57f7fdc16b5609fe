// Every CUDA kernel against its fp64 reference (the op table in kernels/check), plus the
// launchers' contracts: aliasing, the scalar fallback, graph capture, rejected sizes, TopKRows
// over every k, vocabulary size and row layout, ProcessedProbs in place in a graph, and GemvBf16
// over every m. Exits 77
// (ctest: skipped) where no GPU is visible.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/check/cuda_check.h"
#include "kernels/check/op_table.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/sampling.h"
#include "kernels/ref/bf16.h"
#include "kernels/ref/sampling.h"

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
                           // The index keeps names unique where shapes differ only in
                           // fields the name leaves out.
                           return info.param.op->name + "_" + std::to_string(s.num_tokens) + "x" +
                                  std::to_string(s.width) + "_" + std::to_string(info.index);
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

// Llama-3.1-8B's attention: 32 q heads, 8 kv heads, head_dim 128, block 16.
AttentionShape Llama8BShape() {
  AttentionShape s;
  s.num_q_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.block_size = 16;
  s.scale = 0.088f;
  return s;
}

TEST(ChooseDecodeSplitsTest, FewestSplitsForTheLongestWarp) {
  AttentionShape s = Llama8BShape();
  // Llama-3.1-8B at 32K on 132 SMs: a wave of 2 CTAs per SM is 33 splits of 63 or 62 tiles
  // (16 per warp at most); 32 splits of 64 tiles keep 16 per warp with 8 CTAs fewer.
  EXPECT_EQ(ChooseDecodeSplits(1, 32768, 132, s), 32);
  EXPECT_EQ(ChooseDecodeSplits(8, 32768, 132, s), 6);
  EXPECT_EQ(ChooseDecodeSplits(64, 32768, 132, s), 1);
  // Whatever the inputs, one split fewer would give some warp more tiles.
  for (const int32_t head_dim : {128, 256}) {
    s.head_dim = head_dim;
    const int64_t step = head_dim <= 128 ? 16 : 8;
    auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    auto warp_tiles = [&](int64_t context, int64_t splits) {
      return ceil_div(ceil_div(ceil_div(context, step), splits), 4);  // 4 warps per CTA
    };
    for (const int32_t sms : {78, 132}) {
      for (const int32_t batch : {1, 2, 3, 8, 64}) {
        for (const int32_t context : {1, 100, 4096, 32768, 131072}) {
          const int32_t n = ChooseDecodeSplits(batch, context, sms, s);
          ASSERT_GE(n, 1);
          ASSERT_LE(n, 256);
          if (n > 1) {
            EXPECT_GT(warp_tiles(context, n - 1), warp_tiles(context, n))
                << "head_dim " << head_dim << " sms " << sms << " batch " << batch << " context "
                << context << " splits " << n;
          }
        }
      }
    }
  }
}

TEST(ChooseVerifySplitsTest, OneWaveOfFourCtasPerSmEvenIfUnevenAtMost64) {
  AttentionShape s = Llama8BShape();
  // Llama-3.1-8B, 8 queries (32 rows, one row tile) at 32K on 132 SMs: 528 CTA slots over 8 CTAs
  // per split would be 66 splits; the quarter-row combine takes at most 64.
  EXPECT_EQ(ChooseVerifySplits(1, 8, 32768, 132, s), 64);
  EXPECT_EQ(ChooseVerifySplits(8, 8, 32768, 132, s), 8);
  EXPECT_EQ(ChooseVerifySplits(1, 8, 1000, 132, s), 4);  // a split spans at least 256 tokens
  for (const int32_t sms : {78, 132}) {
    for (const int32_t batch : {1, 2, 3, 8}) {
      for (const int32_t q_len : {1, 4, 8, 16}) {
        for (const int32_t context : {300, 4096, 32768}) {
          const int64_t rows = int64_t{q_len} * 4;                      // q heads per kv head
          const int64_t row_tiles = rows <= 16 ? 1 : (rows + 31) / 32;  // 16 rows a warp, 2 warps
          const int64_t per_split = int64_t{batch} * 8 * row_tiles;
          const int64_t cap = std::min<int64_t>((context + 255) / 256, 64);
          const int64_t expected = std::max<int64_t>(1, std::min(4 * sms / per_split, cap));
          EXPECT_EQ(ChooseVerifySplits(batch, q_len, context, sms, s), expected)
              << "sms " << sms << " batch " << batch << " q_len " << q_len << " context "
              << context;
        }
      }
    }
  }
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

// TopKRows rows at `stride` from element `shift` of the buffer (padding and the shift hold 1e30,
// which would win if read), cycling through four styles: uniform floats; a 0.5 grid of 25 values
// (ties everywhere); a single value with every tenth entry NaN or -inf (one tie across the whole
// row, then NaN / -inf ranked by id); -inf with a few NaN and one finite value.
std::vector<float> TopKLogits(int32_t num_rows, int32_t vocab, int64_t stride, int64_t shift,
                              uint64_t seed) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-6.0f, 6.0f);
  std::vector<float> logits(shift + num_rows * stride, 1e30f);
  for (int32_t r = 0; r < num_rows; ++r) {
    float* row = logits.data() + shift + r * stride;
    for (int32_t i = 0; i < vocab; ++i) {
      switch (r % 4) {
        case 0:
          row[i] = uniform(rng);
          break;
        case 1:
          row[i] = std::round(uniform(rng) * 2.0f) / 2.0f;
          break;
        case 2:
          row[i] = i % 10 == 3 ? kNan : (i % 10 == 7 ? -kInf : 0.25f);
          break;
        default:
          row[i] = rng() % 97 == 0 ? kNan : -kInf;
      }
    }
    if (r % 4 == 3) row[rng() % vocab] = -1.0f;
  }
  return logits;
}

// The first index where two id lists differ, or -1.
int64_t FirstMismatch(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// Every k at vocabularies of one chunk, a partial last chunk, whole chunks and the two model
// sizes, for 16-byte rows (stride % 4 == 0), odd strides and a shifted base (scalar loads).
TEST(TopKRowsTest, MatchesTheReferenceForEveryKVocabularyAndLayout) {
  struct Layout {
    int32_t num_rows;
    int64_t pad;
    int64_t shift;
  };
  const Layout layouts[] = {{1, 0, 0}, {5, 1, 0}, {64, 4, 0}, {6, 0, 1}};
  for (int32_t vocab : {7, 1000, 8192, 128256, 151936}) {
    for (const Layout& l : layouts) {
      const int64_t stride = vocab + l.pad;
      const std::vector<float> host = TopKLogits(l.num_rows, vocab, stride, l.shift, vocab + l.pad);
      DeviceBuffer logits(host.size() * sizeof(float));
      logits.Upload(host);
      for (int32_t k : {1, 3, 8, 16}) {
        if (k > vocab) continue;
        DeviceBuffer ids(l.num_rows * k * sizeof(int32_t)),
            workspace(TopKWorkspaceBytes(l.num_rows, vocab, k));
        ids.Poison();
        workspace.Poison();
        ASSERT_EQ(TopKRows(logits.as<float>() + l.shift, stride, l.num_rows, vocab, k,
                           ids.as<int32_t>(), workspace.as<void>(), workspace.bytes(), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int32_t> expected(l.num_rows * k);
        ref::TopKRows(host.data() + l.shift, stride, l.num_rows, vocab, k, expected.data());
        const std::vector<int32_t> got = ids.Download<int32_t>();
        const int64_t at = FirstMismatch(got, expected);
        EXPECT_EQ(at, -1) << "vocab " << vocab << " rows " << l.num_rows << " pad " << l.pad
                          << " shift " << l.shift << " k " << k << ": row " << at / k << " rank "
                          << at % k << " id " << (at < 0 ? 0 : got[at]) << " expected "
                          << (at < 0 ? 0 : expected[at]);
      }
    }
  }
}

// Two launches and a workspace, still only queued work: a graph replays it.
TEST(TopKRowsTest, CapturedInACudaGraphMatchesTheReference) {
  const int32_t rows = 8, vocab = 128256, k = 16;
  const std::vector<float> host = TopKLogits(rows, vocab, vocab, 0, 7);
  DeviceBuffer logits(host.size() * sizeof(float)), ids(rows * k * sizeof(int32_t)),
      workspace(TopKWorkspaceBytes(rows, vocab, k));
  logits.Upload(host);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(TopKRows(logits.as<float>(), vocab, rows, vocab, k, ids.as<int32_t>(),
                     workspace.as<void>(), workspace.bytes(), stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ids.Poison();
  workspace.Poison();
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int32_t> expected(rows * k);
  ref::TopKRows(host.data(), vocab, rows, vocab, k, expected.data());
  EXPECT_EQ(ids.Download<int32_t>(), expected);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(TopKRowsTest, RejectsInvalidArgumentsWithoutStickyErrors) {
  const int32_t rows = 2, vocab = 10000;
  DeviceBuffer logits(rows * vocab * sizeof(float)), ids(rows * kMaxTopK * sizeof(int32_t)),
      workspace(TopKWorkspaceBytes(rows, vocab, kMaxTopK) + 8);
  logits.Upload(TopKLogits(rows, vocab, vocab, 0, 3));
  const size_t bytes = TopKWorkspaceBytes(rows, vocab, kMaxTopK);
  ASSERT_GT(bytes, 0u);
  auto run = [&](int64_t stride, int32_t num_rows, int32_t n, int32_t k, void* ws,
                 size_t ws_bytes) {
    return TopKRows(logits.as<float>(), stride, num_rows, n, k, ids.as<int32_t>(), ws, ws_bytes,
                    nullptr);
  };
  void* ws = workspace.as<void>();
  EXPECT_EQ(run(vocab, rows, vocab, 0, ws, bytes), cudaErrorInvalidValue);             // k < 1
  EXPECT_EQ(run(vocab, rows, vocab, kMaxTopK + 1, ws, bytes), cudaErrorInvalidValue);  // k > 16
  EXPECT_EQ(run(8, rows, 7, 8, nullptr, 0), cudaErrorInvalidValue);                    // k > vocab
  EXPECT_EQ(run(vocab - 1, rows, vocab, 4, ws, bytes), cudaErrorInvalidValue);         // stride
  EXPECT_EQ(run(vocab, -1, vocab, 4, ws, bytes), cudaErrorInvalidValue);
  EXPECT_EQ(run(vocab, rows, 0, 1, ws, bytes), cudaErrorInvalidValue);
  EXPECT_EQ(run(vocab, rows, vocab, kMaxTopK, ws, bytes - 1), cudaErrorInvalidValue);
  EXPECT_EQ(run(vocab, rows, vocab, kMaxTopK, nullptr, bytes), cudaErrorInvalidValue);
  EXPECT_EQ(run(vocab, rows, vocab, kMaxTopK, workspace.as<char>() + 4, bytes),
            cudaErrorInvalidValue);  // not 8-byte aligned
  // Valid: an empty batch launches nothing; one chunk (vocab <= 4096) needs no workspace.
  EXPECT_EQ(run(vocab, 0, vocab, kMaxTopK, nullptr, 0), cudaSuccess);
  EXPECT_EQ(TopKWorkspaceBytes(rows, 4096, kMaxTopK), 0u);
  EXPECT_GT(TopKWorkspaceBytes(rows, 4097, kMaxTopK), 0u);
  EXPECT_EQ(run(vocab, rows, 4096, kMaxTopK, nullptr, 0), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(ProcessedProbsTest, RejectsInvalidArgumentsWithoutStickyErrors) {
  const int32_t rows = 2, vocab = 1000;
  DeviceBuffer logits(rows * vocab * sizeof(float)), params(rows * sizeof(SamplingRow)),
      out(rows * vocab * sizeof(float)), dst_rows(rows * sizeof(int32_t));
  const float* l = logits.as<float>();
  const SamplingRow* p = params.as<SamplingRow>();
  float* o = out.as<float>();
  EXPECT_EQ(ProcessedProbs(l, vocab, rows, 0, p, o, vocab, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ProcessedProbs(l, vocab - 1, rows, vocab, p, o, vocab, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ProcessedProbs(l, vocab, rows, vocab, p, o, vocab - 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ProcessedProbs(l, vocab, -1, vocab, p, o, vocab, nullptr), cudaErrorInvalidValue);
  const int32_t huge = (1 << 23) + 1;
  EXPECT_EQ(ProcessedProbs(l, huge, 1, huge, p, o, huge, nullptr), cudaErrorInvalidValue);
  const int32_t* d = dst_rows.as<int32_t>();
  EXPECT_EQ(ScatterRows(l, vocab, rows, 0, d, o, vocab, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ScatterRows(l, vocab - 1, rows, vocab, d, o, vocab, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ScatterRows(l, vocab, rows, vocab, d, o, vocab - 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(ScatterRows(l, vocab, -1, vocab, d, o, vocab, nullptr), cudaErrorInvalidValue);
  // An empty batch is valid and launches nothing (null pointers are never touched).
  EXPECT_EQ(ProcessedProbs(nullptr, vocab, 0, vocab, nullptr, nullptr, vocab, nullptr),
            cudaSuccess);
  EXPECT_EQ(ScatterRows(nullptr, vocab, 0, vocab, nullptr, nullptr, vocab, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// In place inside a CUDA graph equals out of place outside one, bit for bit (fixed-point sums).
TEST(ProcessedProbsTest, InPlaceCapturedInACudaGraphMatchesOutOfPlace) {
  const int32_t rows = 8, vocab = 32000;
  const std::vector<float> host = TopKLogits(rows, vocab, vocab, 0, 9);
  std::vector<SamplingRow> host_params;
  for (int32_t r = 0; r < rows; ++r) {
    host_params.push_back(SamplingRow{r % 3 == 0 ? 0.0f : 0.8f, r % 2 == 0 ? 0 : 40,
                                      r % 4 == 1 ? 0.9f : 1.0f, r % 5 == 2 ? 0.05f : 0.0f, 0, 0});
  }
  DeviceBuffer logits(host.size() * sizeof(float)), out(host.size() * sizeof(float)),
      params(rows * sizeof(SamplingRow));
  logits.Upload(host);
  params.Upload(host_params);
  out.Poison();
  ASSERT_EQ(ProcessedProbs(logits.as<float>(), vocab, rows, vocab, params.as<SamplingRow>(),
                           out.as<float>(), vocab, nullptr),
            cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(ProcessedProbs(logits.as<float>(), vocab, rows, vocab, params.as<SamplingRow>(),
                           logits.as<float>(), vocab, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<float> in_place = logits.Download<float>(), expected = out.Download<float>();
  EXPECT_EQ(0, std::memcmp(in_place.data(), expected.data(), host.size() * sizeof(float)));
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// GemvBf16's inputs for kMaxGemvRows rows of x, and the fp64 reference without bias. Rows of
// large n are checked at a stride (the kernel's tiles are alike) plus the last two tiles.
struct GemvProblem {
  int64_t n = 0, k = 0, row_step = 1;
  std::vector<uint16_t> x;     // [kMaxGemvRows, k] bf16 bits
  std::vector<uint16_t> w;     // [n, k]
  std::vector<uint16_t> bias;  // [n]
  std::vector<double> y;       // [kMaxGemvRows, n]: sum_l x[i, l] w[j, l]
  std::vector<double> scale;   // [kMaxGemvRows, n]: sum_l |x[i, l] w[j, l]|

  bool Checked(int64_t j) const { return j % row_step == 0 || j + 32 >= n; }
};

GemvProblem MakeGemvProblem(int64_t n, int64_t k) {
  std::mt19937_64 rng(static_cast<uint64_t>(n * 31 + k));
  GemvProblem p;
  p.n = n;
  p.k = k;
  p.row_step = n > 32768 ? 7 : 1;
  p.x = check::RandomBf16(kMaxGemvRows * k, -1.0f, 1.0f, rng);
  p.w = check::RandomBf16(n * k, -1.0f, 1.0f, rng);
  p.bias = check::RandomBf16(n, -1.0f, 1.0f, rng);
  const std::vector<double> x = check::WidenToDouble(p.x);
  p.y.assign(kMaxGemvRows * n, 0.0);
  p.scale.assign(kMaxGemvRows * n, 0.0);
  std::vector<double> w_row(k);
  for (int64_t j = 0; j < n; ++j) {
    if (!p.Checked(j)) continue;
    for (int64_t l = 0; l < k; ++l) w_row[l] = Bf16ToFloat(p.w[j * k + l]);
    for (int64_t i = 0; i < kMaxGemvRows; ++i) {
      double acc = 0, abs_sum = 0;
      for (int64_t l = 0; l < k; ++l) {
        const double prod = x[i * k + l] * w_row[l];
        acc += prod;
        abs_sum += std::abs(prod);
      }
      p.y[i * n + j] = acc;
      p.scale[i * n + j] = abs_sum;
    }
  }
  return p;
}

// x's first m rows at row stride ldx in a buffer of kMaxGemvRows rows; the padding and the rows
// from m on hold NaN (0xffff), so a read of either shows in the output.
std::vector<uint16_t> PaddedGemvInput(const GemvProblem& p, int64_t m, int64_t ldx) {
  std::vector<uint16_t> rows(kMaxGemvRows * ldx, 0xffff);
  for (int64_t i = 0; i < m; ++i) {
    std::copy_n(p.x.begin() + i * p.k, p.k, rows.begin() + i * ldx);
  }
  return rows;
}

// The first y[i, j] (j < n) outside tolerance or padding element (j >= n) written, or "".
// Tolerance: the output's own rounding (bf16: 2^-8 |y|, f32: 1e-3 |y|) plus 2^-16 sum |x w| for
// the order of fp32 accumulation.
std::string FirstGemvMismatch(const GemvProblem& p, const DeviceBuffer& y, int64_t m, int64_t ldy,
                              GemmOut out, bool with_bias) {
  std::vector<double> got(m * ldy);
  if (out == GemmOut::kBf16) {
    const auto bits = y.Download<uint16_t>();
    std::transform(bits.begin(), bits.end(), got.begin(), Bf16ToFloat);
  } else {
    const auto values = y.Download<float>();
    std::copy(values.begin(), values.end(), got.begin());
  }
  const double rel = out == GemmOut::kBf16 ? std::ldexp(1.0, -8) : 1e-3;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldy; ++j) {
      const double v = got[i * ldy + j];
      if (j >= p.n) {
        if (!std::isnan(v))
          return "padding written at " + std::to_string(i) + "," + std::to_string(j);
        continue;
      }
      if (!p.Checked(j)) continue;
      const double ref = p.y[i * p.n + j] + (with_bias ? Bf16ToFloat(p.bias[j]) : 0.0);
      const double tol = rel * std::abs(ref) + std::ldexp(p.scale[i * p.n + j], -16);
      if (!(std::abs(v - ref) <= tol)) {
        return "y[" + std::to_string(i) + ", " + std::to_string(j) + "] = " + std::to_string(v) +
               ", reference " + std::to_string(ref) + ", tolerance " + std::to_string(tol);
      }
    }
  }
  return "";
}

// Every m of the decode projections of Llama-3.1-8B (lm_head: f32 output only), Llama-3.2-1B's
// qkv (one 16-warp iteration over k) and a tiny odd shape (n not a multiple of the 16-row tile, k
// below one lane group's 32 columns), with and without bias, dense and padded row strides, bf16 and
// f32 output.
TEST(GemvTest, MatchesFp64ReferenceForEveryRowCountBiasStrideAndOutput) {
  struct Shape {
    int64_t n, k;
    bool bf16_out;
  };
  for (const Shape& s :
       {Shape{6144, 4096, true}, Shape{4096, 4096, true}, Shape{4096, 14336, true},
        Shape{3072, 2048, true}, Shape{1000, 24, true}, Shape{128256, 4096, false}}) {
    const GemvProblem p = MakeGemvProblem(s.n, s.k);
    DeviceBuffer w(s.n * s.k * 2), bias(s.n * 2);
    w.Upload(p.w);
    bias.Upload(p.bias);
    for (int64_t m = 1; m <= kMaxGemvRows; ++m) {
      const bool with_bias = m % 2 == 1;
      const int64_t ldx = s.k + (m % 4 >= 2 ? 8 : 0), ldy = s.n + (m >= 5 ? 3 : 0);
      DeviceBuffer x(kMaxGemvRows * ldx * 2);
      x.Upload(PaddedGemvInput(p, m, ldx));
      for (GemmOut out : {GemmOut::kBf16, GemmOut::kF32}) {
        if (out == GemmOut::kBf16 && !s.bf16_out) continue;
        DeviceBuffer y(m * ldy * (out == GemmOut::kBf16 ? 2 : 4));
        y.Poison();
        ASSERT_EQ(GemvBf16(Bf16(x), ldx, Bf16(w), with_bias ? Bf16(bias) : nullptr, m, s.n, s.k,
                           y.as<void>(), ldy, out, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(FirstGemvMismatch(p, y, m, ldy, out, with_bias), "")
            << "n " << s.n << " k " << s.k << " m " << m << " ldx " << ldx << " ldy " << ldy
            << (out == GemmOut::kBf16 ? " bf16" : " f32") << (with_bias ? " +bias" : "");
      }
    }
  }
}

TEST(GemvTest, RejectsInvalidArgumentsWithoutStickyErrors) {
  const int64_t n = 64, k = 64, m = 2;
  std::mt19937_64 rng(9);
  DeviceBuffer x(m * k * 2), w(n * k * 2), y(m * n * 2);
  x.Upload(check::RandomBf16(m * k, -1.0f, 1.0f, rng));
  w.Upload(check::RandomBf16(n * k, -1.0f, 1.0f, rng));
  auto run = [&](const __nv_bfloat16* xp, int64_t ldx, const __nv_bfloat16* wp, int64_t rows,
                 int64_t cols, int64_t depth, void* yp, int64_t ldy) {
    return GemvBf16(xp, ldx, wp, nullptr, rows, cols, depth, yp, ldy, GemmOut::kBf16, nullptr);
  };
  void* yp = y.as<void>();
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), 0, n, k, yp, n), cudaErrorInvalidValue);  // m < 1
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), kMaxGemvRows + 1, n, k, yp, n), cudaErrorInvalidValue);
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, 0, k, yp, n), cudaErrorInvalidValue);       // n < 1
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, n, 0, yp, n), cudaErrorInvalidValue);       // k < 8
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, n, k - 4, yp, n), cudaErrorInvalidValue);   // k % 8
  EXPECT_EQ(run(Bf16(x), k - 8, Bf16(w), m, n, k, yp, n), cudaErrorInvalidValue);   // ldx < k
  EXPECT_EQ(run(Bf16(x), k + 4, Bf16(w), m, n, k, yp, n), cudaErrorInvalidValue);   // ldx % 8
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, n, k, yp, n - 1), cudaErrorInvalidValue);   // ldy < n
  EXPECT_EQ(run(Bf16(x, 4), k, Bf16(w), 1, n, k, yp, n), cudaErrorInvalidValue);    // x 8-byte
  EXPECT_EQ(run(Bf16(x), k, Bf16(w, 1), m, n, k, yp, n), cudaErrorInvalidValue);    // w 2-byte
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, n, k, nullptr, n), cudaErrorInvalidValue);  // no y
  EXPECT_EQ(run(nullptr, k, Bf16(w), m, n, k, yp, n), cudaErrorInvalidValue);
  // Valid: the same call with every argument in range.
  EXPECT_EQ(run(Bf16(x), k, Bf16(w), m, n, k, yp, n), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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
