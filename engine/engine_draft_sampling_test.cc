// Sampled output of the cheap drafters (issue 33) keeps the target's distribution: the chi-square
// test of the first token a verification round decides, for the EAGLE-3 head and the parallel
// draft the project trained, and for token trees of the codepair draft model and of the head
// (recursive rejection over siblings), each with its negative control (a broken acceptance rule
// the test must reject). 1,000 sampled requests per test (the negative controls scored 287 and
// 300 at 2,000 against a critical value of 45): its own binary, left out of the ASan stage as
// engine_spec_test is (engine_eagle3_test and engine_parallel_draft_test run there).
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/testing/test_flags.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace speculation_test;  // NOLINT: the shared fixtures of the speculation tests

const std::string kHead = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
const std::string kPard = std::string(SPECD_SOURCE_DIR) + "/models/codepair/pard";

class DraftSamplingTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string drafter = GetParam();
    const bool eagle3 = drafter == "eagle3" || drafter == "eagle3_tree";
    engine_ = MakeEngine(kTarget, eagle3 ? R"({"method": "eagle3", "model": ")" + kHead + R"("})"
                                  : drafter == "tree"
                                      ? R"({"model": ")" + kDraft + R"("})"
                                      : R"({"model": ")" + kPard + R"(", "parallel": true})");
    ASSERT_NE(engine_, nullptr);
    spec_ = {eagle3 ? SpeculationMethod::kEagle3 : SpeculationMethod::kDraftModel, 2};
    // A tree of 9 nodes, 3 children a node: the second token is kept among the root's three.
    if (drafter == "tree" || drafter == "eagle3_tree") spec_.tree = TreeShape{true, 3, 3, 9};
    // The first token is "," with p 0.79; the second is uncertain (engine_spec_test's prompt).
    prompt_ = *engine_->tokenizer()->Encode("class Foo:\n    def __init__(self", true);
  }
  void TearDown() override {
    acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kSpeculativeSampling;
  }
  std::unique_ptr<Engine> engine_;
  SpeculationParams spec_;
  std::vector<int32_t> prompt_;
};

TEST_P(DraftSamplingTest, SecondTokenFollowsTheTargetDistribution) {
  const auto [stat, critical] = SecondTokenChiSquare(*engine_, prompt_, 1000, spec_);
  EXPECT_LT(stat, critical);
}

TEST_P(DraftSamplingTest, BrokenAcceptanceRuleIsCaught) {
  acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kDraftOverTargetForTest;
  const auto [stat, critical] = SecondTokenChiSquare(*engine_, prompt_, 1000, spec_);
  EXPECT_GT(stat, critical);
}

INSTANTIATE_TEST_SUITE_P(CheapDrafters, DraftSamplingTest,
                         ::testing::Values("eagle3", "parallel_draft", "tree", "eagle3_tree"));

}  // namespace
}  // namespace specd
