// The NSA family on the CUDA runner (ctest label gpu; exits 77, "skipped", where no GPU is
// visible), nsa-codepair (shared/models/nsa-codepair: an fp32 dense reference we did not write
// made its goldens; its weights are bf16, so the fp32 CPU forward on the same weights is the
// same-precision baseline):
//  - the last prompt position's top-8 logits of every golden prompt against the golden's, and the
//    whole row against the CPU's, at bf16 tolerance (1/32 of the row's largest |logit|);
//  - greedy decoding (prefill, then graph-replayed decode steps) against the golden's ids, up to
//    bf16 flips (GreedyAgrees);
//  - decode steps and verification chunks of 5 (a block completing inside a chunk) against one
//    prefill, and a ragged batch against each sequence alone.
// NSA's block selection is discontinuous: where the fp32 CPU forward finds a query's S-th and
// (S + 1)-th block scores within kNearTie, bf16 may pick the other block, and that query's logits
// may then move past any bf16 tolerance. Such a row must be at a recorded near tie (the CPU's
// margin, NsaAttention::LastRunSelectionMargin), printed, and rare;
//  - greedy speculation (the codepair draft, SSV exact) gives plain decoding's ids, and lossy SSV
//    strategies give the CPU's rows;
//  - what SSV verification reads (ModelRunner::ssv_load_stats, counted on the device) is what the
//    CPU counts, in graph replays and eager steps;
//  - chunked prefill, preemption (recompute) and the prefix cache keep the ids;
//  - the load under tensor parallelism refused before any device work.
// Data: as cuda_runner_test ($SPECD_SHARED_DIR/models).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/testing/engine_test_util.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h
using serving_test::PreemptionCounter;

constexpr double kBf16RelTolerance = 1.0 / 32;

std::string Dir() { return ModelDir("nsa-codepair"); }

RunnerOptions NsaOptions(const std::string& device) {
  RunnerOptions o = Options(Dir(), device);
  o.max_model_len = 1024;
  o.max_num_batched_tokens = 2048;
  return o;
}

// A query whose block selection came within this of another (NsaAttention::
// LastRunSelectionMargin: scores are compressed probabilities summed over the KV head's 16 query
// heads) may select differently in bf16: its logits may then move far past the bf16 tolerance.
// On the goldens the last query's margins are 0.019-0.72, except one at 0.0036.
constexpr float kNearTie = 0.01f;

// The fp32 CPU forward's smallest selection margin, over the layers and the queries of the last
// `chunk` ids of `tokens` run as one chunk with strategy `ssv` (the rest prefilled first): how
// close their selections are to a tie.
float CpuChunkMargin(const std::vector<int32_t>& tokens, int32_t chunk,
                     const SsvStrategy* ssv = nullptr) {
  static Model* model = [] {
    auto m = Model::Load(Dir(), LoadOptions{});
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m).release() : nullptr;
  }();
  const int32_t n = static_cast<int32_t>(tokens.size()), kv_block = 16;
  if (model == nullptr || chunk < 1 || chunk > n) return 0;
  auto kv = CpuKvCache::Create(model->MakeKvCacheSpec((n + kv_block - 1) / kv_block, kv_block));
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return 0;
  std::vector<int32_t> table((n + kv_block - 1) / kv_block);
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits;
  if (n > chunk) {
    const SequenceInput head{std::span(tokens).first(n - chunk), 0, table, false};
    EXPECT_TRUE(model->Forward(std::span(&head, 1), **kv, &logits).ok());
  }
  SequenceInput last{std::span(tokens).last(chunk), n - chunk, table, false};
  last.ssv = ssv;
  EXPECT_TRUE(model->Forward(std::span(&last, 1), **kv, &logits).ok());
  float margin = std::numeric_limits<float>::infinity();
  for (int32_t l = 0; l < model->config().num_layers; ++l) {
    margin = std::min(margin, model->nsa()->LastRunSelectionMargin(l));
  }
  return margin;
}

