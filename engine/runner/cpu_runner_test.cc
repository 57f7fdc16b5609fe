// CpuRunner against the Model it wraps, and CreateModelRunner's choice of device and its errors.
// CPU only (the CUDA runner is tested in tests/cuda_runner_test.cc and codepair_cuda_test.cc,
// label gpu).
#include "engine/runner/cpu_runner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"

namespace specd {
namespace {

const std::string kTarget = std::string(SPECD_SHARED_DIR) + "/models/codepair/target";

RunnerOptions CpuOptions() {
  RunnerOptions o;
  o.model_dir = kTarget;
  o.device = "cpu";
  o.max_model_len = 256;
  return o;
}

TEST(CreateModelRunnerTest, CpuDeviceBuildsTheCpuRunnerSizedByKvCacheBytes) {
  RunnerOptions o = CpuOptions();
  o.kv_cache_bytes = 1;  // the minimum: one max_model_len sequence
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->device_name().rfind("cpu", 0), 0u);
  EXPECT_EQ((*runner)->block_size(), 16);
  EXPECT_EQ((*runner)->max_model_len(), 256);
  EXPECT_EQ((*runner)->num_kv_blocks(), 256 / 16);
  o.kv_cache_bytes = 0;  // the CPU default, 64 MiB
  auto big = CreateModelRunner(o);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_GT((*big)->num_kv_blocks(), 256 / 16);
}

TEST(CreateModelRunnerTest, BadOptionsAreInvalidArgument) {
  std::vector<RunnerOptions> cases(7, CpuOptions());
  cases[0].device = "tpu";
  cases[1].device = "cuda:x";
  cases[2].device = "cuda:-1";
  cases[3].load_format = "gguf";
  cases[4].load_format = "dummy";  // random weights: CUDA only
  cases[5].gpu_memory_utilization = 0;
  cases[6].max_model_len = 1 << 30;  // beyond max_position_embeddings
  for (const RunnerOptions& o : cases) {
    auto runner = CreateModelRunner(o);
    EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument)
        << o.device << " " << o.load_format << ": " << runner.status();
  }
}

#ifndef SPECD_TEST_HAS_CUDA
TEST(CreateModelRunnerTest, CudaWithoutCudaInTheBuildIsAClearError) {
  RunnerOptions o = CpuOptions();
  o.device = "cuda";
  auto runner = CreateModelRunner(o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(runner.status().message().find("this build has no CUDA"), std::string::npos);
  o.device = "auto";  // no CUDA: the CPU
  auto fallback = CreateModelRunner(o);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_EQ((*fallback)->device_name().rfind("cpu", 0), 0u);
}
#endif

#ifdef SPECD_TEST_HAS_CUDA
// Refused before the device is touched: the same answer with or without a visible GPU.
TEST(CreateModelRunnerTest, CudaRefusesNsaModelsUnderTensorParallelism) {
  RunnerOptions o = CpuOptions();
  o.model_dir = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";
  o.device = "cuda";
  o.tp = {0, 2};
  auto runner = CreateModelRunner(o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument) << runner.status();
  EXPECT_NE(runner.status().message().find("tensor parallelism"), std::string::npos)
      << runner.status();
}
#endif

TEST(CreateModelRunnerTest, CpuRunnerLoadsNsaModels) {
  RunnerOptions o = CpuOptions();
  o.model_dir = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_TRUE((*runner)->config().is_nsa());
}

// A runner and a Model over the same weights, block tables from a real allocator.
class CpuRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto runner = CpuRunner::Create(CpuOptions());
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = std::move(*runner);
    allocator_ = std::make_unique<BlockAllocator>(runner_->num_kv_blocks());
  }
  BlockTable Table(int32_t num_tokens) {
    BlockTable t(runner_->block_size());
    EXPECT_TRUE(t.EnsureCapacity(num_tokens, *allocator_).ok());
    return t;
  }
  std::unique_ptr<CpuRunner> runner_;
  std::unique_ptr<BlockAllocator> allocator_;
};

