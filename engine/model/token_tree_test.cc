// Token trees in the exact CPU forward pass: a tree verified in one chunk gives every node the
// logits its own path gives when run causally, whatever the tree's shape (also across a sliding
// window and when the tree's earlier nodes were written by an earlier pass); malformed trees are
// InvalidArgument.
#include "engine/model/token_tree.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/model_test_util.h"

namespace specd {
namespace {

using model_test::RelError;

TEST(TokenTreeTest, DepthsPathsAndValidation) {
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 4};
  std::vector<int32_t> depths;
  TreeDepths(parents, &depths);
  EXPECT_EQ(depths, (std::vector<int32_t>{0, 1, 1, 2, 2, 3}));
  std::vector<int32_t> path = {9};
  AppendTreePath(parents, 5, &path);
  EXPECT_EQ(path, (std::vector<int32_t>{9, 0, 2, 4, 5}));
  // The mask row of node 5 (ancestors 0, 2, 4 and itself), across a word boundary too.
  std::vector<uint64_t> mask(1, 0);
  SetTreeMaskBits(parents, 5, mask);
  EXPECT_EQ(mask[0],
            (uint64_t{1} << 0) | (uint64_t{1} << 2) | (uint64_t{1} << 4) | (uint64_t{1} << 5));
  std::vector<int32_t> chain(70);
  std::iota(chain.begin(), chain.end(), -1);  // node i's parent is i - 1
  std::vector<uint64_t> wide(2, 0);
  SetTreeMaskBits(chain, 66, wide);
  EXPECT_EQ(wide[0], ~uint64_t{0});
  EXPECT_EQ(wide[1], uint64_t{0b111});
  EXPECT_TRUE(ValidateTreeParents(parents).ok());
  EXPECT_TRUE(ValidateTreeParents(std::vector<int32_t>{-1, -1, 1}).ok());  // a forest
  for (const std::vector<int32_t>& bad :
       {std::vector<int32_t>{0}, std::vector<int32_t>{-1, 1}, std::vector<int32_t>{-1, -2}}) {
    const absl::Status s = ValidateTreeParents(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("tree node"), std::string::npos) << s;
  }
}

class TreeForwardTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    LoadOptions opts;
    opts.num_threads = 2;
    auto model = Model::Load(model_test::ModelPath("tiny-random/" + GetParam()), opts);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    vocab_ = model_->config().vocab_size;
  }

  std::unique_ptr<CpuKvCache> NewCache() {
    auto kv = CpuKvCache::Create(model_->MakeKvCacheSpec(/*num_blocks=*/16, /*block_size=*/4));
    EXPECT_TRUE(kv.ok()) << kv.status();
    return kv.ok() ? std::move(*kv) : nullptr;
  }

  // Logits of the last token of prompt + path, run causally in a fresh cache.
  std::vector<float> CausalLast(const std::vector<int32_t>& tokens) {
    std::unique_ptr<CpuKvCache> kv = NewCache();
    const SequenceInput seq{tokens, 0, table_, false};
    std::vector<float> logits;
    EXPECT_TRUE(model_->Forward({&seq, 1}, *kv, &logits).ok());
    return logits;
  }

  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
  std::vector<int32_t> table_ = [] {
    std::vector<int32_t> t(16);
    std::iota(t.begin(), t.end(), 0);
    return t;
  }();
};

// prompt (23 tokens: past mistral's window of 16 once the tree is deep), then a tree rooted at
// the prompt's last token: node tokens and parents (root = node 0).
const std::vector<int32_t> kPrompt = {3,  17, 99, 5,   41, 8,  77, 12, 6,  300, 2, 9,
                                      55, 61, 70, 101, 33, 14, 90, 7,  18, 250, 4};
const std::vector<int32_t> kTreeTokens = {4, 10, 11, 12, 20, 21, 30, 31, 40};
const std::vector<int32_t> kTreeParents = {-1, 0, 0, 0, 1, 1, 4, 2, 6};

