// specd_profile end to end on the CPU: the built tool measures the codepair pair on a tiny grid
// and the file it writes loads with CostProfile::Load, with the axes asked for and sane times.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/policy/cost_profile.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using json = nlohmann::json;

const std::string kModels = std::string(SPECD_SHARED_DIR) + "/models/codepair";
// The project's trained codepair drafters: an EAGLE-3 head and a parallel (PARD) draft.
const std::string kOwnModels = std::string(SPECD_SOURCE_DIR) + "/models/codepair";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs specd_profile with `args`; its exit status, and its output in *output.
int RunTool(const std::string& args, std::string* output) {
  const std::string log = ::testing::TempDir() + "/specd_profile_test.log";
  const std::string command = std::string(SPECD_PROFILE_BINARY) + " " + args + " >" + log + " 2>&1";
  const int status = std::system(command.c_str());
  *output = ReadFile(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Every time of a GRID's "ms" ([batch][tokens][context]) as one list.
std::vector<double> Times(const json& grid) {
  std::vector<double> out;
  for (const json& b : grid["ms"]) {
    for (const json& t : b) {
      for (const json& c : t) out.push_back(c.get<double>());
    }
  }
  return out;
}

TEST(SpecdProfileTest, WritesAProfileTheLoaderReads) {
  const std::string path = ::testing::TempDir() + "/specd_profile_test.json";
  std::remove(path.c_str());
  std::string output;
  const int rc = RunTool("--model " + kModels + "/target --draft " + kModels +
                             "/draft --device cpu --threads 2 --batch 2,1 --context 64,200 "
                             "--tokens 1,4 --warmup 1 --repeats 3 --budget-seconds 60 --output " +
                             path,
                         &output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("verify_t4"), std::string::npos) << output;  // the table

  absl::StatusOr<CostProfile> profile = CostProfile::Load(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_NE(profile->device.find("cpu"), std::string::npos);
  EXPECT_EQ(profile->models, "target / draft");
  EXPECT_TRUE(profile->Has(PolicyMethod::kNgram));
  EXPECT_TRUE(profile->Has(PolicyMethod::kDraftModel));
  for (PolicyMethod m :
       {PolicyMethod::kSsd, PolicyMethod::kVegas, PolicyMethod::kStreaming, PolicyMethod::kSsv}) {
    EXPECT_FALSE(profile->Has(m)) << PolicyMethodName(m);
  }
  EXPECT_EQ(profile->MaxK(PolicyMethod::kDraftModel), 3);
  EXPECT_EQ(profile->DraftMs(PolicyMethod::kNgram, 2, 3, 64), 0);

  const json j = json::parse(ReadFile(path));
  const json& plain = j["plain"];
  const json& verify = j["verify"];
  const json& draft = j["methods"]["draft_model"]["draft"];
  EXPECT_EQ(plain["batch"], json({1, 2}));  // sorted
  EXPECT_EQ(plain["context"], json({64, 200}));
  EXPECT_EQ(plain.value("tokens", json({1})), json({1}));
  EXPECT_EQ(verify["batch"], json({1, 2}));
  EXPECT_EQ(verify["tokens"], json({1, 4}));
  EXPECT_EQ(verify["context"], json({64, 200}));
  EXPECT_EQ(draft["tokens"], json({1, 3}));  // K: 1 and every tokens - 1 > 1
  EXPECT_EQ(j["methods"]["ngram"], json::object());
  for (const json* grid : {&plain, &verify, &draft}) {
    for (double ms : Times(*grid)) EXPECT_TRUE(std::isfinite(ms) && ms > 0) << ms;
  }

  for (int32_t b : {1, 2}) {
    for (int32_t c : {64, 200}) {
      // Drafting K tokens is K draft steps.
      EXPECT_NEAR(profile->DraftMs(PolicyMethod::kDraftModel, b, 3, c),
                  3 * profile->DraftMs(PolicyMethod::kDraftModel, b, 1, c), 1e-9);
    }
  }
}

// The EAGLE-3 head and a parallel draft: the head's K steps and the draft's one pass per K,
// each an entry the loader reads. (No timing is compared: CI's two cores are shared.)
TEST(SpecdProfileTest, MeasuresTheEagle3HeadAndAParallelDraftsPass) {
  const std::string path = ::testing::TempDir() + "/specd_profile_eagle3_test.json";
  std::remove(path.c_str());
  std::string output;
  const int rc =
      RunTool("--model " + kModels + "/target --draft " + kOwnModels +
                  "/pard --parallel --eagle3 " + kOwnModels +
                  "/eagle3 --device cpu --threads 2 --batch 1,2 --context 16,40 "
                  "--tokens 1,3,5 --warmup 0 --repeats 1 --budget-seconds 120 --output " +
                  path,
              &output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("head step"), std::string::npos) << output;  // progress lines
  EXPECT_NE(output.find("parallel draft pass K=1"), std::string::npos) << output;
  EXPECT_NE(output.find("eagle3_k4"), std::string::npos) << output;  // the table

  absl::StatusOr<CostProfile> profile = CostProfile::Load(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->models, "target / pard (parallel) / EAGLE-3 eagle3");
  ASSERT_TRUE(profile->Has(PolicyMethod::kEagle3));
  ASSERT_TRUE(profile->Has(PolicyMethod::kDraftModel));
  EXPECT_FALSE(profile->Costs(PolicyMethod::kEagle3)->parallel);
  EXPECT_TRUE(profile->Costs(PolicyMethod::kDraftModel)->parallel);
  EXPECT_EQ(profile->MaxK(PolicyMethod::kEagle3), 4);
  EXPECT_EQ(profile->MaxK(PolicyMethod::kDraftModel), 4);

  const json j = json::parse(ReadFile(path));
  const json& head = j["methods"]["eagle3"];
  const json& draft = j["methods"]["draft_model"];
  EXPECT_FALSE(head.contains("verify"));  // dense verification
  EXPECT_EQ(draft["parallel"], true);
  for (const json* grid : {&head["draft"], &draft["draft"]}) {
    EXPECT_EQ((*grid)["batch"], json({1, 2}));
    EXPECT_EQ((*grid)["tokens"], json({1, 2, 4}));  // K: 1 and every tokens - 1 > 1
    EXPECT_EQ((*grid)["context"], json({16, 40}));
    for (double ms : Times(*grid)) EXPECT_TRUE(std::isfinite(ms) && ms > 0) << ms;
  }
  for (int32_t b : {1, 2}) {
    for (int32_t c : {16, 40}) {
      // Drafting K tokens with the head is K head steps.
      EXPECT_NEAR(profile->DraftMs(PolicyMethod::kEagle3, b, 4, c),
                  4 * profile->DraftMs(PolicyMethod::kEagle3, b, 1, c), 1e-9);
    }
  }
  // The parallel draft's K are separate measurements of one pass each, not multiples of one
  // step (its times are whatever the passes took; only their independence is checked).
  const std::vector<double> pass = Times(draft["draft"]);  // [batch][K][context]
  bool all_multiples = true;
  for (size_t b = 0; b < 2; ++b) {
    for (size_t c = 0; c < 2; ++c) {
      const double k1 = pass[(b * 3 + 0) * 2 + c], k4 = pass[(b * 3 + 2) * 2 + c];
      all_multiples = all_multiples && std::abs(k4 - 4 * k1) < 1e-9;
    }
  }
  EXPECT_FALSE(all_multiples);
}

// --vegas: self-speculation's entries -- vegas {draft, verify} (its verification also selects
// the next round's KV), streaming {draft} over dense verification -- on the CPU, where the
// selection travels as scores (host lists); drafting K tokens is K sparse steps.
TEST(SpecdProfileTest, MeasuresSparseDrafting) {
  const std::string path = ::testing::TempDir() + "/specd_profile_vegas_test.json";
  std::remove(path.c_str());
  std::string output;
  const int rc = RunTool("--model " + kModels +
                             "/target --device cpu --threads 2 --batch 1,2 --context 64,200 "
                             "--tokens 1,4 --warmup 0 --repeats 1 --budget-seconds 120 --vegas "
                             "--sparsity-ratio 0.1 --sparse-min-tokens 8 --output " +
                             path,
                         &output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("sparse step"), std::string::npos) << output;  // progress lines
  absl::StatusOr<CostProfile> profile = CostProfile::Load(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_TRUE(profile->Has(PolicyMethod::kVegas));
  ASSERT_TRUE(profile->Has(PolicyMethod::kStreaming));
  EXPECT_EQ(profile->MaxK(PolicyMethod::kVegas), 3);
  const json j = json::parse(ReadFile(path));
  EXPECT_TRUE(j["methods"]["vegas"].contains("verify"));  // the scored pass
  EXPECT_FALSE(j["methods"]["streaming"].contains("verify"));
  for (int32_t b : {1, 2}) {
    for (int32_t c : {64, 200}) {
      for (PolicyMethod m : {PolicyMethod::kVegas, PolicyMethod::kStreaming}) {
        const double one = profile->DraftMs(m, b, 1, c);
        EXPECT_GT(one, 0) << PolicyMethodName(m);
        EXPECT_NEAR(profile->DraftMs(m, b, 3, c), 3 * one, 1e-9) << PolicyMethodName(m);
      }
      EXPECT_GT(profile->VerifyMs(PolicyMethod::kVegas, b, 4, c), 0);
    }
  }
  // Bad budgets are refused with the flag named.
  EXPECT_EQ(
      RunTool("--model " + kModels + "/target --device cpu --vegas --sparsity-ratio 0", &output), 2)
      << output;
}

// Verify times over the grid: the sum over (batch, context) of four-token and one-token passes.
void SumVerifyMs(const CostProfile& profile, double* one, double* four) {
  *one = *four = 0;
  for (int32_t b : {1, 2}) {
    for (int32_t c : {64, 200}) {
      *one += profile.VerifyMs(PolicyMethod::kPlain, b, 1, c);
      *four += profile.VerifyMs(PolicyMethod::kPlain, b, 4, c);
    }
  }
}

// The tool measures a four-token verify pass, not a one-token pass twice: four tokens per
// sequence are not cheaper than one over the grid. This is a timing property, and CI runs this
// test on two cores shared with other tests, where one median was seen off by 7x (b=2 ctx=200:
// t1 110 ms, t4 44 ms) and the grid sum below 0.9x once in ~20 runs. So the check measures
// again, up to five times, and fails only when no run shows it; a tool that wrote the t=1 time
// for t=4 would still fail every run about half the time, and one that skipped work always.
TEST(SpecdProfileTest, FourTokenVerifyIsNotCheaperThanOne) {
  const std::string path = ::testing::TempDir() + "/specd_profile_verify_test.json";
  std::string log;
  for (int attempt = 1; attempt <= 5; ++attempt) {
    std::remove(path.c_str());
    std::string output;
    const int rc = RunTool("--model " + kModels +
                               "/target --device cpu --threads 2 --batch 1,2 "
                               "--context 64,200 --tokens 1,4 --warmup 1 --repeats 3 "
                               "--budget-seconds 60 --output " +
                               path,
                           &output);
    ASSERT_EQ(rc, 0) << output;
    absl::StatusOr<CostProfile> profile = CostProfile::Load(path);
    ASSERT_TRUE(profile.ok()) << profile.status();
    double one = 0, four = 0;
    SumVerifyMs(*profile, &one, &four);
    if (four >= 0.9 * one) return;
    log += "attempt " + std::to_string(attempt) + ": t1 sum " + std::to_string(one) +
           " ms, t4 sum " + std::to_string(four) + " ms\n" + output;
  }
  ADD_FAILURE() << "four-token verify passes were cheaper than one-token passes in 5 runs\n" << log;
}

TEST(SpecdProfileTest, RefusesBadFlagsAndSaysWhatItSkips) {
  std::string output;
  EXPECT_EQ(RunTool("--device cpu", &output), 2) << output;  // no --model
  EXPECT_NE(output.find("--model is required"), std::string::npos) << output;
  EXPECT_EQ(RunTool("--model x --batch 0,4", &output), 2) << output;
  EXPECT_EQ(RunTool("--model x --no-such-flag 1", &output), 2) << output;
  EXPECT_EQ(RunTool("--model x --parallel", &output), 2) << output;  // no --draft
  EXPECT_NE(output.find("--parallel needs --draft"), std::string::npos) << output;
  EXPECT_EQ(RunTool("--help", &output), 0);
  for (const char* skipped : {"vegas", "streaming", "ssv", "ssd"}) {
    EXPECT_NE(output.find(skipped), std::string::npos) << skipped;
  }
  // A model folder that does not exist: an error naming it, exit status 1.
  EXPECT_EQ(RunTool("--model /nonexistent-model --device cpu", &output), 1) << output;
  EXPECT_NE(output.find("nonexistent-model"), std::string::npos) << output;
}

}  // namespace
}  // namespace specd

namespace specd {
namespace {

// The SSV planner (ssv_bench --tune is the same code with --ssv lossless): an NSA target's
// strategies measured into the profile's "ssv" section, ranked in the output; refused on a
// dense target.
TEST(SpecdProfileTest, MeasuresAndRanksTheSsvStrategiesOfAnNsaTarget) {
  const std::string path = ::testing::TempDir() + "/specd_profile_ssv_test.json";
  std::remove(path.c_str());
  std::string output;
  const std::string nsa = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";
  const int rc = RunTool("--model " + nsa + " --draft " + kModels +
                             "/draft --device cpu --threads 2 --batch 1,2 --context 600 "
                             "--tokens 1,5 --warmup 0 --repeats 1 --alpha 0.7 --distinct-contexts "
                             "--ssv exact/c1/r1,exact/c4/r1,shared/c4/r1 --output " +
                             path,
                         &output);
  ASSERT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("SSV ranking at alpha 0.70"), std::string::npos) << output;
  EXPECT_NE(output.find("shared/c4/r1 K4"), std::string::npos) << output;
  absl::StatusOr<CostProfile> profile = CostProfile::Load(path);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_EQ(profile->ssv().size(), 3u);
  EXPECT_DOUBLE_EQ(profile->ssv_alpha, 0.7);
  for (const SsvCosts& c : profile->ssv()) {
    EXPECT_EQ(c.verify.tokens(), (std::vector<int32_t>{1, 5})) << SsvStrategyName(c.strategy);
    for (double ms : c.verify.ms()) EXPECT_GT(ms, 0) << SsvStrategyName(c.strategy);
  }

  ASSERT_EQ(RunTool("--model " + kModels +
                        "/target --device cpu --batch 1 --context 64 "
                        "--tokens 2 --ssv lossless --output " +
                        path,
                    &output),
            1)
      << output;
  EXPECT_NE(output.find("--ssv: SSV strategies verify NSA models"), std::string::npos) << output;
  ASSERT_EQ(RunTool("--model " + nsa + " --ssv exact/c99/r1", &output), 2) << output;
}

}  // namespace
}  // namespace specd
