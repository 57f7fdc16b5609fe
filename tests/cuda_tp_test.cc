// Tensor parallelism of the CUDA runner on real GPUs (ctest label gpu; exits 77, "skipped", where
// no GPU is visible; the cases that need two GPUs skip themselves, saying so, where only one is):
// (a) world size 1 through a NcclCommunicator gives the plain runner's logits and greedy ids
//     (codepair and tiny-random models);
// (b) two ranks, one GPU and one thread each, driven with the same calls: rank 0's logits and
//     greedy ids equal world size 1's up to bf16 noise (codepair, tiny-random), rank 1 returns
//     empty outputs from Forward, Step and StepGreedyVerify; an 8B-shaped dummy model's greedy
//     output is identical at TP 2 and TP 1;
// (c) timing: a decode step at 8B shapes, batch 1 and 64, through NCCL at world size 1 against no
//     communicator (target: at most 2% slower; the numbers are printed).
// The weight shards these ranks load are tested in cuda_tp_weights_test.cc.
// Data: as cuda_runner_test ($SPECD_SHARED_DIR/models, $SPECD_SHAPES_DIR).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/status.h"
#include "engine/distributed/nccl_communicator.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model_config.h"
#include "engine/model/tensor_parallel.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h

constexpr double kBf16RelTolerance = 1.0 / 32;  // as cuda_runner_test: 16 bf16 roundings

std::string ShapesDir() { return Env("SPECD_SHAPES_DIR", SharedDir() + "/models/shapes"); }

// max |ours - ref| / max |ref| over rows of `vocab`, the worst row.
double WorstRowRelError(const std::vector<float>& ours, const std::vector<float>& ref,
                        int32_t vocab) {
  if (ours.size() != ref.size() || ref.empty()) return 1e30;
  double worst = 0;
  for (size_t row = 0; row < ref.size() / vocab; ++row) {
    double diff = 0, top = 0;
    for (size_t i = row * vocab; i < (row + 1) * vocab; ++i) {
      diff = std::max(diff, std::fabs(double{ours[i]} - ref[i]));
      top = std::max(top, std::fabs(double{ref[i]}));
    }
    worst = std::max(worst, diff / top);
  }
  return worst;
}

// Runs fn(r) for r in [0, n) at once, rank 0 on this thread; the first error.
absl::Status OnEveryRank(int32_t n, const std::function<absl::Status(int32_t)>& fn) {
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int32_t r = 1; r < n; ++r) threads.emplace_back([&, r] { status[r] = fn(r); });
  status[0] = fn(0);
  for (std::thread& t : threads) t.join();
  for (int32_t r = 0; r < n; ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(), absl::StrCat("rank ", r, ": ", status[r].message()));
    }
  }
  return absl::OkStatus();
}

