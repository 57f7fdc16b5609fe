// SsdWorker in process (no sockets): the speculation cache serves exactly the drafts the draft
// model would make from scratch for the outcome that happened (greedy: branches forked from the
// sequence's KV compute the same thing as a fresh sequence), misses re-draft, hits chain over
// rounds, the backup tier serves large batches, and every KV block comes back at the end.
#include "engine/speculation/ssd/ssd_worker.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <set>
#include <span>
#include <string>
#include <thread>

#include "engine/distributed/tcp_channel.h"
#include "engine/speculation/draft_model.h"
#include "engine/speculation/ngram.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

const std::string kDraft = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";
constexpr int32_t kK = 4;

RunnerOptions DraftRunner() {
  RunnerOptions r;
  r.model_dir = kDraft;
  r.device = "cpu";
  r.num_threads = 2;
  r.max_model_len = 512;
  r.kv_cache_bytes = int64_t{16} << 20;
  return r;
}

std::unique_ptr<SsdWorker> MakeWorker(const std::string& extra = "",
                                      const std::string& fan_out_mode = "constant") {
  SsdWorkerOptions o;
  auto config = ParseSpeculativeConfig(R"({"method": "ssd", "model": ")" + kDraft +
                                       R"(", "fan_out": 3, "fan_out_mode": ")" + fan_out_mode +
                                       "\"" + extra + "}");
  EXPECT_TRUE(config.ok()) << config.status();
  o.config = *config;
  o.draft = DraftRunner();
  o.max_num_seqs = 16;
  o.max_model_len = 512;
  auto w = SsdWorker::Create(o);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

// What a fresh draft model proposes greedily after `tokens` (K drafts, and the top candidates
// at each drafted position).
Draft Fresh(const std::vector<int32_t>& tokens, int32_t num_candidates = 8,
            int32_t num_drafts = kK) {
  auto runner = CreateModelRunner(DraftRunner());
  EXPECT_TRUE(runner.ok());
  const int32_t vocab = (*runner)->config().vocab_size;
  auto d = DraftModelSpeculator::Create(*std::move(runner), vocab, 2048);
  EXPECT_TRUE(d.ok());
  SamplingParams greedy;
  greedy.temperature = 0;
  TokenHistory history;
  DraftInput in;
  in.seq_id = 1;
  in.tokens = tokens;
  in.num_draft_tokens = num_drafts;
  in.params = &greedy;
  in.history = &history;
  DraftModelSpeculator::CacheDraftOptions cache;
  cache.num_candidates = num_candidates;
  std::vector<Draft> out;
  EXPECT_TRUE((*d)->Propose({&in, 1}, {&cache, 1}, &out).ok());
  return out.at(0);
}

std::vector<int32_t> Prompt() {
  std::ifstream in(std::string(SPECD_SHARED_DIR) + "/models/codepair/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return j["target"][0]["prompt_ids"].get<std::vector<int32_t>>();
}

SpeculateSeq Seq(uint64_t id, uint8_t flags, int32_t accepted) {
  SpeculateSeq m;
  m.seq_id = id;
  m.flags = flags;
  m.accepted_len = static_cast<uint16_t>(accepted);
  m.num_draft_tokens = kK;
  m.fan_out = 3;
  return m;
}

std::vector<int32_t> TokensOf(const SpeculateResponse& r, size_t i) {
  const auto t = r.TokensOf(r.drafts.at(i));
  return {t.begin(), t.end()};
}

// Round 1 of sequence 7 (new, `prompt`): nothing is cached, the primary drafts. Its drafts.
std::vector<int32_t> FirstRound(SsdWorker& w, const std::vector<int32_t>& prompt,
                                SpeculateRequest* req, SpeculateResponse* resp) {
  req->Clear();
  req->round_id = 1;
  req->AddSeq(Seq(7, kSeqNew, 0), prompt);
  EXPECT_TRUE(w.Handle(*req, resp).ok());
  EXPECT_EQ(resp->drafts.size(), 1u);
  EXPECT_EQ(resp->drafts.at(0).status, DraftStatus::kMissPrimary);  // nothing cached yet
  return TokensOf(*resp, 0);
}

// A miss waits for K passes of the draft model, not K + 1: its response carries the K drafts, and
// the row for k = K (the outcome where the verifier accepts all of them) comes with the build's
// first pass, so that outcome still hits.
TEST(SsdWorkerTest, AMissRepliesAfterKPassesAndTheBuildStillCachesAllAccepted) {
  auto w = MakeWorker();
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  const std::vector<int32_t> d = FirstRound(*w, prompt, &req, &resp);
  const Draft fresh = Fresh(prompt, 3, kK + 1);
  ASSERT_EQ(d, std::vector<int32_t>(fresh.tokens.begin(), fresh.tokens.begin() + kK));
  ASSERT_TRUE(w->BuildCache().ok());
  EXPECT_EQ(w->stats().branches, 15) << "F 3 at each of K + 1 = 5 acceptance lengths";
  // All K accepted, then the draft's second-best candidate at position K + 1.
  const int32_t bonus = fresh.candidates.at(size_t{kK} * 3 + 1);
  ASSERT_NE(bonus, fresh.tokens.at(kK));
  std::vector<int32_t> outcome = d;
  outcome.push_back(bonus);
  req.Clear();
  req.round_id = 2;
  req.AddSeq(Seq(7, 0, kK), outcome);
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  EXPECT_EQ(resp.drafts.at(0).status, DraftStatus::kHit);
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), outcome.begin(), outcome.end());
  EXPECT_EQ(TokensOf(resp, 0), Fresh(context).tokens);
}

