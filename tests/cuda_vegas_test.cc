// Vegas on the CUDA runner (ctest label gpu; exits 77, "skipped", where no GPU is visible), on
// the long-context codepair model (../shared/models/codepair-long: head_dim 64, 6 query heads over
// 2 KV heads, so a query's group of 3 may straddle two warps of the score kernel): the scores a
// verification chunk collects and the logits of sparse draft steps against the CPU Model's for
// the same chunks (mixed with dense chunks in one batch), and the engine on the GPU: greedy
// vegas and streaming output equals plain decoding up to bf16 near-ties (GreedyAgrees), and the
// drafts are accepted. Held-out text: codepair-long/golden.json's 8,192-id window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model.h"
#include "engine/runner/model_runner.h"
#include "engine/testing/engine_spec_test_util.h"
#include "kernels/ref/vegas.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h

std::string LongDir() { return ModelDir("codepair-long"); }

std::vector<int32_t> HeldOut() {
  return Ids(ReadJson(LongDir() + "/golden.json")[1]["prompt_ids"]);  // 8,192 ids
}

RunnerOptions LongOptions(const std::string& device) {
  RunnerOptions o = Options(LongDir(), device);
  o.max_model_len = 16384;
  o.max_num_batched_tokens = 16384;  // GreedyAgrees' prefill of an 8K prompt and its output
  o.kv_cache_bytes = int64_t{256} << 20;
  return o;
}

SequenceInput Input(std::span<const int32_t> tokens, int32_t start_pos,
                    std::span<const int32_t> table, bool all_logits) {
  SequenceInput in;
  in.tokens = tokens;
  in.start_pos = start_pos;
  in.block_table = table;
  in.all_logits = all_logits;
  return in;
}

std::vector<int32_t> Slice(const std::vector<int32_t>& ids, size_t begin, size_t n) {
  return std::vector<int32_t>(ids.begin() + begin, ids.begin() + begin + n);
}

// Sequences with their own block tables over one runner's KV blocks.
class Sequences {
 public:
  explicit Sequences(ModelRunner& runner) : runner_(runner), allocator_(runner.num_kv_blocks()) {}
  ~Sequences() {
    for (BlockTable& t : tables_) (void)t.Release(allocator_);
  }
  // A sequence with room for `capacity` positions whose prefix `prompt` is computed.
  int Add(const std::vector<int32_t>& prompt, int32_t capacity) {
    tables_.emplace_back(runner_.block_size());
    EXPECT_TRUE(tables_.back().EnsureCapacity(capacity, allocator_).ok());
    const int s = static_cast<int>(tables_.size()) - 1;
    Forward({Input(prompt, 0, table(s), false)});
    return s;
  }
  std::span<const int32_t> table(int s) const { return tables_[s].ids(); }
  std::vector<float> Forward(const std::vector<SequenceInput>& batch) {
    std::vector<float> logits;
    const absl::Status st = runner_.Forward(batch, &logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  }

 private:
  ModelRunner& runner_;
  BlockAllocator allocator_;
  std::vector<BlockTable> tables_;
};

struct Comparison {
  double max_err = 0, max_ref = 0, correlation = 0;
};

Comparison Compare(std::span<const float> got, std::span<const float> want) {
  Comparison c;
  double sg = 0, sw = 0, sgg = 0, sww = 0, sgw = 0;
  const double n = static_cast<double>(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    c.max_err = std::isfinite(g) ? std::max(c.max_err, std::abs(g - w)) : INFINITY;
    c.max_ref = std::max(c.max_ref, std::abs(w));
    sg += g, sw += w, sgg += g * g, sww += w * w, sgw += g * w;
  }
  const double cov = sgw / n - (sg / n) * (sw / n);
  const double vg = sgg / n - (sg / n) * (sg / n), vw = sww / n - (sw / n) * (sw / n);
  c.correlation = vg > 0 && vw > 0 ? cov / std::sqrt(vg * vw) : 0;
  return c;
}

class CudaVegasTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(LongDir())) return;  // SetUp fails, naming the path
    cpu_ = MakeRunner(LongOptions("cpu")).release();
    gpu_ = MakeRunner(LongOptions("cuda")).release();
  }
  static void TearDownTestSuite() {
    delete cpu_;
    delete gpu_;
  }
  void SetUp() override {
    ASSERT_TRUE(DataPresent(LongDir()));
    ASSERT_TRUE(cpu_ != nullptr && gpu_ != nullptr);
  }
  static ModelRunner* cpu_;
  static ModelRunner* gpu_;
};
ModelRunner* CudaVegasTest::cpu_ = nullptr;
ModelRunner* CudaVegasTest::gpu_ = nullptr;

