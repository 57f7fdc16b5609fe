// DraftReplay (controlled acceptance for benchmarks): drafts on a recorded trajectory are right
// with the configured probability and fixed per position; off the trajectory the model's token
// stands; candidates carry the recorded token right after the draft with the configured
// probability and never elsewhere; bad trajectory files are refused with the line named. Also
// the "replay" object of --speculative-config, and a codepair draft model (CPU) whose greedy
// drafts follow the replay in both of its paths (runner argmax, and host rows with candidates).
// Token trees: a node on the trajectory has the recorded token among its children with
// probability alpha (first, or not at all), at the same positions as the chain's hits, a
// one-child row is the chain's draft, rows off the trajectory stand; the codepair draft's trees
// follow the replay.
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

// The model's children for position p of `t`, best first: the recorded token at `rank` (none
// when rank >= 3), the others fixed per position.
std::vector<int32_t> ModelChildren(const std::vector<int32_t>& t, size_t p, size_t rank) {
  std::vector<int32_t> row;
  for (int32_t i = 1; row.size() < 3; ++i) {
    if (row.size() == rank) row.push_back(t[p]);
    const int32_t other = (t[p] + static_cast<int32_t>(p) * 3 + i) % kVocab;
    if (row.size() < 3 && other != t[p]) row.push_back(other);
  }
  return row;
}

TEST(DraftReplayTest, TreeChildrenHoldTheRecordedTokenWithProbabilityAlpha) {
  const auto traj = RandomTrajectories(4, 600, 6);
  for (double alpha : {0.0, 0.8, 1.0}) {
    auto r = Make(alpha, 0.9, traj);
    int hits = 0, total = 0;
    for (const auto& t : traj) {
      for (size_t p = 11; p < t.size(); ++p) {  // a context of at least kKeyTokens
        const std::vector<int32_t> model = ModelChildren(t, p, p % 4);
        std::vector<int32_t> row = model;
        r->Children(Prefix(t, p - 3), Prefix(t, p).subspan(p - 3), row);  // a node at depth 3
        ASSERT_EQ(row.size(), model.size());
        std::vector<int32_t> sorted = row;
        std::sort(sorted.begin(), sorted.end());
        ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "distinct";
        const bool hit = row[0] == t[p];
        ASSERT_EQ(std::count(row.begin(), row.end(), t[p]), hit ? 1 : 0)
            << "the recorded token is the best child or absent";
        if (hit) {  // the model's others keep their order after it
          std::vector<int32_t> others;
          for (int32_t c : model) {
            if (c != t[p]) others.push_back(c);
          }
          others.resize(row.size() - 1);
          ASSERT_EQ(std::vector<int32_t>(row.begin() + 1, row.end()), others);
        }
        hits += hit;
        ++total;
      }
    }
    EXPECT_NEAR(double(hits) / total, alpha, 0.03) << "alpha " << alpha << " over " << total;
  }
}

TEST(DraftReplayTest, TreeChildrenHitWhereTheChainDraftHits) {
  const auto traj = RandomTrajectories(3, 300, 7);
  for (double alpha : {0.3, 0.8}) {
    auto r = Make(alpha, 0.9, traj);
    for (const auto& t : traj) {
      for (size_t p = 10; p < t.size(); ++p) {
        for (size_t depth : {size_t{0}, size_t{2}}) {  // the root's children, a node at depth 2
          const auto context = Prefix(t, p - depth);
          const auto path = Prefix(t, p).subspan(p - depth);
          const int32_t draft = r->Draft(context, path, -1);
          // One child (top_k 1): the chain's draft, token for token, whatever the model chose.
          for (int32_t model : {t[p], (t[p] + 1) % kVocab}) {
            std::vector<int32_t> one = {model};
            r->Children(context, path, one);
            ASSERT_EQ(one[0], draft) << p;
          }
          // More children: the same hit or miss, and the best child is still the chain's draft.
          for (size_t rank : {0, 1, 2, 3}) {
            std::vector<int32_t> row = ModelChildren(t, p, rank);
            r->Children(context, path, row);
            ASSERT_EQ(row[0], draft) << p;
            ASSERT_EQ(std::find(row.begin(), row.end(), t[p]) != row.end(), draft == t[p]) << p;
          }
        }
      }
    }
  }
}

