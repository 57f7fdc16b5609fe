// The CUDA runner on a real GPU with the codepair models (ctest label gpu; exits 77, "skipped",
// where no GPU is visible): greedy continuations on the golden prompts against the CPU backend's,
// batched runs against single runs, graphs against eager, speculation against plain decoding,
// device greedy verification and GPU sampling features. Models under $SPECD_SHARED_DIR/models;
// the greedy rule is GreedyAgrees in tests/cuda_test_util.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/runner/cuda/cuda_runner.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/sampler.h"
#include "engine/speculation/draft_model.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/testing/engine_test_util.h"
#include "engine/testing/test_flags.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/ref/sampling.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h

// ---- (b, c) codepair on the golden prompts ----

EngineOptions EngineOn(const std::string& device, bool eager = false) {
  EngineOptions o;
  o.model_dir = ModelDir("codepair/target");
  o.device = device;
  o.enforce_eager = eager;
  o.max_model_len = 512;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 1024;
  o.kv_cache_bytes = int64_t{64} << 20;
  return o;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << o.device << ": " << engine.status();
  return engine.ok() ? std::move(*engine) : nullptr;
}

// Greedy with EOS masked (the goldens' min_new_tokens).
constexpr auto* Greedy = &serving_test::GreedyEosMasked;

std::vector<GenerateRequest> GoldenRequests() {
  const nlohmann::json golden = ReadJson(ModelDir("codepair/golden.json"))["target"];
  std::vector<GenerateRequest> out;
  for (const auto& e : golden) out.push_back(Greedy(Ids(e["prompt_ids"]), 48));
  return out;
}

class CodepairCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(DataPresent(ModelDir("codepair/target")));
    cpu_ = std::make_unique<Harness>(MakeRunner(Options(ModelDir("codepair/target"), "cpu")));
    gpu_ = std::make_unique<Harness>(MakeRunner(Options(ModelDir("codepair/target"), "cuda")));
    ASSERT_TRUE(cpu_->ok() && gpu_->ok());
  }
  // Runs `requests` as one batch on `engine`.
  static std::vector<std::vector<int32_t>> Batch(Engine& engine,
                                                 const std::vector<GenerateRequest>& requests) {
    auto results = engine.GenerateBatch(requests);
    EXPECT_TRUE(results.ok()) << results.status();
    std::vector<std::vector<int32_t>> ids;
    if (results.ok()) {
      for (const GenerateResult& r : *results) ids.push_back(r.ids());
    }
    ids.resize(requests.size());
    return ids;
  }
  // The golden prompts with `method` at K = 4 give plain decoding's output on `engine`.
  void ExpectSpeculationEqualsPlain(Engine& engine, SpeculationMethod method,
                                    const std::string& label) {
    ExpectSpeculationEqualsPlain(engine, SpeculationParams{method, 4}, label);
  }
  // ban_eos false: the requests may stop at EOS (no min_tokens), so no draft position has bans
  // (token trees then rank children on the device).
  void ExpectSpeculationEqualsPlain(Engine& engine, const SpeculationParams& spec,
                                    const std::string& label, bool ban_eos = true) {
    std::vector<GenerateRequest> requests = GoldenRequests();
    if (!ban_eos) {
      for (GenerateRequest& r : requests) r.params.min_tokens = 0;
    }
    const auto plain = Batch(engine, requests);
    for (GenerateRequest& r : requests) r.speculation = spec;
    auto results = engine.GenerateBatch(requests);
    ASSERT_TRUE(results.ok()) << results.status();
    int64_t rounds = 0, accepted = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      rounds += (*results)[i].usage.num_drafts;
      accepted += (*results)[i].usage.num_accepted_tokens;
      EXPECT_TRUE(GreedyAgrees(label + " prompt " + std::to_string(i), requests[i].prompt_ids,
                               plain[i], (*results)[i].ids(), *cpu_, *gpu_));
    }
    EXPECT_GT(rounds, 0);
    std::printf("[ codepair %s, K=4 ] %.2f tokens per round\n", label.c_str(),
                rounds ? 1.0 + double(accepted) / rounds : 0.0);
  }
  std::unique_ptr<Harness> cpu_, gpu_;
};

TEST_F(CodepairCudaTest, GreedyOnGoldenPromptsEqualsTheCpuBackend) {
  auto cpu_engine = MakeEngine(EngineOn("cpu"));
  auto gpu_engine = MakeEngine(EngineOn("cuda"));
  ASSERT_TRUE(cpu_engine && gpu_engine);
  EXPECT_EQ(gpu_engine->device_name().rfind("cuda:", 0), 0u) << gpu_engine->device_name();
  const std::vector<GenerateRequest> requests = GoldenRequests();
  ASSERT_EQ(requests.size(), 8u);
  const auto cpu = Batch(*cpu_engine, requests), gpu = Batch(*gpu_engine, requests);
  int exact = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    exact += cpu[i] == gpu[i] ? 1 : 0;
    EXPECT_TRUE(GreedyAgrees("codepair prompt " + std::to_string(i), requests[i].prompt_ids, cpu[i],
                             gpu[i], *cpu_, *gpu_));
  }
  std::printf("[ codepair ] %d of %zu greedy continuations equal the CPU's exactly\n", exact,
              requests.size());
}

TEST_F(CodepairCudaTest, BatchedRunEqualsSingleRunsAndGraphsEqualEager) {
  auto graphs = MakeEngine(EngineOn("cuda"));
  auto eager = MakeEngine(EngineOn("cuda", /*eager=*/true));
  ASSERT_TRUE(graphs && eager);
  const std::vector<GenerateRequest> requests = GoldenRequests();
  const auto batched = Batch(*graphs, requests), batched_eager = Batch(*eager, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    auto alone = graphs->Generate(requests[i]);
    ASSERT_TRUE(alone.ok()) << alone.status();
    const std::string what = "codepair prompt " + std::to_string(i);
    EXPECT_TRUE(GreedyAgrees(what + " batched vs alone", requests[i].prompt_ids, alone->ids(),
                             batched[i], *cpu_, *gpu_));
    EXPECT_TRUE(GreedyAgrees(what + " eager vs graphs", requests[i].prompt_ids, batched[i],
                             batched_eager[i], *cpu_, *gpu_));
  }
}