// A verification step of three chunks -- scored (6 tokens after 3,000: the last query's group of
// 3 q heads straddles two warps), dense (6 after 2,000), scored (11 after 1,500: it straddles two
// CTAs) -- on both runners: every score row matches the CPU Model's within bf16 error (no entry
// left unwritten) and keeps mostly (70%) the same top 7% prefix tokens, and the logits match as
// closely as the same step's without options.
TEST_F(CudaVegasTest, VerificationScoresMatchTheCpuModel) {
  const std::vector<int32_t> ids = HeldOut();
  const int32_t layers = gpu_->config().num_layers;
  struct Chunk {
    size_t begin;
    int32_t prefix, run;
    bool scored;
  };
  const Chunk chunks[] = {{0, 3000, 6, true}, {3100, 2000, 6, false}, {5200, 1500, 11, true}};
  struct Result {
    std::vector<std::vector<float>> scores;  // per chunk: [layers, 2, prefix]
    std::vector<float> logits, dense_logits;
  };
  auto run = [&](ModelRunner& runner) {
    Sequences seqs(runner);
    Result r;
    std::vector<int> s;
    std::vector<std::vector<int32_t>> tokens;
    for (const Chunk& c : chunks) {
      s.push_back(seqs.Add(Slice(ids, c.begin, c.prefix), c.prefix + c.run));
      tokens.push_back(Slice(ids, c.begin + c.prefix, c.run));
      r.scores.emplace_back(c.scored ? size_t(layers) * 2 * c.prefix : 0,
                            std::numeric_limits<float>::quiet_NaN());
    }
    std::vector<ChunkAttention> options(std::size(chunks));
    std::vector<SequenceInput> batch, dense;
    for (size_t i = 0; i < std::size(chunks); ++i) {
      options[i].scores = r.scores[i];
      batch.push_back(Input(tokens[i], chunks[i].prefix, seqs.table(s[i]), true));
      dense.push_back(batch.back());
      if (chunks[i].scored) batch.back().attention = &options[i];
    }
    r.logits = seqs.Forward(batch);
    r.dense_logits = seqs.Forward(dense);  // the same tokens and positions: the same KV
    return r;
  };
  const Result cpu = run(*cpu_), gpu = run(*gpu_);
  ASSERT_EQ(gpu.logits.size(), cpu.logits.size());
  const Comparison base = Compare(gpu.dense_logits, cpu.dense_logits);
  const Comparison with = Compare(gpu.logits, cpu.logits);
  std::printf("[ verification logits ] max |gpu - cpu| %.4f with scores, %.4f without\n",
              with.max_err, base.max_err);
  EXPECT_LE(with.max_err, 1.5 * base.max_err + 0.02);
  for (size_t i = 0; i < std::size(chunks); ++i) {
    if (!chunks[i].scored) continue;
    const int64_t n = chunks[i].prefix;
    for (int32_t l = 0; l < layers; ++l) {
      for (int row = 0; row < 2; ++row) {
        const auto at = [&](const Result& r) {
          return std::span<const float>(r.scores[i]).subspan((int64_t{l} * 2 + row) * n, n);
        };
        const Comparison c = Compare(at(gpu), at(cpu));
        const std::string where = "chunk " + std::to_string(i) + " layer " + std::to_string(l) +
                                  " row " + std::to_string(row);
        EXPECT_LE(c.max_err, 0.05 * c.max_ref + 0.05)
            << where << " (max |cpu| " << c.max_ref << ")";
        EXPECT_GE(c.correlation, 0.99) << where;
      }
    }
    // The selection Vegas makes from them: top 7% of the prefix per layer, as the speculator does.
    const int32_t length = static_cast<int32_t>(n);
    const kernels::ref::VegasBudget budget{0.07, 16, n};
    const int64_t k = kernels::ref::VegasKeepCount(n, budget);
    std::vector<int32_t> want(layers * k), got(layers * k), counts(layers);
    kernels::ref::VegasSelectTopK(cpu.scores[i].data(), 1, n, &length, 1, layers, budget,
                                  want.data(), k, counts.data());
    kernels::ref::VegasSelectTopK(gpu.scores[i].data(), 1, n, &length, 1, layers, budget,
                                  got.data(), k, counts.data());
    for (int32_t l = 0; l < layers; ++l) {
      std::vector<int32_t> common;
      std::set_intersection(want.begin() + l * k, want.begin() + (l + 1) * k, got.begin() + l * k,
                            got.begin() + (l + 1) * k, std::back_inserter(common));
      std::printf("[ chunk %zu layer %d ] %zu of %lld selected tokens shared with the CPU's\n", i,
                  l, common.size(), static_cast<long long>(k));
      EXPECT_GE(common.size(), static_cast<size_t>(k * 7 / 10)) << "chunk " << i << " layer " << l;
    }
  }
}

