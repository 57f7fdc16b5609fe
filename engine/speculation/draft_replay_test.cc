// DraftReplay (controlled acceptance for benchmarks): drafts on a recorded trajectory are right
// with the configured probability and fixed per position; off the trajectory the model's token
// stands; candidates carry the recorded token right after the draft with the configured
// probability and never elsewhere; bad trajectory files are refused with the line named. Also
// the "replay" object of --speculative-config, and a codepair draft model (CPU) whose greedy
// drafts follow the replay in both of its paths (runner argmax, and host rows with candidates).
#include "engine/speculation/draft_replay.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/speculation/draft_model.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

constexpr int32_t kVocab = 8192;

std::vector<std::vector<int32_t>> RandomTrajectories(int n, int len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
  std::vector<std::vector<int32_t>> out(n);
  for (auto& t : out) {
    t.resize(len);
    for (int32_t& x : t) x = id(rng);
  }
  return out;
}

std::unique_ptr<DraftReplay> Make(double alpha, double hit,
                                  const std::vector<std::vector<int32_t>>& t) {
  DraftReplayOptions o;
  o.file = "(memory)";
  o.alpha = alpha;
  o.candidate_hit = hit;
  o.seed = 11;
  auto r = DraftReplay::Create(o, kVocab, t);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

std::span<const int32_t> Prefix(const std::vector<int32_t>& t, size_t n) {
  return std::span<const int32_t>(t).first(n);
}

TEST(DraftReplayTest, DraftsOnTheTrajectoryAreRightWithProbabilityAlpha) {
  const auto traj = RandomTrajectories(4, 600, 1);
  for (double alpha : {0.0, 0.3, 0.8, 1.0}) {
    auto r = Make(alpha, 0.9, traj);
    int right = 0, total = 0;
    for (const auto& t : traj) {
      for (size_t p = 16; p < t.size(); ++p) {
        const int32_t d = r->Draft(Prefix(t, p), {}, /*model_token=*/-7);
        ASSERT_GE(d, 0) << "on the trajectory the replay decides, not the model";
        ASSERT_LT(d, kVocab);
        right += d == t[p];
        ++total;
        // Fixed per position: asking again (or as a later draft of a shorter context) agrees.
        ASSERT_EQ(r->Draft(Prefix(t, p - 2), Prefix(t, p).subspan(p - 2), -7), d);
      }
    }
    const double rate = double(right) / total;
    EXPECT_NEAR(rate, alpha, 0.03) << "alpha " << alpha << " over " << total << " positions";
  }
}

TEST(DraftReplayTest, OffTheTrajectoryTheModelTokenStands) {
  const auto traj = RandomTrajectories(2, 64, 2);
  auto r = Make(1.0, 1.0, traj);
  std::vector<int32_t> ctx(traj[0].begin(), traj[0].begin() + 20);
  EXPECT_EQ(r->Draft(ctx, {}, 5), traj[0][20]);
  ctx[12] = (ctx[12] + 1) % kVocab;  // a rejected draft in the context
  EXPECT_EQ(r->Draft(ctx, {}, 5), 5);
  const std::vector<int32_t> wrong_draft = {(traj[0][20] + 1) % kVocab};
  EXPECT_EQ(r->Draft(Prefix(traj[0], 20), wrong_draft, 6), 6);
  EXPECT_EQ(r->Draft(traj[0], {}, 7), 7);                          // past the recorded end
  EXPECT_EQ(r->Draft(Prefix(traj[0], 5), {}, 8), 8);               // shorter than the key
  EXPECT_EQ(r->Draft(RandomTrajectories(1, 30, 9)[0], {}, 9), 9);  // not recorded
  // Trajectories sharing a prompt's start: each context follows the one it is a prefix of.
  std::vector<std::vector<int32_t>> shared = RandomTrajectories(2, 40, 5);
  std::copy(shared[0].begin(), shared[0].begin() + 20, shared[1].begin());
  auto s = Make(1.0, 1.0, shared);
  for (const auto& t : shared) {
    for (size_t p = 8; p < t.size(); ++p) {
      if (p == 20) continue;  // one context, two next tokens: only inside a prompt (not drafted)
      ASSERT_EQ(s->Draft(Prefix(t, p), {}, -1), t[p]) << p;
    }
  }
}

TEST(DraftReplayTest, CandidatesHoldTheRecordedTokenAfterAWrongDraft) {
  const auto traj = RandomTrajectories(3, 400, 3);
  for (double hit : {0.0, 0.5, 1.0}) {
    auto r = Make(0.5, hit, traj);
    int with = 0, wrong = 0;
    for (const auto& t : traj) {
      for (size_t p = 8; p < t.size(); ++p) {
        const int32_t d = r->Draft(Prefix(t, p), {}, 0);
        std::vector<int32_t> row = {d, t[p], 1, 2, 3, 4};  // the model ranked the truth second
        if (d == t[p]) continue;  // a right draft keeps its row (never used: no miss there)
        r->Candidates(Prefix(t, p), {}, row);
        // Distinct ids, the draft first.
        std::vector<int32_t> sorted = row;
        std::sort(sorted.begin(), sorted.end());
        ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
        ASSERT_EQ(row[0], d);
        ++wrong;
        const auto at = std::find(row.begin(), row.end(), t[p]);
        if (at != row.end()) {
          ASSERT_EQ(at - row.begin(), 1) << "the recorded token is the best alternative or absent";
          ++with;
        }
      }
    }
    EXPECT_NEAR(double(with) / wrong, hit, 0.05) << "candidate_hit " << hit;
  }
}

TEST(DraftReplayTest, LoadRefusesBadFilesNamingTheLine) {
  const std::string path = ::testing::TempDir() + "/replay.jsonl";
  auto load = [&](const std::string& text) {
    std::ofstream(path) << text;
    DraftReplayOptions o;
    o.file = path;
    return DraftReplay::Load(o, kVocab);
  };
  auto ok = load("{\"tokens\": [1,2,3,4,5,6,7,8,9]}\n\n{\"tokens\": [2,2,3,4,5,6,7,8]}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->num_trajectories(), 2u);
  const struct {
    const char* text;
    const char* says;
  } bad[] = {
      {"{\"tokens\": [1,2,3,4,5,6,7,8]}\nnot json\n", ":2: expected"},
      {"{\"ids\": [1,2,3,4,5,6,7,8]}\n", ":1: expected"},
      {"{\"tokens\": [1,2,3,4,5,6,7,\"x\"]}\n", "must be integers"},
      {"{\"tokens\": [1,2,3]}\n", "at least 8"},
      {"{\"tokens\": [1,2,3,4,5,6,7,8192]}\n", "outside [0, 8192)"},
      {"", "no trajectories"},
  };
  for (const auto& b : bad) {
    auto r = load(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status();
  }
  DraftReplayOptions missing;
  missing.file = path + ".absent";
  EXPECT_FALSE(DraftReplay::Load(missing, kVocab).ok());
}

TEST(DraftReplayTest, SpeculativeConfigCarriesTheReplayObject) {
  auto c = ParseSpeculativeConfig(
      R"({"method": "ssd", "model": "d", "replay": {"file": "t.jsonl", "alpha": 0.7,
          "candidate_hit": 0.25, "seed": 9}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->replay.file, "t.jsonl");
  EXPECT_DOUBLE_EQ(c->replay.alpha, 0.7);
  EXPECT_DOUBLE_EQ(c->replay.candidate_hit, 0.25);
  EXPECT_EQ(c->replay.seed, 9u);
  auto back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));  // what the speculator gets
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->replay.file, "t.jsonl");
  EXPECT_DOUBLE_EQ(back->replay.alpha, 0.7);
  EXPECT_DOUBLE_EQ(back->replay.candidate_hit, 0.25);
  EXPECT_EQ(back->replay.seed, 9u);
  EXPECT_FALSE(ParseSpeculativeConfig(R"({"model": "d"})")->replay.enabled());
  for (const char* bad : {R"({"replay": 1})", R"({"replay": {"alpha": 0.5}})",
                          R"({"replay": {"file": "f", "alpha": 1.5}})",
                          R"({"replay": {"file": "f", "candidate_hit": -0.1}})",
                          R"({"replay": {"file": "f", "typo": 1}})"}) {
    auto r = ParseSpeculativeConfig(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("replay"), std::string::npos) << r.status();
  }
}

