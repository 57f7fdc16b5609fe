// The NSA family on the fp32 CPU forward against nsa-codepair's goldens (an exact fp32 dense
// reference we did not write, shared/models/nsa-codepair/PROVENANCE.md): the top 8 logits of the
// last prompt position, layer 0's selected blocks for it, and 24 greedy ids by cached decode
// (EOS not special). Then the KV-cache paths against one pass: chunked prefill, one-token decode
// and verification chunks of 5 tokens (a block completing inside a chunk), and a ragged batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/model_test_util.h"

namespace specd {
namespace {

using model_test::Argmax;
using model_test::ModelPath;

// The golden's own fp32 arithmetic differs from ours by ~3e-5 (PROVENANCE); the smallest
// mistake the goldens catch moves a logit by 0.026.
constexpr double kGoldenTolerance = 2e-4;
// Our own paths (one pass, chunks, decode) differ only by summation order.
constexpr double kPathTolerance = 1e-5;

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<int32_t> top8_ids;
  std::vector<float> top8_logits;
  std::vector<int32_t> layer0_blocks;
};

std::vector<Golden> ReadGoldens() {
  const std::string path = ModelPath("nsa-codepair/golden.json");
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  const nlohmann::json list = nlohmann::json::parse(text.ok() ? *text : "[]", nullptr, false);
  EXPECT_TRUE(list.is_array()) << path;
  std::vector<Golden> out;
  if (!list.is_array()) return out;
  for (const nlohmann::json& e : list) {
    out.push_back({e["prompt_ids"].get<std::vector<int32_t>>(),
                   e["greedy_ids"].get<std::vector<int32_t>>(),
                   e["last_top8_ids"].get<std::vector<int32_t>>(),
                   e["last_top8_logits"].get<std::vector<float>>(),
                   e["layer0_selected_blocks_last_query"].get<std::vector<int32_t>>()});
  }
  return out;
}

// The model once for the whole suite (loading widens 12.8M bf16 weights), and every golden
// prompt prefilled once, each in its own region of one KV pool: the golden tests read the last
// rows and selections, and the greedy test decodes on from there.
class NsaGoldenTest : public ::testing::Test {
 protected:
  static constexpr int32_t kKvBlock = 16;
  static constexpr int32_t kBlocksPerSeq = 48;  // 768 positions
  static constexpr int32_t kNumSeqs = 8;        // the 6 goldens, then 2 scratch sequences
  static constexpr int32_t kScratch = 6;

  struct Prefilled {
    std::vector<float> last_row;         // [vocab] logits of the last prompt position
    std::vector<int32_t> layer0_blocks;  // layer 0's selection for that position
  };

  static void SetUpTestSuite() {
    auto model = Model::Load(ModelPath("nsa-codepair"), LoadOptions{});
    ASSERT_TRUE(model.ok()) << model.status();
    auto kv = CpuKvCache::Create((*model)->MakeKvCacheSpec(kNumSeqs * kBlocksPerSeq, kKvBlock));
    ASSERT_TRUE(kv.ok()) << kv.status();
    model_ = std::move(*model).release();
    kv_ = std::move(*kv).release();
    goldens_ = new std::vector<Golden>(ReadGoldens());
    prefilled_ = new std::vector<Prefilled>();
    for (size_t e = 0; e < goldens_->size(); ++e) {
      const std::vector<int32_t>& prompt = (*goldens_)[e].prompt;
      Prefilled p;
      p.last_row = Run(prompt, 0, static_cast<int32_t>(prompt.size()), false, e);
      const std::span<const int32_t> blocks = model_->nsa()->LastTokenSelection(0, 0);
      p.layer0_blocks.assign(blocks.begin(), blocks.end());
      prefilled_->push_back(std::move(p));
    }
  }
  static void TearDownTestSuite() {
    delete model_;
    delete kv_;
    delete goldens_;
    delete prefilled_;
    model_ = nullptr;
    kv_ = nullptr;
    goldens_ = nullptr;
    prefilled_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    ASSERT_EQ(goldens_->size(), 6u);
    ASSERT_EQ(prefilled_->size(), 6u);
  }