// A draft step of three one-token chunks -- Vegas-style sparse (a different random 7% of the
// prefix per layer plus the last 16 tokens), dense, streaming (4 sinks shared by every layer plus
// a 200-token window) -- matches the CPU Model with the same index lists, as closely as the same
// step run densely does, while the sparse rows' logits differ clearly from dense attention's.
TEST_F(CudaVegasTest, SparseDraftStepMatchesTheCpuModel) {
  const std::vector<int32_t> ids = HeldOut();
  const int32_t layers = gpu_->config().num_layers;
  const size_t begins[] = {0, 3100, 5200};
  const int32_t prefixes[] = {3000, 2000, 2500};
  std::mt19937 rng(18);
  std::vector<std::vector<int32_t>> lists(layers);
  const int32_t recent_a = prefixes[0] - 16;
  for (std::vector<int32_t>& list : lists) {
    for (int32_t p = 0; p < recent_a; ++p) {
      if (rng() % 100 < 7) list.push_back(p);
    }
  }
  std::vector<std::span<const int32_t>> vegas_lists(lists.begin(), lists.end());
  const std::vector<int32_t> sinks = {0, 1, 2, 3};
  std::vector<std::span<const int32_t>> streaming_lists(layers, sinks);
  ChunkAttention vegas, streaming;
  vegas.layer_indices = vegas_lists;
  vegas.recent_start = recent_a;
  streaming.layer_indices = streaming_lists;
  streaming.recent_start = prefixes[2] - 200;
  // The sparse step, then the same step densely (it rewrites the same positions' KV).
  auto run = [&](ModelRunner& runner) {
    Sequences seqs(runner);
    std::vector<std::vector<int32_t>> next;
    std::vector<int> s;
    for (int i = 0; i < 3; ++i) {
      s.push_back(seqs.Add(Slice(ids, begins[i], prefixes[i]), prefixes[i] + 1));
      next.push_back(Slice(ids, begins[i] + prefixes[i], 1));
    }
    std::vector<SequenceInput> batch;
    for (int i = 0; i < 3; ++i)
      batch.push_back(Input(next[i], prefixes[i], seqs.table(s[i]), false));
    const std::vector<SequenceInput> dense = batch;
    batch[0].attention = &vegas;
    batch[2].attention = &streaming;
    std::vector<float> sparse_logits = seqs.Forward(batch);
    return std::make_pair(sparse_logits, seqs.Forward(dense));
  };
  const auto [cpu, cpu_dense] = run(*cpu_);
  const auto [gpu, gpu_dense] = run(*gpu_);
  ASSERT_EQ(gpu.size(), cpu.size());
  const size_t vocab = static_cast<size_t>(gpu_->config().vocab_size);
  const double base = Compare(gpu_dense, cpu_dense).max_err;
  for (int i = 0; i < 3; ++i) {
    auto row = [&](const std::vector<float>& v) {
      return std::span<const float>(v).subspan(i * vocab, vocab);
    };
    const double err = Compare(row(gpu), row(cpu)).max_err;
    const double effect = Compare(row(cpu_dense), row(cpu)).max_err;
    std::printf("[ draft row %d ] max |gpu - cpu| %.4f (dense step %.4f); sparse vs dense %.4f\n",
                i, err, base, effect);
    EXPECT_LE(err, 2 * base + 0.02) << "row " << i;
    if (i != 1) {
      EXPECT_GT(effect, 4 * err) << "row " << i << ": sparse attention changed little";
    }
  }
}

