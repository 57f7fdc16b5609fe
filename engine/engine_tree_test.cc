// Token trees on the CPU engine (issue 33): greedy output of tree rounds equals plain decoding
// for the draft model, the EAGLE-3 head and n-gram, with every greedy option (penalties over the
// tree's path, min_tokens, stop strings, logprobs, n > 1) and in a batch mixing trees, chains
// and plain rows; trees accept more per round than chains of the same depth; malformed tree
// options are refused. Sampled tree rounds: engine_draft_sampling_test. The exact path
// (HostVerifier, Acceptor::VerifyTree) is the oracle for the GPU's.
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace speculation_test;  // NOLINT: the shared fixtures of the speculation tests

const std::string kHead = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";

SpeculationParams Tree(SpeculationMethod method, int32_t depth, int32_t top_k, int32_t nodes) {
  SpeculationParams p;
  p.method = method;
  p.tree = TreeShape{true, depth, top_k, nodes};
  return p;
}

class TreeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    engine_ = MakeEngine(kTarget, R"({"model": ")" + kDraft + R"(", "eagle3_model": ")" + kHead +
                                      R"(", "num_speculative_tokens": 4})")
                  .release();
    ASSERT_NE(engine_, nullptr);
    prompts_ = new std::vector<std::vector<int32_t>>(LoadPrompts(*engine_->tokenizer()));
    prompts_->resize(8);
    plain_ = new std::vector<GenerateResult>(RunGreedy(*engine_, *prompts_, kPlain, kLen));
  }
  static void TearDownTestSuite() {
    delete engine_;
    delete prompts_;
    delete plain_;
  }
  static Engine* engine_;
  static std::vector<std::vector<int32_t>>* prompts_;
  static std::vector<GenerateResult>* plain_;
};
Engine* TreeTest::engine_ = nullptr;
std::vector<std::vector<int32_t>>* TreeTest::prompts_ = nullptr;
std::vector<GenerateResult>* TreeTest::plain_ = nullptr;

TEST_F(TreeTest, GreedyTreesEqualPlainForTheDraftModelAndNgram) {
  for (SpeculationMethod m : {SpeculationMethod::kNgram, SpeculationMethod::kDraftModel}) {
    for (const auto& [depth, top_k, nodes] : std::vector<std::tuple<int32_t, int32_t, int32_t>>{
             {4, 2, 8}, {6, 3, 16}, {3, 4, 12}, {5, 1, 5}}) {
      const SpeculationParams spec = Tree(m, depth, top_k, nodes);
      const auto got = RunGreedy(*engine_, *prompts_, spec, kLen);
      ASSERT_EQ(got.size(), plain_->size());
      int64_t drafts = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].ids(), (*plain_)[i].ids())
            << SpeculationMethodName(m) << " tree " << depth << "/" << top_k << "/" << nodes
            << ", prompt " << i;
        drafts += got[i].usage.num_draft_tokens;
      }
      EXPECT_GT(drafts, 0) << SpeculationMethodName(m) << ": nothing was speculated";
    }
  }
}

// The head's trees: each level one head pass in tree slots of its own, the accepted path's
// hidden states found at the next round (top_k 1: a chain grown as a tree; 8/4/64: the widest
// the round allows).
TEST_F(TreeTest, GreedyTreesEqualPlainForTheEagle3Head) {
  for (const auto& [depth, top_k, nodes] : std::vector<std::tuple<int32_t, int32_t, int32_t>>{
           {3, 2, 6}, {5, 3, 16}, {8, 4, 64}, {4, 1, 4}, {1, 4, 4}}) {
    const SpeculationParams spec = Tree(SpeculationMethod::kEagle3, depth, top_k, nodes);
    const auto got = RunGreedy(*engine_, *prompts_, spec, kLen);
    ASSERT_EQ(got.size(), plain_->size());
    int64_t drafts = 0, accepted = 0, undrafted = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].ids(), (*plain_)[i].ids())
          << "eagle3 tree " << depth << "/" << top_k << "/" << nodes << ", prompt " << i;
      const RequestUsage& u = got[i].usage;
      drafts += u.num_draft_tokens;
      accepted += u.num_accepted_tokens;
      // Decode steps without drafts: the first (the head lacks the cached prompt's states) and
      // the last (one token left). A round whose accepted path the head failed to find would
      // leave the next round without its target hidden states, and undrafted.
      undrafted += u.completion_tokens - 1 - u.num_drafts - u.num_accepted_tokens;
    }
    const std::string shape =
        std::to_string(depth) + "/" + std::to_string(top_k) + "/" + std::to_string(nodes);
    EXPECT_GT(drafts, 0) << "eagle3 tree " << shape;
    EXPECT_GT(accepted, 0) << "eagle3 tree " << shape;
    std::printf("eagle3 tree %s: %.2f tokens per round, %lld decode steps without drafts\n",
                shape.c_str(), TokensPerRound(got), static_cast<long long>(undrafted));
    EXPECT_LE(undrafted, 2 * static_cast<int64_t>(got.size())) << "eagle3 tree " << shape;
  }
}