// CpuChunkMargin of the last query of `tokens` alone.
float CpuLastQueryMargin(const std::vector<int32_t>& tokens) { return CpuChunkMargin(tokens, 1); }

struct Golden {
  std::vector<int32_t> prompt, greedy, top8_ids;
  std::vector<float> top8_logits;
};

std::vector<Golden> Goldens() {
  std::vector<Golden> out;
  for (const auto& e : ReadJson(Dir() + "/golden.json")) {
    out.push_back({Ids(e["prompt_ids"]), Ids(e["greedy_ids"]), Ids(e["last_top8_ids"]),
                   e["last_top8_logits"].get<std::vector<float>>()});
  }
  return out;
}

double MaxAbs(std::span<const float> row) {
  double m = 0;
  for (float v : row) m = std::max(m, std::fabs(double{v}));
  return m;
}

std::span<const float> Row(const std::vector<float>& logits, int64_t row, int32_t vocab) {
  return std::span<const float>(logits).subspan(row * vocab, vocab);
}

TEST(CudaNsaTest, GoldenLogitsAndGreedyIdsAtBf16Tolerance) {
  ASSERT_TRUE(DataPresent(Dir()));
  Harness gpu(MakeRunner(NsaOptions("cuda")));
  Harness cpu(MakeRunner(NsaOptions("cpu")));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const std::vector<Golden> goldens = Goldens();
  ASSERT_FALSE(goldens.empty());
  int index = 0, strict = 0;
  for (const Golden& g : goldens) {
    const std::vector<float> row = gpu.LastLogits(g.prompt), base = cpu.LastLogits(g.prompt);
    ASSERT_EQ(row.size(), static_cast<size_t>(gpu.vocab()));
    double golden_err = 0, golden_max = 0;
    for (size_t i = 0; i < g.top8_ids.size(); ++i) {
      golden_err = std::max(golden_err, std::fabs(double{row[g.top8_ids[i]]} - g.top8_logits[i]));
      golden_max = std::max(golden_max, std::fabs(double{g.top8_logits[i]}));
    }
    const double cpu_err = MaxAbsDiff(row, base), cpu_max = MaxAbs(base);
    const float margin = CpuLastQueryMargin(g.prompt);
    const bool within =
        golden_err <= kBf16RelTolerance * golden_max && cpu_err <= kBf16RelTolerance * cpu_max;
    std::printf(
        "[ nsa-codepair ] prompt %d (%zu ids): top-8 error %.4f of %.3f, row error %.4f of "
        "%.3f against the CPU; the last query's selection margin %.4f%s\n",
        index, g.prompt.size(), golden_err, golden_max, cpu_err, cpu_max, margin,
        within ? "" : (margin < kNearTie ? ": past the tolerance at a near tie" : ""));
    // Past the tolerance only where the CPU's own selection was nearly a tie.
    EXPECT_TRUE(within || margin < kNearTie) << "prompt " << index;
    strict += within ? 1 : 0;
    const auto n = static_cast<int>(g.greedy.size());
    EXPECT_TRUE(GreedyAgrees("nsa-codepair prompt " + std::to_string(index), g.prompt, g.greedy,
                             gpu.Greedy(g.prompt, n), cpu, gpu));
    ++index;
  }
  EXPECT_GE(strict, 4) << "most goldens within the bf16 tolerance";
}

