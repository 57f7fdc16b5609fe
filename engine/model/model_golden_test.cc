// Golden tests of the fp32 CPU forward pass against HF transformers (tiny-random: five
// architecture variants; codepair target/draft) and llama2.c (stories260K), plus KV-cache
// consistency: token-by-token decode, chunked prefill and ragged batches must reproduce a
// single full prefill. Comparison rule (models/README.md): max |ours - golden| over a row
// <= 1e-4 * max |golden|; greedy ids exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/json_fields.h"
#include "engine/model/model.h"
#include "engine/model/model_test_util.h"

namespace specd {
namespace {

constexpr double kTolerance = 1e-4;

using namespace model_test;  // NOLINT: ModelPath, ReadJson, Ids, RelError, Argmax

// A model with a KV cache and per-sequence block tables from a real allocator.
class Harness {
 public:
  explicit Harness(const std::string& dir, int32_t block_size = 16, int32_t num_blocks = 128) {
    auto model = Model::Load(dir, LoadOptions{});
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return;
    model_ = std::move(*model);
    auto kv = CpuKvCache::Create(model_->MakeKvCacheSpec(num_blocks, block_size));
    EXPECT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    allocator_ = std::make_unique<BlockAllocator>(num_blocks);
  }
  bool ok() const { return model_ != nullptr; }
  Model& model() { return *model_; }
  int32_t vocab() const { return model_->config().vocab_size; }

  int AddSequence() {
    tables_.emplace_back(kv_->spec().block_size);
    lengths_.push_back(0);
    return static_cast<int>(tables_.size()) - 1;
  }
  // Takes and frees `n` blocks so later tables get non-contiguous ids.
  void Fragment(int n) {
    std::vector<BlockId> held;
    for (int i = 0; i < n; ++i) held.push_back(*allocator_->Allocate());
    for (int i = 0; i < n; i += 2) EXPECT_TRUE(allocator_->Free(held[i]).ok());
  }

  struct Step {
    int seq;
    std::vector<int32_t> tokens;
    bool all_logits;
  };
  // Runs one batch; returns the logits rows [num_rows * vocab].
  std::vector<float> Run(const std::vector<Step>& steps) {
    std::vector<SequenceInput> batch;
    for (const Step& s : steps) {
      const int32_t end = lengths_[s.seq] + static_cast<int32_t>(s.tokens.size());
      EXPECT_TRUE(tables_[s.seq].EnsureCapacity(end, *allocator_).ok());
      batch.push_back({s.tokens, lengths_[s.seq], tables_[s.seq].ids(), s.all_logits});
    }
    std::vector<float> logits;
    absl::Status status = model_->Forward(batch, *kv_, &logits);
    EXPECT_TRUE(status.ok()) << status;
    for (const Step& s : steps) lengths_[s.seq] += static_cast<int32_t>(s.tokens.size());
    return logits;
  }

  // Greedy decoding: prefill `prompt`, then feed each argmax back. Returns the new ids and
  // the prompt's last-position logits.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int n,
                              std::vector<float>* prompt_logits = nullptr) {
    const int seq = AddSequence();
    std::vector<float> logits = Run({{seq, prompt, false}});
    if (prompt_logits != nullptr) *prompt_logits = logits;
    std::vector<int32_t> out;
    while (static_cast<int>(out.size()) < n) {
      out.push_back(Argmax(logits));
      if (static_cast<int>(out.size()) < n) logits = Run({{seq, {out.back()}, false}});
    }
    return out;
  }