// Speculation on the GPU (draft model on the same GPU, greedy rows verified by the runner's own
// argmax at every drafted position; n-gram too): the output is plain decoding's, up to bf16
// flips at near-ties (a verification pass computes a position in a multi-token chunk, the
// decode step alone). Token trees too: the tree verified in one pass with the attention's tree
// masks and walked on the device, the accepted path's KV moved in place; never more than
// num_nodes drafts a round, and more tokens a round than a chain of the tree's depth.
TEST_F(CodepairCudaTest, GreedySpeculationEqualsPlainDecoding) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.draft_model = ModelDir("codepair/draft");
  o.speculative.draft_kv_cache_bytes = int64_t{16} << 20;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  for (SpeculationMethod m : {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram}) {
    ExpectSpeculationEqualsPlain(*engine, m, SpeculationMethodName(m) + std::string(" on the GPU"));
    SpeculationParams tree{m, 0};
    tree.tree = TreeShape{true, 3, 2, 12};
    ExpectSpeculationEqualsPlain(*engine, tree,
                                 SpeculationMethodName(m) + std::string(" tree on the GPU"));
    // Trees of more nodes than the verification attention's short runs (the prefill kernel).
    tree.tree = TreeShape{true, 6, 4, 32};
    ExpectSpeculationEqualsPlain(*engine, tree,
                                 SpeculationMethodName(m) + std::string(" tree 6/4/32 on the GPU"));
    // Without bans the draft model's nodes are ranked on the device (ForwardCandidates).
    ExpectSpeculationEqualsPlain(
        *engine, tree, SpeculationMethodName(m) + std::string(" tree 6/4/32, EOS allowed"), false);
    GenerateRequest r = GoldenRequests()[0];
    r.speculation = tree;
    auto got = engine->Generate(r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_LE(got->usage.num_draft_tokens, 32 * got->usage.num_drafts);
    if (m == SpeculationMethod::kDraftModel) {
      EXPECT_GT(got->usage.num_draft_tokens, 6 * got->usage.num_drafts) << "drafted chains";
      r.speculation = SpeculationParams{m, 6};
      auto chain = engine->Generate(r);
      ASSERT_TRUE(chain.ok()) << chain.status();
      const auto per_round = [](const GenerateResult& g) {
        return double(g.usage.num_accepted_tokens) / std::max<int64_t>(1, g.usage.num_drafts);
      };
      std::printf(
          "[ codepair draft model on the GPU ] accepted per round: tree 6/4/32 %.2f, "
          "chain K 6 %.2f\n",
          per_round(*got), per_round(*chain));
      EXPECT_GT(per_round(*got), per_round(*chain));
    }
  }
}

// The draft on another device than the target (the second GPU when there is one, else the CPU
// backend): same output as plain decoding.
TEST_F(CodepairCudaTest, DraftOnAnotherDeviceEqualsPlainDecoding) {
  EngineOptions o = EngineOn("cuda:0");
  o.speculative.draft_model = ModelDir("codepair/draft");
  o.speculative.draft_kv_cache_bytes = int64_t{16} << 20;
  o.speculative.speculator_device = CudaDeviceCount() > 1 ? "cuda:1" : "cpu";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  ExpectSpeculationEqualsPlain(*engine, SpeculationMethod::kDraftModel,
                               "draft on " + o.speculative.speculator_device + ", target cuda:0");
}

// Speculation rounds whose verification and draft catch-up steps replay round graphs give the
// output of the same rounds run eagerly (enforce_eager: neither graphs nor padding), up to bf16
// flips, at K 2 and 7.
TEST_F(CodepairCudaTest, SpeculationThroughRoundGraphsEqualsEager) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.draft_model = ModelDir("codepair/draft");
  o.speculative.draft_kv_cache_bytes = int64_t{16} << 20;
  o.speculative.num_speculative_tokens = 7;
  EngineOptions e = o;
  e.enforce_eager = true;
  auto graphs = MakeEngine(o), eager = MakeEngine(e);
  ASSERT_TRUE(graphs && eager);
  for (int32_t k : {2, 7}) {
    std::vector<GenerateRequest> requests = GoldenRequests();
    for (GenerateRequest& r : requests) r.speculation = {SpeculationMethod::kDraftModel, k};
    const auto g = Batch(*graphs, requests), x = Batch(*eager, requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_TRUE(GreedyAgrees(
          "K=" + std::to_string(k) + " prompt " + std::to_string(i) + " eager vs round graphs",
          requests[i].prompt_ids, x[i], g[i], *cpu_, *gpu_));
    }
  }
}