// One prefill of the longest golden prompt, then the same ids as decode steps, and as chunks of
// 5 after a prefix that ends inside a block: every row within bf16 tolerance of the prefill's.
TEST(CudaNsaTest, DecodeAndVerificationChunksAgreeWithOnePrefill) {
  ASSERT_TRUE(DataPresent(Dir()));
  Harness h(MakeRunner(NsaOptions("cuda")));
  ASSERT_TRUE(h.ok());
  std::vector<int32_t> ids;
  for (const Golden& g : Goldens()) {
    if (g.prompt.size() > ids.size()) ids = g.prompt;
  }
  ASSERT_GE(ids.size(), size_t{100}) << "a prompt past a few NSA blocks";
  const int32_t vocab = h.vocab();
  const std::vector<float> full = h.Run({{h.AddSequence(), ids, true}});
  const int decode = h.AddSequence();
  const std::vector<float> head = h.Run({{decode, {ids.begin(), ids.begin() + 3}, true}});
  // A row past the tolerance must be a query whose selection the CPU found nearly tied.
  int32_t near_ties = 0;
  auto check = [&](std::span<const float> row, size_t position, double* worst) {
    const auto want = Row(full, static_cast<int64_t>(position), vocab);
    const double err = MaxAbsDiff(row, want) / std::max(1e-6, MaxAbs(want));
    if (err <= kBf16RelTolerance) {
      *worst = std::max(*worst, err);
      return;
    }
    const float margin = CpuLastQueryMargin({ids.begin(), ids.begin() + position + 1});
    std::printf("[ nsa-codepair ] position %zu: row error %.2e, selection margin %.4f\n", position,
                err, margin);
    EXPECT_LT(margin, kNearTie) << "position " << position << ": row error " << err;
    ++near_ties;
  };
  double worst = 0;
  for (size_t i = 3; i < ids.size(); ++i) {
    check(h.Run({{decode, {ids[i]}, false}}), i, &worst);
  }
  std::printf(
      "[ nsa-codepair ] decode vs prefill: worst row error %.2e of the row's max (%d rows past "
      "it at near ties)\n",
      worst, near_ties);
  const int chunked = h.AddSequence();
  size_t at = 37;  // inside the second block of 32
  h.Run({{chunked, {ids.begin(), ids.begin() + static_cast<int64_t>(at)}, false}});
  worst = 0;
  while (at < ids.size()) {
    const size_t n = std::min<size_t>(5, ids.size() - at);
    const std::vector<float> rows = h.Run(
        {{chunked,
          {ids.begin() + static_cast<int64_t>(at), ids.begin() + static_cast<int64_t>(at + n)},
          true}});
    for (size_t j = 0; j < n; ++j) check(Row(rows, static_cast<int64_t>(j), vocab), at + j, &worst);
    at += n;
  }
  std::printf(
      "[ nsa-codepair ] chunks of 5 vs prefill: worst row error %.2e of the row's max (%d rows "
      "past it at near ties in all)\n",
      worst, near_ties);
  EXPECT_LE(near_ties, static_cast<int32_t>(ids.size() / 20)) << "near ties are rare";
}

// Sequences of different lengths in one step (prefill chunks, then decode) give each one's rows
// as it gets them alone.
TEST(CudaNsaTest, ARaggedBatchEqualsEachSequenceAlone) {
  ASSERT_TRUE(DataPresent(Dir()));
  Harness h(MakeRunner(NsaOptions("cuda")));
  ASSERT_TRUE(h.ok());
  const std::vector<Golden> goldens = Goldens();
  ASSERT_GE(goldens.size(), size_t{2});
  const int32_t vocab = h.vocab();
  std::vector<std::vector<float>> alone;
  for (size_t i = 0; i < 2; ++i) alone.push_back(h.LastLogits(goldens[i].prompt));
  const int a = h.AddSequence(), b = h.AddSequence();
  const std::vector<float> both =
      h.Run({{a, goldens[0].prompt, false}, {b, goldens[1].prompt, false}});
  for (int i = 0; i < 2; ++i) {
    const double err = MaxAbsDiff(Row(both, i, vocab), alone[i]) / MaxAbs(alone[i]);
    std::printf("[ nsa-codepair ] batched vs alone, sequence %d: %.2e\n", i, err);
    EXPECT_LE(err, kBf16RelTolerance) << "sequence " << i;
  }
}

// ---- Speculation on the NSA target: the codepair draft (same tokenizer) on the GPU ----