// Selections kept on the device (ChunkAttention::select_slot / slot): a verification chunk that
// selects into a slot keeps exactly the tokens the host would select from the same pass's
// weights (kernels::ref::VegasSelectTopK), and a draft step over the slot gives the logits of the
// same step over the host's lists (up to the split count); its graph replay (the runner with
// graphs) equals its eager run (an enforce_eager runner) bit for bit.
TEST_F(CudaVegasTest, SlotSelectionEqualsTheHostsAndItsGraphEqualsEager) {
  ASSERT_GT(gpu_->num_sparse_slots(), 3);
  RunnerOptions eager_options = LongOptions("cuda");
  eager_options.enforce_eager = true;
  std::unique_ptr<ModelRunner> eager = MakeRunner(eager_options);
  ASSERT_TRUE(eager != nullptr);
  const std::vector<int32_t> ids = HeldOut();
  const int32_t layers = gpu_->config().num_layers;
  const size_t begins[] = {0, 4000};
  const int32_t prefixes[] = {3000, 2500};
  const int32_t slots[] = {3, 0};
  constexpr int32_t kChunk = 5;
  const SelectBudget budget{0.07, 32, 0};
  const kernels::ref::VegasBudget ref_budget{0.07, 32, std::numeric_limits<int64_t>::max()};
  struct Out {
    std::vector<float> slot_logits, list_logits;
    std::vector<std::vector<int32_t>> lists;  // [seq * layers + layer]
  };
  auto run = [&](ModelRunner& runner) {
    Out out;
    Sequences seqs(runner);
    std::vector<int> s;
    std::vector<std::vector<int32_t>> chunk, next;
    for (int i = 0; i < 2; ++i) {
      s.push_back(seqs.Add(Slice(ids, begins[i], prefixes[i]), prefixes[i] + kChunk + 1));
      chunk.push_back(Slice(ids, begins[i] + prefixes[i], kChunk));
      next.push_back(Slice(ids, begins[i] + prefixes[i] + kChunk, 1));
    }
    // The verification chunk twice (it rewrites the same KV): scores to the host, then into
    // the slots.
    std::vector<std::vector<float>> scores(2);
    ChunkAttention host[2], device[2];
    std::vector<SequenceInput> to_host, to_slots;
    for (int i = 0; i < 2; ++i) {
      scores[i].assign(static_cast<size_t>(layers) * 2 * prefixes[i], 0.0f);
      host[i].scores = scores[i];
      device[i].select_slot = slots[i];
      device[i].select_budget = budget;
      to_host.push_back(Input(chunk[i], prefixes[i], seqs.table(s[i]), true));
      to_host.back().attention = &host[i];
      to_slots.push_back(to_host.back());
      to_slots.back().attention = &device[i];
    }
    seqs.Forward(to_host);
    seqs.Forward(to_slots);
    // The host's selection from the weights, as VegasSpeculator::OnVerified makes it.
    std::vector<std::vector<std::span<const int32_t>>> spans(2);
    ChunkAttention list_step[2], slot_step[2];
    std::vector<SequenceInput> by_list, by_slot;
    for (int i = 0; i < 2; ++i) {
      const int64_t k = kernels::ref::VegasKeepCount(prefixes[i], ref_budget);
      std::vector<int32_t> indices(static_cast<size_t>(layers * k)), counts(layers);
      kernels::ref::VegasSelectTopK(scores[i].data(), 1, prefixes[i], &prefixes[i], 1, layers,
                                    ref_budget, indices.data(), k, counts.data());
      for (int32_t l = 0; l < layers; ++l) {
        out.lists.emplace_back(indices.begin() + l * k, indices.begin() + (l + 1) * k);
      }
      for (int32_t l = 0; l < layers; ++l) spans[i].push_back(out.lists[i * layers + l]);
      list_step[i].layer_indices = spans[i];
      list_step[i].recent_start = prefixes[i];
      slot_step[i].slot = slots[i];
      slot_step[i].slot_count = static_cast<int32_t>(k);
      slot_step[i].recent_start = prefixes[i];
      by_list.push_back(Input(next[i], prefixes[i] + kChunk, seqs.table(s[i]), false));
      by_list.back().attention = &list_step[i];
      by_slot.push_back(by_list.back());
      by_slot.back().attention = &slot_step[i];
    }
    out.list_logits = seqs.Forward(by_list);
    out.slot_logits = seqs.Forward(by_slot);
    return out;
  };
  const Out graphs = run(*gpu_);
  const Out eagerly = run(*eager);
  ASSERT_FALSE(graphs.slot_logits.empty());
  // The same selections either way (the runners' verification passes are alike: eager).
  EXPECT_EQ(graphs.lists, eagerly.lists);
  EXPECT_EQ(graphs.slot_logits, eagerly.slot_logits) << "graph replay != eager, bit for bit";
  const Comparison c = Compare(graphs.slot_logits, graphs.list_logits);
  std::printf("[ slots ] max |slot - list| %.5f of %.3f, correlation %.6f\n", c.max_err, c.max_ref,
              c.correlation);
  EXPECT_LE(c.max_err, 0.02 * c.max_ref) << "the slot's lists are not the host's selection";
}