TEST(DraftReplayTest, TreeChildrenOffTheTrajectoryStand) {
  const auto traj = RandomTrajectories(1, 64, 8);
  auto r = Make(1.0, 1.0, traj);
  const std::vector<int32_t> model = {1, 2, 3};
  auto children = [&](std::span<const int32_t> context, std::span<const int32_t> path) {
    std::vector<int32_t> row = model;
    r->Children(context, path, row);
    return row;
  };
  const auto& t = traj[0];
  EXPECT_EQ(children(Prefix(t, 20), {})[0], t[20]);  // on it: alpha 1 puts it first
  const std::vector<int32_t> sibling = {(t[20] + 1) % kVocab};
  EXPECT_EQ(children(Prefix(t, 20), sibling), model) << "a path that left the trajectory";
  std::vector<int32_t> rejected(t.begin(), t.begin() + 20);
  rejected[10] = (rejected[10] + 1) % kVocab;
  EXPECT_EQ(children(rejected, {}), model) << "a context that left it";
  EXPECT_EQ(children(t, {}), model) << "past its end";
  EXPECT_EQ(children(Prefix(t, 5), {}), model) << "shorter than the key";
  std::vector<int32_t> none;
  r->Children(Prefix(t, 20), {}, none);  // no children (everything banned): nothing to do
  EXPECT_TRUE(none.empty());
  // The model had both the recorded token and the miss's token: a fill keeps the row's length.
  auto miss = Make(0.0, 1.0, traj);
  const int32_t wrong = miss->Draft(Prefix(t, 30), {}, -1);
  std::vector<int32_t> row = {wrong, t[30], 5};
  miss->Children(Prefix(t, 30), {}, row);
  ASSERT_EQ(row.size(), 3u);
  EXPECT_EQ(row[0], wrong);
  EXPECT_NE(row[1], t[30]);
  EXPECT_NE(row[2], t[30]);
  EXPECT_NE(row[1], row[2]);
  EXPECT_NE(row[1], wrong);
  EXPECT_NE(row[2], wrong);
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
  auto back = ParseSpeculativeConfig(SpeculativeConfigToJson(*c));  // written and read back
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

// A tree's nodes whose path from the root follows `t` (after its first `n` tokens): each one's
// children (best first), -1 for the root.
std::vector<std::pair<int32_t, std::vector<int32_t>>> OnTrackChildren(const Draft& d,
                                                                      const std::vector<int32_t>& t,
                                                                      size_t n) {
  std::vector<std::pair<int32_t, std::vector<int32_t>>> out;
  std::vector<int32_t> depth(d.tokens.size(), 0);
  std::vector<char> on(d.tokens.size(), 0);
  for (int32_t node = -1; node < static_cast<int32_t>(d.tokens.size()); ++node) {
    if (node >= 0) {
      const int32_t parent = d.parents[node];
      depth[node] = parent < 0 ? 0 : depth[parent] + 1;
      on[node] = (parent < 0 || on[parent]) && d.tokens[node] == t[n + depth[node]];
      if (!on[node]) continue;
    }
    std::vector<int32_t> children;
    for (size_t c = 0; c < d.tokens.size(); ++c) {
      if (d.parents[c] == node) children.push_back(d.tokens[c]);
    }
    out.emplace_back(node, children);
  }
  return out;
}

TEST(DraftReplayTest, CodepairDraftTreesFollowTheReplay) {
  RunnerOptions o;
  o.model_dir = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";
  o.device = "cpu";
  o.num_threads = 2;
  o.max_model_len = 256;
  auto runner = CreateModelRunner(o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ASSERT_TRUE((*runner)->SupportsTokenTrees());
  auto draft = DraftModelSpeculator::Create(*std::move(runner), kVocab, 64);
  ASSERT_TRUE(draft.ok()) << draft.status();
  const auto traj = RandomTrajectories(1, 64, 10);  // nothing the model would draft itself
  SamplingParams params;
  params.temperature = 0;
  TokenHistory history;
  const std::vector<int32_t> ctx(traj[0].begin(), traj[0].begin() + 24);
  history.AddPrompt(ctx);
  for (double alpha : {1.0, 0.0}) {
    (*draft)->set_replay(Make(alpha, 1.0, traj));
    DraftInput in;
    in.seq_id = alpha > 0 ? 1 : 2;
    in.tokens = ctx;
    in.num_draft_tokens = 21;  // every node grown: 3, then 3 x 3, then the best 3 x 3
    in.tree_depth = 3;
    in.tree_top_k = 3;
    in.params = &params;
    in.history = &history;
    std::vector<Draft> out(1);
    ASSERT_TRUE((*draft)->Propose({&in, 1}, &out).ok());
    const Draft& d = out[0];
    ASSERT_EQ(d.parents.size(), d.tokens.size());
    ASSERT_GE(d.tokens.size(), 4u) << "a tree, not a chain";
    const auto on = OnTrackChildren(d, traj[0], 24);
    ASSERT_EQ(on[0].first, -1);
    ASSERT_EQ(on[0].second.size(), 3u) << "the root's top_k children";
    size_t depth = 0;
    for (const auto& [node, children] : on) {
      if (children.empty()) continue;  // not expanded, or its children not kept
      const int32_t want = traj[0][24 + depth];
      if (alpha > 0) {
        EXPECT_EQ(children[0], want) << "alpha 1: the recorded token is the best child";
      } else {
        EXPECT_EQ(std::count(children.begin(), children.end(), want), 0) << "alpha 0: never";
      }
      ++depth;
    }
    // alpha 1: the recorded node at depth 2 is among its level's 3 best here (the slot scores
    // favour it: each of its path's slots is its row's best), so the recorded path is whole.
    EXPECT_EQ(depth, alpha > 0 ? 3u : 1u);
  }
}

}  // namespace
}  // namespace specd