// EAGLE-3 on the GPU (the head the project trained for codepair, models/codepair/eagle3, run by
// CudaEagle3Compute on the target's GPU from the hidden states its passes capture, through round
// graphs and eagerly): plain decoding's output up to bf16 flips, and the head accepts drafts.
TEST_F(CodepairCudaTest, Eagle3OnTheGpuEqualsPlainDecoding) {
  double rate_with_graphs = 0;  // K 4: a round's steps after the first in one chained graph
  for (bool eager : {false, true}) {
    EngineOptions o = EngineOn("cuda", eager);
    o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
    auto engine = MakeEngine(o);
    ASSERT_TRUE(engine);
    ExpectSpeculationEqualsPlain(*engine, SpeculationMethod::kEagle3,
                                 eager ? "eagle3 on the GPU, eager" : "eagle3 on the GPU");
    // Real acceptance: the CPU head accepts 3.20 tokens per round at K 4 on the 48 held-out
    // prompts (docs/benchmarks.md, "Cheap drafters").
    std::vector<GenerateRequest> requests = GoldenRequests();
    for (GenerateRequest& r : requests) r.speculation = {SpeculationMethod::kEagle3, 4};
    auto results = engine->GenerateBatch(requests);
    ASSERT_TRUE(results.ok()) << results.status();
    int64_t rounds = 0, accepted = 0;
    for (const GenerateResult& r : *results) {
      rounds += r.usage.num_drafts;
      accepted += r.usage.num_accepted_tokens;
    }
    ASSERT_GT(rounds, 0);
    EXPECT_GT(1.0 + double(accepted) / rounds, 1.8);
    // The chained graph runs the eager path's kernels (padded to a bucket): the same drafts up
    // to bf16 flips.
    if (!eager) rate_with_graphs = 1.0 + double(accepted) / rounds;
    if (eager) {
      EXPECT_NEAR(1.0 + double(accepted) / rounds, rate_with_graphs, 0.1);
    }
    // Token trees of the head on the GPU (tree rows in its paged KV with the attention's tree
    // masks, children ranked on the device): plain decoding's output, and more tokens a round
    // than a chain of the tree's depth.
    for (const TreeShape& shape : {TreeShape{true, 3, 2, 6}, TreeShape{true, 6, 4, 32}}) {
      SpeculationParams tree{SpeculationMethod::kEagle3, 0};
      tree.tree = shape;
      ExpectSpeculationEqualsPlain(*engine, tree,
                                   absl::StrCat("eagle3 tree ", shape.depth, "/", shape.top_k, "/",
                                                shape.num_nodes, eager ? " (eager)" : ""));
      // Without bans the children are ranked on the device (TopCandidates).
      ExpectSpeculationEqualsPlain(*engine, tree,
                                   absl::StrCat("eagle3 tree ", shape.depth, "/", shape.top_k, "/",
                                                shape.num_nodes, ", EOS allowed"),
                                   false);
    }
    auto per_round = [&](const SpeculationParams& spec) {
      std::vector<GenerateRequest> rs = GoldenRequests();
      for (GenerateRequest& r : rs) r.speculation = spec;
      auto got = engine->GenerateBatch(rs);
      EXPECT_TRUE(got.ok()) << got.status();
      int64_t n = 0, a = 0;
      if (got.ok()) {
        for (const GenerateResult& r : *got) {
          n += r.usage.num_drafts;
          a += r.usage.num_accepted_tokens;
        }
      }
      return n > 0 ? 1.0 + double(a) / n : 0.0;
    };
    SpeculationParams tree{SpeculationMethod::kEagle3, 0};
    tree.tree = TreeShape{true, 6, 4, 32};
    const double tree_rate = per_round(tree);
    const double chain_rate = per_round({SpeculationMethod::kEagle3, 6});
    std::printf(
        "[ codepair eagle3 on the GPU%s ] tokens per round: tree 6/4/32 %.2f, chain K 6 %.2f\n",
        eager ? ", eager" : "", tree_rate, chain_rate);
    EXPECT_GT(tree_rate, chain_rate);
  }
}

// EAGLE-3 beside a draft model in the same batches (the draft on the second GPU when there is
// one: the head must select its own device after the draft's calls), every prompt alternating
// between the two and n-gram: plain decoding's output up to bf16 flips.
TEST_F(CodepairCudaTest, Eagle3BesideADraftModelOnAnotherDevice) {
  EngineOptions o = EngineOn("cuda:0");
  o.speculative.draft_model = ModelDir("codepair/draft");
  o.speculative.draft_kv_cache_bytes = int64_t{16} << 20;
  o.speculative.speculator_device = CudaDeviceCount() > 1 ? "cuda:1" : "cuda:0";
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  std::vector<GenerateRequest> requests = GoldenRequests();
  const auto plain = Batch(*engine, requests);
  const SpeculationMethod methods[] = {SpeculationMethod::kEagle3, SpeculationMethod::kDraftModel,
                                       SpeculationMethod::kNgram};
  for (size_t i = 0; i < requests.size(); ++i) requests[i].speculation = {methods[i % 3], 4};
  const auto mixed = Batch(*engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(GreedyAgrees("mixed batch prompt " + std::to_string(i), requests[i].prompt_ids,
                             plain[i], mixed[i], *cpu_, *gpu_));
  }
}

// Parallel drafting on the GPU (the PARD-style draft the project trained for codepair,
// models/codepair/pard): the catch-up and K - 1 mask tokens in one draft pass, the K drafts drawn
// on the device (StepDraft rows at the mask positions): plain decoding's output up to bf16 flips.
// EAGLE-3 under tensor parallelism on two GPUs: the head on rank 0 reads its residual stream,
// whole after the all-reduce, and drafts greedy chains through its round graphs; the output is
// plain decoding's at TP 2 up to recorded bf16 near-ties (checked on the CPU backend). Worker
// ranks are launched from specd: $SPECD_BINARY (tools/gpu/run_all.sh sets it to the packed one),
// else the build's.
TEST_F(CodepairCudaTest, Eagle3AtTp2EqualsPlainDecoding) {
  if (CudaDeviceCount() < 2) {
    GTEST_SKIP() << "EAGLE-3 at TP 2 needs 2 GPUs; " << CudaDeviceCount() << " visible";
  }
#ifdef SPECD_BINARY
  const char* env = std::getenv("SPECD_BINARY");
  EngineOptions o = EngineOn("cuda");
  o.tensor_parallel.size = 2;
  o.tensor_parallel.worker_binary = env != nullptr && *env != '\0' ? env : SPECD_BINARY;
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  ExpectSpeculationEqualsPlain(*engine, SpeculationParams{SpeculationMethod::kEagle3, 4},
                               "eagle3 at TP 2");
  ExpectSpeculationEqualsPlain(*engine, SpeculationParams{SpeculationMethod::kEagle3, 7},
                               "eagle3 K 7 at TP 2");
#else
  FAIL() << "built without specd: no worker binary";
#endif
}

TEST_F(CodepairCudaTest, ParallelDraftOnTheGpuEqualsPlainDecoding) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.draft_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/pard";
  o.speculative.parallel_drafting = true;
  o.speculative.draft_kv_cache_bytes = int64_t{16} << 20;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  ExpectSpeculationEqualsPlain(*engine, SpeculationMethod::kDraftModel,
                               "parallel draft on the GPU");
}

