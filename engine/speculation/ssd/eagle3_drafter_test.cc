// The EAGLE-3 head in SSD's speculator (eagle3_drafter.h), on the CPU with the head the project
// trained for codepair: fed the target's hidden states as the verifier sends them, it drafts
// exactly what the in-process head (engine/speculation/eagle3.h) drafts from the same target
// passes, for a long prompt (rows older than the ring run at once) and after a verified round;
// a branch forked for an outcome drafts what the sequence itself would draft for it; adopting a
// branch and releasing everything gives every pool region back; a sequence whose rows start
// midway (a speculator that rejoined) still drafts; each draft takes the candidates its own pass
// ranked on a "device".
#include "engine/speculation/ssd/eagle3_drafter.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/speculation/eagle3.h"
#include "engine/speculation/ssd/ssd_worker.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

const std::string kTarget = std::string(SPECD_SHARED_DIR) + "/models/codepair/target";
const std::string kHead = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
constexpr int32_t kK = 4;

std::vector<int32_t> Prompt(int i) {
  std::ifstream in(std::string(SPECD_SHARED_DIR) + "/models/codepair/golden.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  return j["target"][i]["prompt_ids"].get<std::vector<int32_t>>();
}

// The target on the CPU with the head beside it (the in-process reference), and a sequence's
// passes over it.
class Target {
 public:
  Target() {
    RunnerOptions r;
    r.model_dir = kTarget;
    r.device = "cpu";
    r.num_threads = 2;
    r.max_model_len = 512;
    r.kv_cache_bytes = int64_t{16} << 20;
    r.eagle3_head = kHead;
    auto runner = CreateModelRunner(r);
    EXPECT_TRUE(runner.ok()) << runner.status();
    runner_ = *std::move(runner);
    auto head = Eagle3Speculator::Create(runner_->eagle3());
    EXPECT_TRUE(head.ok()) << head.status();
    head_ = *std::move(head);
    for (int32_t b = 0; b < 64; ++b) table_.push_back(b);
  }
  // Runs tokens at [start, ...) of sequence 1: the argmax after each, and the pass's captured
  // hidden states; the in-process head takes the pass.
  std::vector<int32_t> Pass(const std::vector<int32_t>& tokens, int32_t start,
                            std::vector<float>* hidden) {
    SequenceInput in;
    in.tokens = tokens;
    in.start_pos = start;
    in.block_table = table_;
    in.all_logits = true;
    in.seq_id = 1;
    std::vector<float> logits;
    EXPECT_TRUE(runner_->Forward({&in, 1}, &logits).ok());
    const auto captured = runner_->captured_hidden_states();
    hidden->assign(captured.begin(), captured.end());
    const uint8_t wanted = 1;
    EXPECT_TRUE(head_->OnTargetPass({&in, 1}, {&wanted, 1}).ok());
    const int32_t vocab = runner_->config().vocab_size;
    std::vector<int32_t> argmax;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* row = &logits[t * vocab];
      argmax.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    return argmax;
  }
  // The in-process head's greedy drafts after `tokens`.
  std::vector<int32_t> HeadDrafts(const std::vector<int32_t>& tokens) {
    DraftInput in = Input(1, tokens, kK);
    std::vector<Draft> out;
    EXPECT_TRUE(head_->Propose({&in, 1}, &out).ok());
    return out.at(0).tokens;
  }
  int32_t vocab() const { return runner_->config().vocab_size; }

  static DraftInput Input(uint64_t seq, const std::vector<int32_t>& tokens, int32_t k) {
    static const SamplingParams greedy = [] {
      SamplingParams p;
      p.temperature = 0;
      return p;
    }();
    static const TokenHistory history;
    DraftInput in;
    in.seq_id = seq;
    in.tokens = tokens;
    in.num_draft_tokens = k;
    in.params = &greedy;
    in.history = &history;
    return in;
  }

 private:
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Eagle3Speculator> head_;
  std::vector<int32_t> table_;
};

std::unique_ptr<Eagle3CacheDrafter> MakeDrafter(int32_t vocab) {
  auto d = CreateEagle3CacheDrafter(kHead, kTarget, "cpu", vocab, 512);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

std::vector<int32_t> Drafts(Eagle3CacheDrafter& d, uint64_t seq, const std::vector<int32_t>& tokens,
                            int32_t k, std::vector<int32_t>* candidates = nullptr) {
  DraftInput in = Target::Input(seq, tokens, k);
  CacheDrafter::CacheDraftOptions cache;
  cache.num_candidates = 4;
  std::vector<Draft> out;
  EXPECT_TRUE(d.Propose({&in, 1}, {&cache, 1}, &out, {}).ok());
  if (candidates != nullptr) *candidates = out.at(0).candidates;
  return out.at(0).tokens;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Eagle3DrafterTest, DraftsAsTheInProcessHeadFromTheSameTargetPasses) {
  Target target;
  auto drafter = MakeDrafter(target.vocab());
  ASSERT_NE(drafter, nullptr);
  // The prompt's pass (143 tokens: the oldest rows run at once), then its first token.
  const std::vector<int32_t> prompt = Prompt(0);
  ASSERT_GT(prompt.size(), size_t{kEagle3PoolWindow});
  std::vector<float> hidden;
  std::vector<int32_t> context = prompt;
  context.push_back(target.Pass(prompt, 0, &hidden).back());
  ASSERT_TRUE(drafter->AddTargetRows(1, context, 0, hidden).ok());
  const std::vector<int32_t> reference = target.HeadDrafts(context);
  ASSERT_EQ(reference.size(), size_t{kK});
  // The speculator asks one draft more (the cache's row for k = K).
  const std::vector<int32_t> drafts = Drafts(*drafter, 1, context, kK + 1);
  ASSERT_EQ(drafts.size(), size_t{kK + 1});
  EXPECT_EQ(std::vector<int32_t>(drafts.begin(), drafts.begin() + kK), reference);

  // Verification of the drafts: the target's pass over the last token and them.
  const auto n = static_cast<int32_t>(context.size());
  std::vector<int32_t> chunk = {context.back()};
  chunk.insert(chunk.end(), drafts.begin(), drafts.begin() + kK);
  const std::vector<int32_t> argmax = target.Pass(chunk, n - 1, &hidden);
  int32_t k = 0;
  while (k < kK && drafts[k] == argmax[k]) ++k;
  std::vector<int32_t> next =
      Concat(context, std::vector<int32_t>(drafts.begin(), drafts.begin() + k));
  next.push_back(argmax[k]);
  // The rows of the accepted positions: n - 1 .. n - 1 + k.
  const auto width = hidden.size() / chunk.size();
  ASSERT_TRUE(
      drafter->AddTargetRows(1, next, n - 1, std::span<const float>(hidden).first((k + 1) * width))
          .ok());
  const std::vector<int32_t> reference2 = target.HeadDrafts(next);
  const std::vector<int32_t> drafts2 = Drafts(*drafter, 1, next, kK);
  EXPECT_EQ(drafts2, reference2) << "accepted " << k;
}

TEST(Eagle3DrafterTest, ABranchDraftsWhatTheSequenceWouldAndAdoptionKeepsRegions) {
  Target target;
  auto drafter = MakeDrafter(target.vocab());
  auto twin = MakeDrafter(target.vocab());
  ASSERT_NE(drafter, nullptr);
  ASSERT_NE(twin, nullptr);
  const int32_t free_regions = drafter->num_free_regions();
  const std::vector<int32_t> prompt = Prompt(1);
  std::vector<float> hidden;
  std::vector<int32_t> context = prompt;
  context.push_back(target.Pass(prompt, 0, &hidden).back());
  std::vector<int32_t> candidates;
  std::vector<int32_t> drafts;
  for (Eagle3CacheDrafter* d : {drafter.get(), twin.get()}) {
    ASSERT_TRUE(d->AddTargetRows(1, context, 0, hidden).ok());
    drafts = Drafts(*d, 1, context, kK + 1, &candidates);
  }
  ASSERT_EQ(drafts.size(), size_t{kK + 1});
  // Outcome (k, t): the k drafts accepted, then t, the second candidate at position k + 1.
  for (int32_t k : {0, 2}) {
    const int32_t t = candidates.at(size_t(k) * 4 + 1);
    ASSERT_NE(t, drafts[k]);
    std::vector<int32_t> branch =
        Concat(context, std::vector<int32_t>(drafts.begin(), drafts.begin() + k));
    branch.push_back(t);
    const uint64_t id = 100 + k;
    ASSERT_TRUE(drafter->Fork(1, id, static_cast<int32_t>(context.size()) + k).ok());
    const std::vector<int32_t> got = Drafts(*drafter, id, branch, kK);
    // The twin drafts the outcome on the sequence itself (no fork).
    auto twin2 = MakeDrafter(target.vocab());
    ASSERT_TRUE(twin2->AddTargetRows(1, context, 0, hidden).ok());
    Drafts(*twin2, 1, context, kK + 1);
    EXPECT_EQ(got, Drafts(*twin2, 1, branch, kK)) << "k " << k;
    EXPECT_EQ(got.size(), size_t{kK});
  }
  // More branches than the compute has pool regions: the rest fork without one and draft
  // nothing, and every region comes back when they go.
  const int32_t regions = drafter->num_free_regions();
  std::vector<int32_t> outcome = context;
  outcome.push_back(candidates.at(1));
  for (int32_t i = 0; i <= regions; ++i) {
    ASSERT_TRUE(drafter->Fork(1, 1000 + i, static_cast<int32_t>(context.size())).ok()) << i;
  }
  EXPECT_EQ(drafter->num_free_regions(), 0);
  EXPECT_TRUE(Drafts(*drafter, 1000 + regions, outcome, kK).empty()) << "no region: no drafts";
  EXPECT_EQ(Drafts(*drafter, 1000, outcome, kK).size(), size_t{kK});
  for (int32_t i = 0; i <= regions; ++i) drafter->Release(1000 + i);
  EXPECT_EQ(drafter->num_free_regions(), regions);
  ASSERT_TRUE(drafter->Adopt(1, 102).ok());
  drafter->Release(100);
  EXPECT_EQ(drafter->num_states(), 1);
  drafter->Release(1);
  EXPECT_EQ(drafter->num_free_regions(), free_regions);
  EXPECT_EQ(drafter->num_states(), 0);
  // Unknown parents and children are refused.
  EXPECT_EQ(drafter->Fork(5, 6, 3).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(drafter->Adopt(5, 6).code(), absl::StatusCode::kNotFound);
}

// The worker with the head: rounds whose outcomes the real target decides (greedy), the hidden
// states sent as the verifier sends them; a complete cache build serves hits, a hit's drafts are
// the branch's, and every region comes back once the sequence is dropped.
TEST(Eagle3DrafterTest, TheWorkerServesHitsFromTheHeadsCache) {
  Target target;
  SsdWorkerOptions o;
  auto config = ParseSpeculativeConfig(R"({"method": "ssd", "eagle3_model": ")" + kHead +
                                       R"(", "fan_out": 3, "fan_out_mode": "constant",
                                       "cache_build": "complete"})");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->ssd.eagle3_drafter);
  o.config = *config;
  o.draft.device = "cpu";
  o.max_num_seqs = 4;
  o.max_model_len = 512;
  o.target_model = kTarget;
  o.vocab_size = target.vocab();
  auto worker = SsdWorker::Create(o);
  ASSERT_FALSE(worker.ok()) << "no hidden_width: refused";
  std::vector<float> hidden;
  std::vector<int32_t> context = Prompt(2);
  context.push_back(target.Pass(context, 0, &hidden).back());
  o.hidden_width = static_cast<int32_t>(hidden.size() / (context.size() - 1));
  worker = SsdWorker::Create(o);
  ASSERT_TRUE(worker.ok()) << worker.status();
  SsdWorker& w = **worker;
  SpeculateRequest req;
  SpeculateResponse resp;
  SpeculateSeq m;
  m.seq_id = 7;
  m.flags = kSeqNew;
  m.num_draft_tokens = kK;
  m.fan_out = 3;
  req.AddHidden(req.AddSeq(m, context), 0, hidden, o.hidden_width);
  int32_t hits = 0, rounds = 0;
  for (; rounds < 12; ++rounds) {
    ASSERT_TRUE(w.Handle(req, &resp).ok());
    ASSERT_EQ(resp.drafts.size(), 1u);
    if (resp.drafts[0].status == DraftStatus::kHit) ++hits;
    const auto got = resp.TokensOf(resp.drafts[0]);
    const std::vector<int32_t> drafts(got.begin(), got.end());
    ASSERT_EQ(drafts.size(), size_t{kK}) << "round " << rounds;
    ASSERT_TRUE(w.BuildCache().ok());
    // Verification by the target, then the next request: the outcome and its hidden rows.
    const auto n = static_cast<int32_t>(context.size());
    std::vector<int32_t> chunk = {context.back()};
    chunk.insert(chunk.end(), drafts.begin(), drafts.end());
    const std::vector<int32_t> argmax = target.Pass(chunk, n - 1, &hidden);
    int32_t k = 0;
    while (k < kK && drafts[k] == argmax[k]) ++k;
    std::vector<int32_t> fresh(drafts.begin(), drafts.begin() + k);
    fresh.push_back(argmax[k]);
    context.insert(context.end(), fresh.begin(), fresh.end());
    req.Clear();
    m.flags = 0;
    m.accepted_len = static_cast<uint16_t>(k);
    req.AddHidden(req.AddSeq(m, fresh), n - 1,
                  std::span<const float>(hidden).first(size_t(k + 1) * o.hidden_width),
                  o.hidden_width);
  }
  std::printf("[ the head in the speculator ] %d hits in %d rounds, %lld branches built\n", hits,
              rounds, static_cast<long long>(w.stats().branches));
  EXPECT_GT(hits, 0) << "of " << rounds << " rounds";
  EXPECT_EQ(w.stats().hits, hits);
  w.Drop(7);
  EXPECT_EQ(w.draft_free_blocks(), 0);  // the head holds no KV blocks
}

// A speculator that joins mid-sequence (a restart) gets the sequence's tokens whole but the
// target's hidden states only from the verifier's next pass on: the positions before them can
// never be run, and the head skips them and drafts instead of waiting for them forever.
TEST(Eagle3DrafterTest, ASequenceJoinedMidwayDraftsFromTheRowsItGets) {
  Target target;
  auto drafter = MakeDrafter(target.vocab());
  ASSERT_NE(drafter, nullptr);
  const std::vector<int32_t> prompt = Prompt(1);
  std::vector<float> hidden;
  std::vector<int32_t> context = prompt;
  context.push_back(target.Pass(prompt, 0, &hidden).back());
  const auto width = hidden.size() / prompt.size();
  // Only the last 5 committed positions' rows (those of a verification pass), none before.
  const auto first = static_cast<int32_t>(prompt.size()) - 5;
  ASSERT_GT(first, 0);
  ASSERT_TRUE(drafter
                  ->AddTargetRows(7, context, first,
                                  std::span<const float>(hidden).subspan(first * width, 5 * width))
                  .ok());
  EXPECT_EQ(Drafts(*drafter, 7, context, kK).size(), size_t{kK});
}

// The head's compute with candidates ranked "on the device" (as the CUDA head's are): each pass's
// rows get [their argmax, 1000 + p, 2000 + p, 3000 + p], p the pass's number, so a draft's
// candidates show which pass they came from. The rest is the CPU head's.
class PassNumberedCandidates : public Eagle3Compute {
 public:
  explicit PassNumberedCandidates(std::unique_ptr<Eagle3Compute> inner)
      : inner_(std::move(inner)) {}
  const Eagle3Config& config() const override { return inner_->config(); }
  std::span<const int32_t> draft_to_target() const override { return inner_->draft_to_target(); }
  int32_t num_pool_regions() const override { return inner_->num_pool_regions(); }
  absl::Status Fuse(std::span<const int32_t> capture_rows,
                    std::span<const int32_t> pool_rows) override {
    return inner_->Fuse(capture_rows, pool_rows);
  }
  bool RanksOnDevice() const override { return true; }
  absl::Status TopCandidates(int32_t k, std::vector<int32_t>* ids,
                             std::vector<float>* logprobs) override {
    for (int32_t argmax : last_ids_) {
      for (int32_t j = 0; j < k; ++j) {
        ids->push_back(j == 0 ? argmax : 1000 * j + passes_);
        logprobs->push_back(-static_cast<float>(j));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Forward(std::span<const Row> rows, std::span<const uint8_t> host_logits,
                       std::vector<int32_t>* ids, std::vector<float>* logits) override {
    ++passes_;
    const absl::Status s = inner_->Forward(rows, host_logits, ids, logits);
    last_ids_ = *ids;
    return s;
  }
  bool Standalone() const override { return true; }
  absl::Status SetHostCapture(std::span<const float> rows) override {
    return inner_->SetHostCapture(rows);
  }
  absl::Status CopyHidden(std::span<const int32_t> from, std::span<const int32_t> to) override {
    return inner_->CopyHidden(from, to);
  }
  absl::Status ForkCache(int64_t parent, int64_t child, int32_t slots) override {
    return inner_->ForkCache(parent, child, slots);
  }
  absl::Status AdoptCache(int64_t parent, int64_t child) override {
    return inner_->AdoptCache(parent, child);
  }
  void Truncate(int64_t seq, int32_t slot) override { inner_->Truncate(seq, slot); }
  void Release(int64_t seq) override { inner_->Release(seq); }

 private:
  std::unique_ptr<Eagle3Compute> inner_;
  std::vector<int32_t> last_ids_;
  int32_t passes_ = 0;
};

// A compute that ranks on the device gives every pass its own candidates, and each draft takes
// its own pass's: over a Propose's passes and from one Propose to the next.
TEST(Eagle3DrafterTest, EachDraftTakesTheCandidatesItsOwnPassRanked) {
  Target target;
  auto inner = CreateStandaloneCpuEagle3Compute(kHead, kTarget);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto drafter = Eagle3CacheDrafter::Create(
      std::make_unique<PassNumberedCandidates>(*std::move(inner)), target.vocab(), 512, "cpu");
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  const std::vector<int32_t> prompt = Prompt(1);
  std::vector<float> hidden;
  std::vector<int32_t> context = prompt;
  context.push_back(target.Pass(prompt, 0, &hidden).back());
  ASSERT_TRUE((*drafter)->AddTargetRows(1, context, 0, hidden).ok());
  int32_t pass = 0;
  for (int call = 0; call < 2; ++call) {
    std::vector<int32_t> candidates;
    const std::vector<int32_t> drafts = Drafts(**drafter, 1, context, kK, &candidates);
    ASSERT_EQ(drafts.size(), size_t{kK});
    ASSERT_EQ(candidates.size(), size_t{kK} * 4);
    for (int32_t j = 0; j < kK; ++j) {
      ++pass;
      EXPECT_EQ(candidates[size_t(j) * 4], drafts[j]) << "call " << call << ", draft " << j;
      EXPECT_EQ(candidates[size_t(j) * 4 + 1], 1000 + pass) << "call " << call << ", draft " << j;
      EXPECT_EQ(candidates[size_t(j) * 4 + 3], 3000 + pass) << "call " << call << ", draft " << j;
    }
    context.insert(context.end(), drafts.begin(), drafts.end());  // as if all were accepted
  }
}

TEST(Eagle3DrafterTest, AMissingTargetOrAnotherVocabularyIsRefused) {
  EXPECT_FALSE(CreateEagle3CacheDrafter(kHead, "/nonexistent", "cpu", 0, 512).ok());
  auto wrong_vocab = CreateEagle3CacheDrafter(kHead, kTarget, "cpu", 17, 512);
  EXPECT_EQ(wrong_vocab.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
