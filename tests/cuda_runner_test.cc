// The CUDA runner on a real GPU (ctest label gpu; exits 77, "skipped", where no GPU is visible):
// (a) tiny-random models of five HF families against HF transformers' fp32 goldens at bf16
//     tolerance, and their greedy continuations;
// (b, c) codepair against the CPU backend, batched and graph runs: codepair_cuda_test.cc;
// (d) a random-weight model with Llama-3.1-8B's shapes (--load-format dummy) serving requests
//     through the Engine's serving API;
// (e) out-of-memory at weight load and KV allocation as clear errors;
// (f) round graphs: verification steps replayed through CUDA graphs against eager runs;
// (g) the standalone EAGLE-3 head (SSD's speculator): candidates ranked with their pass, and a
//     miss's ranked round against its passes one at a time;
// plus the fill kernels (kernels/cuda/init.h).
//
// Data: models under $SPECD_SHARED_DIR/models (default: the build's SPECD_SHARED_DIR), shapes
// under $SPECD_SHAPES_DIR (default: $SPECD_SHARED_DIR/models/shapes); with a GPU visible, a
// test whose data is absent fails, naming the path it looked for (only "no GPU" skips).
//
// Tolerance (a): max |gpu - golden| over a row <= 2^-5 * max |golden| of the row. bf16 keeps 8
// significant bits, so one rounding of the row's largest logit is up to 2^-9 of it; activations
// are rounded to bf16 about ten times per layer and the goldens are fp32, so we allow the
// equivalent of 16 such roundings at the top of the row (measured values are printed).
// Greedy rule: GreedyAgrees in tests/cuda_test_util.h.
#include "engine/runner/cuda/cuda_runner.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/runner/model_runner.h"
#include "engine/speculation/ssd/eagle3_drafter.h"
#include "kernels/cuda/init.h"
#include "kernels/ref/bf16.h"
#include "tests/cuda_test_util.h"

namespace specd {
namespace {

using namespace cuda_test;  // NOLINT: the shared helpers of tests/cuda_test_util.h

constexpr double kBf16RelTolerance = 1.0 / 32;

std::string ShapesDir() { return Env("SPECD_SHAPES_DIR", SharedDir() + "/models/shapes"); }

std::span<const float> Row(const std::vector<float>& logits, int64_t row, int32_t vocab) {
  return std::span<const float>(logits).subspan(row * vocab, vocab);
}

// max |ours - ref| / max |ref| over a row.
double RelError(std::span<const float> ours, std::span<const float> ref) {
  double diff = 0, top = 0;
  for (size_t i = 0; i < ref.size() && i < ours.size(); ++i) {
    diff = std::max(diff, std::fabs(double{ours[i]} - ref[i]));
    top = std::max(top, std::fabs(double{ref[i]}));
  }
  return ours.size() == ref.size() ? diff / top : 1e30;
}

// ---- fill kernels ----

TEST(FillTest, UniformFillEqualsTheHostHashBitForBit) {
  const int64_t n = 100003;
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * 2), cudaSuccess);
  auto* out = static_cast<__nv_bfloat16*>(d);
  ASSERT_EQ(kernels::FillUniformBf16(out, n, 42, -0.02f, 0.02f, nullptr), cudaSuccess);
  std::vector<uint16_t> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  double sum = 0;
  // The bounds as bf16 rounds them (bf16(-0.02) = -0.02001953125).
  const float lo = kernels::Bf16ToFloat(kernels::FloatToBf16(-0.02f));
  const float hi = kernels::Bf16ToFloat(kernels::FloatToBf16(0.02f));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], kernels::FloatToBf16(kernels::HashUniform(42, i, -0.02f, 0.02f))) << i;
    const float v = kernels::Bf16ToFloat(got[i]);
    ASSERT_TRUE(v >= lo && v <= hi) << v;
    sum += v;
  }
  EXPECT_LT(std::fabs(sum / n), 1e-3);
  ASSERT_EQ(kernels::FillBf16(out, n, 1.0f, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint16_t b) { return b == 0x3f80; }));
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST(FillTest, ScatterWritesExactlyTheListedElements) {
  const int64_t rows = 3, stride = 1000;
  std::vector<float> host(rows * stride, 1.0f);
  const std::vector<int32_t> r = {0, 2, 2, 1}, c = {999, 0, 0, 500};
  float* data = nullptr;
  int32_t* idx = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&data), host.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&idx), 8 * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(data, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(idx, r.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(idx + 4, c.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(kernels::ScatterF32(data, stride, idx, idx + 4, 4, -INFINITY, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), data, host.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < rows * stride; ++i) {
    const bool listed = i == 999 || i == 2 * stride || i == stride + 500;
    EXPECT_EQ(std::isinf(host[i]), listed) << i;
  }
  EXPECT_EQ(cudaFree(data), cudaSuccess);
  EXPECT_EQ(cudaFree(idx), cudaSuccess);
}

// ---- (a) tiny-random goldens ----

class CudaTinyRandomTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return ModelDir(std::string("tiny-random/") + GetParam()); }
};