// A drafter that says it captured a CUDA graph during its next Propose, which then takes 1.5 s
// (a first capture's cost, exaggerated so that no scheduling stall of a loaded CI machine comes
// near it); otherwise the draft model's.
class CapturingDrafter : public CacheDrafter {
 public:
  explicit CapturingDrafter(std::unique_ptr<CacheDrafter> inner, bool* capture_next)
      : inner_(std::move(inner)), capture_next_(capture_next) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_model_len() const override { return inner_->max_model_len(); }
  std::string device_name() const override { return inner_->device_name(); }
  int32_t max_rows_per_pass() const override { return inner_->max_rows_per_pass(); }
  absl::Status Propose(std::span<const DraftInput> inputs, std::span<const CacheDraftOptions> cache,
                       std::vector<Draft>* drafts, const std::function<bool()>& stop) override {
    if (*capture_next_) {
      *capture_next_ = false;
      ++captured_;
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    }
    return inner_->Propose(inputs, cache, drafts, stop);
  }
  absl::Status Fork(uint64_t parent, uint64_t child, int32_t num_tokens) override {
    return inner_->Fork(parent, child, num_tokens);
  }
  absl::Status Adopt(uint64_t parent, uint64_t child) override {
    return inner_->Adopt(parent, child);
  }
  void Release(uint64_t seq_id) override { inner_->Release(seq_id); }
  int32_t num_free_blocks() const override { return inner_->num_free_blocks(); }
  int32_t num_total_blocks() const override { return inner_->num_total_blocks(); }
  int64_t graphs_captured() const override { return captured_; }

 private:
  std::unique_ptr<CacheDrafter> inner_;
  bool* capture_next_;
  int64_t captured_ = 0;
};

// b* times a primary re-draft only when it captured no graph: a first capture (tens of replays'
// time) taken as the first sample would make the primary look slow enough to send every later
// miss to the backup, which never times the primary again.
TEST(SsdWorkerTest, ARedraftThatCapturedAGraphIsNoSampleOfThePrimarysTime) {
  SsdWorkerOptions o;
  auto config = ParseSpeculativeConfig(R"({"method": "ssd", "model": ")" + kDraft +
                                       R"(", "num_speculative_tokens": 4, "fan_out": 3})");
  ASSERT_TRUE(config.ok()) << config.status();
  o.config = *config;
  o.draft = DraftRunner();
  o.max_num_seqs = 16;
  o.max_model_len = 512;
  bool capture_next = false;
  o.wrap_drafter = [&](std::unique_ptr<CacheDrafter> inner) -> std::unique_ptr<CacheDrafter> {
    return std::make_unique<CapturingDrafter>(std::move(inner), &capture_next);
  };
  auto w = SsdWorker::Create(o);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  FirstRound(**w, prompt, &req, &resp);  // a new sequence's re-draft: no sample either
  EXPECT_EQ((*w)->tier_seconds().primary, 0.0);
  // No cache was built, so every outcome misses: one re-draft that captures, then one that does
  // not.
  for (int round = 2; round <= 3; ++round) {
    capture_next = round == 2;
    req.Clear();
    req.round_id = static_cast<uint64_t>(round);
    req.AddSeq(Seq(7, 0, 0), std::vector<int32_t>{prompt.at(static_cast<size_t>(round))});
    ASSERT_TRUE((*w)->Handle(req, &resp).ok());
    ASSERT_EQ(resp.drafts.at(0).status, DraftStatus::kMissPrimary);
    if (round == 2) {
      EXPECT_EQ((*w)->tier_seconds().primary, 0.0) << "the capturing pass counted";
    }
  }
  EXPECT_GT((*w)->tier_seconds().primary, 0.0);
  // The other re-draft (a few passes of the tiny draft model) takes milliseconds; 1 s is far from
  // both it and the capturing pass's 1.5 s.
  EXPECT_LT((*w)->tier_seconds().primary, 1.0) << "the capturing pass counted";
}