TEST_F(CpuRunnerTest, StepDrawsFromTheLastLogitsRowOfEachSampledChunk) {
  const std::vector<int32_t> a = {0, 5, 9, 14, 3}, b = {0, 7, 7};
  BlockTable ta = Table(5), tb = Table(3), tc = Table(5), td = Table(3);
  std::vector<SequenceInput> batch = {{a, 0, ta.ids(), false}, {b, 0, tb.ids(), false}};
  std::vector<float> logits;
  ASSERT_TRUE(runner_->Forward(batch, &logits).ok());
  const int32_t vocab = runner_->config().vocab_size;
  ASSERT_EQ(logits.size(), 2u * vocab);

  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.logprobs = 2;
  Sampler sampler_b(greedy, 1);
  TokenHistory history;
  history.AddPrompt(b);
  SampleRow row;
  row.chunk = 1;  // only b draws
  row.sampler = &sampler_b;
  row.params = &greedy;
  row.history = &history;
  std::vector<SampleResult> out;
  std::vector<SequenceInput> again = {{a, 0, tc.ids(), false}, {b, 0, td.ids(), false}};
  ASSERT_TRUE(runner_->Step(again, {&row, 1}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  std::span<const float> row_b(logits.data() + vocab, vocab);
  EXPECT_EQ(out[0].id, Argmax(row_b));
  ASSERT_EQ(out[0].top.size(), 2u);
  EXPECT_EQ(out[0].top[0].id, out[0].id);
}

// SSD's candidates: the top raw logits of the row (before the sampler's penalties), ties to
// the lower id, as many as asked (at most kMaxSampleCandidates).
TEST_F(CpuRunnerTest, StepCandidatesAreTheTopRawLogits) {
  const std::vector<int32_t> a = {0, 5, 9, 14, 3};
  BlockTable ta = Table(5), tb = Table(5);
  std::vector<SequenceInput> batch = {{a, 0, ta.ids(), false}};
  std::vector<float> logits;
  ASSERT_TRUE(runner_->Forward(batch, &logits).ok());
  const int32_t vocab = runner_->config().vocab_size;
  SamplingParams params;
  params.temperature = 0;
  params.repetition_penalty = 2.0f;
  Sampler sampler(params, 1);
  TokenHistory history;
  history.AddPrompt(a);
  SampleRow row;
  row.sampler = &sampler;
  row.params = &params;
  row.history = &history;
  row.num_candidates = 5;
  std::vector<SampleResult> out;
  std::vector<SequenceInput> again = {{a, 0, tb.ids(), false}};
  ASSERT_TRUE(runner_->Step(again, {&row, 1}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return logits[x] > logits[y]; });
  EXPECT_EQ(out[0].candidates, std::vector<int32_t>(order.begin(), order.begin() + 5));
  row.num_candidates = kMaxSampleCandidates + 1;
  EXPECT_EQ(runner_->Step(again, {&row, 1}, &out).code(), absl::StatusCode::kInvalidArgument);
}

// Verification of greedy drafts: rows naming tokens inside a chunk draw from those tokens'
// logits, as Forward with all_logits returns them.
TEST_F(CpuRunnerTest, RowsNamingTokensDrawFromThoseTokensLogits) {
  const std::vector<int32_t> a = {0, 5, 9, 14, 3}, b = {0, 7, 7};
  BlockTable ta = Table(5), tb = Table(3), tc = Table(5), td = Table(3);
  std::vector<SequenceInput> batch = {{a, 0, ta.ids(), true}, {b, 0, tb.ids(), false}};
  std::vector<float> logits;
  ASSERT_TRUE(runner_->Forward(batch, &logits).ok());
  const int32_t vocab = runner_->config().vocab_size;
  ASSERT_EQ(logits.size(), 6u * vocab);  // 5 rows of a, the last of b

  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy, 1);
  TokenHistory history;
  std::vector<SampleRow> rows;
  for (int32_t token : {4, 0, 2}) rows.push_back({0, &sampler, &greedy, &history, {}, 1, 0, token});
  rows.push_back({1, &sampler, &greedy, &history, {}, 1, 0, -1});
  std::vector<SampleResult> out;
  std::vector<SequenceInput> again = {{a, 0, tc.ids(), false}, {b, 0, td.ids(), false}};
  ASSERT_TRUE(runner_->Step(again, rows, &out).ok());
  ASSERT_EQ(out.size(), 4u);
  auto row = [&](int r) { return std::span<const float>(logits.data() + r * vocab, vocab); };
  EXPECT_EQ(out[0].id, Argmax(row(4)));
  EXPECT_EQ(out[1].id, Argmax(row(0)));
  EXPECT_EQ(out[2].id, Argmax(row(2)));
  EXPECT_EQ(out[3].id, Argmax(row(5)));
  rows[0].token = 5;  // past the chunk
  EXPECT_EQ(runner_->Step(again, rows, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuRunnerTest, MalformedRowsAndAllLogitsChunksAreRejected) {
  const std::vector<int32_t> a = {0, 5};
  BlockTable t = Table(2);
  std::vector<SequenceInput> batch = {{a, 0, t.ids(), false}};
  SamplingParams p;
  Sampler sampler(p, 1);
  TokenHistory history;
  SampleRow row{3, &sampler, &p, &history, {}, 1, 0};  // chunk 3 of a 1-chunk batch
  std::vector<SampleResult> out;
  EXPECT_EQ(runner_->Step(batch, {&row, 1}, &out).code(), absl::StatusCode::kInvalidArgument);
  batch[0].all_logits = true;
  EXPECT_EQ(runner_->Step(batch, {}, &out).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