  // Sequence `seq`'s table: its region of the pool in reverse order (non-contiguous blocks).
  static std::vector<int32_t> Table(size_t seq) {
    std::vector<int32_t> t(kBlocksPerSeq);
    std::iota(t.rbegin(), t.rend(), static_cast<int32_t>(seq) * kBlocksPerSeq);
    return t;
  }

  // Runs tokens[begin, end) of sequence `seq` as one chunk; returns its logits rows.
  static std::vector<float> Run(const std::vector<int32_t>& tokens, int32_t begin, int32_t end,
                                bool all_logits, size_t seq) {
    const std::vector<int32_t> table = Table(seq);
    const SequenceInput input{std::span(tokens).subspan(begin, end - begin), begin, table,
                              all_logits};
    std::vector<float> logits;
    const absl::Status status = model_->Forward(std::span(&input, 1), *kv_, &logits);
    EXPECT_TRUE(status.ok()) << status;
    return logits;
  }

  int32_t vocab() const { return model_->config().vocab_size; }

  static Model* model_;
  static CpuKvCache* kv_;
  static std::vector<Golden>* goldens_;
  static std::vector<Prefilled>* prefilled_;
};

Model* NsaGoldenTest::model_ = nullptr;
CpuKvCache* NsaGoldenTest::kv_ = nullptr;
std::vector<Golden>* NsaGoldenTest::goldens_ = nullptr;
std::vector<NsaGoldenTest::Prefilled>* NsaGoldenTest::prefilled_ = nullptr;

// max |a - b| over two equal-size row sets, divided by max |b|.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
    ref = std::max(ref, std::fabs(double{b[i]}));
  }
  return diff / ref;
}

TEST_F(NsaGoldenTest, LastPromptLogitsAndLayer0SelectionMatchGoldens) {
  for (size_t e = 0; e < goldens_->size(); ++e) {
    const Golden& g = (*goldens_)[e];
    const std::vector<float>& row = (*prefilled_)[e].last_row;
    ASSERT_EQ(row.size(), static_cast<size_t>(vocab()));
    std::vector<int32_t> order(vocab());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    order.resize(8);
    EXPECT_EQ(order, g.top8_ids) << "entry " << e;
    double max_diff = 0;
    for (size_t k = 0; k < g.top8_ids.size(); ++k) {
      max_diff = std::max(max_diff, std::fabs(double{row[g.top8_ids[k]]} - g.top8_logits[k]));
    }
    // The golden's values are rounded to 5 decimals.
    EXPECT_LE(max_diff, kGoldenTolerance) << "entry " << e;
    const std::vector<int32_t>& blocks = (*prefilled_)[e].layer0_blocks;
    EXPECT_EQ(blocks, g.layer0_blocks) << "entry " << e;
    std::printf("[ nsa-codepair entry %zu ] top-8 max |d| %.2e, layer-0 blocks %s\n", e, max_diff,
                blocks == g.layer0_blocks ? "equal" : "DIFFER");
  }
}

TEST_F(NsaGoldenTest, GreedyCachedDecodeMatchesGoldenIds) {
  for (size_t e = 0; e < goldens_->size(); ++e) {
    const Golden& g = (*goldens_)[e];
    std::vector<int32_t> tokens = g.prompt;
    std::vector<int32_t> generated;
    std::vector<float> row = (*prefilled_)[e].last_row;  // the prefill, then one token a step
    while (generated.size() < g.greedy.size()) {
      const int32_t next = Argmax(row);
      generated.push_back(next);
      tokens.push_back(next);  // EOS included: the golden does not stop at it
      if (generated.size() == g.greedy.size()) break;
      const int32_t pos = static_cast<int32_t>(tokens.size()) - 1;
      row = Run(tokens, pos, pos + 1, false, e);
    }
    EXPECT_EQ(generated, g.greedy) << "entry " << e;
  }
}