// SSD's sampled cache branches on the GPU (issue 34): the draft model draws them on the device,
// candidates and Saguaro down-weighting included, and keeps their q rows in the runner's kept
// rows. Against the same Propose copying its rows to the host: the same drafts, candidates and
// rows bit for bit (device draws are keyed by seed and position). The third branch finds both
// blocks taken and goes to the host; the blocks come back with the drafts. Position 0's row is
// the plain row (C = 1) with its top-F ids down-weighted as kernels/ref does it, and its
// candidates are that row's best ids.
TEST_F(CodepairCudaTest, SampledCacheDraftsKeptOnTheDeviceEqualTheHostCopies) {
  constexpr int32_t kK = 3, kF = 3, kCandidates = 4, kVocab = 8192;
  auto make = [](int32_t kept_blocks) {
    auto draft = DraftModelSpeculator::Create(
        MakeRunner(Options(ModelDir("codepair/draft"), "cuda")), kVocab, 1024);
    EXPECT_TRUE(draft.ok()) << draft.status();
    if (kept_blocks > 0) {
      EXPECT_TRUE((*draft)->KeepProbsOnDevice(kK + 1, kept_blocks).ok());
    }
    return *std::move(draft);
  };
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  const std::vector<GenerateRequest> golden = GoldenRequests();
  std::vector<std::vector<int32_t>> contexts;
  std::vector<TokenHistory> histories(3);
  for (size_t i = 0; i < 3; ++i) {
    contexts.push_back(golden[i].prompt_ids);
    histories[i].AddPrompt(contexts.back());
  }
  auto propose = [&](DraftModelSpeculator& draft, float c) {
    std::vector<DraftInput> inputs(3);
    std::vector<DraftModelSpeculator::CacheDraftOptions> cache(3);
    for (size_t i = 0; i < 3; ++i) {
      inputs[i].seq_id = i + 1;
      inputs[i].tokens = contexts[i];
      inputs[i].num_draft_tokens = kK;
      inputs[i].params = &sampled;
      inputs[i].history = &histories[i];
      inputs[i].seed = 1000 + i;
      inputs[i].num_generated = static_cast<int64_t>(contexts[i].size());
      cache[i].num_candidates = kCandidates;
      cache[i].saguaro_fan_out = kF;
      cache[i].saguaro_c = c;
    }
    std::vector<Draft> drafts;
    EXPECT_TRUE(draft.Propose(inputs, cache, &drafts).ok());
    return drafts;
  };
  auto kept_draft = make(2);
  auto host_draft = make(0);
  auto plain_draft = make(0);
  ASSERT_EQ(kept_draft->num_free_kept_blocks(), 2);
  std::vector<Draft> kept = propose(*kept_draft, 0.5f);
  const std::vector<Draft> host = propose(*host_draft, 0.5f);
  const std::vector<Draft> plain = propose(*plain_draft, 1.0f);
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept_draft->num_free_kept_blocks(), 0);
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("branch ", i));
    ASSERT_EQ(kept[i].tokens.size(), size_t{kK});
    EXPECT_EQ(kept[i].tokens, host[i].tokens);
    EXPECT_EQ(kept[i].candidates, host[i].candidates);
    EXPECT_EQ(kept[i].candidates.size(), size_t{kK} * kCandidates);
    EXPECT_EQ(host[i].kept_probs, nullptr);
    std::vector<float> rows = kept[i].probs;
    if (i < 2) {
      ASSERT_NE(kept[i].kept_probs, nullptr);
      EXPECT_TRUE(kept[i].probs.empty());
      ASSERT_TRUE(kept_draft->ReadKeptProbs(*kept[i].kept_probs, &rows).ok());
    } else {
      EXPECT_EQ(kept[i].kept_probs, nullptr) << "no block was left for the third branch";
    }
    ASSERT_EQ(rows.size(), size_t{kK} * kVocab);
    EXPECT_EQ(rows, host[i].probs);
    // Position 0 (the same context in every run): the plain row down-weighted at its top F.
    std::vector<float> expected(plain[i].probs.begin(), plain[i].probs.begin() + kVocab);
    std::vector<int32_t> top(kCandidates);
    kernels::ref::TopKRows(expected.data(), kVocab, 1, kVocab, kCandidates, top.data());
    EXPECT_EQ(
        std::vector<int32_t>(kept[i].candidates.begin(), kept[i].candidates.begin() + kCandidates),
        top);
    const float c = 0.5f;
    kernels::ref::SaguaroDownweightRows(expected.data(), kVocab, 1, kVocab, top.data(), kCandidates,
                                        &kF, &c);
    EXPECT_LT(MaxAbsDiff(std::span<const float>(rows).first(kVocab), expected), 1e-6);
  }
  kept.clear();
  EXPECT_EQ(kept_draft->num_free_kept_blocks(), 2);
}