// ---- the engine on the GPU ----

EngineOptions LongEngine(std::shared_ptr<EngineObserver> observer) {
  EngineOptions o;
  o.model_dir = LongDir();
  o.device = "cuda";
  o.max_model_len = 16384;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 8192;
  o.kv_cache_bytes = int64_t{1} << 30;
  o.observer = std::move(observer);
  return o;
}

SpeculationParams Sparse(SpeculationMethod m, int32_t k, double ratio) {
  SpeculationParams p{m, k};
  p.sparsity_ratio = ratio;
  p.sparse_min_tokens = 32;  // below every ratio's share of 4K, so the ratio decides
  return p;
}

class KeptObserver : public speculation_test::SpecObserver {
 public:
  void OnSpeculation(const SpeculationStepMetrics& m) override {
    speculation_test::SpecObserver::OnSpeculation(m);
    std::lock_guard lock(mu_);
    kept.insert(kept.end(), m.sparse_kept_tokens.begin(), m.sparse_kept_tokens.end());
  }
  std::vector<int32_t> kept;
};

class CudaVegasEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(DataPresent(LongDir()));
    observer_ = std::make_shared<KeptObserver>();
    auto engine = Engine::Create(LongEngine(observer_));
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    cpu_ = std::make_unique<Harness>(MakeRunner(LongOptions("cpu")));
    gpu_ = std::make_unique<Harness>(MakeRunner(LongOptions("cuda")));
    ASSERT_TRUE(cpu_->ok() && gpu_->ok());
    const std::vector<int32_t> ids = HeldOut();
    // 4K and 8K contexts of held-out code.
    prompts_ = {Slice(ids, 0, 4096), Slice(ids, 4096, 4096), ids};
    plain_ = Run(speculation_test::kPlain);
  }
  std::vector<GenerateResult> Run(const SpeculationParams& spec, int32_t min_tokens = 0) {
    std::vector<GenerateRequest> requests;
    for (const auto& p : prompts_) {
      requests.push_back(speculation_test::Greedy(p, kGen, spec));
      requests.back().params.min_tokens = min_tokens;
    }
    auto results = engine_->GenerateBatch(requests);
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? *std::move(results) : std::vector<GenerateResult>();
  }
  static constexpr int32_t kGen = 32;
  std::shared_ptr<KeptObserver> observer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Harness> cpu_, gpu_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<GenerateResult> plain_;
};