// Entry 0's prompt + greedy continuation (625 tokens): its rows by one pass, by chunked prefill
// (chunks of 97: NSA and paged blocks cut mid-chunk), then the rows of positions 600 .. 624 again
// by one-token decode and by verification chunks of 5 over the KV already there (block 18
// completes at 607, inside the chunk 605 .. 609).
TEST_F(NsaGoldenTest, ChunkedPrefillDecodeAndVerificationChunksMatchOnePass) {
  const Golden& g = (*goldens_)[0];
  std::vector<int32_t> tokens = g.prompt;
  tokens.insert(tokens.end(), g.greedy.begin(), g.greedy.end());
  const int32_t n = static_cast<int32_t>(tokens.size());
  const int32_t first = static_cast<int32_t>(g.prompt.size()) - 1;  // the last prompt position
  const int64_t v = vocab();
  const std::vector<float> one_pass = Run(tokens, 0, n, true, kScratch);  // rows 0 .. n - 1
  const std::vector<float> tail(one_pass.begin() + first * v, one_pass.end());

  std::vector<float> chunked;
  for (int32_t b = 0; b < n; b += 97) {
    const std::vector<float> rows = Run(tokens, b, std::min(n, b + 97), true, kScratch);
    chunked.insert(chunked.end(), rows.begin(), rows.end());
  }
  const double chunked_diff = MaxRelDiff(chunked, one_pass);

  std::vector<float> decoded;
  for (int32_t p = first; p < n; ++p) {
    const std::vector<float> row = Run(tokens, p, p + 1, false, kScratch);
    decoded.insert(decoded.end(), row.begin(), row.end());
  }
  const double decode_diff = MaxRelDiff(decoded, tail);

  std::vector<float> verified;
  for (int32_t p = first; p < n; p += 5) {
    const std::vector<float> rows = Run(tokens, p, std::min(n, p + 5), true, kScratch);
    verified.insert(verified.end(), rows.begin(), rows.end());
  }
  const double verify_diff = MaxRelDiff(verified, tail);

  std::printf(
      "[ nsa-codepair entry 0 ] max rel diff vs one pass: chunked %.2e, decode %.2e, "
      "verification chunks %.2e\n",
      chunked_diff, decode_diff, verify_diff);
  EXPECT_LE(chunked_diff, kPathTolerance);
  EXPECT_LE(decode_diff, kPathTolerance);
  EXPECT_LE(verify_diff, kPathTolerance);
}

// Two sequences of different lengths in one Forward (ragged: the compressed blocks are per
// sequence) give the rows each gets alone.
TEST_F(NsaGoldenTest, RaggedBatchMatchesSequencesAlone) {
  const std::vector<int32_t> a((*goldens_)[2].prompt.begin(), (*goldens_)[2].prompt.begin() + 301);
  const std::vector<int32_t> b((*goldens_)[3].prompt.begin(), (*goldens_)[3].prompt.begin() + 170);
  const std::vector<float> alone_a = Run(a, 0, 301, false, kScratch);
  const std::vector<float> alone_b = Run(b, 0, 170, false, kScratch + 1);
  const std::vector<int32_t> table_a = Table(kScratch), table_b = Table(kScratch + 1);
  const std::vector<SequenceInput> batch = {{a, 0, table_a, false}, {b, 0, table_b, false}};
  std::vector<float> both;
  ASSERT_TRUE(model_->Forward(batch, *kv_, &both).ok());
  const std::vector<float> first(both.begin(), both.begin() + vocab());
  const std::vector<float> second(both.begin() + vocab(), both.end());
  EXPECT_LE(MaxRelDiff(first, alone_a), kPathTolerance);
  EXPECT_LE(MaxRelDiff(second, alone_b), kPathTolerance);
}