// A copy of the model directory `dir` in `out` with every F32 tensor rounded to bf16 (round to
// nearest even), as the GPU runner stores weights: the same-precision baseline for goldens.
bool WriteBf16RoundedCopy(const std::string& dir, const std::string& out) {
  namespace fs = std::filesystem;
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != "model.safetensors") {
      fs::copy_file(e.path(), out + "/" + e.path().filename().string(),
                    fs::copy_options::overwrite_existing);
    }
  }
  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 8) return false;
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (8 + header_len > bytes.size()) return false;
  const nlohmann::json header =
      nlohmann::json::parse(bytes.substr(8, header_len), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return false;
  const size_t base = 8 + header_len;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t["dtype"] != "F32") continue;
    const auto offsets = t["data_offsets"].get<std::vector<uint64_t>>();
    for (uint64_t off = offsets[0]; off + 4 <= offsets[1]; off += 4) {
      float v;
      std::memcpy(&v, bytes.data() + base + off, 4);
      v = kernels::Bf16ToFloat(kernels::FloatToBf16(v));
      std::memcpy(bytes.data() + base + off, &v, 4);
    }
  }
  std::ofstream(out + "/model.safetensors", std::ios::binary) << bytes;
  return true;
}

// The GPU's logits against HF's fp32 goldens. The tolerance is bf16's: 1/32 of the largest
// |logit|, or three times the error of the same-precision baseline -- the exact fp32 CPU backend
// on the model with its weights rounded to bf16, as the GPU holds them -- when a model is that
// sensitive to bf16 weights (llama-linear row 0: its bf16-weight baseline alone is ~3e-2 at
// position 39, against ~7e-3 for the other families).
TEST_P(CudaTinyRandomTest, PrefillLogitsMatchHfGoldenAtBf16Tolerance) {
  ASSERT_TRUE(DataPresent(dir()));
  Harness h(MakeRunner(Options(dir(), "cuda")));
  ASSERT_TRUE(h.ok());
  const std::string rounded =
      (std::filesystem::temp_directory_path() / ("specd-bf16-" + std::string(GetParam()))).string();
  ASSERT_TRUE(WriteBf16RoundedCopy(dir(), rounded));
  Harness baseline(MakeRunner(Options(rounded, "cpu")));
  ASSERT_TRUE(baseline.ok());
  const nlohmann::json g = ReadJson(dir() + "/golden.json");
  auto run = [&](Harness& on) {
    const int a = on.AddSequence(), b = on.AddSequence();
    return on.Run({{a, Ids(g["input_ids"][0]), true}, {b, Ids(g["input_ids"][1]), true}});
  };
  const std::vector<float> logits = run(h), base = run(baseline);
  const int32_t vocab = h.vocab();
  ASSERT_EQ(logits.size(), static_cast<size_t>(2 * 40 * vocab));
  ASSERT_EQ(base.size(), logits.size());
  double sum_abs = 0;
  for (float v : logits) sum_abs += std::fabs(v);
  for (int row = 0; row < 2; ++row) {
    for (const auto& [pos, key] : {std::pair<int, const char*>{39, "logits_last_pos"},
                                   std::pair<int, const char*>{5, "logits_pos5"}}) {
      const auto golden = g[key][row].get<std::vector<float>>();
      const double err = RelError(Row(logits, row * 40 + pos, vocab), golden);
      const double base_err = RelError(Row(base, row * 40 + pos, vocab), golden);
      const double tolerance = std::max(kBf16RelTolerance, 3 * base_err);
      std::printf(
          "[ %s ] row %d pos %d: rel error %.2e (bf16-weight baseline %.2e, tolerance "
          "%.2e)\n",
          GetParam(), row, pos, err, base_err, tolerance);
      EXPECT_LE(err, tolerance) << "row " << row << " position " << pos;
    }
  }
  const double golden_sum = g["logits_sum_abs"].get<double>();
  EXPECT_NEAR(sum_abs, golden_sum, kBf16RelTolerance * golden_sum);
  std::filesystem::remove_all(rounded);
}