TEST_F(CudaVegasEngineTest, GreedyVegasAndStreamingEqualPlainDecoding) {
  ASSERT_EQ(plain_.size(), prompts_.size());
  for (SpeculationMethod m : {SpeculationMethod::kVegas, SpeculationMethod::kStreaming}) {
    for (int32_t k : {4, 8}) {
      for (double ratio : {0.03, 0.07, 0.20, 1.0}) {
        if (ratio == 1.0 && m != SpeculationMethod::kVegas) continue;  // streaming: dense drafts
        observer_->Reset();
        observer_->kept.clear();
        const auto got = Run(Sparse(m, k, ratio));
        ASSERT_EQ(got.size(), plain_.size());
        const std::string label = std::string(SpeculationMethodName(m)) + " K " +
                                  std::to_string(k) + " ratio " + std::to_string(ratio);
        int64_t rounds = 0, accepted = 0, drafts = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(GreedyAgrees(label + " prompt " + std::to_string(i), prompts_[i],
                                   plain_[i].ids(), got[i].ids(), *cpu_, *gpu_));
          rounds += got[i].usage.num_drafts;
          accepted += got[i].usage.num_accepted_tokens;
          drafts += got[i].usage.num_draft_tokens;
        }
        std::printf(
            "[ %s ] %lld rounds, %lld of %lld drafts accepted, %.2f tokens per round, %zu "
            "sparse rounds\n",
            label.c_str(), static_cast<long long>(rounds), static_cast<long long>(accepted),
            static_cast<long long>(drafts),
            rounds > 0 ? 1.0 + static_cast<double>(accepted) / rounds : 0.0,
            observer_->kept.size());
        EXPECT_GT(drafts, 0) << label << ": nothing was drafted";
        if (ratio == 1.0) {
          // Every prefix token kept: the drafts are the target's own (sparse kernel over full
          // lists), so nearly all are accepted.
          EXPECT_GE(accepted, drafts * 8 / 10) << label;
          continue;
        }
        EXPECT_EQ(static_cast<int64_t>(observer_->kept.size()), rounds)
            << label << ": every round drafts sparsely";
        if (m == SpeculationMethod::kVegas) {
          EXPECT_GT(accepted, 0) << label << ": vegas drafts never accepted";
        }
      }
    }
  }
}

// Vegas, streaming, n-gram and plain requests in one batch, and vegas with min_tokens (its bans
// take the sampled-verification path) against plain decoding with the same min_tokens: each
// equals plain decoding.
TEST_F(CudaVegasEngineTest, MixedBatchOfMethodsEqualsPlain) {
  const SpeculationParams specs[] = {Sparse(SpeculationMethod::kVegas, 6, 0.07),
                                     Sparse(SpeculationMethod::kStreaming, 5, 0.07),
                                     {SpeculationMethod::kNgram, 4},
                                     speculation_test::kPlain,
                                     Sparse(SpeculationMethod::kVegas, 4, 0.1),
                                     speculation_test::kPlain};
  std::vector<GenerateRequest> requests;
  for (size_t j = 0; j < std::size(specs); ++j) {
    requests.push_back(speculation_test::Greedy(prompts_[j % 2], kGen, specs[j]));
    if (j >= 4) requests.back().params.min_tokens = kGen;  // requests 4 and 5: prompt 0
  }
  auto results = engine_->GenerateBatch(requests);
  ASSERT_TRUE(results.ok()) << results.status();
  for (size_t j = 0; j < 5; ++j) {
    const std::vector<int32_t>& want = j == 4 ? (*results)[5].ids() : plain_[j % 2].ids();
    EXPECT_TRUE(GreedyAgrees("mixed request " + std::to_string(j), prompts_[j % 2], want,
                             (*results)[j].ids(), *cpu_, *gpu_));
  }
  EXPECT_GT((*results)[0].usage.num_draft_tokens, 0);
  EXPECT_GT((*results)[1].usage.num_draft_tokens, 0);
  EXPECT_GT((*results)[4].usage.num_draft_tokens, 0);
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "cuda_vegas_test");
}