TEST_P(TreeForwardTest, EveryNodeGetsItsPathsLogits) {
  // The prompt but its last token, then the tree (whose root is that token) in one chunk, in a
  // batch beside a plain causal chunk of another sequence.
  std::unique_ptr<CpuKvCache> kv = NewCache();
  const int32_t start = static_cast<int32_t>(kPrompt.size()) - 1;
  const std::vector<int32_t> prefix(kPrompt.begin(), kPrompt.end() - 1);
  std::vector<float> logits;
  {
    const SequenceInput seq{prefix, 0, table_, false};
    ASSERT_TRUE(model_->Forward({&seq, 1}, *kv, &logits).ok());
  }
  const TokenTree tree{start, kTreeParents};
  std::vector<int32_t> other_table(table_.begin() + 8, table_.end());
  const std::vector<int32_t> other = {5, 6, 7};
  std::vector<SequenceInput> batch(2);
  batch[0] = SequenceInput{other, 0, other_table, true};
  batch[1] = SequenceInput{kTreeTokens, start, table_, true};
  batch[1].tree = &tree;
  logits.clear();
  ASSERT_TRUE(model_->Forward(batch, *kv, &logits).ok());
  ASSERT_EQ(logits.size(), (other.size() + kTreeTokens.size()) * vocab_);
  const std::span<const float> all(logits);
  EXPECT_LT(RelError(all.subspan(2 * vocab_, vocab_), CausalLast(other)), 1e-5);
  for (size_t n = 0; n < kTreeTokens.size(); ++n) {
    std::vector<int32_t> path;
    AppendTreePath(kTreeParents, static_cast<int32_t>(n), &path);
    std::vector<int32_t> tokens = prefix;
    for (int32_t p : path) tokens.push_back(kTreeTokens[p]);
    const std::vector<float> expected = CausalLast(tokens);
    EXPECT_LT(RelError(all.subspan((other.size() + n) * vocab_, vocab_), expected), 1e-5)
        << "node " << n;
  }
}

TEST_P(TreeForwardTest, ALevelAtATimeEqualsTheWholeTree) {
  // Tree drafting runs a tree level by level: nodes below start_pos come from earlier passes.
  std::unique_ptr<CpuKvCache> whole = NewCache();
  std::unique_ptr<CpuKvCache> levels = NewCache();
  const int32_t start = static_cast<int32_t>(kPrompt.size()) - 1;
  const std::vector<int32_t> prefix(kPrompt.begin(), kPrompt.end() - 1);
  std::vector<float> expected, got, scratch;
  for (CpuKvCache* kv : {whole.get(), levels.get()}) {
    const SequenceInput seq{prefix, 0, table_, false};
    ASSERT_TRUE(model_->Forward({&seq, 1}, *kv, &scratch).ok());
  }
  const TokenTree tree{start, kTreeParents};
  SequenceInput all{kTreeTokens, start, table_, true};
  all.tree = &tree;
  ASSERT_TRUE(model_->Forward({&all, 1}, *whole, &expected).ok());
  // Root alone, then nodes 1..3, then 4..8.
  for (const auto& [first, count] :
       std::vector<std::pair<int32_t, int32_t>>{{0, 1}, {1, 3}, {4, 5}}) {
    const TokenTree part{start, std::span<const int32_t>(kTreeParents).first(first + count)};
    SequenceInput seq{std::span<const int32_t>(kTreeTokens).subspan(first, count), start + first,
                      table_, true};
    seq.tree = &part;
    ASSERT_TRUE(model_->Forward({&seq, 1}, *levels, &got).ok());
  }
  ASSERT_EQ(got.size(), expected.size());
  for (size_t n = 0; n < kTreeTokens.size(); ++n) {
    EXPECT_LT(RelError(std::span<const float>(got).subspan(n * vocab_, vocab_),
                       std::span<const float>(expected).subspan(n * vocab_, vocab_)),
              1e-5)  // the same math in other GEMM shapes
        << "node " << n;
  }
}

TEST_P(TreeForwardTest, MalformedTreesAreInvalid) {
  std::unique_ptr<CpuKvCache> kv = NewCache();
  std::vector<float> logits;
  auto expect_invalid = [&](const SequenceInput& seq, const std::string& words) {
    logits.clear();
    const absl::Status s = model_->Forward({&seq, 1}, *kv, &logits);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << s;
    EXPECT_TRUE(logits.empty());
  };
  const std::vector<int32_t> tokens = {1, 2, 3};
  const std::vector<int32_t> parents = {-1, 0, 0};
  const TokenTree late{5, parents};  // starts after start_pos
  SequenceInput seq{tokens, 4, table_, true};
  seq.tree = &late;
  expect_invalid(seq, "tree start 5");
  const TokenTree short_tree{4, std::span<const int32_t>(parents).first(2)};
  seq.tree = &short_tree;
  expect_invalid(seq, "2 parents");
  const std::vector<int32_t> cyclic = {-1, 2, 0};
  const TokenTree bad{4, cyclic};
  seq.tree = &bad;
  expect_invalid(seq, "tree node 1");
  const TokenTree good{4, parents};
  seq.tree = &good;
  ChunkAttention scores;
  std::vector<float> buffer(model_->config().num_layers * 2 * 4);
  scores.scores = buffer;
  seq.attention = &scores;
  expect_invalid(seq, "no attention options");
}

INSTANTIATE_TEST_SUITE_P(Models, TreeForwardTest, ::testing::Values("llama3", "mistral", "qwen3"));

}  // namespace
}  // namespace specd