TEST_P(CudaTinyRandomTest, GreedyContinuationMatchesGoldenUpToBf16Flips) {
  ASSERT_TRUE(DataPresent(dir()));
  Harness gpu(MakeRunner(Options(dir(), "cuda")));
  Harness cpu(MakeRunner(Options(dir(), "cpu")));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const nlohmann::json g = ReadJson(dir() + "/golden.json");
  const std::vector<int32_t> prompt = Ids(g["greedy_prompt"]), expected = Ids(g["greedy_ids"]);
  EXPECT_TRUE(GreedyAgrees(GetParam(), prompt, expected, gpu.Greedy(prompt, 40), cpu, gpu));
}

TEST_P(CudaTinyRandomTest, DecodeStepsThroughGraphsMatchOnePrefill) {
  ASSERT_TRUE(DataPresent(dir()));
  Harness h(MakeRunner(Options(dir(), "cuda")));
  ASSERT_TRUE(h.ok());
  const std::vector<int32_t> ids = Ids(ReadJson(dir() + "/golden.json")["input_ids"][0]);
  const std::vector<float> full = h.Run({{h.AddSequence(), ids, true}});
  const int seq = h.AddSequence();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<float> row = h.Run({{seq, {ids[i]}, false}});
    EXPECT_LE(RelError(row, Row(full, static_cast<int64_t>(i), h.vocab())), kBf16RelTolerance)
        << "position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, CudaTinyRandomTest,
                         ::testing::Values("llama3", "llama-linear", "qwen2", "qwen3", "mistral"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ---- (d) Llama-3.1-8B shapes with random weights, end to end ----

TEST(DummyShapesTest, Llama8BShapedModelServesRequestsEndToEnd) {
  const std::string dir = ShapesDir() + "/llama-3.1-8b";
  ASSERT_TRUE(DataPresent(dir + "/config.json"));
  EngineOptions o;
  o.model_dir = dir;
  o.device = "cuda";
  o.load_format = "dummy";
  o.max_model_len = 4096;
  o.max_num_seqs = 32;
  auto created = Engine::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<Engine> engine = std::move(*created);
  EXPECT_GT(engine->Stats().kv_blocks_total, 0);
  ASSERT_TRUE(engine->Start().ok());
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<int32_t>> ids;
  std::map<RequestId, absl::Status> done;
  std::mt19937 rng(7);
  std::vector<RequestId> submitted;
  for (int i = 0; i < 6; ++i) {
    GenerateRequest r;
    for (int t = 0; t < 100 + 150 * i; ++t) r.prompt_ids.push_back(rng() % 128000);
    r.params.max_tokens = 16;
    r.params.ignore_eos = true;
    r.params.temperature = i % 2 == 0 ? 0.0f : 0.7f;
    if (i == 3) r.params.seed = 5;
    if (i == 4) r.params.logprobs = 2;
    auto id = engine->Submit(std::move(r), [&](RequestOutput&& out) {
      std::lock_guard lock(mu);
      for (const GeneratedToken& t : out.tokens) ids[out.id].push_back(t.id);
      if (out.finished) {
        done[out.id] = out.status;
        cv.notify_all();
      }
    });
    ASSERT_TRUE(id.ok()) << id.status();
    submitted.push_back(*id);
  }
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::minutes(5), [&] { return done.size() == 6; }));
  }
  for (RequestId id : submitted) {
    EXPECT_TRUE(done[id].ok()) << done[id];
    ASSERT_EQ(ids[id].size(), 16u);
    for (int32_t t : ids[id]) EXPECT_TRUE(t >= 0 && t < 128256) << t;
  }
  engine->Stop();
}

// ---- (f) round graphs: verification steps replay CUDA graphs (issue 16, point 4) ----

// Codepair's target with rows for 16 sequences of up to 16 verified positions each.
std::unique_ptr<ModelRunner> RoundRunner(bool eager) {
  RunnerOptions o = Options(ModelDir("codepair/target"), "cuda");
  o.enforce_eager = eager;
  o.max_sample_rows = 256;
  return MakeRunner(o);
}

CudaRunner::GraphStats StatsOf(ModelRunner& r) { return static_cast<CudaRunner&>(r).graph_stats(); }