// The device path of StepGreedyVerify (argmax ids kept on the GPU, VerifyGreedyAndPack) gives
// what the host scan over the same step's ids gives, for drafts that are all right, wrong at
// the first or the last position, and a draftless row, in one ragged batch.
TEST_F(CodepairCudaTest, DeviceGreedyVerificationEqualsTheHostScan) {
  ModelRunner& gpu = gpu_->runner();
  const std::vector<GenerateRequest> prompts = GoldenRequests();
  // Rows: K drafts right; wrong at the first; wrong at the last; a draftless row. 13 rows of
  // the runner's 16 (Options: max_num_seqs).
  constexpr int kK = 3;
  const int n = 4;
  auto wrong_at = [](int i) { return i == 1 ? 0 : kK - 1; };
  BlockAllocator allocator(gpu.num_kv_blocks());
  std::vector<BlockTable> tables;
  std::vector<std::vector<int32_t>> truth(n), chunks(n), drafts(n);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  TokenHistory history;
  Sampler sampler(greedy, 1);
  // The greedy continuations (the GPU runner's decode path) are the truth; computed first, as
  // the harness has its own block allocator over the same KV blocks.
  for (int i = 0; i < n; ++i) truth[i] = gpu_->Greedy(prompts[i].prompt_ids, kK + 1);
  for (int i = 0; i < n; ++i) {
    const std::vector<int32_t>& prompt = prompts[i].prompt_ids;
    tables.emplace_back(gpu.block_size());
    ASSERT_TRUE(
        tables.back().EnsureCapacity(static_cast<int32_t>(prompt.size()) + kK + 1, allocator).ok());
    // Prefill the prompt but its last token, which the verification chunk carries.
    std::vector<SequenceInput> prefill = {
        {std::span<const int32_t>(prompt).first(prompt.size() - 1), 0, tables.back().ids(), false}};
    std::vector<float> logits;
    ASSERT_TRUE(gpu.Forward(prefill, &logits).ok());
    if (i < n - 1) {
      drafts[i].assign(truth[i].begin(), truth[i].begin() + kK);
      if (i > 0) drafts[i][wrong_at(i)] = (drafts[i][wrong_at(i)] + 1) % gpu.config().vocab_size;
    }
    chunks[i] = {prompt.back()};
    chunks[i].insert(chunks[i].end(), drafts[i].begin(), drafts[i].end());
  }
  std::vector<SequenceInput> batch;
  std::vector<SampleRow> rows;
  std::vector<std::span<const int32_t>> spans;
  for (int i = 0; i < n; ++i) {
    batch.push_back({chunks[i], static_cast<int32_t>(prompts[i].prompt_ids.size()) - 1,
                     tables[i].ids(), false});
    SampleRow row;
    row.chunk = i;
    row.sampler = &sampler;
    row.params = &greedy;
    row.history = &history;
    rows.push_back(row);
    spans.emplace_back(drafts[i]);
  }
  std::vector<GreedyVerifyResult> device, host;
  absl::Status s = gpu.StepGreedyVerify(batch, rows, spans, &device);
  ASSERT_TRUE(s.ok()) << s;
  // Same step again (same tokens at the same positions: the KV it writes is identical).
  s = gpu.ModelRunner::StepGreedyVerify(batch, rows, spans, &host);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(device.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(device[i].num_accepted, host[i].num_accepted) << "row " << i;
    EXPECT_EQ(device[i].next.id, host[i].next.id) << "row " << i;
  }
  // Against the truth, up to bf16 near-ties between a multi-token chunk and decode steps.
  int as_expected = 0;
  for (int i = 0; i < n - 1; ++i) {
    const int want = i == 0 ? kK : wrong_at(i);
    as_expected += device[i].num_accepted == want && device[i].next.id == truth[i][want] ? 1 : 0;
  }
  as_expected += device[n - 1].num_accepted == 0 && device[n - 1].next.id == truth[n - 1][0];
  EXPECT_GE(as_expected, n - 1) << "verification disagrees with greedy decoding on most rows";
  std::printf("[ device verification ] %d of %d rows exactly as greedy decoding\n", as_expected, n);
  for (BlockTable& t : tables) ASSERT_TRUE(t.Release(allocator).ok());
}

TEST_F(CodepairCudaTest, SeededSamplingRepeatsAloneAndInBatch) {
  auto engine = MakeEngine(EngineOn("cuda"));
  ASSERT_TRUE(engine);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("def parse(", true), 32);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.top_k = 50;
  r.params.min_p = 0.01f;
  r.params.seed = 1234;
  GenerateRequest other = r;
  other.params.seed = 99;
  auto a = engine->Generate(r);
  std::vector<GenerateRequest> batch = {other, r, other};
  auto b = engine->GenerateBatch(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->ids(), (*b)[1].ids());
  EXPECT_NE(a->ids(), (*b)[0].ids());
  EXPECT_EQ((*b)[0].ids(), (*b)[2].ids());
}

TEST_F(CodepairCudaTest, LogprobsBansAndPenaltiesReachTheGpuSampler) {
  auto engine = MakeEngine(EngineOn("cuda"));
  ASSERT_TRUE(engine);
  const std::vector<int32_t> prompt = *engine->tokenizer()->Encode("import numpy as", true);
  // Logprobs rows go through the CPU sampler: the greedy token is the top-1.
  GenerateRequest lp = Greedy(prompt, 8);
  lp.params.logprobs = 3;
  auto with_logprobs = engine->Generate(lp);
  ASSERT_TRUE(with_logprobs.ok()) << with_logprobs.status();
  for (const GeneratedToken& t : with_logprobs->tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].id, t.id);
    EXPECT_LT(t.logprob, 0.0f);
  }
  // min_tokens bans stop ids on the GPU path: the first greedy token, banned, is not drawn.
  auto plain = engine->Generate(Greedy(prompt, 24));
  ASSERT_TRUE(plain.ok());
  GenerateRequest banned = Greedy(prompt, 4);
  banned.params.stop_token_ids = {plain->ids()[0]};
  auto without_first = engine->Generate(banned);
  ASSERT_TRUE(without_first.ok());
  EXPECT_NE(without_first->ids()[0], plain->ids()[0]);
  // Presence / frequency penalties: the first token has no output history, later ones change.
  GenerateRequest penalized = Greedy(prompt, 24);
  penalized.params.presence_penalty = 2.0f;
  penalized.params.frequency_penalty = 2.0f;
  auto p = engine->Generate(penalized);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ids()[0], plain->ids()[0]);
  EXPECT_NE(p->ids(), plain->ids());
  std::map<int32_t, int> counts;
  for (int32_t id : p->ids()) ++counts[id];
  int most = 0;
  for (const auto& [id, n] : counts) most = std::max(most, n);
  EXPECT_LE(most, 3) << "penalties should stop a token from repeating";
}