// A build cut short (the verifier's next request came) keeps its unfinished branches: a hit on
// one resumes it from the drafts it has, and the drafts equal a fresh sequence's.
TEST(SsdWorkerTest, AnUnfinishedBranchResumesOnAHit) {
  auto w = MakeWorker();
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  const std::vector<int32_t> d = FirstRound(*w, prompt, &req, &resp);
  // One check before the wave, then one before each pass: the catch-up pass and one decode
  // pass run (two drafts per branch of the K + 1 = 5 wanted), then the build stops.
  int checks = 0;
  ASSERT_TRUE(w->BuildCache([&] { return ++checks > 3; }).ok());
  EXPECT_EQ(w->stats().branches, 15) << "every branch of the wave is kept, unfinished";
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), d.begin(), d.begin() + 1);
  const int32_t bonus = Fresh(context, 3).candidates.at(1);
  ASSERT_NE(bonus, d[1]);
  req.Clear();
  req.round_id = 2;
  const std::vector<int32_t> outcome = {d[0], bonus};
  req.AddSeq(Seq(7, 0, 1), outcome);
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  context.push_back(bonus);
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kHit);
  EXPECT_EQ(w->stats().hits_partial, 1);
  EXPECT_EQ(TokensOf(resp, 0), Fresh(context).tokens) << "a resumed branch equals a fresh draft";
  w->Drop(7);
  EXPECT_EQ(w->draft_free_blocks(), w->draft_total_blocks());
}

TEST(SsdWorkerTest, CacheHitsServeExactlyTheDraftsOfAFreshSequence) {
  auto w = MakeWorker();
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  const std::vector<int32_t> d = FirstRound(*w, prompt, &req, &resp);
  ASSERT_EQ(d, Fresh(prompt).tokens);
  ASSERT_TRUE(w->BuildCache().ok());
  EXPECT_GT(w->stats().branches, 0);

  // Outcome: 2 drafts accepted, then the draft's second choice at position 3 (cached: F = 3).
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), d.begin(), d.begin() + 2);
  const Draft at3 = Fresh(context, 3);
  const int32_t bonus = at3.candidates.at(1);  // candidates[0][1]: row 0 of the fresh run
  ASSERT_NE(bonus, d[2]);
  std::vector<int32_t> fresh = {d[0], d[1], bonus};
  req.Clear();
  req.round_id = 2;
  req.AddSeq(Seq(7, 0, 2), fresh);
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  context.push_back(bonus);
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kHit);
  EXPECT_EQ(TokensOf(resp, 0), Fresh(context).tokens) << "a hit must equal a fresh draft";
  ASSERT_TRUE(w->BuildCache().ok());

  // Hits chain: all K accepted and the bonus token is the draft's own first choice after them.
  const std::vector<int32_t> d2 = TokensOf(resp, 0);
  std::vector<int32_t> all = context;
  all.insert(all.end(), d2.begin(), d2.end());
  const int32_t bonus2 = Fresh(all, 3).candidates.at(0);
  fresh = d2;
  fresh.push_back(bonus2);
  req.Clear();
  req.round_id = 3;
  req.AddSeq(Seq(7, 0, kK), fresh);
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  all.push_back(bonus2);
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kHit);
  EXPECT_EQ(TokensOf(resp, 0), Fresh(all).tokens);
  ASSERT_TRUE(w->BuildCache().ok());

  // A miss: a bonus token no cache entry has (the draft's 8th choice) is re-drafted.
  const std::vector<int32_t> d3 = TokensOf(resp, 0);
  const int32_t rare = Fresh(all, 8).candidates.at(7);
  req.Clear();
  req.round_id = 4;
  req.AddSeq(Seq(7, 0, 0), std::vector<int32_t>{rare});
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  all.push_back(rare);
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kMissPrimary);
  EXPECT_EQ(TokensOf(resp, 0), Fresh(all).tokens);
  ASSERT_TRUE(w->BuildCache().ok());

  w->Drop(7);
  EXPECT_EQ(w->draft_free_blocks(), w->draft_total_blocks()) << "KV blocks leaked";
}