std::vector<std::vector<int32_t>> GoldenPrompts() {
  std::vector<std::vector<int32_t>> out;
  // Held in a local: a range-for over ReadJson(...)["target"] would outlive its temporary.
  const nlohmann::json golden = ReadJson(ModelDir("codepair/golden.json"));
  for (const auto& e : golden["target"]) {
    out.push_back(Ids(e["prompt_ids"]));
  }
  return out;
}

// What one verification step of `r` gives, and the logits of every position of its chunks
// (Forward with all_logits over the same chunks first: [sum of K_i + 1, vocab]).
struct RoundOutcome {
  std::vector<float> logits;
  std::vector<GreedyVerifyResult> results;
};

// Row i verifies drafts[i] after prompts[i] (whose last token starts the chunk), in fresh
// sequences of `r`: greedy rows, or temperature-1 rows seeded seed + i (deterministic drafts:
// one-hot q).
RoundOutcome RunRound(ModelRunner& r, const std::vector<std::vector<int32_t>>& prompts,
                      const std::vector<std::vector<int32_t>>& drafts, bool sampled,
                      uint64_t seed) {
  const size_t n = prompts.size();
  BlockAllocator allocator(r.num_kv_blocks());
  std::vector<BlockTable> tables;
  std::vector<std::vector<int32_t>> chunks(n);
  std::vector<TokenHistory> histories(n);
  std::vector<SequenceInput> prefill, batch;
  SamplingParams params;
  params.temperature = sampled ? 1.0f : 0.0f;
  Sampler sampler(params, 1);
  for (size_t i = 0; i < n; ++i) {
    tables.emplace_back(r.block_size());
    const auto len = static_cast<int32_t>(prompts[i].size() + drafts[i].size());
    EXPECT_TRUE(tables.back().EnsureCapacity(len, allocator).ok());
    histories[i].AddPrompt(prompts[i]);
    chunks[i] = {prompts[i].back()};
    chunks[i].insert(chunks[i].end(), drafts[i].begin(), drafts[i].end());
  }
  for (size_t i = 0; i < n; ++i) {
    const auto start = static_cast<int32_t>(prompts[i].size()) - 1;
    prefill.push_back(
        {std::span<const int32_t>(prompts[i]).first(start), 0, tables[i].ids(), false});
    batch.push_back({chunks[i], start, tables[i].ids(), /*all_logits=*/true});
  }
  RoundOutcome out;
  std::vector<float> ignored;
  absl::Status s;
  for (const SequenceInput& p : prefill) {  // one prompt at a time: the batch may not fit
    s = r.Forward({&p, 1}, &ignored);
    EXPECT_TRUE(s.ok()) << s;
  }
  s = r.Forward(batch, &out.logits);
  EXPECT_TRUE(s.ok()) << s;
  std::vector<SampleRow> rows(n);
  std::vector<std::span<const int32_t>> spans;
  for (size_t i = 0; i < n; ++i) {
    batch[i].all_logits = false;
    rows[i].chunk = static_cast<int32_t>(i);
    rows[i].sampler = &sampler;
    rows[i].params = &params;
    rows[i].history = &histories[i];
    rows[i].seed = seed + i;
    spans.emplace_back(drafts[i]);
  }
  const std::vector<DraftProbs> probs(n);
  s = sampled ? r.StepSampledVerify(batch, rows, spans, probs, &out.results)
              : r.StepGreedyVerify(batch, rows, spans, &out.results);
  EXPECT_TRUE(s.ok()) << s;
  out.results.resize(n);
  for (BlockTable& t : tables) EXPECT_TRUE(t.Release(allocator).ok());
  return out;
}

// Verification batches of 1 to 13 sequences (graph buckets 1, 4, 8 and 16) with K varying per
// row and from step to step (1 to 7 drafts, wrong at varying positions, a draftless row), built
// from codepair's greedy continuations.
struct RoundCase {
  std::vector<std::vector<int32_t>> prompts, drafts;
};
RoundCase MakeRoundCase(int n, int shift, bool plant_errors,
                        const std::vector<std::vector<int32_t>>& golden,
                        const std::vector<std::vector<int32_t>>& truth, int32_t vocab) {
  constexpr int kK[] = {1, 2, 3, 4, 7};
  RoundCase c;
  for (int i = 0; i < n; ++i) {
    const size_t p = static_cast<size_t>(i) % golden.size();
    const int k = i == 2 ? 0 : kK[(i + shift) % 5];
    c.prompts.push_back(golden[p]);
    c.drafts.emplace_back(truth[p].begin(), truth[p].begin() + k);
    const int wrong = (i + shift) % (k + 2);  // k or k + 1: every draft right
    if (plant_errors && wrong < k) c.drafts.back()[wrong] = (c.drafts.back()[wrong] + 1) % vocab;
  }
  return c;
}