TEST(DraftReplayTest, CodepairDraftFollowsTheReplayInBothPaths) {
  RunnerOptions o;
  o.model_dir = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = 256;
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  auto draft = DraftModelSpeculator::Create(*std::move(runner), kVocab, 64);
  ASSERT_TRUE(draft.ok()) << draft.status();
  const auto traj = RandomTrajectories(1, 64, 4);  // nothing the model would draft itself
  (*draft)->set_replay(Make(1.0, 1.0, traj));
  SamplingParams params;
  params.temperature = 0;  // greedy: the replay's domain
  TokenHistory history;
  const std::vector<int32_t> ctx(traj[0].begin(), traj[0].begin() + 24);
  history.AddPrompt(ctx);
  for (int32_t candidates : {0, 4}) {  // 0: the runner's argmax; 4: host rows with candidates
    DraftInput in;
    in.seq_id = 1 + candidates;
    in.tokens = ctx;
    in.num_draft_tokens = 5;
    in.params = &params;
    in.history = &history;
    DraftModelSpeculator::CacheDraftOptions cache;
    cache.num_candidates = candidates;
    std::vector<Draft> out;
    ASSERT_TRUE((*draft)->Propose({&in, 1}, {&cache, 1}, &out).ok());
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, std::vector<int32_t>(traj[0].begin() + 24, traj[0].begin() + 29))
        << "candidates " << candidates;
    EXPECT_EQ(out[0].candidates.size(), size_t(5 * candidates));
    for (int32_t j = 0; candidates > 0 && j < 5; ++j) {
      EXPECT_EQ(out[0].candidates[j * candidates], traj[0][24 + j]);
    }
  }
  (*draft)->set_replay(Make(0.0, 1.0, traj));  // alpha 0: never the recorded token
  DraftInput in;
  in.seq_id = 9;
  in.tokens = ctx;
  in.num_draft_tokens = 1;
  in.params = &params;
  in.history = &history;
  DraftModelSpeculator::CacheDraftOptions cache;
  cache.num_candidates = 3;
  std::vector<Draft> out;
  ASSERT_TRUE((*draft)->Propose({&in, 1}, {&cache, 1}, &out).ok());
  ASSERT_EQ(out[0].tokens.size(), 1u);
  EXPECT_NE(out[0].tokens[0], traj[0][24]);
  ASSERT_EQ(out[0].candidates.size(), 3u);
  EXPECT_EQ(out[0].candidates[1], traj[0][24]) << "candidate_hit 1: the truth comes second";
}

}  // namespace
}  // namespace specd
