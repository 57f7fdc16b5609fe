// Model::Forward input validation: bad requests are InvalidArgument and leave the cache
// untouched; an empty batch is a no-op.
#include "engine/model/model.h"

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

namespace specd {
namespace {

class ForwardValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LoadOptions opts;
    opts.num_threads = 1;
    auto model = Model::Load(std::string(SPECD_SHARED_DIR) + "/models/tiny-random/llama3", opts);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto kv = CpuKvCache::Create(model_->MakeKvCacheSpec(/*num_blocks=*/8, /*block_size=*/4));
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    table_.resize(8);
    std::iota(table_.begin(), table_.end(), 0);
  }

  absl::Status Run(const SequenceInput& seq) {
    logits_.clear();
    return model_->Forward({&seq, 1}, *kv_, &logits_);
  }

  void ExpectInvalid(const SequenceInput& seq, const std::string& words) {
    absl::Status s = Run(seq);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << s;
    EXPECT_TRUE(logits_.empty());
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuKvCache> kv_;
  std::vector<int32_t> table_;
  std::vector<float> logits_;
};

TEST_F(ForwardValidationTest, RejectsTokenOutsideVocabulary) {
  const std::vector<int32_t> tokens = {5, 1024};
  ExpectInvalid({tokens, 0, table_, false}, "token id 1024");
  const std::vector<int32_t> negative = {-1};
  ExpectInvalid({negative, 0, table_, false}, "token id -1");
}

TEST_F(ForwardValidationTest, RejectsShortBlockTable) {
  const std::vector<int32_t> tokens(9, 7);  // 9 positions need 3 blocks of 4
  ExpectInvalid({tokens, 0, std::span<const int32_t>(table_).first(2), false}, "block table");
}

TEST_F(ForwardValidationTest, RejectsBlockIdOutsideCache) {
  const std::vector<int32_t> tokens = {7};
  const std::vector<int32_t> table = {8};
  ExpectInvalid({tokens, 0, table, false}, "block id 8");
}

TEST_F(ForwardValidationTest, RejectsPositionsPastMaxPositionEmbeddings) {
  const std::vector<int32_t> tokens = {7, 8};
  ExpectInvalid({tokens, 4095, table_, false}, "max_position_embeddings");
  ExpectInvalid({tokens, -1, table_, false}, "start_pos");
}

TEST_F(ForwardValidationTest, RejectsEmptySequenceAndForeignCache) {
  ExpectInvalid({{}, 0, table_, false}, "no tokens");
  auto other = CpuKvCache::Create(KvCacheSpec{2, 2, 32, 4, 8});  // head_dim 32, not 16
  ASSERT_TRUE(other.ok());
  const std::vector<int32_t> tokens = {7};
  const SequenceInput seq{tokens, 0, table_, false};
  EXPECT_EQ(model_->Forward({&seq, 1}, **other, &logits_).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ForwardValidationTest, AppendsRowsAndAcceptsEmptyBatch) {
  EXPECT_TRUE(model_->Forward({}, *kv_, &logits_).ok());
  EXPECT_TRUE(logits_.empty());
  const std::vector<int32_t> tokens = {7, 8, 9};
  logits_.assign(3, 1.0f);  // existing rows are kept
  const SequenceInput seq{tokens, 0, table_, true};
  ASSERT_TRUE(model_->Forward({&seq, 1}, *kv_, &logits_).ok());
  EXPECT_EQ(logits_.size(), 3u + 3u * 1024u);
  EXPECT_EQ(logits_[0], 1.0f);
}

}  // namespace
}  // namespace specd