// Two greedy continuations of `prompt` that should agree: equal, or equal up to a first
// divergence the CPU explains (its logits nearly tied between the two ids, GreedyAgrees' rule, or
// its selection for that query nearly tied, kNearTie); printed either way.
void ExpectSameIdsUpToNearTies(const std::string& what, const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& want, const std::vector<int32_t>& got,
                               Harness& cpu, Harness& gpu) {
  size_t k = 0;
  while (k < want.size() && k < got.size() && want[k] == got[k]) ++k;
  if (k == want.size() && k == got.size()) return;
  ASSERT_LT(k, std::min(want.size(), got.size())) << what << ": lengths differ";
  std::vector<int32_t> prefix = prompt;
  prefix.insert(prefix.end(), want.begin(), want.begin() + static_cast<int64_t>(k));
  const float margin = CpuLastQueryMargin(prefix);
  const bool tie = GreedyAgrees(what, prefix, {want[k]}, {got[k]}, cpu, gpu);
  std::printf("[ %s ] diverges at %zu: selection margin %.4f%s\n", what.c_str(), k, margin,
              tie || margin < kNearTie ? ", a near tie" : "");
  EXPECT_TRUE(tie || margin < kNearTie) << what << " at generated position " << k;
}

// Greedy with EOS masked (the goldens' min_new_tokens).
constexpr auto* GreedyRequest = &serving_test::GreedyEosMasked;

// Greedy speculation with the draft model, verified by SSV exact with groups of 4 (and 1), gives
// plain decoding's ids on every golden prompt and on a 2,048-id prompt (the goldens' prompts one
// after another), up to a first divergence the CPU explains: its logits nearly tied between the
// two ids (GreedyAgrees' rule) or its selection for that query nearly tied (kNearTie).
TEST(CudaNsaTest, SpeculationWithSsvExactGivesThePlainIds) {
  ASSERT_TRUE(DataPresent(Dir()));
  ASSERT_TRUE(DataPresent(ModelDir("codepair/draft")));
  EngineOptions o;
  o.model_dir = Dir();
  o.device = "cuda";
  o.max_model_len = 4096;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 2048;
  o.kv_cache_bytes = int64_t{64} << 20;
  o.speculative.draft_model = ModelDir("codepair/draft");
  o.speculative.draft_kv_cache_bytes = int64_t{32} << 20;
  // The codepair EAGLE-3 head fits nsa-codepair's shapes (hidden size, layers, vocabulary); it
  // was trained on the other model's hidden states, so it accepts little, but every round it
  // drafts is verified with SSV like the draft model's.
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  RunnerOptions ro = NsaOptions("cuda");
  ro.max_model_len = 4096;
  Harness gpu(MakeRunner(ro));
  ro.device = "cpu";
  Harness cpu(MakeRunner(ro));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> long_prompt;
  for (const Golden& g : Goldens()) {
    prompts.push_back(g.prompt);
    long_prompt.insert(long_prompt.end(), g.prompt.begin(), g.prompt.end());
  }
  long_prompt.resize(std::min<size_t>(long_prompt.size(), 2048));
  ASSERT_EQ(long_prompt.size(), size_t{2048});
  prompts.push_back(long_prompt);
  int64_t drafts = 0, accepted = 0, head_drafts = 0;
  const std::pair<SpeculationMethod, int32_t> strategies[] = {{SpeculationMethod::kDraftModel, 4},
                                                              {SpeculationMethod::kDraftModel, 1},
                                                              {SpeculationMethod::kEagle3, 4}};
  for (size_t p = 0; p < prompts.size(); ++p) {
    auto plain = (*engine)->Generate(GreedyRequest(prompts[p], 32));
    ASSERT_TRUE(plain.ok()) << plain.status();
    for (const auto& [method, c] : strategies) {
      GenerateRequest r = GreedyRequest(prompts[p], 32);
      r.speculation.method = method;
      r.speculation.num_speculative_tokens = 4;
      r.speculation.ssv_mode = SsvMode::kExact;
      r.speculation.ssv_group_size = c;
      auto spec = (*engine)->Generate(r);
      ASSERT_TRUE(spec.ok()) << spec.status();
      if (method == SpeculationMethod::kEagle3) {
        head_drafts += spec->usage.num_draft_tokens;
      } else {
        drafts += spec->usage.num_draft_tokens;
        accepted += spec->usage.num_accepted_tokens;
      }
      const std::string what =
          absl::StrCat("prompt ", p, " ", SpeculationMethodName(method), " SSV exact C ", c);
      ExpectSameIdsUpToNearTies(what, prompts[p], plain->ids(), spec->ids(), cpu, gpu);
    }
  }
  EXPECT_GT(head_drafts, 0) << "the EAGLE-3 head drafted";
  std::printf("[ nsa-codepair + codepair draft on the GPU ] %lld of %lld drafts accepted\n",
              static_cast<long long>(accepted), static_cast<long long>(drafts));
  EXPECT_GT(accepted, 0);
  // Lossy strategies (shared mode, reuse schedules) run on the GPU too: a request asks for one
  // (its rows are checked against the CPU's in LossyStrategiesGiveTheCpusRows), and a server
  // takes one as its default.
  GenerateRequest shared = GreedyRequest(prompts[0], 16);
  shared.speculation.method = SpeculationMethod::kDraftModel;
  shared.speculation.ssv_mode = SsvMode::kShared;
  shared.speculation.ssv_group_size = 4;
  shared.speculation.ssv_refresh_every = 2;
  auto lossy_out = (*engine)->Generate(shared);
  ASSERT_TRUE(lossy_out.ok()) << lossy_out.status();
  EXPECT_EQ(lossy_out->ids().size(), size_t{16});
  EXPECT_GT(lossy_out->usage.num_drafts, 0);
  EngineOptions lossy = o;
  lossy.speculative.ssv = SsvStrategy{.group_size = 4, .mode = SsvMode::kShared};
  EXPECT_TRUE(Engine::Create(lossy).ok());
}