// The rank behind the power-law exponent r counts the candidates the cache holds: a greedy
// draft leads its own candidate row and the cache skips it (a rejected draft is never the bonus
// token), so the draft's second choice is the cache's first, held at fan-out 1.
TEST(SsdWorkerTest, BonusRankCountsOnlyTheCandidatesTheCacheHolds) {
  auto w = MakeWorker();
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  const std::vector<int32_t> d = FirstRound(*w, prompt, &req, &resp);
  ASSERT_TRUE(w->BuildCache().ok());
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), d.begin(), d.begin() + 2);
  const Draft at3 = Fresh(context, 3);
  ASSERT_EQ(at3.candidates.at(0), d[2]) << "the draft token leads the row";
  const int32_t bonus = at3.candidates.at(1);
  req.Clear();
  req.round_id = 2;
  req.AddSeq(Seq(7, 0, 2), std::vector<int32_t>{d[0], d[1], bonus});
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kHit);
  ASSERT_EQ(w->outcomes().num_rounds(), 1);
  EXPECT_EQ(w->outcomes().HitRate(1), 1.0) << "rank 0 among the cached candidates, not 1";
  w->Drop(7);
  EXPECT_EQ(w->draft_free_blocks(), w->draft_total_blocks()) << "KV blocks leaked";
}

// Saguaro sampling moves the bonus token onto the ids it down-weights, so those must be the ids
// the cache holds at that position: the same F (the geometric fan-out gives some positions other
// fan-outs than the draft's one F), the same top-F of the same row, the draft token aside (a
// rejected draft is never the bonus token; the cache takes the next candidate in its place).
TEST(SsdWorkerTest, SaguaroDownweightsTheIdsTheCacheHolds) {
  constexpr int32_t kF = 3;
  auto w = MakeWorker("", "geometric");
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  SpeculateSeq m = Seq(7, kSeqNew | kSeqWantProbs, 0);
  m.fan_out = kF;
  m.sampling.temperature = 1.0f;
  m.sampling.seed = 99;
  m.saguaro_c = 0.5f;
  req.round_id = 1;
  req.AddSeq(m, prompt);
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  const std::vector<int32_t> d = TokensOf(resp, 0);
  ASSERT_EQ(d.size(), size_t{kK});
  const auto vocab = static_cast<size_t>(w->vocab_size());
  const std::span<const float> q = resp.ProbsOf(resp.drafts.at(0), static_cast<uint32_t>(vocab));
  ASSERT_EQ(q.size(), d.size() * vocab);
  ASSERT_TRUE(w->BuildCache().ok());

  // p: the draft's row at each position before down-weighting, from a fresh draft model.
  auto runner = CreateModelRunner(DraftRunner());
  ASSERT_TRUE(runner.ok());
  auto fresh = DraftModelSpeculator::Create(*std::move(runner), static_cast<int32_t>(vocab), 2048);
  ASSERT_TRUE(fresh.ok());
  SamplingParams sampled;
  sampled.temperature = 1.0f;
  TokenHistory history;
  for (int32_t k = 0; k < kK; ++k) {
    SCOPED_TRACE(k);
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), d.begin(), d.begin() + k);
    DraftInput in;
    in.seq_id = 100 + static_cast<uint64_t>(k);
    in.tokens = context;
    in.num_draft_tokens = 1;
    in.params = &sampled;
    in.history = &history;
    DraftModelSpeculator::CacheDraftOptions cache;
    cache.num_candidates = 2 * kF;
    std::vector<Draft> out;
    ASSERT_TRUE((*fresh)->Propose({&in, 1}, {&cache, 1}, &out).ok());
    const std::vector<float>& p = out.at(0).probs;
    ASSERT_EQ(p.size(), vocab);
    // Down-weighted: q'/p is C / Z there and 1 / Z elsewhere (C = 0.5).
    const std::span<const float> qk = q.subspan(size_t(k) * vocab, vocab);
    double max_ratio = 0;
    for (size_t t = 0; t < vocab; ++t) {
      if (p[t] > 1e-6f) max_ratio = std::max(max_ratio, double(qk[t]) / p[t]);
    }
    std::set<int32_t> down;
    for (size_t t = 0; t < vocab; ++t) {
      if (p[t] > 1e-6f && double(qk[t]) / p[t] < 0.75 * max_ratio) down.insert(int32_t(t));
    }
    const std::vector<int32_t> top = TopF(p, kF);
    EXPECT_EQ(down, std::set<int32_t>(top.begin(), top.end()));
    const std::vector<int32_t> cached = w->cache().BonusTokens(7, k);
    for (int32_t t : down) {
      if (t == d[k]) continue;
      EXPECT_TRUE(std::binary_search(cached.begin(), cached.end(), t)) << t;
    }
    if (down.count(d[k]) == 0) {
      EXPECT_EQ(std::set<int32_t>(cached.begin(), cached.end()), down);
    }
    std::vector<int32_t> expected = CachedCandidates(out.at(0).candidates, d[k], kF);
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(cached, expected);
    (*fresh)->Release(in.seq_id);
  }
  w->Drop(7);
  EXPECT_EQ(w->draft_free_blocks(), w->draft_total_blocks()) << "KV blocks leaked";
}