// SSD's draft ranks candidates on the GPU (kernels::TopKRows inside Step): for short prefill
// chunks (a round graph) and for decode steps of a batch (a decode graph) they are exactly the top
// raw logits of the same step run through Forward, whatever penalties the row's sampler applies.
TEST_F(CodepairCudaTest, StepCandidatesAreTheTopRawLogitsOfTheSameStep) {
  ModelRunner& r = gpu_->runner();
  const int32_t vocab = r.config().vocab_size;
  BlockAllocator allocator(r.num_kv_blocks());
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 57, 300, 12, 9, 44}, {1, 8, 8, 8, 2000}, {1, 640, 17}};
  std::vector<BlockTable> tables;
  for (size_t i = 0; i < prompts.size(); ++i) {
    tables.emplace_back(r.block_size());
    ASSERT_TRUE(tables.back().EnsureCapacity(16, allocator).ok());
  }
  SamplingParams params;
  params.temperature = 0;
  params.repetition_penalty = 1.5f;  // changes the draw's logits, not the candidates'
  params.presence_penalty = 1.0f;
  std::vector<Sampler> samplers;
  std::vector<TokenHistory> histories(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    samplers.emplace_back(params, 1);
    histories[i].AddPrompt(prompts[i]);
  }
  auto rows_for = [&](int32_t k) {
    std::vector<SampleRow> rows(prompts.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].chunk = static_cast<int32_t>(i);
      rows[i].sampler = &samplers[i];
      rows[i].params = &params;
      rows[i].history = &histories[i];
      rows[i].num_candidates = k;
    }
    return rows;
  };
  for (int step = 0; step < 2; ++step) {  // 0: short prefill chunks (a round graph); 1: decode
    std::vector<SequenceInput> batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int32_t>& p = prompts[i];
      if (step == 0) {
        batch.push_back({p, 0, tables[i].ids(), false});
      } else {
        batch.push_back({std::span<const int32_t>(p).last(1), static_cast<int32_t>(p.size()),
                         tables[i].ids(), false});
      }
    }
    std::vector<float> logits;
    ASSERT_TRUE(r.Forward(batch, &logits).ok());
    for (int32_t k : {1, 6, 16}) {
      std::vector<SampleResult> out;
      const std::vector<SampleRow> rows = rows_for(k);
      ASSERT_TRUE(r.Step(batch, rows, &out).ok());  // rewrites the same KV with the same values
      ASSERT_EQ(out.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        std::vector<int32_t> want(k);
        kernels::ref::TopKRows(logits.data() + i * vocab, vocab, 1, vocab, k, want.data());
        EXPECT_EQ(out[i].candidates, want) << "step " << step << " row " << i << " k " << k;
      }
    }
  }
  std::vector<SampleResult> out;
  std::vector<SampleRow> rows = rows_for(kMaxSampleCandidates + 1);
  std::vector<SequenceInput> one = {{prompts[0], 0, tables[0].ids(), false}};
  rows.resize(1);
  EXPECT_EQ(r.Step(one, rows, &out).code(), absl::StatusCode::kInvalidArgument);
  for (BlockTable& t : tables) ASSERT_TRUE(t.Release(allocator).ok());
}

// ---- Sampled speculation verified on the device (StepSampledVerify, StepDraft) ----

// One fixed deterministic draft (K = 1, the target's second most probable token), verified on
// the device 3008 times with different seeds in batches of 8 copies of one context (16 verified
// positions, the harness runner's max_sample_rows): the
// committed first token follows the target's temperature-1 distribution p (the draft when
// accepted, the residual draw norm(max(0, p - one-hot)) otherwise), and a seed repeats its
// outcome. (Ignoring q changes nothing for a deterministic draft, so the negative control is
// the engine-level test below, whose drafts are sampled.)
TEST_F(CodepairCudaTest, DeviceSampledVerificationOfAFixedDraftDrawsFromP) {
  ModelRunner& r = gpu_->runner();
  ASSERT_TRUE(r.SamplesSpeculationOnDevice());
  const int32_t vocab = r.config().vocab_size;
  const std::vector<int32_t> context = {1, 57, 300, 12, 9, 44, 640, 17};
  const std::vector<float> logits = gpu_->LastLogits(context);
  std::vector<double> p(vocab);
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += p[i] = std::exp(double{logits[i]} - max);
  for (double& x : p) x /= sum;
  std::vector<int32_t> order(vocab);
  for (int32_t i = 0; i < vocab; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  const std::vector<int32_t> draft = {order[1]};
  constexpr int kRows = 8, kSteps = 376;
  BlockAllocator allocator(r.num_kv_blocks());
  std::vector<BlockTable> tables;
  SamplingParams params;
  params.temperature = 1.0f;
  params.max_tokens = 2;
  std::vector<Sampler> samplers;
  std::vector<TokenHistory> histories(kRows);
  for (int i = 0; i < kRows; ++i) {
    tables.emplace_back(r.block_size());
    ASSERT_TRUE(
        tables.back().EnsureCapacity(static_cast<int32_t>(context.size()) + 1, allocator).ok());
    samplers.emplace_back(params, 1);
    histories[i].AddPrompt(context);
  }
  // Prefill every copy once; each verification step rewrites the same two positions.
  const std::vector<int32_t> prefix(context.begin(), context.end() - 1);
  std::vector<int32_t> chunk = {context.back(), draft[0]};
  std::vector<SequenceInput> prefill, verify;
  for (int i = 0; i < kRows; ++i) {
    prefill.push_back({prefix, 0, tables[i].ids(), false});
    verify.push_back({chunk, static_cast<int32_t>(prefix.size()), tables[i].ids(), false});
  }
  std::vector<float> ignored;
  ASSERT_TRUE(r.Forward(prefill, &ignored).ok());
  std::vector<std::span<const int32_t>> drafts(kRows, std::span<const int32_t>(draft));
  std::vector<DraftProbs> probs(kRows);
  std::map<int32_t, int> counts;
  int accepted = 0;
  std::vector<int32_t> first_outcome;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<SampleRow> rows(kRows);
    for (int i = 0; i < kRows; ++i) {
      rows[i].chunk = i;
      rows[i].sampler = &samplers[i];
      rows[i].params = &params;
      rows[i].history = &histories[i];
      rows[i].seed = 7000 + static_cast<uint64_t>(step) * kRows + i;
    }
    std::vector<GreedyVerifyResult> out;
    const absl::Status status = r.StepSampledVerify(verify, rows, drafts, probs, &out);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(out.size(), static_cast<size_t>(kRows));
    for (const GreedyVerifyResult& v : out) {
      ASSERT_GE(v.num_accepted, 0);
      ASSERT_LE(v.num_accepted, 1);
      accepted += v.num_accepted;
      ++counts[v.num_accepted == 1 ? draft[0] : v.next.id];
      if (step == 0) first_outcome.push_back(v.num_accepted == 1 ? -1 : v.next.id);
    }
    if (step == 0) {  // the same seeds again: the same outcomes
      std::vector<GreedyVerifyResult> again;
      ASSERT_TRUE(r.StepSampledVerify(verify, rows, drafts, probs, &again).ok());
      for (int i = 0; i < kRows; ++i) {
        EXPECT_EQ(again[i].num_accepted == 1 ? -1 : again[i].next.id, first_outcome[i]);
      }
    }
  }
  const int total = kRows * kSteps;
  double stat = 0, rest_expected = total;
  int rest = total, bins = 0;
  for (int32_t id : order) {
    const double expected = total * p[id];
    if (expected < 5) break;
    const int observed = counts.count(id) ? counts[id] : 0;
    stat += (observed - expected) * (observed - expected) / expected;
    rest_expected -= expected;
    rest -= observed;
    ++bins;
  }
  if (rest_expected >= 5) {
    stat += (rest - rest_expected) * (rest - rest_expected) / rest_expected;
    ++bins;
  }
  const double critical = speculation_test::ChiSquareCritical999(std::max(bins - 1, 1));
  std::printf(
      "[ device sampled verification ] draft p=%.3f accepted %d of %d; chi-square %.2f, "
      "%d bins, critical %.2f\n",
      p[draft[0]], accepted, total, stat, bins, critical);
  EXPECT_GE(bins, 4);
  EXPECT_LT(stat, critical);
  EXPECT_NEAR(double(accepted) / total, p[draft[0]], 4 * std::sqrt(p[draft[0]] / total) + 0.01);
  for (BlockTable& t : tables) ASSERT_TRUE(t.Release(allocator).ok());
}