// A model on `world` GPUs (rank r on GPU r) with NCCL, or (world 0) the plain runner on GPU 0
// without a communicator, plus block tables from one allocator (every rank has the same number
// of KV blocks). Every call goes to every rank at once, as a worker process would mirror it.
class TpModel {
 public:
  static std::unique_ptr<TpModel> Create(const RunnerOptions& options, int32_t world) {
    auto m = std::unique_ptr<TpModel>(new TpModel());
    const int32_t n = std::max(world, 1);
    m->comms_.resize(n);
    m->runners_.resize(n);
    absl::Status s;
    if (world > 0) {
      auto id = NewNcclUniqueId();
      EXPECT_TRUE(id.ok()) << id.status();
      if (!id.ok()) return nullptr;
      s = OnEveryRank(n, [&](int32_t r) -> absl::Status {
        SPECD_ASSIGN_OR_RETURN(m->comms_[r], NcclCommunicator::Create(*id, r, n, r));
        return absl::OkStatus();
      });
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) return nullptr;
    }
    s = OnEveryRank(n, [&](int32_t r) -> absl::Status {
      RunnerOptions o = options;
      o.device = absl::StrCat("cuda:", r);
      o.tp = {r, n};
      o.comm = m->comms_[r].get();
      SPECD_ASSIGN_OR_RETURN(m->runners_[r], CudaRunner::Create(o, r));
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << "world " << world << " " << options.model_dir << ": " << s;
    if (!s.ok()) return nullptr;
    m->allocator_ = std::make_unique<BlockAllocator>(m->runners_[0]->num_kv_blocks());
    for (int32_t r = 1; r < n; ++r) {
      EXPECT_EQ(m->runners_[r]->num_kv_blocks(), m->runners_[0]->num_kv_blocks()) << "rank " << r;
    }
    return m;
  }

  int32_t num_ranks() const { return static_cast<int32_t>(runners_.size()); }
  CudaRunner& rank0() { return *runners_[0]; }
  int32_t vocab() const { return runners_[0]->config().vocab_size; }

  // Forward on every rank: rank 0's logits; a worker's must be empty.
  std::vector<float> Forward(std::span<const SequenceInput> batch) {
    std::vector<std::vector<float>> logits(runners_.size());
    const absl::Status s = OnEveryRank(
        num_ranks(), [&](int32_t r) { return runners_[r]->Forward(batch, &logits[r]); });
    EXPECT_TRUE(s.ok()) << s;
    for (int32_t r = 1; r < num_ranks(); ++r) EXPECT_TRUE(logits[r].empty()) << "rank " << r;
    return logits[0];
  }
  // Step on every rank with `rows` on rank 0 and only their (chunk, token) on the workers.
  std::vector<SampleResult> Step(std::span<const SequenceInput> batch,
                                 const std::vector<SampleRow>& rows) {
    const std::vector<SampleRow> bare = Bare(rows);
    std::vector<std::vector<SampleResult>> out(runners_.size());
    const absl::Status s = OnEveryRank(num_ranks(), [&](int32_t r) {
      return runners_[r]->Step(batch, r == 0 ? rows : bare, &out[r]);
    });
    EXPECT_TRUE(s.ok()) << s;
    for (int32_t r = 1; r < num_ranks(); ++r) EXPECT_TRUE(out[r].empty()) << "rank " << r;
    return out[0];
  }
  std::vector<GreedyVerifyResult> Verify(std::span<const SequenceInput> batch,
                                         const std::vector<SampleRow>& rows,
                                         std::span<const std::span<const int32_t>> drafts) {
    const std::vector<SampleRow> bare = Bare(rows);
    std::vector<std::vector<GreedyVerifyResult>> out(runners_.size());
    const absl::Status s = OnEveryRank(num_ranks(), [&](int32_t r) {
      return runners_[r]->StepGreedyVerify(batch, r == 0 ? rows : bare, drafts, &out[r]);
    });
    EXPECT_TRUE(s.ok()) << s;
    for (int32_t r = 1; r < num_ranks(); ++r) EXPECT_TRUE(out[r].empty()) << "rank " << r;
    return out[0];
  }

  // Sequences and their block tables (as cuda_test::Harness).
  int AddSequence() {
    tables_.emplace_back(runners_[0]->block_size());
    lengths_.push_back(0);
    return static_cast<int>(tables_.size()) - 1;
  }
  // The chunk's SequenceInput, growing the sequence's table; Advance moves its length on.
  SequenceInput Chunk(int seq, std::span<const int32_t> tokens, bool all_logits) {
    const int32_t end = lengths_[seq] + static_cast<int32_t>(tokens.size());
    EXPECT_TRUE(tables_[seq].EnsureCapacity(end, *allocator_).ok());
    return {tokens, lengths_[seq], tables_[seq].ids(), all_logits};
  }
  void Advance(int seq, int32_t n) { lengths_[seq] += n; }
  int32_t length(int seq) const { return lengths_[seq]; }
  void Release(int seq) { EXPECT_TRUE(tables_[seq].Release(*allocator_).ok()); }

  std::vector<float> Run(int seq, const std::vector<int32_t>& tokens, bool all_logits) {
    const SequenceInput in = Chunk(seq, tokens, all_logits);
    std::vector<float> logits = Forward({&in, 1});
    Advance(seq, static_cast<int32_t>(tokens.size()));
    return logits;
  }
  std::vector<float> LastLogits(const std::vector<int32_t>& tokens) {
    const int seq = AddSequence();
    std::vector<float> logits = Run(seq, tokens, false);
    Release(seq);
    return logits;
  }
  // Prefill, then one decode step (a decode graph) per token, argmax on the host.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n) {
    const int seq = AddSequence();
    std::vector<float> logits = Run(seq, prompt, false);
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < n) {
      out.push_back(Argmax(logits));
      if (static_cast<int>(out.size()) < n) logits = Run(seq, {out.back()}, false);
    }
    Release(seq);
    return out;
  }
  // The same through Step with greedy rows: under tensor parallelism the ranks merge their
  // vocabulary shards by the argmax (VocabMergeK 1) in the prefill and the decode graphs.
  std::vector<int32_t> GreedyBySteps(const std::vector<int32_t>& prompt, int n) {
    SamplingParams greedy;
    greedy.temperature = 0;
    Sampler sampler(greedy, 0);
    TokenHistory history;
    history.AddPrompt(prompt);
    std::vector<SampleRow> rows(1);
    rows[0].sampler = &sampler;
    rows[0].params = &greedy;
    rows[0].history = &history;
    const int seq = AddSequence();
    std::vector<int32_t> out, chunk = prompt;
    while (static_cast<int>(out.size()) < n) {
      const SequenceInput in = Chunk(seq, chunk, false);
      const std::vector<SampleResult> step = Step({&in, 1}, rows);
      if (step.size() != 1) break;
      Advance(seq, static_cast<int32_t>(chunk.size()));
      out.push_back(step[0].id);
      chunk.assign(1, out.back());
    }
    Release(seq);
    return out;
  }

 private:
  TpModel() = default;
  // What a worker is sent of each row.
  static std::vector<SampleRow> Bare(const std::vector<SampleRow>& rows) {
    std::vector<SampleRow> bare(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      bare[i].chunk = rows[i].chunk;
      bare[i].token = rows[i].token;
      bare[i].full_logits = NeedsFullLogits(rows[i]);  // as TpCall rebuilds a row
      bare[i].num_candidates = rows[i].num_candidates;
    }
    return bare;
  }

  // Declared before the runners, so destroyed after them.
  std::vector<std::unique_ptr<NcclCommunicator>> comms_;
  std::vector<std::unique_ptr<CudaRunner>> runners_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::vector<BlockTable> tables_;
  std::vector<int32_t> lengths_;
};