// A verification chunk of 8 queries under each lossy strategy (shared mode per group, reuse
// schedules per token, both) after a 560-token prefix: the GPU's rows equal the CPU's (the same
// strategy in the fp32 reference) within the bf16 tolerance, but where a query whose selection
// the rows depend on was nearly tied; and the lossy rows are not the exact ones.
TEST(CudaNsaTest, LossyStrategiesGiveTheCpusRows) {
  ASSERT_TRUE(DataPresent(Dir()));
  Harness gpu(MakeRunner(NsaOptions("cuda")));
  Harness cpu(MakeRunner(NsaOptions("cpu")));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  std::vector<int32_t> ids;
  for (const Golden& g : Goldens()) {
    if (g.prompt.size() > ids.size()) ids = g.prompt;
  }
  constexpr size_t kPrefix = 560, kQueries = 8;  // 17 blocks of 32 past S = 8: selections differ
  ASSERT_GE(ids.size(), kPrefix + kQueries);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + kPrefix);
  const std::vector<int32_t> chunk(ids.begin() + kPrefix, ids.begin() + kPrefix + kQueries);
  const int32_t vocab = gpu.vocab();
  const SsvStrategy exact{.group_size = 4, .mode = SsvMode::kExact};
  auto rows_of = [&](Harness& h, const SsvStrategy& ssv) {
    const int seq = h.AddSequence();
    h.Run({{seq, prefix, false}});
    std::vector<float> rows = h.Run({{seq, chunk, true, &ssv}});
    h.Release(seq);
    return rows;
  };
  const std::vector<float> gpu_exact = rows_of(gpu, exact);
  for (const SsvStrategy& ssv :
       {SsvStrategy{.group_size = 4, .mode = SsvMode::kShared},
        SsvStrategy{.group_size = 1, .mode = SsvMode::kExact, .refresh_every = 2},
        SsvStrategy{.group_size = 4, .mode = SsvMode::kShared, .refresh_every = 3}}) {
    const std::string name = SsvStrategyName(ssv);
    const std::vector<float> got = rows_of(gpu, ssv), want = rows_of(cpu, ssv);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, changed = 0;
    for (size_t q = 0; q < kQueries; ++q) {
      const auto g = Row(got, static_cast<int64_t>(q), vocab);
      const auto w = Row(want, static_cast<int64_t>(q), vocab);
      changed = std::max(changed, MaxAbsDiff(g, Row(gpu_exact, static_cast<int64_t>(q), vocab)) /
                                      std::max(1e-6, MaxAbs(w)));
      const double err = MaxAbsDiff(g, w) / std::max(1e-6, MaxAbs(w));
      if (err <= kBf16RelTolerance) {
        worst = std::max(worst, err);
        continue;
      }
      // The selection this row attends may come from its group's first query (shared mode).
      const size_t first = q / static_cast<size_t>(ssv.group_size) * ssv.group_size;
      const float margin =
          std::min(CpuLastQueryMargin({ids.begin(), ids.begin() + kPrefix + q + 1}),
                   CpuLastQueryMargin({ids.begin(), ids.begin() + kPrefix + first + 1}));
      std::printf("[ %s ] query %zu: row error %.2e, selection margin %.4f\n", name.c_str(), q, err,
                  margin);
      EXPECT_LT(margin, kNearTie) << name << " query " << q << ": row error " << err;
    }
    std::printf("[ %s ] GPU vs CPU: worst row error %.2e of the row's max; vs exact C 4: %.2e\n",
                name.c_str(), worst, changed);
    EXPECT_GT(changed, kBf16RelTolerance) << name << ": the lossy strategy changed no row";
  }
}