// b* from the measured hit rate, at batch 8: 90% of the sequence-rounds hit, so 720 hits in 100
// requests of 8 sequences. Hits per request (7.2) is no probability: read as one, p_hit = 1 and
// the backup tier never takes over, however slow the primary.
TEST(MeasuredCriticalBatchSizeTest, ABatchOfEightAtNinetyPercentHitsSwitchesToTheBackup) {
  SsdWorkerStats stats;
  stats.rounds = 100;
  stats.hits = 720;
  stats.misses_primary = 80;
  const TierSeconds seconds{.verify = 0.02, .primary = 0.01, .backup = 0.0002};
  BatchRoundModel model;
  model.p_hit = 0.9;
  model.e_hit = model.e_miss = ExpectedTokensPerRound(0.8, 7);
  model.e_backup = 1;
  model.t_p = 0.5;
  model.t_b = 0.01;
  const int32_t expected = CriticalBatchSize(model, 16);
  ASSERT_GT(expected, 1);
  ASSERT_LE(expected, 8);
  const int32_t b_star = MeasuredCriticalBatchSize(stats, 0.8, 7, seconds, 16);
  EXPECT_EQ(b_star, expected);
  EXPECT_GE(8, b_star) << "a batch of 8 sends its misses to the backup";
  stats.misses_primary = 40;  // misses the backup drafted count as misses too
  stats.misses_backup = 40;
  EXPECT_EQ(MeasuredCriticalBatchSize(stats, 0.8, 7, seconds, 16), expected);
  stats.hits = 800;  // every sequence hit: no miss to hand to the backup
  stats.misses_primary = stats.misses_backup = 0;
  EXPECT_EQ(MeasuredCriticalBatchSize(stats, 0.8, 7, seconds, 16), kNeverSwitch);
  EXPECT_EQ(MeasuredCriticalBatchSize(stats, 0.8, 7, TierSeconds{}, 16), kNeverSwitch);
}

TEST(WaveCostModelTest, OneSizeScalesAndTwoSizesFitALine) {
  WaveCostModel m;
  EXPECT_FALSE(m.measured());
  EXPECT_EQ(m.Predict(10), 0.0);
  m.Add(10, 0.002);
  m.Add(10, 0.002);
  ASSERT_TRUE(m.measured());
  EXPECT_DOUBLE_EQ(m.Predict(10), 0.002);
  EXPECT_DOUBLE_EQ(m.Predict(5), 0.0015) << "half fixed below the one size seen";
  EXPECT_DOUBLE_EQ(m.Predict(20), 0.004);
  // Waves of 10 and 30 branches at 1 ms + 0.1 ms per branch: the line through them.
  WaveCostModel line;
  for (int i = 0; i < 4; ++i) {
    line.Add(10, 0.002);
    line.Add(30, 0.004);
  }
  EXPECT_NEAR(line.Predict(20), 0.003, 1e-9);
  EXPECT_NEAR(line.Predict(50), 0.006, 1e-9);
  // A one-off stall counts twice the prediction at most.
  WaveCostModel stall = line;
  stall.Add(30, 1.0);
  EXPECT_LT(stall.Predict(30), 0.006);
  // Newer waves count more: a wave that got dearer moves the estimate toward its cost.
  for (int i = 0; i < 20; ++i) line.Add(30, 0.008);
  EXPECT_GT(line.Predict(30), 0.007);
}

TEST(WaveCostModelTest, BranchesWithinFillsTheWindowWaveByWave) {
  WaveCostModel m;
  for (int i = 0; i < 4; ++i) {
    m.Add(8, 0.0018);  // 1 ms + 0.1 ms per branch
    m.Add(16, 0.0026);
  }
  // Waves of at most 16 branches at 2.6 ms: two fit in 5.25 ms, then what a third has room for.
  EXPECT_EQ(BranchesWithin(m, 0.00525, 16, 1000), 32);
  EXPECT_EQ(BranchesWithin(m, 0.00525 + 0.0015, 16, 1000), 32 + 5);
  EXPECT_EQ(BranchesWithin(m, 0.00525 + 0.0015, 16, 20), 20) << "at most max_branches";
  EXPECT_EQ(BranchesWithin(m, 0.0005, 16, 1000), 0) << "not one branch fits";
  EXPECT_EQ(BranchesWithin(m, -1, 16, 1000), 0);
}

