// spec_bench end to end on the CPU (codepair pair, a few tokens per request): the K sweep and
// `auto` end with the summary table, controlled acceptance settles every point on one engine,
// --cost-profile reaches the engine, a single --k keeps the plain output (no summary), also with
// --no-prefix-caching, and replayed token trees accept what alpha predicts, printing acceptance up
// to their depth.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace specd {
namespace {

const std::string kModels = std::string(SPECD_SHARED_DIR) + "/models/codepair";

// Runs spec_bench on the CPU over the codepair pair with `args`; its exit status, and its
// output in *output.
int RunBench(const std::string& args, std::string* output) {
  const std::string log = ::testing::TempDir() + "/spec_bench_test.log";
  const std::string command = std::string(SPECD_SPEC_BENCH_BINARY) + " --model " + kModels +
                              "/target --draft " + kModels + "/draft --prompts " + kModels +
                              "/prompts.jsonl --device cpu --threads 2 --repeats 1 " + args + " >" +
                              log + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  *output = text.str();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Lines of `output` matching `pattern` (a whole-line ECMAScript regex).
int CountLines(const std::string& output, const std::string& pattern) {
  const std::regex re(pattern);
  std::istringstream lines(output);
  int n = 0;
  for (std::string line; std::getline(lines, line);) n += std::regex_match(line, re);
  return n;
}

TEST(SpecBenchTest, SweepsKAndComparesAutoWithTheBestFixedChoice) {
  std::string out;
  ASSERT_EQ(RunBench("--batches 1,2 --ks 1,2 --auto --max-tokens 8", &out), 0) << out;
  for (const char* row : {"draft_model k=1", "draft_model k=2", "ngram k=1", "ngram k=2", "auto"}) {
    EXPECT_EQ(CountLines(out, std::string("^[12] +") + row + " +[0-9.]+ .*"), 2) << row << out;
  }
  EXPECT_EQ(CountLines(out, "^summary: .*"), 1) << out;
  // batch, plain, best fixed (method [k=K]), its tok/s, auto, the two ratios, the verdict.
  EXPECT_EQ(CountLines(out,
                       "^[12] +[0-9.]+ +(none|(draft_model|ngram) k=[12]) +[0-9.]+ +[0-9.]+ +"
                       "[0-9.]+x +[0-9.]+x +(PASS|MISS)$"),
            2)
      << out;
  EXPECT_EQ(CountLines(out,
                       "^batch [12]: auto chose \\(request-steps\\):.*"
                       "usage.speculation.by_method:.*"),
            2)
      << out;
}

TEST(SpecBenchTest, ControlledAcceptanceSettlesEveryPoint) {
  std::string out;
  ASSERT_EQ(RunBench("--batches 2 --ks 2 --auto --max-tokens 8 --replay-alpha 0.8", &out), 0)
      << out;
  // The draft model and auto replay (their outputs follow the trajectories); n-gram joins them
  // because auto runs.
  for (const char* row : {"draft_model", "ngram", "auto"}) {
    EXPECT_EQ(CountLines(out, std::string("^2 +") + row + " .*output = trajectory: .*"), 1)
        << row << out;
  }
  EXPECT_EQ(CountLines(out,
                       "^2 +(draft_model|auto) .*output = trajectory: 2 of 2; settled after "
                       "[1-5] runs.*"),
            2)
      << out;
  EXPECT_EQ(CountLines(out, "^2 +[0-9.]+ +.* (PASS|MISS)$"), 1) << out;
}

// The row of `method` at `batch`: tokens per round and acceptance by position (false: none).
bool ParseRow(const std::string& output, const std::string& batch, const std::string& method,
              double* tokens_per_round, std::string* acceptance) {
  const std::regex re("^" + batch + " +" + method +
                      " +[0-9.]+ +[0-9.]+x +([0-9.]+)  ([0-9. ]+)  \\{per step: draft [0-9.]+ ms, "
                      "verify [0-9.]+ ms, rest [0-9.]+ ms\\}.*");
  std::istringstream lines(output);
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (!std::regex_match(line, m, re)) continue;
    *tokens_per_round = std::stod(m[1].str());
    *acceptance = m[2].str();
    return true;
  }
  return false;
}

TEST(SpecBenchTest, ReplayedTreesAcceptWhatAlphaPredicts) {
  std::string out;
  ASSERT_EQ(RunBench("--batches 4 --k 5 --trees 5/3/16 --max-tokens 48 --replay-alpha 0.8", &out),
            0)
      << out;
  // Alpha a per position, depth 5: about 1 + a + a^2 + ... + a^5 tokens per round, fewer when a
  // request's last round is cut by max_tokens (here about 15 rounds a request) and, for the tree,
  // when its selection drops the recorded path. The hits are drawn per position, the same for
  // the chain and the tree, so the tree's count follows the chain's closely.
  double expected = 1;
  for (int d = 1; d <= 5; ++d) expected += std::pow(0.8, d);
  double chain = 0, tree = 0;
  std::string chain_acceptance, tree_acceptance;
  ASSERT_TRUE(ParseRow(out, "4", "draft_model k=5", &chain, &chain_acceptance)) << out;
  ASSERT_TRUE(ParseRow(out, "4", "draft_model tree 5/3/16", &tree, &tree_acceptance)) << out;
  EXPECT_NEAR(chain, expected - 0.2, 0.5) << out;
  EXPECT_NEAR(tree, chain, 0.3) << out;
  // Acceptance by position up to the tree's depth only (its 16 nodes are not positions).
  EXPECT_EQ(CountLines(tree_acceptance, "^[0-9.]+( [0-9.]+){4} *$"), 1) << tree_acceptance;
  EXPECT_EQ(CountLines(out,
                       "^4 +draft_model (k=5|tree 5/3/16) .*output = trajectory: 4 of 4; "
                       "settled after [1-5] runs.*"),
            2)
      << out;
}

TEST(SpecBenchTest, ReplayedVegasAcceptsWhatAlphaPredicts) {
  // Vegas drafts with the target itself over a sparse selection of its KV; replayed, its greedy
  // drafts follow the recording with probability alpha while every sparse pass still runs.
  std::string out;
  ASSERT_EQ(RunBench("--batches 2 --k 4 --max-tokens 32 --replay-alpha 0.8 --draft none --vegas "
                     "--sparsity-ratio 0.1 --sparse-min-tokens 8",
                     &out),
            0)
      << out;
  double expected = 1;
  for (int d = 1; d <= 4; ++d) expected += std::pow(0.8, d);
  double tokens = 0;
  std::string acceptance;
  ASSERT_TRUE(ParseRow(out, "2", "vegas", &tokens, &acceptance)) << out;
  EXPECT_NEAR(tokens, expected - 0.2, 0.6) << out;
  EXPECT_EQ(CountLines(out, "^2 +vegas .*output = trajectory: 2 of 2; settled after [1-5] runs.*"),
            1)
      << out;
  EXPECT_EQ(CountLines(out, "^2 +draft_model .*"), 0) << out;  // --draft none
}

TEST(SpecBenchTest, AutoRunsBesideVegasWithoutADraftModel) {
  // --draft none --vegas --auto: auto runs on the self-speculation engine (its default rule
  // prices neither Vegas nor streaming, so it picks plain or n-gram here, losslessly).
  std::string out;
  ASSERT_EQ(RunBench("--batches 2 --k 4 --max-tokens 16 --replay-alpha 0.8 --draft none --vegas "
                     "--sparsity-ratio 0.1 --sparse-min-tokens 8 --auto",
                     &out),
            0)
      << out;
  EXPECT_EQ(CountLines(out, "^2 +auto .*output = trajectory: 2 of 2; settled after [1-5] runs.*"),
            1)
      << out;
  EXPECT_EQ(CountLines(out, "^2 +[0-9.]+ +.* (PASS|MISS)$"), 1) << out;
  EXPECT_EQ(CountLines(out, "^batch 2: auto chose \\(request-steps\\):.*"), 1) << out;
}

TEST(SpecBenchTest, OneKKeepsTheOutputWithoutSummaryAndFlagsAreChecked) {
  std::string out;
  ASSERT_EQ(RunBench("--batches 1 --k 2 --max-tokens 4", &out), 0) << out;
  EXPECT_EQ(CountLines(out, "^1 +(draft_model|ngram) +[0-9.]+ .*"), 2) << out;
  EXPECT_EQ(out.find("summary:"), std::string::npos) << out;
  EXPECT_EQ(CountLines(out, "^1 +auto .*"), 0) << out;
  ASSERT_EQ(RunBench("--batches 1 --k 2 --max-tokens 4 --no-prefix-caching", &out), 0) << out;
  EXPECT_EQ(CountLines(out, "^1 +(draft_model|ngram) +[0-9.]+ .*"), 2) << out;

  EXPECT_EQ(RunBench("--ks 0,2", &out), 2) << out;
  EXPECT_EQ(RunBench("--ks 1,x", &out), 2) << out;
  // The profile goes to the engine, which refuses a file it cannot load.
  EXPECT_EQ(RunBench("--auto --cost-profile /nonexistent/profile.json --batches 1", &out), 1)
      << out;
  EXPECT_NE(out.find("--cost-profile"), std::string::npos) << out;
}

}  // namespace
}  // namespace specd