const int kRoundCases[][2] = {{1, 3}, {3, 0}, {8, 1}, {13, 2}, {3, 4}, {1, 3}};  // {n, shift}

// Greedy verification through round graphs gives the eager runner's accepted lengths and tokens,
// except where bf16 noise between the two runs explains a flip (GreedyAgrees' rule: at the first
// position where they differ, the eager margin for its token is at most twice the largest
// |graph - eager| logit difference of that row); the logits of the same chunks agree at bf16
// tolerance; every verification step replays a round graph; a repeated shape reuses its graph.
TEST(RoundGraphTest, GreedyVerificationThroughGraphsEqualsEager) {
  ASSERT_TRUE(DataPresent(ModelDir("codepair/target")));
  auto graph = RoundRunner(/*eager=*/false);
  Harness eager(RoundRunner(/*eager=*/true));
  ASSERT_TRUE(graph && eager.ok());
  ASSERT_FALSE(static_cast<CudaRunner&>(*graph).graph_batch_sizes().empty());
  const int32_t vocab = graph->config().vocab_size;
  const std::vector<std::vector<int32_t>> golden = GoldenPrompts();
  ASSERT_FALSE(golden.empty());
  std::vector<std::vector<int32_t>> truth;
  for (const auto& p : golden) truth.push_back(eager.Greedy(p, 8));
  int rows = 0, flips = 0;
  int32_t graphs_before_repeat = 0;
  for (size_t c = 0; c < std::size(kRoundCases); ++c) {
    const auto [n, shift] = kRoundCases[c];
    const RoundCase rc = MakeRoundCase(n, shift, /*plant_errors=*/true, golden, truth, vocab);
    if (c + 1 == std::size(kRoundCases)) graphs_before_repeat = StatsOf(*graph).round_graphs;
    const CudaRunner::GraphStats before = StatsOf(*graph);
    const RoundOutcome a = RunRound(*graph, rc.prompts, rc.drafts, false, 0);
    const RoundOutcome b = RunRound(eager.runner(), rc.prompts, rc.drafts, false, 0);
    const CudaRunner::GraphStats after = StatsOf(*graph);
    // The chunks' Forward and the verification step, at least.
    EXPECT_GE(after.round_launches - before.round_launches, 2) << "batch " << n;
    ASSERT_EQ(a.logits.size(), b.logits.size());
    for (size_t row = 0; row < a.logits.size() / vocab; ++row) {
      EXPECT_LE(RelError(Row(a.logits, row, vocab), Row(b.logits, row, vocab)), kBf16RelTolerance)
          << "batch " << n << " logits row " << row;
    }
    for (int i = 0, first = 0; i < n; first += static_cast<int>(rc.drafts[i].size()) + 1, ++i) {
      ++rows;
      const GreedyVerifyResult &g = a.results[i], &e = b.results[i];
      if (g.num_accepted == e.num_accepted && g.next.id == e.next.id) continue;
      const int j = std::min(g.num_accepted, e.num_accepted);
      const int32_t g_token = g.num_accepted > j ? rc.drafts[i][j] : g.next.id;
      const int32_t e_token = e.num_accepted > j ? rc.drafts[i][j] : e.next.id;
      const auto gr = Row(a.logits, first + j, vocab), er = Row(b.logits, first + j, vocab);
      const double margin = double{er[e_token]} - er[g_token];
      const double error = MaxAbsDiff(gr, er);
      ++flips;
      std::printf(
          "[ round graphs ] batch %d row %d: graph %d/%d, eager %d/%d; margin %.5f, "
          "error %.5f\n",
          n, i, g.num_accepted, g.next.id, e.num_accepted, e.next.id, margin, error);
      EXPECT_LE(margin, 2 * error) << "batch " << n << " row " << i;
    }
  }
  EXPECT_EQ(StatsOf(*graph).round_graphs, graphs_before_repeat) << "a repeated shape recaptured";
  EXPECT_EQ(StatsOf(eager.runner()).round_launches + StatsOf(eager.runner()).decode_launches, 0);
  const CudaRunner::GraphStats s = StatsOf(*graph);
  std::printf(
      "[ round graphs ] %d rows, %d bf16 flips; %lld round replays, %d round graphs "
      "holding %lld bytes\n",
      rows, flips, static_cast<long long>(s.round_launches), s.round_graphs,
      static_cast<long long>(s.round_graph_bytes));
}