// Seeded temperature-1 requests with the draft model on the same GPU (sampled drafts drawn on
// the device, q rows kept in its slots, verified by StepSampledVerify) and with n-gram drafts:
// the second token follows the target's distribution (tests/engine_spec_test's chi-square on the
// GPU); a verifier that accepts every draft fails the same test.
class CodepairCudaSamplingTest : public CodepairCudaTest {
 protected:
  void TearDown() override { runner_internal::verify_accepts_every_draft_for_test = false; }
  std::unique_ptr<Engine> DraftEngine() {
    EngineOptions o = EngineOn("cuda");
    o.speculative.draft_model = ModelDir("codepair/draft");
    o.speculative.draft_kv_cache_bytes = int64_t{64} << 20;
    return MakeEngine(o);
  }
  static std::vector<int32_t> Prompt(const Engine& engine) {
    return *engine.tokenizer()->Encode("class Foo:\n    def __init__(self", true);
  }
};

TEST_F(CodepairCudaSamplingTest, DraftModelSecondTokenFollowsTheTarget) {
  auto engine = DraftEngine();
  ASSERT_TRUE(engine);
  const auto [stat, critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 3000);
  EXPECT_LT(stat, critical);
}

TEST_F(CodepairCudaSamplingTest, AVerifierAcceptingEveryDraftIsCaught) {
  auto engine = DraftEngine();
  ASSERT_TRUE(engine);
  runner_internal::verify_accepts_every_draft_for_test = true;
  const auto [stat, critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 3000);
  EXPECT_GT(stat, critical);
}

// Sampled EAGLE-3 drafts on the GPU (the head's rows over the target vocabulary drawn on the
// device, q left in the runner's probability slots, verified there): the second token follows
// the target; a verifier that accepts every draft is caught.
TEST_F(CodepairCudaSamplingTest, Eagle3SecondTokenFollowsTheTarget) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  const SpeculationParams spec{SpeculationMethod::kEagle3, 2};
  const auto [stat, critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 1500, spec);
  EXPECT_LT(stat, critical);
  // The head's token trees (nodes one-hot, recursive rejection over siblings on the device).
  SpeculationParams tree{SpeculationMethod::kEagle3, 0};
  tree.tree = TreeShape{true, 3, 3, 9};
  const auto [tree_stat, tree_critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 1500, tree);
  std::printf("[ sampled eagle3 tree on the GPU ] chi-square %.2f, critical %.2f\n", tree_stat,
              tree_critical);
  EXPECT_LT(tree_stat, tree_critical);
  runner_internal::verify_accepts_every_draft_for_test = true;
  const auto [broken, critical2] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 1500, spec);
  EXPECT_GT(broken, critical2);
}

// Sampled EAGLE-3 rounds in one captured graph (CudaEagle3Compute::DraftRound with draws: the
// catch-up, its draw and the chained steps' draws on the device, q rows copied into the slots
// inside the graph). A prompt of 2^k + 1 tokens makes the first round's catch-up 2^k rows from
// position 0, which the round graph takes without padding, so the second token comes from a
// round drafted in one graph (K 2: the catch-up's draw and one chained step). At K 3 the first
// draft is drawn by the eager catch-up and the rest by a sampled chained graph instead when the
// prompt is one token longer (the catch-up would need padding before position 0). The head logs
// how its rounds ran at exit.
TEST_F(CodepairCudaSamplingTest, Eagle3SampledRoundGraphsFollowTheTarget) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  // Prompt()'s text after BOS and newlines: its second token stays uncertain.
  const std::vector<int32_t> text = Prompt(*engine);
  const auto newline = engine->tokenizer()->Encode("\n", false);
  ASSERT_TRUE(newline.ok() && newline->size() == 1u);
  size_t length = 2;
  while (length < text.size()) length = 2 * (length - 1) + 1;
  std::vector<int32_t> round_prompt = {text[0]};
  round_prompt.insert(round_prompt.end(), length - text.size(), (*newline)[0]);
  round_prompt.insert(round_prompt.end(), text.begin() + 1, text.end());
  ASSERT_EQ(round_prompt.size(), length);
  const auto [stat, critical] = speculation_test::SecondTokenChiSquare(
      *engine, round_prompt, 1500, SpeculationParams{SpeculationMethod::kEagle3, 2});
  std::printf("[ sampled eagle3 round graph, prompt of %zu ] chi-square %.2f, critical %.2f\n",
              length, stat, critical);
  EXPECT_LT(stat, critical);
  std::vector<int32_t> chain_prompt = round_prompt;
  chain_prompt.insert(chain_prompt.begin() + 1, (*newline)[0]);
  const auto [chain_stat, chain_critical] = speculation_test::SecondTokenChiSquare(
      *engine, chain_prompt, 1500, SpeculationParams{SpeculationMethod::kEagle3, 3});
  std::printf("[ sampled eagle3 chained graph ] chi-square %.2f, critical %.2f\n", chain_stat,
              chain_critical);
  EXPECT_LT(chain_stat, chain_critical);
  runner_internal::verify_accepts_every_draft_for_test = true;
  const auto [broken, broken_critical] = speculation_test::SecondTokenChiSquare(
      *engine, round_prompt, 1500, SpeculationParams{SpeculationMethod::kEagle3, 2});
  std::printf("[ sampled eagle3 round graph, every draft accepted ] chi-square %.2f\n", broken);
  EXPECT_GT(broken, broken_critical);
}

