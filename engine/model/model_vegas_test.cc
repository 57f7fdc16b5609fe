// Vegas attention options of the CPU forward pass (ChunkAttention): sparse attention over an
// index list plus the recent tokens and score collection, checked against kernels::ref's
// references (fp64, over the same K/V written out in their "HND" layout) and against the dense
// pass; mixed batches in one Forward.
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "engine/model/attention.h"
#include "engine/model/model.h"
#include "engine/model/model_test_util.h"
#include "gtest/gtest.h"
#include "kernels/ref/vegas.h"

namespace specd {
namespace {

using model_test::ModelPath;
using model_test::RelError;

// A random cache of one layer, its HND copy in f64, and random queries of one sequence.
struct AttentionCase {
  AttentionShape shape{4, 2, 16, 0};
  int32_t block_size = 8;
  int32_t seq_len = 70;  // keys [0, seq_len)
  int32_t q_len = 3;     // queries at seq_len - q_len ...
  std::unique_ptr<CpuKvCache> kv;
  std::vector<int32_t> table;
  std::vector<double> k_hnd, v_hnd, q64;
  std::vector<float> q;

  explicit AttentionCase(int32_t window = 0) {
    shape.sliding_window = window;
    const int32_t blocks = (seq_len + block_size - 1) / block_size + 2;
    KvCacheSpec spec{1, shape.num_kv_heads, shape.head_dim, block_size, blocks};
    kv = *CpuKvCache::Create(spec);
    table.resize(blocks - 1);
    std::iota(table.rbegin(), table.rend(), 1);  // not in order: blocks blocks-1 .. 1
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    const int64_t d = shape.head_dim, kvh = shape.num_kv_heads;
    k_hnd.assign(blocks * kvh * block_size * d, 0);
    v_hnd.assign(k_hnd.size(), 0);
    for (int32_t p = 0; p < seq_len; ++p) {
      const int32_t b = table[p / block_size], slot = p % block_size;
      float* k = kv->KeySlot(0, b, slot);
      float* v = kv->ValueSlot(0, b, slot);
      for (int64_t i = 0; i < kvh * d; ++i) {
        k[i] = normal(rng);
        v[i] = normal(rng);
        const int64_t hnd = ((b * kvh + i / d) * block_size + slot) * d + i % d;
        k_hnd[hnd] = k[i];
        v_hnd[hnd] = v[i];
      }
    }
    q.resize(int64_t{q_len} * shape.num_heads * d);
    for (float& x : q) x = normal(rng);
    q64.assign(q.begin(), q.end());
  }
  kernels::ref::AttentionShape RefShape() const {
    return {shape.num_heads,
            shape.num_kv_heads,
            shape.head_dim,
            block_size,
            1.0 / std::sqrt(static_cast<double>(shape.head_dim)),
            shape.sliding_window};
  }
  // Ours over one sequence of q_len tokens.
  std::vector<float> Run(ThreadPool& pool, std::span<const SparseKeys> sparse,
                         std::vector<float>* scores) {
    std::vector<int32_t> positions(q_len), seq_of_token(q_len, 0);
    std::iota(positions.begin(), positions.end(), seq_len - q_len);
    const std::span<const int32_t> tables[1] = {table};
    const TokenLayout layout{positions, seq_of_token, tables};
    std::vector<float> out(q.size());
    std::vector<int32_t> slots(q_len, -1);
    slots.front() = 0;
    slots.back() = 1;
    const int32_t prefix[2] = {seq_len - q_len, seq_len - q_len};
    const int64_t stride = prefix[0];
    std::vector<float> capture(2 * shape.num_heads * stride, -INFINITY);
    const ScoreCapture cap{slots, prefix, capture.data(), stride};
    PagedAttention(pool, shape, layout, q.data(), int64_t{shape.num_heads} * shape.head_dim, *kv, 0,
                   out.data(), sparse, scores != nullptr ? &cap : nullptr);
    if (scores != nullptr) {  // head averages, as Model::ReduceScores
      scores->assign(2 * stride, 0.0f);
      for (int row = 0; row < 2; ++row) {
        for (int64_t j = 0; j < stride; ++j) {
          float sum = 0;
          for (int h = 0; h < shape.num_heads; ++h) {
            sum += capture[(row * shape.num_heads + h) * stride + j];
          }
          (*scores)[row * stride + j] = sum / shape.num_heads;
        }
      }
    }
    return out;
  }
};

TEST(VegasAttentionTest, SparseEqualsReferenceSparseAttention) {
  ThreadPool pool(2);
  for (int32_t window : {0, 40}) {
    AttentionCase c(window);
    std::vector<int32_t> indices = {0, 1, 2, 3, 9, 17, 18, 33, 40, 41, 50};
    const int32_t recent = 55;
    const SparseKeys sparse[1] = {{indices, recent}};
    const std::vector<float> ours = c.Run(pool, sparse, nullptr);
    std::vector<double> want(ours.size());
    const int32_t cu[2] = {0, c.q_len};
    const int32_t count = static_cast<int32_t>(indices.size());
    kernels::ref::PagedSparseAttention<double>(
        c.q64.data(), c.shape.num_heads * c.shape.head_dim, c.k_hnd.data(), c.v_hnd.data(),
        c.table.data(), static_cast<int64_t>(c.table.size()), cu, &c.seq_len, indices.data(), count,
        &count, &recent, 1, c.RefShape(), want.data(), c.shape.num_heads * c.shape.head_dim);
    const std::vector<float> want32(want.begin(), want.end());
    EXPECT_LT(RelError(ours, want32), 1e-5) << "window " << window;
  }
}

TEST(VegasAttentionTest, CapturedScoresEqualReference) {
  ThreadPool pool(2);
  for (int32_t window : {0, 40}) {
    AttentionCase c(window);
    std::vector<float> scores;
    const std::vector<float> ours = c.Run(pool, {}, &scores);
    const int64_t prefix = c.seq_len - c.q_len;
    std::vector<double> out(ours.size()), want(2 * prefix);
    const int32_t cu[2] = {0, c.q_len};
    kernels::ref::PagedVerifyAttentionWithScores<double>(
        c.q64.data(), c.shape.num_heads * c.shape.head_dim, c.k_hnd.data(), c.v_hnd.data(),
        c.table.data(), static_cast<int64_t>(c.table.size()), cu, &c.seq_len, 1, c.RefShape(),
        out.data(), c.shape.num_heads * c.shape.head_dim, want.data(), prefix);
    int num_masked = 0;
    for (int64_t j = 0; j < 2 * prefix; ++j) {
      if (std::isinf(want[j])) {
        EXPECT_TRUE(std::isinf(scores[j]) && scores[j] < 0) << j;
        ++num_masked;
        continue;
      }
      EXPECT_NEAR(scores[j], want[j], 1e-5 * std::max(1.0, std::abs(want[j]))) << j;
    }
    EXPECT_EQ(num_masked > 0, window > 0);
    const std::vector<float> out32(out.begin(), out.end());
    EXPECT_LT(RelError(ours, out32), 1e-5);
  }
}

// The long-context model: a prompt's KV, then a chunk of 3 tokens run several ways.
class VegasModelTest : public ::testing::Test {
 protected:
  static constexpr int32_t kPrompt = 300;
  void SetUp() override {
    LoadOptions options;
    options.num_threads = 2;
    model_ = *Model::Load(ModelPath("codepair-long"), options);
    ASSERT_NE(model_, nullptr);
    layers_ = model_->config().num_layers;
    std::mt19937 rng(3);
    for (int i = 0; i < kPrompt + 3; ++i) ids_.push_back(static_cast<int32_t>(rng() % 8000) + 100);
  }
  // A fresh cache holding the prompt in sequence `s`'s blocks (table base s * 32).
  void Prefill(CpuKvCache& kv, int s, std::vector<int32_t>* table) {
    table->resize(32);
    std::iota(table->begin(), table->end(), s * 32);
    SequenceInput in;
    in.tokens = std::span<const int32_t>(ids_).first(kPrompt);
    in.block_table = *table;
    std::vector<float> logits;
    ASSERT_TRUE(model_->Forward({&in, 1}, kv, &logits).ok());
  }
  SequenceInput Chunk(const std::vector<int32_t>& table, const ChunkAttention* a) {
    SequenceInput in;
    in.tokens = std::span<const int32_t>(ids_).subspan(kPrompt, 3);
    in.start_pos = kPrompt;
    in.block_table = table;
    in.all_logits = true;
    in.attention = a;
    return in;
  }
  std::unique_ptr<Model> model_;
  int32_t layers_ = 0;
  std::vector<int32_t> ids_;
};

TEST_F(VegasModelTest, FullIndexListEqualsDenseAndMixedBatchesWork) {
  auto kv = *CpuKvCache::Create(model_->MakeKvCacheSpec(128));
  std::vector<int32_t> tables[3];
  for (int s = 0; s < 3; ++s) Prefill(*kv, s, &tables[s]);
  // Dense, alone.
  std::vector<float> dense;
  SequenceInput in = Chunk(tables[0], nullptr);
  ASSERT_TRUE(model_->Forward({&in, 1}, *kv, &dense).ok());
  // Every prefix position listed, recent from 200: the same keys as dense.
  std::vector<int32_t> all(200);
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::span<const int32_t>> full(layers_, all);
  ChunkAttention full_sparse;
  full_sparse.layer_indices = full;
  full_sparse.recent_start = 200;
  // A real selection: sinks and a few tokens.
  std::vector<int32_t> few = {0, 1, 2, 3, 50, 120};
  std::vector<std::span<const int32_t>> few_lists(layers_, few);
  ChunkAttention few_sparse;
  few_sparse.layer_indices = few_lists;
  few_sparse.recent_start = 280;
  std::vector<float> scores(layers_ * 2 * kPrompt, 1e9f);
  ChunkAttention scored;
  scored.scores = scores;
  // One batch: dense-equivalent sparse, scored dense, sparse.
  const SequenceInput batch[3] = {Chunk(tables[0], &full_sparse), Chunk(tables[1], &scored),
                                  Chunk(tables[2], &few_sparse)};
  std::vector<float> mixed;
  ASSERT_TRUE(model_->Forward(batch, *kv, &mixed).ok());
  const size_t vocab = model_->config().vocab_size;
  ASSERT_EQ(mixed.size(), 9 * vocab);
  for (int r = 0; r < 3; ++r) {
    const std::span<const float> want(dense.data() + r * vocab, vocab);
    EXPECT_LT(RelError(std::span<const float>(mixed).subspan(r * vocab, vocab), want), 1e-5);
    EXPECT_LT(RelError(std::span<const float>(mixed).subspan((3 + r) * vocab, vocab), want), 1e-5);
    // Few keys: a different answer.
    EXPECT_GT(RelError(std::span<const float>(mixed).subspan((6 + r) * vocab, vocab), want), 1e-3);
  }
  // The sparse chunk alone gives what it gave in the batch.
  std::vector<float> alone;
  SequenceInput s = Chunk(tables[2], &few_sparse);
  ASSERT_TRUE(model_->Forward({&s, 1}, *kv, &alone).ok());
  EXPECT_LT(RelError(alone, std::span<const float>(mixed).subspan(6 * vocab)), 1e-6);
  // Every score written and finite (no window in this model).
  for (float x : scores) ASSERT_TRUE(std::isfinite(x) && std::abs(x) < 1e6);
}

// Row 0 is the chunk's first query: a chunk of that token alone (both rows the same query) scores
// the prefix as the 3-token chunk's row 0 does, in every layer (causal: later tokens do not
// change the first one's hidden state).
TEST_F(VegasModelTest, ScoreRowsAreTheFirstAndLastQueries) {
  auto kv = *CpuKvCache::Create(model_->MakeKvCacheSpec(128));
  std::vector<int32_t> tables[2];
  for (int s = 0; s < 2; ++s) Prefill(*kv, s, &tables[s]);
  std::vector<float> three(layers_ * 2 * kPrompt), one(layers_ * 2 * kPrompt);
  ChunkAttention a3, a1;
  a3.scores = three;
  a1.scores = one;
  SequenceInput batch[2] = {Chunk(tables[0], &a3), Chunk(tables[1], &a1)};
  batch[1].tokens = batch[1].tokens.first(1);
  std::vector<float> logits;
  ASSERT_TRUE(model_->Forward(batch, *kv, &logits).ok());
  for (int32_t l = 0; l < layers_; ++l) {
    const std::span<const float> row0(three.data() + (l * 2) * kPrompt, kPrompt);
    const std::span<const float> row1(three.data() + (l * 2 + 1) * kPrompt, kPrompt);
    const std::span<const float> alone0(one.data() + (l * 2) * kPrompt, kPrompt);
    const std::span<const float> alone1(one.data() + (l * 2 + 1) * kPrompt, kPrompt);
    EXPECT_LT(RelError(alone0, row0), 1e-5) << "layer " << l;
    EXPECT_LT(RelError(alone1, row0), 1e-5) << "layer " << l;
    EXPECT_GT(RelError(row1, row0), 1e-3) << "layer " << l << ": the last query differs";
  }
}

TEST_F(VegasModelTest, RefusesMalformedOptions) {
  auto kv = *CpuKvCache::Create(model_->MakeKvCacheSpec(128));
  std::vector<int32_t> table;
  Prefill(*kv, 0, &table);
  std::vector<float> logits, small(5);
  ChunkAttention bad_scores;
  bad_scores.scores = small;
  SequenceInput in = Chunk(table, &bad_scores);
  EXPECT_EQ(model_->Forward({&in, 1}, *kv, &logits).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> unsorted = {5, 3};
  std::vector<std::span<const int32_t>> lists(layers_, unsorted);
  ChunkAttention bad_order;
  bad_order.layer_indices = lists;
  bad_order.recent_start = 100;
  in = Chunk(table, &bad_order);
  EXPECT_EQ(model_->Forward({&in, 1}, *kv, &logits).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> ok = {3, 5};
  std::vector<std::span<const int32_t>> few(layers_ - 1, ok);
  ChunkAttention bad_layers;
  bad_layers.layer_indices = few;
  in = Chunk(table, &bad_layers);
  EXPECT_EQ(model_->Forward({&in, 1}, *kv, &logits).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