 private:
  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuKvCache> kv_;
  std::unique_ptr<BlockAllocator> allocator_;
  std::vector<BlockTable> tables_;
  std::vector<int32_t> lengths_;
};

std::span<const float> Row(const std::vector<float>& logits, int64_t row, int32_t vocab) {
  return std::span<const float>(logits).subspan(row * vocab, vocab);
}

// Every row of `ours` within tolerance of the same row of `reference`.
void ExpectRowsMatch(const std::vector<float>& ours, const std::vector<float>& reference,
                     int32_t vocab) {
  ASSERT_EQ(ours.size(), reference.size());
  for (size_t r = 0; r < ours.size() / vocab; ++r) {
    auto ref = Row(reference, r, vocab);
    EXPECT_LE(RelError(Row(ours, r, vocab), std::vector<float>(ref.begin(), ref.end())), kTolerance)
        << "row " << r;
  }
}

class TinyRandomTest : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return ModelPath(std::string("tiny-random/") + GetParam()); }
  nlohmann::json golden() const { return ReadJson(dir() + "/golden.json"); }
};

TEST_P(TinyRandomTest, TwoRowsInOneBatchMatchGoldenLogits) {
  Harness h(dir());
  ASSERT_TRUE(h.ok());
  const nlohmann::json g = golden();
  const int a = h.AddSequence(), b = h.AddSequence();
  const std::vector<float> logits =
      h.Run({{a, Ids(g["input_ids"][0]), true}, {b, Ids(g["input_ids"][1]), true}});
  const int32_t vocab = h.vocab();
  ASSERT_EQ(logits.size(), static_cast<size_t>(2 * 40 * vocab));
  double sum_abs = 0;
  for (float v : logits) sum_abs += std::fabs(v);
  for (int row = 0; row < 2; ++row) {
    const double last = RelError(Row(logits, row * 40 + 39, vocab),
                                 g["logits_last_pos"][row].get<std::vector<float>>());
    const double pos5 =
        RelError(Row(logits, row * 40 + 5, vocab), g["logits_pos5"][row].get<std::vector<float>>());
    EXPECT_LE(last, kTolerance) << "row " << row << " position 39";
    EXPECT_LE(pos5, kTolerance) << "row " << row << " position 5";
    std::printf("[ %s ] row %d: rel error pos39 %.2e, pos5 %.2e\n", GetParam(), row, last, pos5);
  }
  const double golden_sum = g["logits_sum_abs"].get<double>();
  EXPECT_NEAR(sum_abs, golden_sum, 1e-5 * golden_sum);
}

TEST_P(TinyRandomTest, GreedyContinuationMatchesGolden) {
  Harness h(dir());
  ASSERT_TRUE(h.ok());
  const nlohmann::json g = golden();
  EXPECT_EQ(h.Greedy(Ids(g["greedy_prompt"]), 40), Ids(g["greedy_ids"]));
}

TEST_P(TinyRandomTest, TokenByTokenDecodeMatchesFullPrefill) {
  Harness h(dir());
  ASSERT_TRUE(h.ok());
  const std::vector<int32_t> ids = Ids(golden()["input_ids"][0]);
  const std::vector<float> full = h.Run({{h.AddSequence(), ids, true}});
  const int seq = h.AddSequence();
  std::vector<float> stepped;
  for (int32_t id : ids) {
    std::vector<float> row = h.Run({{seq, {id}, false}});
    stepped.insert(stepped.end(), row.begin(), row.end());
  }
  ExpectRowsMatch(stepped, full, h.vocab());
}

