// vegas_bench --tune end to end on the CPU (codepair-long, context 512, a few tokens per
// request): the paper's three steps run in order over the given grid, the choice is printed and
// written as a --speculative-config that parses back to it, a prompt file is read, and a prompt
// file shorter than the context is refused.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "engine/speculation/spec_config.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

const std::string kModel = std::string(SPECD_SHARED_DIR) + "/models/codepair-long";

int RunTune(const std::string& args, std::string* output) {
  const std::string log = ::testing::TempDir() + "/vegas_tune_test.log";
  const std::string command = std::string(SPECD_VEGAS_BENCH_BINARY) + " --model " + kModel +
                              " --device cpu --tune --context 512 --batches 1 --min-tokens 16 "
                              "--max-tokens 16 --repeats 1 --max-model-len 1024 " +
                              args + " >" + log + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  *output = text.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int CountLines(const std::string& output, const std::string& pattern) {
  const std::regex re(pattern);
  std::istringstream lines(output);
  int n = 0;
  for (std::string line; std::getline(lines, line);) n += std::regex_match(line, re);
  return n;
}

TEST(VegasTuneTest, RunsTheThreeStepsAndWritesAConfigThatParses) {
  const std::string written = ::testing::TempDir() + "/vegas_tune_choice.json";
  std::remove(written.c_str());
  std::string out;
  ASSERT_EQ(RunTune("--ks 2,4 --ratios 0.4,0.05,0.1,0.2 --write " + written, &out), 0) << out;
  // (1) at the largest K, ascending ratios: at least two (the first, then until a plateau).
  const int step1 = CountLines(out, "^1 ratio +4 +0\\.(050|100|200|400) .*");
  EXPECT_GE(step1, 2) << out;
  EXPECT_EQ(CountLines(out, "^1 ratio +4 +0\\.050 .*"), 1) << "ascending: 0.05 first\n" << out;
  // (2) every K at one ratio; (3) at most two neighbours.
  EXPECT_EQ(CountLines(out, "^2 K +2 .*"), 1) << out;
  EXPECT_EQ(CountLines(out, "^2 K +4 .*"), 1) << out;
  const int step3 = CountLines(out, "^3 ratio .*");
  EXPECT_GE(step3, 1);
  EXPECT_LE(step3, 2);
  EXPECT_EQ(CountLines(out, "^vegas tune: K [24], sparsity_ratio 0\\.(050|100|200|400) .*"), 1)
      << out;
  std::ifstream in(written);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<SpeculativeConfig> config = ParseSpeculativeConfig(text.str());
  ASSERT_TRUE(config.ok()) << config.status() << "\n" << text.str();
  EXPECT_EQ(config->method, SpeculationMethod::kVegas);
  EXPECT_TRUE(config->num_speculative_tokens == 2 || config->num_speculative_tokens == 4);
  EXPECT_EQ(config->sparse.min_tokens, 16);
  const double r = config->sparse.sparsity_ratio;
  EXPECT_TRUE(r == 0.05 || r == 0.1 || r == 0.2 || r == 0.4) << r;
  EXPECT_NE(out.find(nlohmann::json::parse(text.str()).dump()), std::string::npos)
      << "the printed choice is the written one\n"
      << out;
}

TEST(VegasTuneTest, ReadsAPromptFileAndRefusesOneShorterThanTheContext) {
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(kModel + "/golden.json"));
  ASSERT_TRUE(golden.is_array() && !golden.empty());
  const std::string file = ::testing::TempDir() + "/vegas_tune_prompts.json";
  std::ofstream(file) << nlohmann::json::array({golden[0]["prompt_ids"]}).dump();
  std::string out;
  EXPECT_EQ(RunTune("--ks 2 --ratios 0.1,0.2 --prompts " + file, &out), 0) << out;
  EXPECT_EQ(CountLines(out, "^vegas tune: K 2, .*"), 1) << out;
  std::ofstream(file) << "[[1, 2, 3]]";
  EXPECT_EQ(RunTune("--ks 2 --ratios 0.1 --prompts " + file, &out), 1) << out;
  EXPECT_NE(out.find("no prompts of at least 512 ids"), std::string::npos) << out;
}

}  // namespace
}  // namespace specd