// Verification chunks of 8 over entry 0's continuation (positions 600 .. 623) with SSV
// strategies: mode exact at any group size gives the plain chunk's rows bit for bit; mode shared
// (C 4) keeps the first row (its query attends its own selection in every layer, over KV that no
// shared query wrote) and changes others; refresh_every 2 changes rows. What the chunks read is
// counted: grouping reads fewer keys than the queries would alone, and the online overlap is in (0,
// 1].
TEST_F(NsaGoldenTest, SsvStrategiesOnVerificationChunks) {
  const Golden& g = (*goldens_)[0];
  std::vector<int32_t> tokens = g.prompt;
  tokens.insert(tokens.end(), g.greedy.begin(), g.greedy.end());
  const int32_t first = static_cast<int32_t>(g.prompt.size()) - 1;
  const std::vector<int32_t> table = Table(kScratch);
  Run(tokens, 0, first, false, kScratch);  // the prefix's KV
  auto chunks = [&](const SsvStrategy* ssv) {
    std::vector<float> rows;
    for (int32_t p = first; p + 8 <= first + 24; p += 8) {
      SequenceInput input{std::span(tokens).subspan(p, 8), p, table, true};
      input.ssv = ssv;
      std::vector<float> logits;
      const absl::Status status = model_->Forward(std::span(&input, 1), *kv_, &logits);
      EXPECT_TRUE(status.ok()) << status;
      rows.insert(rows.end(), logits.begin(), logits.end());
    }
    return rows;
  };
  const int64_t v = vocab();
  auto row = [&](const std::vector<float>& rows, int64_t r) {
    return std::vector<float>(rows.begin() + r * v, rows.begin() + (r + 1) * v);
  };
  const std::vector<float> plain = chunks(nullptr);
  const SsvLoadStats before = model_->nsa()->ssv_stats();
  for (int32_t c : {1, 2, 4, 8}) {
    const SsvStrategy exact{.group_size = c};
    EXPECT_EQ(chunks(&exact), plain) << "exact C " << c;
  }
  const SsvLoadStats exact = model_->nsa()->ssv_stats() - before;
  // 4 group sizes x 3 chunks x 8 queries x 6 layers x 1 KV head.
  EXPECT_EQ(exact.queries, 4 * 3 * 8 * 6);
  EXPECT_LT(exact.grouped_keys, exact.per_query_keys);
  EXPECT_EQ(exact.overlap_pairs, 4 * 3 * 7 * 6);
  EXPECT_GT(exact.overlap_sum, 0.0);
  EXPECT_LE(exact.overlap_sum, static_cast<double>(exact.overlap_pairs));

  const SsvStrategy shared{.group_size = 4, .mode = SsvMode::kShared};
  const std::vector<float> got = chunks(&shared);
  int changed = 0;
  for (int64_t r = 0; r < 24; ++r) {
    if (r == 0) {
      EXPECT_EQ(row(got, r), row(plain, r));
    } else {
      changed += row(got, r) != row(plain, r);
    }
  }
  EXPECT_GT(changed, 0) << "mode shared changed no row: is it applied?";
  const SsvStrategy reuse{.refresh_every = 2};
  EXPECT_NE(chunks(&reuse), plain) << "refresh_every 2 changed no row: is it applied?";
  std::printf(
      "[ nsa-codepair entry 0, SSV ] exact chunks of 8: %.1f keys per query alone, %.1f grouped "
      "(C 1/2/4/8 pooled); adjacent overlap %.3f\n",
      double(exact.per_query_keys) / exact.queries, double(exact.grouped_keys) / exact.queries,
      exact.overlap_sum / exact.overlap_pairs);

  SequenceInput bad{std::span(tokens).subspan(first, 2), first, table, true};
  const SsvStrategy zero{.group_size = 0};
  bad.ssv = &zero;
  std::vector<float> logits;
  const absl::Status status = model_->Forward(std::span(&bad, 1), *kv_, &logits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("ssv.group_size"), std::string::npos) << status;
}

TEST_F(NsaGoldenTest, RefusesVegasAttentionOptions) {
  const Golden& g = (*goldens_)[0];
  const std::vector<int32_t> table = Table(kScratch);
  std::vector<float> scores(static_cast<size_t>(model_->config().num_layers) * 2 * 10);
  const ChunkAttention options{scores, {}, 0};
  SequenceInput input{std::span(g.prompt).subspan(10, 2), 10, table, false};
  input.attention = &options;
  std::vector<float> logits;
  const absl::Status status = model_->Forward(std::span(&input, 1), *kv_, &logits);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("NSA"), std::string::npos) << status;
}

}  // namespace
}  // namespace specd