TEST_P(TinyRandomTest, ChunkedPrefillInRaggedBatchesMatchesFullPrefill) {
  // Block size 5 and fragmented block ids: chunks and the sliding window cross blocks.
  Harness h(dir(), /*block_size=*/5, /*num_blocks=*/64);
  ASSERT_TRUE(h.ok());
  const nlohmann::json g = golden();
  const std::vector<int32_t> a = Ids(g["input_ids"][0]), b = Ids(g["input_ids"][1]);
  const std::vector<float> full = h.Run({{h.AddSequence(), a, true}});
  h.Fragment(10);
  const int sa = h.AddSequence(), sb = h.AddSequence();
  std::vector<float> chunked = h.Run({{sa, {a.begin(), a.begin() + 7}, true}});
  // The second chunk of a shares a batch with all of b.
  std::vector<float> mixed = h.Run({{sa, {a.begin() + 7, a.begin() + 23}, true}, {sb, b, false}});
  chunked.insert(chunked.end(), mixed.begin(), mixed.begin() + 16 * h.vocab());
  std::vector<float> last = h.Run({{sa, {a.begin() + 23, a.end()}, true}});
  chunked.insert(chunked.end(), last.begin(), last.end());
  ExpectRowsMatch(chunked, full, h.vocab());
  // b's only row is its last position.
  EXPECT_LE(RelError(Row(mixed, 16, h.vocab()), g["logits_last_pos"][1].get<std::vector<float>>()),
            kTolerance);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, TinyRandomTest,
                         ::testing::Values("llama3", "llama-linear", "qwen2", "qwen3", "mistral"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

class CodepairTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CodepairTest, GreedyAndTopLogitsMatchGolden) {
  Harness h(ModelPath(std::string("codepair/") + GetParam()), 16, 256);
  ASSERT_TRUE(h.ok());
  const nlohmann::json entries = ReadJson(ModelPath("codepair/golden.json"))[GetParam()];
  ASSERT_EQ(entries.size(), 8u);
  for (size_t p = 0; p < entries.size(); ++p) {
    const nlohmann::json& e = entries[p];
    std::vector<float> last;
    const std::vector<int32_t> ids = h.Greedy(Ids(e["prompt_ids"]), 48, &last);
    EXPECT_EQ(ids, Ids(e["greedy_ids"])) << "prompt " << p;
    const std::vector<int32_t> top_ids = Ids(e["last_logits_top8_ids"]);
    const std::vector<float> top = e["last_logits_top8"].get<std::vector<float>>();
    std::vector<float> ours;
    for (int32_t id : top_ids) ours.push_back(last[id]);
    const double err = RelError(ours, top);
    EXPECT_LE(err, kTolerance) << "prompt " << p;
    std::printf("[ codepair/%s ] prompt %zu: top-8 rel error %.2e\n", GetParam(), p, err);
    std::vector<int32_t> order(last.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                      [&](int32_t x, int32_t y) { return last[x] > last[y]; });
    EXPECT_EQ(std::vector<int32_t>(order.begin(), order.begin() + 8), top_ids) << "prompt " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(TargetAndDraft, CodepairTest, ::testing::Values("target", "draft"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Stories260KTest, GreedyFromBosMatchesGolden) {
  Harness h(ModelPath("stories260K/hf"), 16, 32);
  ASSERT_TRUE(h.ok());
  const nlohmann::json g = ReadJson(ModelPath("stories260K/golden/greedy_from_bos.json"));
  const std::vector<int32_t> expected = Ids(g["generated_ids"]);
  EXPECT_EQ(h.Greedy(Ids(g["prompt_ids"]), static_cast<int>(expected.size())), expected);
}

TEST(Stories260KTest, FirstEightPositionsMatchGoldenLogits) {
  Harness h(ModelPath("stories260K/hf"), 16, 32);
  ASSERT_TRUE(h.ok());
  const nlohmann::json g = ReadJson(ModelPath("stories260K/golden/greedy_from_bos.json"));
  std::vector<int32_t> inputs = {1};
  for (int i = 0; i < 7; ++i) inputs.push_back(g["generated_ids"][i].get<int32_t>());
  const std::vector<float> logits = h.Run({{h.AddSequence(), inputs, true}});
  // logits_pos0-7_f32.bin: float32 little endian, [8, 512].
  absl::StatusOr<std::string> bin =
      ReadFileToString(ModelPath("stories260K/golden/logits_pos0-7_f32.bin"));
  ASSERT_TRUE(bin.ok()) << bin.status();
  ASSERT_EQ(bin->size(), 8u * 512 * sizeof(float));
  std::vector<float> golden(8 * 512);
  std::memcpy(golden.data(), bin->data(), bin->size());
  ExpectRowsMatch(logits, golden, 512);
}

}  // namespace
}  // namespace specd