TEST(WaveCostModelTest, SplitBudgetIsEvenUpToEachCap) {
  EXPECT_EQ(SplitBudget(10, std::vector<int32_t>{8, 8, 8}), (std::vector<int32_t>{4, 3, 3}));
  EXPECT_EQ(SplitBudget(10, std::vector<int32_t>{1, 8, 8}), (std::vector<int32_t>{1, 5, 4}));
  EXPECT_EQ(SplitBudget(30, std::vector<int32_t>{2, 3, 4}), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(SplitBudget(2, std::vector<int32_t>{5, 5, 5}), (std::vector<int32_t>{1, 1, 0}));
  EXPECT_EQ(SplitBudget(0, std::vector<int32_t>{5}), (std::vector<int32_t>{0}));
}

// With the time budget (the default), the cache is as large as the measured waves build within
// the verifier's window (SpeculateRequest::window_ns): one wave of F's budget when not one wave
// fits, more than F when the window is long. The first build, before any wave was measured, is
// F's.
TEST(SsdWorkerTest, TheTimeBudgetSizesTheCacheToTheVerifiersWindow) {
  auto round = [](SsdWorker& w, uint64_t window_ns, bool first, int32_t bonus) {
    SpeculateRequest req;
    SpeculateResponse resp;
    req.round_id = first ? 1 : 2;
    req.window_ns = window_ns;
    if (first) {
      req.AddSeq(Seq(7, kSeqNew, 0), Prompt());
    } else {
      const std::vector<int32_t> outcome = {bonus};
      req.AddSeq(Seq(7, 0, 0), outcome);
    }
    EXPECT_TRUE(w.Handle(req, &resp).ok());
    EXPECT_TRUE(w.BuildCache().ok());
    return resp.drafts.at(0).num_tokens > 0 ? TokensOf(resp, 0).at(0) : 0;
  };
  {
    auto w = MakeWorker();
    ASSERT_NE(w, nullptr);
    const int32_t d = round(*w, 1, true, 0);
    EXPECT_EQ(w->stats().branches, 15) << "F 3 at each of K + 1 = 5 acceptance lengths";
    round(*w, 1, false, d + 1);
    EXPECT_EQ(w->stats().budget_branches, 15) << "a 1 ns window holds no wave: F's, one wave";
    EXPECT_EQ(w->stats().branches, 30);
  }
  {
    auto w = MakeWorker();
    ASSERT_NE(w, nullptr);
    const int32_t d = round(*w, uint64_t{100} * 1000 * 1000 * 1000, true, 0);
    EXPECT_EQ(w->stats().branches, 15);
    round(*w, uint64_t{100} * 1000 * 1000 * 1000, false, d + 1);
    EXPECT_EQ(w->stats().budget_branches, (kK + 1) * 16) << "every candidate it keeps";
    EXPECT_GT(w->stats().branches - 15, 15) << "a long window builds more than F 3";
  }
  // "cache_budget": "fixed" ignores the window.
  auto w = MakeWorker(R"(, "cache_budget": "fixed")");
  ASSERT_NE(w, nullptr);
  const int32_t d = round(*w, 1, true, 0);
  round(*w, 1, false, d + 1);
  EXPECT_EQ(w->stats().branches, 30);
  EXPECT_EQ(w->stats().budget_branches, 0);
}

TEST(SsdWorkerTest, LargeBatchesFallBackToTheBackupAndUnknownSequencesGetNothing) {
  auto w = MakeWorker(R"(, "critical_batch_size": 2, "backup": "ngram")");
  ASSERT_NE(w, nullptr);
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  SpeculateResponse resp;
  req.round_id = 1;
  req.AddSeq(Seq(1, kSeqNew, 0), prompt);
  req.AddSeq(Seq(2, kSeqNew, 0), prompt);
  req.AddSeq(Seq(3, 0, 0), std::vector<int32_t>{5});  // never sent whole: unknown
  ASSERT_TRUE(w->Handle(req, &resp).ok());
  ASSERT_EQ(resp.drafts.size(), 3u);
  EXPECT_EQ(resp.drafts[0].status, DraftStatus::kMissBackup);
  EXPECT_EQ(resp.drafts[1].status, DraftStatus::kMissBackup);
  EXPECT_EQ(resp.drafts[2].status, DraftStatus::kNone);
  EXPECT_EQ(resp.drafts[2].num_tokens, 0u);
  // The backup is n-gram prompt lookup over the context.
  EXPECT_EQ(TokensOf(resp, 0), NgramLookup(prompt, 1, 4, kK));
  ASSERT_TRUE(w->BuildCache().ok());  // k = 0 entries from the draft's row at position 1
  EXPECT_GT(w->stats().branches, 0);
  w->Drop(1);
  w->Drop(2);
  EXPECT_EQ(w->draft_free_blocks(), w->draft_total_blocks());
}

// The verifier's end of a served channel: the next SpeculateResponse, skipping the cache offers
// before it (counted in *offers).
absl::StatusOr<const SpeculateResponse*> NextResponse(TcpChannel& verifier, Message& m,
                                                      int* offers = nullptr) {
  for (;;) {
    absl::StatusOr<MessageType> type = verifier.Recv(absl::Seconds(10), &m);
    if (!type.ok()) return type.status();
    if (*type == MessageType::kSpeculateResponse) return &std::get<SpeculateResponse>(m);
    if (*type != MessageType::kCacheOffer) {
      return absl::InternalError(std::string(MessageTypeName(*type)));
    }
    if (offers != nullptr) ++*offers;
  }
}

// A served channel: the worker's loop on its own thread, the verifier's end here. On a failed
// assertion the verifier end closes, which ends the loop, before the join.
struct ServedWorker {
  explicit ServedWorker(SsdWorker& w) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    verifier = TcpChannel::FromConnectedSocket(fds[0], w.limits(), "v");
    speculator = TcpChannel::FromConnectedSocket(fds[1], w.limits(), "s");
    loop = std::thread([this, &w] { served = w.ServeChannel(*speculator); });
  }
  ~ServedWorker() {
    verifier->Close();
    if (loop.joinable()) loop.join();
  }
  std::unique_ptr<TcpChannel> verifier, speculator;
  absl::Status served;
  std::thread loop;
};