// The greedy rule of cuda_test::GreedyAgrees with a TpModel as the GPU side: at the first
// difference the divergence is accepted if the CPU's fp32 preference for its token is at most
// twice the largest |gpu - cpu| logit error of that row.
bool GreedyAgreesTp(const std::string& what, const std::vector<int32_t>& prompt,
                    const std::vector<int32_t>& expected, const std::vector<int32_t>& got,
                    Harness& cpu, TpModel& gpu) {
  size_t k = 0;
  while (k < expected.size() && k < got.size() && expected[k] == got[k]) ++k;
  if (k == expected.size() && k == got.size()) return true;
  if (k == expected.size() || k == got.size()) return false;
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), expected.begin(), expected.begin() + k);
  const std::vector<float> c = cpu.LastLogits(prefix), g = gpu.LastLogits(prefix);
  const double margin = double{c[expected[k]]} - c[got[k]];
  const double error = MaxAbsDiff(c, g);
  std::printf("[ %s ] diverges at %zu: expected %d, got %d; CPU margin %.5f, error %.5f: %s\n",
              what.c_str(), k, expected[k], got[k], margin, error,
              margin <= 2 * error ? "accepted" : "REJECTED");
  return margin <= 2 * error;
}

RunnerOptions SmallOptions(const std::string& dir) {
  RunnerOptions o = Options(dir, "cuda");
  o.max_sample_rows = 64;
  return o;
}

// Prompts of `n` tokens from the vocabulary, deterministic.
std::vector<std::vector<int32_t>> Prompts(int32_t vocab, int count, int n) {
  std::vector<std::vector<int32_t>> out(count);
  for (int p = 0; p < count; ++p) {
    for (int i = 0; i < n; ++i)
      out[p].push_back(static_cast<int32_t>((p * 7919 + i * 104729) % vocab));
  }
  return out;
}

// ---- (a) world size 1 through NCCL ----

class CudaTpWorldOneTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTpWorldOneTest, NcclAtWorldSizeOneGivesThePlainRunnersLogitsAndGreedyIds) {
  const std::string dir = ModelDir(GetParam());
  ASSERT_TRUE(DataPresent(dir));
  auto plain = TpModel::Create(SmallOptions(dir), 0);
  auto nccl = TpModel::Create(SmallOptions(dir), 1);
  ASSERT_TRUE(plain && nccl);
  const int32_t vocab = plain->vocab();
  for (const std::vector<int32_t>& prompt : Prompts(vocab, 3, 37)) {
    const int a = plain->AddSequence(), b = nccl->AddSequence();
    const std::vector<float> want = plain->Run(a, prompt, true), got = nccl->Run(b, prompt, true);
    const double err = WorstRowRelError(got, want, vocab);
    std::printf("[ %s ] prefill logits: worst row rel error %.2e (%s)\n", GetParam(), err,
                got == want ? "bit-identical" : "differ");
    EXPECT_LE(err, kBf16RelTolerance);
    plain->Release(a);
    nccl->Release(b);
    const std::vector<int32_t> greedy_plain = plain->Greedy(prompt, 24);
    EXPECT_EQ(nccl->Greedy(prompt, 24), greedy_plain);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTpWorldOneTest,
                         ::testing::Values("codepair/target", "tiny-random/qwen2"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '/' || ch == '-') ch = '_';
                           }
                           return name;
                         });

// ---- (b) two GPUs ----

#define SKIP_WITHOUT_TWO_GPUS()                                                        \
  do {                                                                                 \
    if (CudaDeviceCount() < 2) {                                                       \
      GTEST_SKIP() << "tensor parallelism at TP 2 needs 2 GPUs; " << CudaDeviceCount() \
                   << " visible";                                                      \
    }                                                                                  \
  } while (0)

class CudaTpTwoGpuTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaTpTwoGpuTest, TwoRanksGiveWorldSizeOnesLogitsAndGreedyIds) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = ModelDir(GetParam());
  ASSERT_TRUE(DataPresent(dir));
  Harness cpu(MakeRunner(Options(dir, "cpu")));
  ASSERT_TRUE(cpu.ok());
  auto one = TpModel::Create(SmallOptions(dir), 0);
  auto two = TpModel::Create(SmallOptions(dir), 2);
  ASSERT_TRUE(one && two);
  const int32_t vocab = one->vocab();
  int exact = 0, count = 0;
  for (const std::vector<int32_t>& prompt : Prompts(vocab, 4, 29)) {
    const int a = one->AddSequence(), b = two->AddSequence();
    const std::vector<float> want = one->Run(a, prompt, true), got = two->Run(b, prompt, true);
    const double err = WorstRowRelError(got, want, vocab);
    std::printf("[ %s TP 2 ] prefill logits: worst row rel error %.2e vs TP 1\n", GetParam(), err);
    EXPECT_LE(err, kBf16RelTolerance);
    one->Release(a);
    two->Release(b);
    const std::vector<int32_t> g1 = one->Greedy(prompt, 32), g2 = two->Greedy(prompt, 32);
    exact += g1 == g2 ? 1 : 0;
    ++count;
    EXPECT_TRUE(GreedyAgreesTp(absl::StrCat(GetParam(), " TP 2 prompt ", count), prompt, g1, g2,
                               cpu, *two));
  }
  std::printf("[ %s TP 2 ] %d of %d greedy continuations equal TP 1's exactly\n", GetParam(), exact,
              count);
}

// Issue 21's correctness run: the 48 held-out codepair prompts (prompts.jsonl), 32 greedy tokens
// each, at TP 2 (greedy
// decode steps merge the vocabulary shards by their argmax) against TP 1 on the GPU; a divergence
// passes only as a bf16 near-tie (GreedyAgreesTp, checked on the CPU backend).
TEST(CudaTpCodepairTest, All48PromptsAtTp2EqualTp1UpToNearTies) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = ModelDir("codepair/target");
  ASSERT_TRUE(DataPresent(dir));
  auto tokenizer = Tokenizer::FromDir(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(ModelDir("codepair/prompts.jsonl"));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto ids = (*tokenizer)->Encode(nlohmann::json::parse(line)["prompt"].get<std::string>(), true);
    ASSERT_TRUE(ids.ok()) << ids.status();
    prompts.push_back(*std::move(ids));
  }
  ASSERT_EQ(prompts.size(), 48u);
  Harness cpu(MakeRunner(Options(dir, "cpu")));
  ASSERT_TRUE(cpu.ok());
  auto one = TpModel::Create(SmallOptions(dir), 0);
  auto two = TpModel::Create(SmallOptions(dir), 2);
  ASSERT_TRUE(one && two);
  int exact = 0, count = 0;
  for (const std::vector<int32_t>& prompt : prompts) {
    const std::vector<int32_t> g1 = one->GreedyBySteps(prompt, 32);
    const std::vector<int32_t> g2 = two->GreedyBySteps(prompt, 32);
    ASSERT_EQ(g2.size(), 32u);
    exact += g1 == g2 ? 1 : 0;
    ++count;
    EXPECT_TRUE(
        GreedyAgreesTp(absl::StrCat("codepair TP 2 prompt ", count), prompt, g1, g2, cpu, *two));
  }
  std::printf("[ codepair TP 2 ] %d of %d prompts' 32-token continuations equal TP 1's\n", exact,
              count);
}