TEST_F(TreeTest, EveryGreedyOptionKeepsThePlainOutput) {
  std::vector<GenerateResult> plain = RunPrompts(*engine_, *prompts_, {}, kPlain);
  ExpectGreedyCasesLossless(
      *engine_, *prompts_, plain,
      {Tree(SpeculationMethod::kDraftModel, 4, 2, 10), Tree(SpeculationMethod::kNgram, 4, 2, 10),
       Tree(SpeculationMethod::kEagle3, 4, 2, 10)});
}

TEST_F(TreeTest, MixedBatchOfTreesChainsAndPlainRowsEqualsPlain) {
  const std::vector<SpeculationParams> specs = {Tree(SpeculationMethod::kDraftModel, 4, 2, 8),
                                                Tree(SpeculationMethod::kEagle3, 5, 3, 16),
                                                {SpeculationMethod::kDraftModel, 3},
                                                Tree(SpeculationMethod::kNgram, 3, 2, 6),
                                                kPlain,
                                                {SpeculationMethod::kEagle3, 4},
                                                {SpeculationMethod::kNgram, 4}};
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < prompts_->size(); ++i) {
    requests.push_back(Greedy((*prompts_)[i], kLen, specs[i % specs.size()]));
  }
  auto got = engine_->GenerateBatch(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    EXPECT_EQ((*got)[i].ids(), (*plain_)[i].ids()) << "request " << i;
  }
}

TEST_F(TreeTest, TreesAcceptMoreThanChainsOfTheirDepth) {
  for (SpeculationMethod m : {SpeculationMethod::kDraftModel, SpeculationMethod::kEagle3}) {
    const double chain = TokensPerRound(RunGreedy(*engine_, *prompts_, {m, 4}, kLen));
    const double tree = TokensPerRound(RunGreedy(*engine_, *prompts_, Tree(m, 4, 3, 16), kLen));
    std::printf("codepair %s, greedy: chain K 4 %.2f, tree 4/3/16 %.2f tokens per round\n",
                SpeculationMethodName(m), chain, tree);
    EXPECT_GT(tree, chain) << SpeculationMethodName(m);
  }
}

TEST(TreeConfigTest, TreeOptionsAreCheckedAndResolved) {
  auto server = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 5, "tree": {"top_k": 3}})");
  ASSERT_TRUE(server.ok()) << server.status();
  // The server's tree for its default method: depth K, its top_k, 16 nodes.
  absl::StatusOr<ResolvedSpeculation> r = ResolveSpeculation({}, *server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tree.enabled);
  EXPECT_EQ(r->tree.depth, 5);
  EXPECT_EQ(r->tree.top_k, 3);
  EXPECT_EQ(r->tree.num_nodes, kDefaultTreeNodes);
  EXPECT_EQ(r->num_speculative_tokens, kDefaultTreeNodes);  // the lookahead: every node
  // A request's fields over the server's; "tree": false; max_k caps the nodes.
  SpeculationParams mine;
  mine.tree = TreeShape{true, 2, 0, 40};
  mine.policy_max_k = 12;
  r = ResolveSpeculation(mine, *server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tree.depth, 2);
  EXPECT_EQ(r->tree.top_k, 3);
  EXPECT_EQ(r->tree.num_nodes, 12);
  mine = {};
  mine.tree_off = true;
  r = ResolveSpeculation(mine, *server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tree.enabled);
  EXPECT_EQ(r->num_speculative_tokens, 5);
  // A tree for a method that drafts none, or for auto, is refused; the server's is not applied.
  mine = {};
  mine.method = SpeculationMethod::kAuto;
  mine.tree.enabled = true;
  r = ResolveSpeculation(mine, *server, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("speculation.tree"), std::string::npos) << r.status();
  mine.method = SpeculationMethod::kAuto;
  mine.tree.enabled = false;
  r = ResolveSpeculation(mine, *server, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tree.enabled);
  // Out of range, in the server's config and in a request.
  for (const char* bad :
       {R"({"method": "ngram", "tree": {"depth": 0}})",
        R"({"method": "ngram", "tree": {"top_k": 17}})",
        R"({"method": "ngram", "tree": {"num_nodes": 65}})",
        R"({"method": "ngram", "tree": {"width": 2}})", R"({"method": "ngram", "tree": 3})"}) {
    const auto parsed = ParseSpeculativeConfig(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("tree"), std::string::npos) << parsed.status();
  }
  mine = {};
  mine.tree = TreeShape{true, 0, 99, 0};
  r = ResolveSpeculation(mine, *server, false);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // The config round-trips through JSON (how SSD's speculator gets it).
  auto again = ParseSpeculativeConfig(SpeculativeConfigToJson(*server));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->tree.enabled);
  EXPECT_EQ(again->tree.top_k, 3);
}

}  // namespace
}  // namespace specd