// Cache offers (wire version 10): after the response, the build sends the verifier its complete
// greedy branches, each the drafts a fresh draft model makes for its outcome (a sampled
// sequence's never); a request that took its drafts from an offer gets no response, and the
// loop goes on with the offered branch as the sequence's drafts.
TEST(SsdWorkerTest, OffersCompleteGreedyBranchesAndAnswersNoRoundThatTookOne) {
  auto w = MakeWorker(R"(, "cache_build": "complete")");
  ASSERT_NE(w, nullptr);
  ServedWorker served(*w);
  TcpChannel& verifier = *served.verifier;
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  req.round_id = 1;
  req.AddSeq(Seq(3, kSeqNew, 0), prompt);
  SpeculateSeq sampled = Seq(4, kSeqNew | kSeqWantProbs, 0);
  sampled.sampling = {0.8f, 1.0f, 0, 0.0f, 11};
  req.AddSeq(sampled, prompt);
  ASSERT_TRUE(verifier.Send(req, absl::Seconds(5)).ok());
  Message m;
  absl::StatusOr<MessageType> type = verifier.Recv(absl::Seconds(10), &m);
  ASSERT_TRUE(type.ok()) << type.status();
  ASSERT_EQ(*type, MessageType::kSpeculateResponse) << "the response comes first";
  const std::vector<int32_t> d = TokensOf(std::get<SpeculateResponse>(m), 0);
  ASSERT_EQ(d.size(), size_t{kK});
  // The complete build of round 1: one wave, so one offer, of sequence 3's branches only:
  // F = 3 candidates at each of the K + 1 acceptance lengths.
  type = verifier.Recv(absl::Seconds(10), &m);
  ASSERT_TRUE(type.ok()) << type.status();
  ASSERT_EQ(*type, MessageType::kCacheOffer);
  const CacheOffer offer = std::get<CacheOffer>(m);
  EXPECT_EQ(offer.round_id, 1u);
  EXPECT_GT(offer.cache_build_ns, 0u);
  ASSERT_EQ(offer.drafts.size(), size_t{(kK + 1) * 3});
  const OfferedDraft* taken = nullptr;
  for (const OfferedDraft& o : offer.drafts) {
    EXPECT_EQ(o.seq_id, 3u) << "a sampled sequence's branches need q rows: never offered";
    EXPECT_EQ(o.num_tokens, uint32_t{kK});
    if (o.accepted_len == 2 && taken == nullptr) taken = &o;
  }
  ASSERT_NE(taken, nullptr);
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), d.begin(), d.begin() + 2);
  context.push_back(taken->bonus);
  const std::span<const int32_t> offered = offer.TokensOf(*taken);
  EXPECT_EQ(std::vector<int32_t>(offered.begin(), offered.end()), Fresh(context).tokens)
      << "an offered branch must equal a fresh draft";

  // Round 2 took that branch from the offer: no response, and the build that follows offers
  // the outcomes of its drafts (round 2's offer is the next message).
  req.Clear();
  req.round_id = 2;
  req.AddSeq(Seq(3, kSeqOfferHit, 2), std::vector<int32_t>{d[0], d[1], taken->bonus});
  ASSERT_FALSE(req.WantsResponse());
  ASSERT_TRUE(verifier.Send(req, absl::Seconds(5)).ok());
  type = verifier.Recv(absl::Seconds(10), &m);
  ASSERT_TRUE(type.ok()) << type.status();
  ASSERT_EQ(*type, MessageType::kCacheOffer) << "round 2 wanted no response";
  const CacheOffer second = std::get<CacheOffer>(m);
  EXPECT_EQ(second.round_id, 2u);
  EXPECT_GT(second.receive_ns + second.triage_ns, 0u) << "the unanswered round's stage times";
  ASSERT_FALSE(second.drafts.empty());

  // Round 3 asks, for an outcome offered in round 2: a hit with the offered drafts.
  const OfferedDraft& next = second.drafts.front();
  std::vector<int32_t> fresh(offered.begin(), offered.begin() + next.accepted_len);
  fresh.push_back(next.bonus);
  req.Clear();
  req.round_id = 3;
  req.AddSeq(Seq(3, 0, next.accepted_len), fresh);
  ASSERT_TRUE(verifier.Send(req, absl::Seconds(5)).ok());
  absl::StatusOr<const SpeculateResponse*> third = NextResponse(verifier, m);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ((*third)->round_id, 3u);
  EXPECT_EQ((*third)->drafts.at(0).status, DraftStatus::kHit);
  const std::span<const int32_t> next_tokens = second.TokensOf(next);
  EXPECT_EQ(TokensOf(**third, 0), std::vector<int32_t>(next_tokens.begin(), next_tokens.end()));
  ASSERT_TRUE(verifier.Send(Shutdown{"done"}, absl::Seconds(5)).ok());
  served.loop.join();
  EXPECT_TRUE(served.served.ok()) << served.served;
  EXPECT_EQ(w->stats().offer_rounds, 1);
  EXPECT_GE(w->stats().offered, int64_t{2} * (kK + 1) * 3);
}