// Step and StepGreedyVerify with a worker that gets only (chunk, token) rows: rank 0's ids equal
// TP 1's (bf16 near-ties aside), the worker returns nothing.
TEST_P(CudaTpTwoGpuTest, WorkerMirrorsStepAndVerificationWithBareRows) {
  SKIP_WITHOUT_TWO_GPUS();
  const std::string dir = ModelDir(GetParam());
  ASSERT_TRUE(DataPresent(dir));
  auto one = TpModel::Create(SmallOptions(dir), 0);
  auto two = TpModel::Create(SmallOptions(dir), 2);
  ASSERT_TRUE(one && two);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  TokenHistory history;
  Sampler sampler(greedy, 1);
  constexpr int kK = 3;
  const std::vector<std::vector<int32_t>> prompts = Prompts(one->vocab(), 3, 21);
  int agree = 0, total = 0;
  // Per model: prefill every prompt but its last token, one plain Step (batch of all), then a
  // verification round with the greedy continuation as drafts (the last row draftless).
  std::vector<std::vector<int32_t>> results(2);
  for (int which = 0; which < 2; ++which) {
    TpModel& m = which == 0 ? *one : *two;
    std::vector<int> seqs;
    for (const auto& p : prompts) {
      seqs.push_back(m.AddSequence());
      m.Run(seqs.back(), std::vector<int32_t>(p.begin(), p.end() - 1), false);
    }
    std::vector<SequenceInput> batch;
    std::vector<SampleRow> rows;
    for (size_t i = 0; i < prompts.size(); ++i) {
      batch.push_back(m.Chunk(seqs[i], std::span<const int32_t>(prompts[i]).last(1), false));
      SampleRow row;
      row.chunk = static_cast<int32_t>(i);
      row.sampler = &sampler;
      row.params = &greedy;
      row.history = &history;
      rows.push_back(row);
    }
    const std::vector<SampleResult> step = m.Step(batch, rows);
    ASSERT_EQ(step.size(), prompts.size());
    std::vector<std::vector<int32_t>> chunks(prompts.size()), drafts(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      m.Advance(seqs[i], 1);
      results[which].push_back(step[i].id);
      chunks[i] = {step[i].id};
      if (i + 1 < prompts.size()) {  // drafts: the token itself repeated (some rejected)
        for (int j = 0; j < kK; ++j) drafts[i].push_back(step[i].id);
        chunks[i].insert(chunks[i].end(), drafts[i].begin(), drafts[i].end());
      }
    }
    batch.clear();
    std::vector<std::span<const int32_t>> spans;
    for (size_t i = 0; i < prompts.size(); ++i) {
      batch.push_back(m.Chunk(seqs[i], chunks[i], false));
      spans.emplace_back(drafts[i]);
    }
    const std::vector<GreedyVerifyResult> verified = m.Verify(batch, rows, spans);
    ASSERT_EQ(verified.size(), prompts.size());
    for (const GreedyVerifyResult& v : verified) {
      results[which].push_back(v.num_accepted);
      results[which].push_back(v.next.id);
    }
    for (int s : seqs) m.Release(s);
  }
  for (size_t i = 0; i < results[0].size(); ++i) agree += results[0][i] == results[1][i] ? 1 : 0;
  total = static_cast<int>(results[0].size());
  std::printf("[ %s TP 2 ] step and verification: %d of %d values equal TP 1's\n", GetParam(),
              agree, total);
  EXPECT_GE(agree, total - 2) << "TP 2 disagrees with TP 1 beyond bf16 near-ties";
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTpTwoGpuTest,
                         ::testing::Values("codepair/target", "tiny-random/llama3",
                                           "tiny-random/qwen2", "tiny-random/qwen3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (ch == '/' || ch == '-') ch = '_';
                           }
                           return name;
                         });