// Seeded sampled verification through round graphs: the same seeds give the same outcomes when
// replayed, and the eager runner's outcomes on all but a few rows (bf16 noise can move p across
// an acceptance test's uniform).
TEST(RoundGraphTest, SeededSampledVerificationThroughGraphsRepeatsAndFollowsEager) {
  ASSERT_TRUE(DataPresent(ModelDir("codepair/target")));
  auto graph = RoundRunner(/*eager=*/false);
  Harness eager(RoundRunner(/*eager=*/true));
  ASSERT_TRUE(graph && eager.ok());
  const int32_t vocab = graph->config().vocab_size;
  const std::vector<std::vector<int32_t>> golden = GoldenPrompts();
  ASSERT_FALSE(golden.empty());
  std::vector<std::vector<int32_t>> truth;
  for (const auto& p : golden) truth.push_back(eager.Greedy(p, 8));
  int rows = 0, agree = 0;
  for (size_t c = 0; c < std::size(kRoundCases); ++c) {
    const auto [n, shift] = kRoundCases[c];
    const RoundCase rc = MakeRoundCase(n, shift, /*plant_errors=*/false, golden, truth, vocab);
    const uint64_t seed = 1000 * (c + 1);
    const int64_t launches = StatsOf(*graph).round_launches;
    const RoundOutcome a = RunRound(*graph, rc.prompts, rc.drafts, true, seed);
    const RoundOutcome again = RunRound(*graph, rc.prompts, rc.drafts, true, seed);
    const RoundOutcome b = RunRound(eager.runner(), rc.prompts, rc.drafts, true, seed);
    EXPECT_GE(StatsOf(*graph).round_launches - launches, 4) << "batch " << n;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(a.results[i].num_accepted, again.results[i].num_accepted) << "batch " << n;
      EXPECT_EQ(a.results[i].next.id, again.results[i].next.id) << "batch " << n;
      ++rows;
      agree += a.results[i].num_accepted == b.results[i].num_accepted &&
               a.results[i].next.id == b.results[i].next.id;
    }
  }
  std::printf("[ round graphs, sampled ] %d of %d rows as eager\n", agree, rows);
  EXPECT_GE(agree, rows * 9 / 10);
}

// ---- (e) out of memory ----

TEST(CudaOomTest, WeightsThatDoNotFitAreResourceExhausted) {
  const std::string dir = ShapesDir() + "/llama-3.1-8b";
  ASSERT_TRUE(DataPresent(dir + "/config.json"));
  RunnerOptions o = Options(dir, "cuda");
  o.load_format = "dummy";
  o.kv_cache_bytes = 0;
  o.gpu_memory_utilization = 0.05;  // 4-7 GB of an H100/H200: less than 16 GB of weights
  auto runner = CreateModelRunner(o);
  ASSERT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted) << runner.status();
  EXPECT_NE(runner.status().message().find("model weights need"), std::string::npos);
  std::printf("%s\n", runner.status().ToString().c_str());
}