// Sampled EAGLE-3 chains with penalties and top-p on the device (each draw counts the earlier
// drafts as output): a seeded request accepts drafts and repeats, and equal requests of one
// batch agree. (Not alone against in a batch: the head's bf16 GEMMs round differently at another
// batch size, so a draft may differ, and with it which draws verification makes.)
TEST_F(CodepairCudaSamplingTest, Eagle3SampledDraftsRepeat) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.eagle3_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("def parse(", true), 32);
  r.params.temperature = 0.7f;
  r.params.top_p = 0.95f;
  r.params.repetition_penalty = 1.1f;
  r.params.seed = 77;
  r.speculation = {SpeculationMethod::kEagle3, 5};
  GenerateRequest other = r;
  other.params.seed = 3;
  auto a = engine->Generate(r);
  auto again = engine->Generate(r);
  std::vector<GenerateRequest> batch = {other, r, other};
  auto b = engine->GenerateBatch(batch);
  ASSERT_TRUE(a.ok() && again.ok() && b.ok());
  EXPECT_GT(a->usage.num_drafts, 0);
  EXPECT_GT(a->usage.num_accepted_tokens, 0);
  EXPECT_EQ(a->ids(), again->ids());
  EXPECT_EQ((*b)[0].ids(), (*b)[2].ids());
}

// Sampled token trees on the GPU (draft model and n-gram nodes, one-hot q; recursive rejection
// over siblings on the device, kernels::VerifyTreeStochastic): the second token follows the
// target; a verifier accepting every child with mass is caught.
TEST_F(CodepairCudaSamplingTest, TreeSecondTokenFollowsTheTarget) {
  auto engine = DraftEngine();
  ASSERT_TRUE(engine);
  for (SpeculationMethod m : {SpeculationMethod::kDraftModel, SpeculationMethod::kNgram}) {
    SpeculationParams spec{m, 0};
    spec.tree = TreeShape{true, 3, 3, 9};
    const auto [stat, critical] =
        speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 2000, spec);
    std::printf("[ sampled %s tree on the GPU ] chi-square %.2f, critical %.2f\n",
                SpeculationMethodName(m), stat, critical);
    EXPECT_LT(stat, critical) << SpeculationMethodName(m);
  }
  SpeculationParams spec{SpeculationMethod::kDraftModel, 0};
  spec.tree = TreeShape{true, 3, 3, 9};
  runner_internal::verify_accepts_every_draft_for_test = true;
  const auto [broken, critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 2000, spec);
  std::printf("[ sampled tree, a verifier accepting every child ] chi-square %.2f\n", broken);
  EXPECT_GT(broken, critical);
}

// Sampled parallel drafts on the GPU (q of all K positions left in the draft runner's slots by
// one StepDraft): the second token follows the target; a verifier accepting every draft is caught.
TEST_F(CodepairCudaSamplingTest, ParallelDraftSecondTokenFollowsTheTarget) {
  EngineOptions o = EngineOn("cuda");
  o.speculative.draft_model = std::string(SPECD_SOURCE_DIR) + "/models/codepair/pard";
  o.speculative.parallel_drafting = true;
  o.speculative.draft_kv_cache_bytes = int64_t{64} << 20;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine);
  const auto [stat, critical] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 1500);
  EXPECT_LT(stat, critical);
  runner_internal::verify_accepts_every_draft_for_test = true;
  const auto [broken, critical2] =
      speculation_test::SecondTokenChiSquare(*engine, Prompt(*engine), 1500);
  EXPECT_GT(broken, critical2);
}

// Logprobs of sampled speculative requests (verified on the device, the raw rows of the
// committed positions read back): every committed token, accepted draft or not, has its raw
// logprob and the top 3, and each top list holds the most probable tokens in order.
TEST_F(CodepairCudaSamplingTest, SampledSpeculationReturnsLogprobsOfEveryToken) {
  auto engine = DraftEngine();
  ASSERT_TRUE(engine);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("def parse(", true), 24);
  r.params.temperature = 1.0f;
  r.params.seed = 5;
  r.params.logprobs = 3;
  r.speculation = {SpeculationMethod::kDraftModel, 4};
  auto out = engine->Generate(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GT(out->usage.num_accepted_tokens, 0);
  ASSERT_EQ(out->tokens.size(), 24u);
  for (const GeneratedToken& t : out->tokens) {
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_LE(t.logprob, 0.0f);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
    EXPECT_LE(t.logprob, t.top[0].logprob + 1e-6f);
    for (const TokenLogprob& top : t.top) {
      if (top.id == t.id) {
        EXPECT_FLOAT_EQ(top.logprob, t.logprob);
      }
    }
  }
}

// A seeded sampled request with draft-model speculation gives the same tokens alone and in a
// batch with other requests (Philox keyed by seed and position, on both sides of the round).
TEST_F(CodepairCudaSamplingTest, SeededSampledSpeculationRepeatsAloneAndInBatch) {
  auto engine = DraftEngine();
  ASSERT_TRUE(engine);
  GenerateRequest r = Greedy(*engine->tokenizer()->Encode("def parse(", true), 32);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.seed = 1234;
  r.speculation = {SpeculationMethod::kDraftModel, 4};
  GenerateRequest other = r;
  other.params.seed = 99;
  other.speculation = {SpeculationMethod::kNgram, 3};
  auto a = engine->Generate(r);
  std::vector<GenerateRequest> batch = {other, r, other, other};
  auto b = engine->GenerateBatch(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->usage.num_drafts, 0);
  EXPECT_EQ(a->ids(), (*b)[1].ids());
  EXPECT_EQ((*b)[0].ids(), (*b)[2].ids());
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "codepair_cuda_test");
}