// got's SSV counts against want's. The fields no selection changes (queries, pairs, and blocks per
// query: S each past S blocks) exactly; the others exactly too (overlap_sum within 1e-3 relative:
// the GPU adds its per-pair doubles in another order), unless the CPU found a selection of the
// chunk nearly tied (`near_tie`), where bf16 may take another block: then within one other block
// per query x layer x kv head (its keys, and 1/S of the overlap of both pairs it is in).
void ExpectCountsMatch(const std::string& what, const SsvLoadStats& got, const SsvLoadStats& want,
                       bool near_tie, const NsaConfig& nsa) {
  std::printf(
      "[ %s ] GPU (CPU): %lld (%lld) queries, keys %lld (%lld) per query, %lld (%lld) grouped, "
      "blocks %lld (%lld) per query, %lld (%lld) grouped, overlap %.4f (%.4f) over %lld (%lld) "
      "pairs%s\n",
      what.c_str(), static_cast<long long>(got.queries), static_cast<long long>(want.queries),
      static_cast<long long>(got.per_query_keys), static_cast<long long>(want.per_query_keys),
      static_cast<long long>(got.grouped_keys), static_cast<long long>(want.grouped_keys),
      static_cast<long long>(got.per_query_blocks), static_cast<long long>(want.per_query_blocks),
      static_cast<long long>(got.grouped_blocks), static_cast<long long>(want.grouped_blocks),
      got.overlap_sum, want.overlap_sum, static_cast<long long>(got.overlap_pairs),
      static_cast<long long>(want.overlap_pairs), near_tie ? " (a near tie)" : "");
  EXPECT_EQ(got.queries, want.queries) << what;
  EXPECT_EQ(got.overlap_pairs, want.overlap_pairs) << what;
  EXPECT_EQ(got.per_query_blocks, want.per_query_blocks) << what;
  const int64_t rows = near_tie ? want.queries : 0;
  EXPECT_LE(std::abs(got.per_query_keys - want.per_query_keys), rows * nsa.block_size) << what;
  EXPECT_LE(std::abs(got.grouped_keys - want.grouped_keys), rows * nsa.block_size) << what;
  EXPECT_LE(std::abs(got.grouped_blocks - want.grouped_blocks), rows) << what;
  EXPECT_NEAR(got.overlap_sum, want.overlap_sum,
              1e-3 * want.overlap_sum + 2.0 * static_cast<double>(rows) / nsa.block_counts)
      << what;
}