// The serving loop over a real channel, with a verifier that sends each round's outcome the
// moment the drafts arrive: the cache build is interrupted every round, and no request may be
// lost to it (every round is answered, in order, within the timeout).
TEST(SsdWorkerTest, ServingLoopAnswersEveryRoundWhileBuildingTheCache) {
  auto w = MakeWorker();
  ASSERT_NE(w, nullptr);
  ServedWorker served(*w);
  TcpChannel* verifier = served.verifier.get();
  const std::vector<int32_t> prompt = Prompt();
  SpeculateRequest req;
  req.round_id = 1;
  req.AddSeq(Seq(3, kSeqNew, 0), prompt);
  Message reply;
  int hits = 0;
  // The stage times the responses reported (ns, SsdSpeculatorStage order).
  std::array<uint64_t, kNumSsdSpeculatorStages> reported{};
  int offers = 0;  // cache offers that came in before a response
  for (uint64_t round = 1; round <= 24; ++round) {
    ASSERT_TRUE(verifier->Send(req, absl::Seconds(5)).ok());
    absl::StatusOr<const SpeculateResponse*> got = NextResponse(*verifier, reply, &offers);
    ASSERT_TRUE(got.ok()) << "round " << round << ": " << got.status();
    const SpeculateResponse& resp = **got;
    ASSERT_EQ(resp.round_id, round);
    hits += resp.drafts[0].status == DraftStatus::kHit ? 1 : 0;
    reported[0] += resp.receive_ns;
    reported[1] += resp.triage_ns;
    reported[2] += resp.draft_ns;
    reported[3] += resp.cache_build_ns;
    reported[4] += resp.reply_ns;
    // Outcome: the first draft accepted, then the draft's own choice after it (a likely
    // outcome, often cached; which one does not matter here).
    const std::vector<int32_t> d = TokensOf(resp, 0);
    ASSERT_GE(d.size(), 2u);
    req.Clear();
    req.round_id = round + 1;
    req.AddSeq(Seq(3, 0, 2), std::vector<int32_t>{d[0], d[1], (d[1] + 1) % w->vocab_size()});
  }
  ASSERT_TRUE(verifier->Send(Shutdown{"done"}, absl::Seconds(5)).ok());
  served.loop.join();
  EXPECT_TRUE(served.served.ok()) << served.served;  // the loop ended on the Shutdown
  std::printf("[ serving loop ] 24 rounds, %d cache hits, %d offers\n", hits, offers);
  // The round's timeline: every stage ran (the first round's new sequence is a miss the draft
  // model drafts), and the responses reported what the worker measured, except the last build
  // and send, which no response followed.
  const SsdWorkerStats& stats = w->stats();
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) {
    SCOPED_TRACE(kSsdSpeculatorStageNames[i]);
    EXPECT_GT(reported[i], 0u);
    EXPECT_GT(stats.stage_seconds[i], 0.0);
    EXPECT_LE(reported[i] * 1e-9, stats.stage_seconds[i] + 1e-9);
  }
  EXPECT_NEAR(reported[1] * 1e-9, stats.stage_seconds[1], 1e-6);  // triage: all reported
  EXPECT_NEAR(reported[2] * 1e-9, stats.stage_seconds[2], 1e-6);  // draft: all reported
}

}  // namespace
}  // namespace specd
