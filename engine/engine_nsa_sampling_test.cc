// Sampled speculation on an NSA target (nsa-codepair, the codepair draft) verified with SSV:
// the chi-square test of engine_spec_test_util.h, and its negative control. Its own binary so
// that the sanitizer stage can leave these 3,000 requests out (tools/ci/sanitizers.sh).
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/testing/engine_nsa_test_util.h"
#include "engine/testing/engine_spec_test_util.h"
#include "engine/testing/test_flags.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using namespace nsa_test;  // NOLINT: the shared fixtures of engine_nsa_test_util.h

// Sampled speculation verified with SSV mode exact (C 4) keeps the target's distribution: the
// second token after golden entry 0's first 320 ids (10 NSA blocks: S = 8 of them are selected)
// against the target's own top-20 probabilities; the same test catches a broken
// acceptance rule.
class NsaSampledTest : public ::testing::TestWithParam<bool> {
 protected:
  void TearDown() override {
    acceptance_internal::acceptor_rule_for_test = acceptance_internal::Rule::kSpeculativeSampling;
  }
};

TEST_P(NsaSampledTest, SecondTokenFollowsTheTargetUnderSsvExact) {
  const bool broken = GetParam();
  if (broken) {
    acceptance_internal::acceptor_rule_for_test =
        acceptance_internal::Rule::kDraftOverTargetForTest;
  }
  const std::vector<Golden> goldens = ReadGoldens();
  ASSERT_EQ(goldens.size(), 6u);
  EngineOptions options;
  options.model_dir = kNsaModel;
  options.max_model_len = 2048;
  options.num_threads = 2;
  options.speculative.draft_model = kDraftModel;
  auto engine = Engine::Create(options);  // offline: GenerateBatch
  ASSERT_TRUE(engine.ok()) << engine.status();
  SpeculationParams spec{SpeculationMethod::kDraftModel, 2};
  spec.ssv_group_size = 4;
  const std::vector<int32_t> prompt(goldens[0].prompt.begin(), goldens[0].prompt.begin() + 320);
  const auto [stat, critical] =
      speculation_test::SecondTokenChiSquare(**engine, prompt, 1500, spec);
  if (broken) {
    EXPECT_GT(stat, critical) << "the broken rule must be caught";
  } else {
    EXPECT_LT(stat, critical);
  }
}

INSTANTIATE_TEST_SUITE_P(Acceptance, NsaSampledTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Broken" : "Correct"; });

}  // namespace
}  // namespace specd