// What SSV verification reads (ssv_load_stats) for a chunk of 8 queries after a 306-id prefix of
// the goldens' prompts one after another (a chunk whose selections the fp32 CPU finds at least
// 0.02 from a tie under each strategy, so bf16 selects the same blocks), under exact strategies
// (groups of 1, 4 and 3, the last uneven) and lossy ones: the GPU runner's totals (counted on the
// device) grow by the CPU runner's (NsaAttention::CountLoads), both when the chunk replays a round
// graph and when it runs eagerly; the prefill before it, without a strategy, counts nothing.
TEST(CudaNsaTest, SsvLoadStatsEqualTheCpus) {
  ASSERT_TRUE(DataPresent(Dir()));
  RunnerOptions eager_options = NsaOptions("cuda");
  eager_options.enforce_eager = true;
  Harness gpu(MakeRunner(NsaOptions("cuda")));
  Harness eager(MakeRunner(eager_options));
  Harness cpu(MakeRunner(NsaOptions("cpu")));
  ASSERT_TRUE(gpu.ok() && eager.ok() && cpu.ok());
  std::vector<int32_t> ids;
  for (const Golden& g : Goldens()) ids.insert(ids.end(), g.prompt.begin(), g.prompt.end());
  constexpr size_t kPrefix = 306, kQueries = 8;  // block 9: S = 8 of 10 candidates
  ASSERT_GE(ids.size(), kPrefix + kQueries);
  ids.resize(kPrefix + kQueries);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + kPrefix);
  const std::vector<int32_t> chunk(ids.begin() + kPrefix, ids.end());
  const ModelConfig& config = cpu.runner().config();
  const int64_t rows_per_query = int64_t{config.num_layers} * config.num_kv_heads;
  // The chunk's counts under `ssv`, after its prefix.
  auto counts_of = [&](Harness& h, const SsvStrategy& ssv) {
    const int seq = h.AddSequence();
    const SsvLoadStats start = h.runner().ssv_load_stats();
    h.Run({{seq, prefix, false}});
    const SsvLoadStats before = h.runner().ssv_load_stats();
    EXPECT_EQ(before.queries, start.queries) << "a prefill without a strategy counts nothing";
    EXPECT_EQ(before.grouped_keys, start.grouped_keys);
    h.Run({{seq, chunk, true, &ssv}});
    const SsvLoadStats counts = h.runner().ssv_load_stats() - before;
    h.Release(seq);
    return counts;
  };
  auto round_launches = [&] {
    return static_cast<CudaRunner&>(gpu.runner()).graph_stats().round_launches;
  };
  for (const SsvStrategy& ssv :
       {SsvStrategy{.group_size = 1, .mode = SsvMode::kExact},
        SsvStrategy{.group_size = 4, .mode = SsvMode::kExact},
        SsvStrategy{.group_size = 3, .mode = SsvMode::kExact},
        SsvStrategy{.group_size = 4, .mode = SsvMode::kShared},
        SsvStrategy{.group_size = 1, .mode = SsvMode::kExact, .refresh_every = 2},
        SsvStrategy{.group_size = 4, .mode = SsvMode::kShared, .refresh_every = 3}}) {
    const std::string name = SsvStrategyName(ssv);
    const float margin = CpuChunkMargin(ids, static_cast<int32_t>(kQueries), &ssv);
    std::printf("[ %s ] the chunk's selection margin on the CPU: %.4f\n", name.c_str(), margin);
    const SsvLoadStats want = counts_of(cpu, ssv);
    // Every query, layer and kv head counts, S blocks each; overlap pairs on refresh layers.
    EXPECT_EQ(want.queries, static_cast<int64_t>(kQueries) * rows_per_query) << name;
    const int64_t refresh_layers = (config.num_layers + ssv.refresh_every - 1) / ssv.refresh_every;
    EXPECT_EQ(want.overlap_pairs,
              static_cast<int64_t>(kQueries - 1) * refresh_layers * config.num_kv_heads)
        << name;
    EXPECT_EQ(want.per_query_blocks, want.queries * config.nsa.block_counts) << name;
    const int64_t launches = round_launches();
    const SsvLoadStats replayed = counts_of(gpu, ssv);
    EXPECT_GT(round_launches(), launches) << name << ": the chunk replayed a round graph";
    ExpectCountsMatch(name + " graph", replayed, want, margin < kNearTie, config.nsa);
    ExpectCountsMatch(name + " eager", counts_of(eager, ssv), want, margin < kNearTie, config.nsa);
  }
}