RunnerOptions Dummy8B(int32_t max_num_seqs) {
  RunnerOptions o = Options(ShapesDir() + "/llama-3.1-8b", "cuda");
  o.load_format = "dummy";
  o.max_model_len = 1024;
  o.max_num_seqs = max_num_seqs;
  o.max_num_batched_tokens = 2048;
  o.kv_cache_bytes = int64_t{3} << 30;
  return o;
}

TEST(CudaTpDummy8BTest, GreedyOutputAtTp2IsIdenticalToTp1) {
  SKIP_WITHOUT_TWO_GPUS();
  ASSERT_TRUE(DataPresent(ShapesDir() + "/llama-3.1-8b/config.json"));
  const std::vector<std::vector<int32_t>> prompts = Prompts(128000, 3, 50);
  std::vector<std::vector<int32_t>> tp1;
  {
    auto one = TpModel::Create(Dummy8B(8), 0);
    ASSERT_TRUE(one);
    for (const auto& p : prompts) tp1.push_back(one->Greedy(p, 16));
  }
  auto two = TpModel::Create(Dummy8B(8), 2);
  ASSERT_TRUE(two);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(two->Greedy(prompts[i], 16), tp1[i]) << "prompt " << i;
  }
}

// ---- (c) timing ----

// Seconds per decode step of `batch` sequences at context 256, the engine's path (Step with
// greedy rows: a decode graph, then the GPU sampler), median of `rounds` rounds of `steps`.
std::vector<double> DecodeStepSeconds(TpModel& m, int32_t batch, int rounds, int steps) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  TokenHistory history;
  Sampler sampler(greedy, 1);
  std::vector<int> seqs;
  std::vector<int32_t> token = {17};
  std::vector<SequenceInput> inputs;
  std::vector<SampleRow> rows;
  for (int32_t i = 0; i < batch; ++i) {
    seqs.push_back(m.AddSequence());
    m.Advance(seqs.back(), 256);  // KV of positions < 256: the cache's contents, never NaN
    inputs.push_back(m.Chunk(seqs.back(), token, false));
    SampleRow row;
    row.chunk = i;
    row.sampler = &sampler;
    row.params = &greedy;
    row.history = &history;
    rows.push_back(row);
  }
  std::vector<double> per_round;
  std::vector<SampleResult> out;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) EXPECT_TRUE(m.rank0().Step(inputs, rows, &out).ok());
    per_round.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps);
  }
  for (int s : seqs) m.Release(s);
  return per_round;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(CudaTpTimingTest, DecodeStepThroughNcclAtWorldSizeOneCostsAtMostTwoPercent) {
  ASSERT_TRUE(DataPresent(ShapesDir() + "/llama-3.1-8b/config.json"));
  auto plain = TpModel::Create(Dummy8B(64), 0);
  auto nccl = TpModel::Create(Dummy8B(64), 1);
  ASSERT_TRUE(plain && nccl);
  for (const int32_t batch : {1, 64}) {
    DecodeStepSeconds(*plain, batch, 1, 20);  // warm-up
    DecodeStepSeconds(*nccl, batch, 1, 20);
    std::vector<double> a, b;
    for (int round = 0; round < 5; ++round) {  // alternated, so drift hits both
      a.push_back(Median(DecodeStepSeconds(*plain, batch, 1, 50)));
      b.push_back(Median(DecodeStepSeconds(*nccl, batch, 1, 50)));
    }
    const double ta = Median(a), tb = Median(b), overhead = tb / ta - 1;
    std::printf(
        "[ 8B decode step, batch %d ] no communicator %.3f ms, NCCL world size 1 %.3f ms: "
        "%+.2f%% (target <= 2%%: %s)\n",
        batch, ta * 1e3, tb * 1e3, overhead * 100, overhead <= 0.02 ? "met" : "MISSED");
    EXPECT_LE(overhead, 0.05) << "batch " << batch << ": the NCCL path at world size 1 costs "
                              << overhead * 100 << "% (target 2%)";
  }
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "cuda_tp_test");
}