TEST(CudaOomTest, KvCacheThatDoesNotFitIsResourceExhaustedAndTheGpuStaysUsable) {
  const std::string dir = ModelDir("codepair/target");
  ASSERT_TRUE(DataPresent(dir));
  RunnerOptions o = Options(dir, "cuda");
  o.kv_cache_bytes = int64_t{1} << 50;
  auto explicit_kv = CreateModelRunner(o);
  ASSERT_EQ(explicit_kv.status().code(), absl::StatusCode::kResourceExhausted)
      << explicit_kv.status();
  EXPECT_NE(explicit_kv.status().message().find("KV cache"), std::string::npos);
  std::printf("%s\n", explicit_kv.status().ToString().c_str());
  o.kv_cache_bytes = 0;
  o.gpu_memory_utilization = 0.001;  // below what the CUDA context alone holds
  auto tiny = CreateModelRunner(o);
  ASSERT_EQ(tiny.status().code(), absl::StatusCode::kResourceExhausted) << tiny.status();
  std::printf("%s\n", tiny.status().ToString().c_str());
  o.gpu_memory_utilization = 0.9;  // after both failures a normal load still works
  auto ok = CreateModelRunner(o);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// ---- the standalone EAGLE-3 head (SSD's speculator) ----

// SSD's speculator ranks the candidates of every pass (Eagle3Compute::PrefetchCandidates): the
// ranking rides on the pass and comes back with its ids. It must equal the ranking made after the
// pass (TopCandidates alone), for the k prefetched, and another k still ranks afresh.
TEST(StandaloneEagle3CudaTest, PrefetchedCandidatesEqualTheOnesRankedAfterThePass) {
  const std::string head = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  ASSERT_TRUE(DataPresent(head));
  ASSERT_TRUE(DataPresent(ModelDir("codepair/target")));
  StandaloneEagle3Options o;
  o.dir = head;
  o.target_dir = ModelDir("codepair/target");
  o.device = "cuda:0";
  o.max_model_len = 512;
  o.kv_cache_bytes = int64_t{64} << 20;
  auto compute = CreateStandaloneEagle3Compute(o);
  ASSERT_TRUE(compute.ok()) << compute.status();
  Eagle3Compute& c = **compute;
  ASSERT_TRUE(c.RanksOnDevice());
  constexpr int32_t kSeqs = 4;
  const int64_t width =
      static_cast<int64_t>(c.config().aux_layer_ids.size()) * c.config().target_hidden_size;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> capture(static_cast<size_t>(kSeqs * width));
  for (float& x : capture) x = normal(rng);
  ASSERT_TRUE(c.SetHostCapture(capture).ok());
  std::vector<int32_t> capture_rows, pool_rows;
  for (int32_t i = 0; i < kSeqs; ++i) {
    capture_rows.push_back(i);
    pool_rows.push_back(i * kEagle3PoolWindow);
  }
  ASSERT_TRUE(c.Fuse(capture_rows, pool_rows).ok());
  std::vector<std::vector<int32_t>> tables(kSeqs);
  std::vector<Eagle3Compute::Row> rows(kSeqs);
  for (int32_t i = 0; i < kSeqs; ++i) {
    tables[i] = {i};
    rows[i].seq = i;
    rows[i].token = 11 + 5 * i;
    rows[i].position = 0;
    rows[i].hidden = pool_rows[i];
    rows[i].logits = true;
    rows[i].block_table = tables[i];
  }
  const std::vector<uint8_t> on_device(kSeqs, 0);
  auto pass = [&](int32_t prefetch, int32_t k, std::vector<int32_t>* ids,
                  std::vector<float>* logprobs) {
    std::vector<int32_t> argmax;
    std::vector<float> logits;
    c.PrefetchCandidates(prefetch);
    ASSERT_TRUE(c.Forward(rows, on_device, &argmax, &logits).ok());
    c.PrefetchCandidates(0);
    ASSERT_TRUE(c.TopCandidates(k, ids, logprobs).ok());
    ASSERT_EQ(ids->size(), size_t{kSeqs} * k);
    for (int32_t i = 0; i < kSeqs; ++i) EXPECT_EQ((*ids)[size_t(i) * k], argmax[i]) << i;
  };
  std::vector<int32_t> after_ids, prefetched_ids, other_ids;
  std::vector<float> after_lp, prefetched_lp, other_lp;
  pass(0, 4, &after_ids, &after_lp);
  pass(4, 4, &prefetched_ids, &prefetched_lp);
  EXPECT_EQ(prefetched_ids, after_ids);
  EXPECT_EQ(prefetched_lp, after_lp);
  pass(4, 2, &other_ids, &other_lp);  // prefetched 4, asked 2: ranked afresh
  for (int32_t i = 0; i < kSeqs; ++i) {
    for (int32_t j = 0; j < 2; ++j) {
      EXPECT_EQ(other_ids[size_t(i) * 2 + j], after_ids[size_t(i) * 4 + j]) << i << "," << j;
    }
  }
}

// SSD's speculator drafts a miss as one ranked round on the device (the catch-up and K - 1 steps
// in one graph, every step's candidates and prenorm rows kept) where nothing may stop it between
// passes. Its drafts and candidates equal the ones the passes give one at a time (a `stop` that
// never stops forces those), and so does a branch forked from its drafts afterwards, which reads
// the prenorm rows the round kept.
TEST(StandaloneEagle3CudaTest, ARankedRoundDraftsAsThePassesDoAndKeepsTheirRows) {
  const std::string head = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  const std::string target = ModelDir("codepair/target");
  ASSERT_TRUE(DataPresent(head));
  ASSERT_TRUE(DataPresent(target));
  const nlohmann::json config = ReadJson(target + "/config.json");
  const auto vocab = config["vocab_size"].get<int32_t>();
  auto round =
      CreateEagle3CacheDrafter(head, target, "cuda:0", vocab, 512, false, int64_t{64} << 20);
  auto passes =
      CreateEagle3CacheDrafter(head, target, "cuda:0", vocab, 512, false, int64_t{64} << 20);
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_TRUE(passes.ok()) << passes.status();
  const int64_t width = config["hidden_size"].get<int64_t>() * 3;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<int32_t> context(24);
  for (int32_t& t : context) t = token(rng);
  std::vector<float> rows(static_cast<size_t>(context.size() - 1) * width);
  for (float& x : rows) x = normal(rng);
  SamplingParams greedy;
  greedy.temperature = 0;
  TokenHistory history;
  constexpr int32_t kK = 5;
  auto draft = [&](Eagle3CacheDrafter& d, uint64_t seq, const std::vector<int32_t>& tokens,
                   bool one_at_a_time) {
    DraftInput in;
    in.seq_id = seq;
    in.tokens = tokens;
    in.num_draft_tokens = kK;
    in.params = &greedy;
    in.history = &history;
    CacheDrafter::CacheDraftOptions cache;
    cache.num_candidates = 4;
    std::vector<Draft> out;
    const std::function<bool()> never = [] { return false; };
    EXPECT_TRUE(d.Propose({&in, 1}, {&cache, 1}, &out, one_at_a_time ? never : nullptr).ok());
    return out.at(0);
  };
  // The prompt (its catch-up is too long for a round graph), then a verified outcome: two drafts
  // accepted and a bonus token, their target rows sent, a catch-up of 3 rows: the round.
  Draft first[2], second[2];
  for (int which = 0; which < 2; ++which) {
    Eagle3CacheDrafter& d = which == 0 ? **round : **passes;
    ASSERT_TRUE(d.AddTargetRows(1, context, 0, rows).ok());
    first[which] = draft(d, 1, context, which == 1);
  }
  ASSERT_EQ(first[0].tokens, first[1].tokens);
  EXPECT_EQ(first[0].candidates, first[1].candidates);
  std::vector<int32_t> next = context;
  next.insert(next.end(), first[0].tokens.begin(), first[0].tokens.begin() + 2);
  next.push_back(token(rng));
  std::vector<float> more(3 * static_cast<size_t>(width));
  for (float& x : more) x = normal(rng);
  const int64_t captured = (*round)->graphs_captured();
  for (int which = 0; which < 2; ++which) {
    Eagle3CacheDrafter& d = which == 0 ? **round : **passes;
    ASSERT_TRUE(d.AddTargetRows(1, next, static_cast<int32_t>(context.size()) - 1, more).ok());
    second[which] = draft(d, 1, next, which == 1);
  }
  EXPECT_EQ((*round)->rounds_on_device(), 1) << "the second Propose, and only it, is a round";
  EXPECT_GT((*round)->graphs_captured(), captured) << "its graph was captured (SSD's b* skips it)";
  EXPECT_EQ((*passes)->rounds_on_device(), 0);
  EXPECT_EQ(second[0].tokens, second[1].tokens);
  EXPECT_EQ(second[0].candidates, second[1].candidates);
  ASSERT_EQ(second[0].tokens.size(), size_t{kK});
  // A branch for outcome (3, the second candidate at position 4), drafted one pass at a time on
  // both: it forks from the rows each kept for the drafts.
  std::vector<int32_t> branch = next;
  branch.insert(branch.end(), second[0].tokens.begin(), second[0].tokens.begin() + 3);
  branch.push_back(second[0].candidates.at(3 * 4 + 1));
  Draft forked[2];
  for (int which = 0; which < 2; ++which) {
    Eagle3CacheDrafter& d = which == 0 ? **round : **passes;
    ASSERT_TRUE(d.Fork(1, 50, static_cast<int32_t>(next.size()) + 3).ok());
    forked[which] = draft(d, 50, branch, true);
  }
  EXPECT_EQ(forked[0].tokens, forked[1].tokens);
  EXPECT_EQ(forked[0].candidates, forked[1].candidates);
}

TEST(CudaDeviceTest, AMissingGpuIsInvalidArgument) {
  RunnerOptions o = Options(ModelDir("codepair/target"), "cuda:97");
  EXPECT_EQ(CreateModelRunner(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) {
  return specd::cuda_test::RunUnlessNoGpu(argc, argv, "cuda_runner_test");
}