// Two golden prompts submitted together, prefilled in chunks of 100 ids (blocks cut mid-chunk) in
// a KV pool that holds exactly both prompts, so decoding preempts one and recomputes it (its
// pages and their compressed entries); then the first again, served from the prefix cache. Each
// gets plain decoding's ids (a lone request with room) up to near ties.
TEST(CudaNsaTest, ChunkedPrefillPreemptionAndThePrefixCacheKeepTheIds) {
  ASSERT_TRUE(DataPresent(Dir()));
  const std::vector<Golden> goldens = Goldens();
  ASSERT_GE(goldens.size(), size_t{4});
  EngineOptions o;
  o.model_dir = Dir();
  o.device = "cuda";
  o.max_model_len = 640;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 1024;
  o.kv_cache_bytes = int64_t{64} << 20;
  auto roomy = Engine::Create(o);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  auto observer = std::make_shared<PreemptionCounter>();
  o.max_num_batched_tokens = 100;
  // 38 + 28 pages of 16 tokens for the two prompts, plus the runner's scratch page: a page is
  // 6 layers of bf16 K and V (16 x 32 each) and one compressed entry (the mean K and V).
  o.kv_cache_bytes = 67 * int64_t{6 * (2 * 16 * 32 * 2 + 2 * 32 * 2)};
  o.observer = observer;
  auto tight = Engine::Create(o);
  ASSERT_TRUE(tight.ok()) << tight.status();
  RunnerOptions ro = NsaOptions("cuda");
  Harness gpu(MakeRunner(ro));
  ro.device = "cpu";
  Harness cpu(MakeRunner(ro));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const size_t picks[] = {0, 3};
  std::vector<std::vector<int32_t>> plain;
  for (size_t e : picks) {
    auto r = (*roomy)->Generate(GreedyRequest(goldens[e].prompt, 24));
    ASSERT_TRUE(r.ok()) << r.status();
    plain.push_back(r->ids());
  }
  roomy->reset();
  std::vector<GenerateRequest> both;
  for (size_t e : picks) both.push_back(GreedyRequest(goldens[e].prompt, 24));
  auto results = (*tight)->GenerateBatch(both);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), size_t{2});
  EXPECT_GT(observer->preempted(), 0) << "the pool holds both prompts and no more";
  for (size_t i = 0; i < 2; ++i) {
    ExpectSameIdsUpToNearTies(absl::StrCat("golden ", picks[i], " preempted"),
                              goldens[picks[i]].prompt, plain[i], (*results)[i].ids(), cpu, gpu);
  }
  auto again = (*tight)->GenerateBatch(std::span(both).first(1));
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSameIdsUpToNearTies("golden 0 from the prefix cache", goldens[0].prompt, plain[0],
                            (*again)[0].ids(), cpu, gpu);
}

TEST(CudaNsaTest, TensorParallelismIsRefused) {
  RunnerOptions o = NsaOptions("cuda");
  o.tp = {0, 2};
  auto runner = CreateModelRunner(o);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument) << runner.status();
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "cuda_nsa_test");
}
