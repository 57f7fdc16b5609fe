#include "engine/model/eagle3_head.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/eagle3_test_util.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/model_test_util.h"
#include "engine/model/safetensors.h"
#include "engine/model/token_tree.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using eagle3_test::HeadOptions;
using eagle3_test::WriteRandomHead;

class Eagle3HeadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = LoadModelConfig(target_dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    target_ = *config;
  }
  // Writes a head with `o` into a fresh folder and loads it.
  absl::StatusOr<std::unique_ptr<Eagle3Head>> Load(const std::string& name, HeadOptions o) {
    const std::string dir = ::testing::TempDir() + "/eagle3_head_test_" + name;
    std::filesystem::remove_all(dir);
    WriteRandomHead(dir, target_, o);
    return Eagle3Head::Load(dir, target_dir_, target_);
  }
  // The status message of a load that must fail, checked to mention `what`.
  void ExpectRefused(const std::string& name, HeadOptions o, const std::string& what) {
    auto head = Load(name, o);
    ASSERT_FALSE(head.ok()) << name << " loaded";
    EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument) << head.status();
    EXPECT_NE(std::string(head.status().message()).find(what), std::string::npos)
        << name << ": " << head.status();
  }

  const std::string target_dir_ = model_test::ModelPath("codepair/target");
  ModelConfig target_;
};

TEST_F(Eagle3HeadTest, LoadsAReducedVocabularyHeadWithVllmDefaultLayers) {
  auto head = Load("ok", {.draft_vocab_size = 1024});
  ASSERT_TRUE(head.ok()) << head.status();
  const Eagle3Config& c = (*head)->config();
  EXPECT_EQ(c.draft_vocab_size, 1024);
  EXPECT_EQ(c.target_hidden_size, 384);
  // vLLM's default for a 6-layer target: (2, 6 / 2, 6 - 3).
  EXPECT_EQ(c.aux_layer_ids, (std::vector<int32_t>{2, 3, 3}));
  EXPECT_EQ((*head)->fc_input_size(), 3 * 384);
  EXPECT_EQ((*head)->draft_to_target()[5], 10);
}

// The catch-up pass runs many positions of a sequence at once; drafting runs one at a time. Both
// must give the same rows: the cache and the causal rule see the same keys either way.
TEST_F(Eagle3HeadTest, OnePassOverPositionsEqualsOneCallPerPosition) {
  auto loaded = Load("incremental", {.draft_vocab_size = 2048, .aux_layer_ids = {1, 3, 5}});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Eagle3Head& head = **loaded;
  const int64_t h = head.hidden_size(), vocab = head.vocab_size();
  constexpr int kPositions = 9;
  std::vector<float> hidden(kPositions * h);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : hidden) x = normal(rng);
  std::vector<Eagle3Head::Row> rows;
  Eagle3Head::Kv batched, single;
  for (int p = 0; p < kPositions; ++p) {
    rows.push_back({.token = 17 * p + 3,
                    .position = p + 4,
                    .hidden = &hidden[p * h],
                    .kv = &batched,
                    .logits = true});
  }
  std::vector<float> prenorm, logits;
  ASSERT_TRUE(head.Forward(rows, &prenorm, &logits).ok());
  ASSERT_EQ(logits.size(), static_cast<size_t>(kPositions * vocab));
  for (int p = 0; p < kPositions; ++p) {
    Eagle3Head::Row row = rows[p];
    row.kv = &single;
    std::vector<float> one_prenorm, one_logits;
    ASSERT_TRUE(head.Forward({&row, 1}, &one_prenorm, &one_logits).ok());
    for (int64_t i = 0; i < h; ++i) {
      ASSERT_NEAR(one_prenorm[i], prenorm[p * h + i], 1e-4 * (1 + std::abs(prenorm[p * h + i])))
          << "position " << p << ", column " << i;
    }
    int64_t finite = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      const float want = logits[p * vocab + v];
      if (std::isinf(want)) {
        ASSERT_TRUE(std::isinf(one_logits[v]) && one_logits[v] < 0) << "id " << v;
        continue;
      }
      ++finite;
      ASSERT_NEAR(one_logits[v], want, 1e-4 * (1 + std::abs(want))) << "id " << v;
    }
    EXPECT_EQ(finite, 2048) << "logits outside the draft vocabulary must be -inf";
  }
  EXPECT_EQ(single.size(), kPositions);
  single.Truncate(8);  // positions 4..7 stay
  EXPECT_EQ(single.size(), 4);
  EXPECT_EQ(single.k.size(), static_cast<size_t>(4 * 2 * 64));
}

TEST_F(Eagle3HeadTest, RowsOutOfOrderOrMalformedAreRefused) {
  auto loaded = Load("rows", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<float> hidden((*loaded)->hidden_size(), 0.5f), prenorm, logits;
  Eagle3Head::Kv kv;
  Eagle3Head::Row a{.token = 5, .position = 3, .hidden = hidden.data(), .kv = &kv};
  Eagle3Head::Row b = a;
  std::vector<Eagle3Head::Row> same = {a, b};
  EXPECT_FALSE((*loaded)->Forward(same, &prenorm, &logits).ok());
  b.token = 1 << 20;
  b.position = 4;
  EXPECT_FALSE((*loaded)->Forward({&b, 1}, &prenorm, &logits).ok());
  EXPECT_EQ(kv.size(), 0) << "a refused pass writes nothing";
}

// Token trees: nodes in slots of their own (a level per pass, at their depth's position) see the
// prefix, their ancestors and themselves only, so each node's row is the one its path gives run
// as a chain after the same prefix.
TEST_F(Eagle3HeadTest, TreeRowsEqualTheirPathRunAsAChain) {
  auto loaded = Load("tree", {.draft_vocab_size = 2048, .aux_layer_ids = {1, 3, 5}});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Eagle3Head& head = **loaded;
  const int64_t h = head.hidden_size(), vocab = head.vocab_size();
  constexpr int32_t kPrefix = 5;
  const std::vector<int32_t> parents = {-1, -1, 0, 0, 1, 2, 4};
  const std::vector<std::vector<int32_t>> levels = {{0, 1}, {2, 3, 4}, {5, 6}};
  const auto num_nodes = static_cast<int32_t>(parents.size());
  std::vector<int32_t> depths;
  TreeDepths(parents, &depths);
  std::vector<float> hidden((kPrefix + num_nodes) * h);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : hidden) x = normal(rng);
  auto token = [](int32_t i) { return 29 * i + 7; };
  Eagle3Head::Kv prefix;
  std::vector<Eagle3Head::Row> rows;
  for (int32_t p = 0; p < kPrefix; ++p) {
    rows.push_back({.token = token(p), .position = p, .hidden = &hidden[p * h], .kv = &prefix});
  }
  std::vector<float> prenorm, logits;
  ASSERT_TRUE(head.Forward(rows, &prenorm, &logits).ok());
  // The tree, a level per pass.
  Eagle3Head::Kv tree_kv = prefix;
  const TokenTree tree{kPrefix, parents};
  std::vector<float> tree_prenorm(num_nodes * h), tree_logits(num_nodes * vocab);
  for (const std::vector<int32_t>& level : levels) {
    rows.clear();
    for (int32_t node : level) {
      rows.push_back({.token = token(kPrefix + node),
                      .position = kPrefix + depths[node],
                      .slot = kPrefix + node,
                      .tree = &tree,
                      .hidden = &hidden[(kPrefix + node) * h],
                      .kv = &tree_kv,
                      .logits = true});
    }
    ASSERT_TRUE(head.Forward(rows, &prenorm, &logits).ok());
    for (size_t r = 0; r < level.size(); ++r) {
      std::copy_n(&prenorm[r * h], h, &tree_prenorm[level[r] * h]);
      std::copy_n(&logits[r * vocab], vocab, &tree_logits[level[r] * vocab]);
    }
  }
  EXPECT_EQ(tree_kv.size(), kPrefix + num_nodes);
  for (int32_t node = 0; node < num_nodes; ++node) {
    std::vector<int32_t> path;
    AppendTreePath(parents, node, &path);
    Eagle3Head::Kv chain = prefix;
    rows.clear();
    for (size_t d = 0; d < path.size(); ++d) {
      rows.push_back({.token = token(kPrefix + path[d]),
                      .position = kPrefix + static_cast<int32_t>(d),
                      .hidden = &hidden[(kPrefix + path[d]) * h],
                      .kv = &chain,
                      .logits = d + 1 == path.size()});
    }
    ASSERT_TRUE(head.Forward(rows, &prenorm, &logits).ok());
    const float* want = &prenorm[(path.size() - 1) * h];
    for (int64_t i = 0; i < h; ++i) {
      ASSERT_NEAR(tree_prenorm[node * h + i], want[i], 1e-4 * (1 + std::abs(want[i])))
          << "node " << node << ", column " << i;
    }
    for (int64_t v = 0; v < vocab; ++v) {
      if (std::isinf(logits[v])) continue;
      ASSERT_NEAR(tree_logits[node * vocab + v], logits[v], 1e-4 * (1 + std::abs(logits[v])))
          << "node " << node << ", id " << v;
    }
  }
  // A row outside its tree's slots, or a slot not after the cache's, is refused, writing nothing.
  Eagle3Head::Row outside{.token = 3,
                          .position = kPrefix + 3,
                          .slot = kPrefix + num_nodes,
                          .tree = &tree,
                          .hidden = hidden.data(),
                          .kv = &tree_kv};
  EXPECT_FALSE(head.Forward({&outside, 1}, &prenorm, &logits).ok());
  Eagle3Head::Row before = outside;
  before.tree = nullptr;
  before.slot = kPrefix + 2;
  EXPECT_FALSE(head.Forward({&before, 1}, &prenorm, &logits).ok());
  EXPECT_EQ(tree_kv.size(), kPrefix + num_nodes);
  tree_kv.Truncate(kPrefix);  // the tree's slots go, the prefix stays
  EXPECT_EQ(tree_kv.slots, prefix.slots);
}

TEST_F(Eagle3HeadTest, MalformedHeadsAreRefusedWithTheReason) {
  ExpectRefused("hidden", {.target_hidden_size = 512}, "target_hidden_size");
  ExpectRefused("no_d2t", {.draft_vocab_size = 1024, .write_d2t = false}, "'d2t'");
  ExpectRefused("d2t_collides", {.draft_vocab_size = 1024, .d2t_override_at = 7}, "d2t");
  ExpectRefused("layer_ids", {.aux_layer_ids = {1, 3, 6}}, "layer id 6");
  ExpectRefused("two_ids", {.aux_layer_ids = {1, 3}}, "3 target layers");
  ExpectRefused("layers", {.num_layers = 2}, "num_hidden_layers");
  ExpectRefused("architecture", {.architecture = "LlamaForCausalLM"}, "LlamaForCausalLMEagle3");
  ExpectRefused("no_fc", {.omit_tensor = "fc.weight"}, "fc.weight");
  ExpectRefused("q_shape", {.misshape_tensor = "midlayer.self_attn.q_proj.weight"}, "q_proj");
}

// The target keeps the residual stream at the input of the layers a head reads: id 0 is the
// embedding output, and what a prefill keeps equals what the same tokens keep in two chunks.
TEST(TargetCaptureTest, KeepsTheResidualStreamAtLayerInputs) {
  const std::string dir = model_test::ModelPath("codepair/target");
  LoadOptions options;
  options.num_threads = 1;
  auto model = Model::Load(dir, options);
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  EXPECT_FALSE(m.SetAuxHiddenLayers(std::vector<int32_t>{0, 6}).ok());
  const std::vector<int32_t> ids = {0, 3, 3, 5};
  ASSERT_TRUE(m.SetAuxHiddenLayers(ids).ok());
  const std::vector<int32_t> tokens = {0, 17, 400, 9, 1234, 77, 5, 8000};
  const std::vector<int32_t> blocks = {0, 1};
  auto kv = CpuKvCache::Create(m.MakeKvCacheSpec(4, 4));
  ASSERT_TRUE(kv.ok());
  std::vector<float> logits;
  const SequenceInput whole{.tokens = tokens, .start_pos = 0, .block_table = blocks};
  ASSERT_TRUE(m.Forward({&whole, 1}, **kv, &logits).ok());
  const int64_t h = 384, width = ids.size() * h;
  const std::vector<float> once(m.aux_hidden().begin(), m.aux_hidden().end());
  ASSERT_EQ(once.size(), tokens.size() * width);
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir);
  ASSERT_TRUE(ckpt.ok());
  auto embed = ckpt->ReadF32("model.embed_tokens.weight", {8192, h});
  ASSERT_TRUE(embed.ok());
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int64_t i = 0; i < h; ++i) {
      ASSERT_EQ(once[t * width + i], (*embed)[tokens[t] * h + i]) << "token " << t;
      // Slots 1 and 2 name the same layer.
      ASSERT_EQ(once[t * width + h + i], once[t * width + 2 * h + i]) << "token " << t;
    }
  }
  std::vector<float> chunked;
  for (int32_t start : {0, 5}) {
    const int32_t n = start == 0 ? 5 : 3;
    const SequenceInput part{
        .tokens = std::span(tokens).subspan(start, n), .start_pos = start, .block_table = blocks};
    ASSERT_TRUE(m.Forward({&part, 1}, **kv, &logits).ok());
    chunked.insert(chunked.end(), m.aux_hidden().begin(), m.aux_hidden().end());
  }
  ASSERT_EQ(chunked.size(), once.size());
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(chunked[i], once[i], 1e-4 * (1 + std::abs(once[i]))) << "value " << i;
  }
}

// The shape configs of public heads (models/shapes, for random-weight speed runs) parse against
// their targets' shapes, with vLLM's default layers.
TEST(Eagle3ShapeTest, PublicHeadShapesParseAgainstTheirTargets) {
  const std::string mine = std::string(SPECD_SOURCE_DIR) + "/models/shapes/";
  const std::pair<const char*, const char*> pairs[] = {{"eagle3-llama-3.1-8b", "llama-3.1-8b"},
                                                       {"eagle3-qwen3-8b", "qwen3-8b"},
                                                       {"eagle3-qwen3-32b", "qwen3-32b"}};
  for (const auto& [head, target] : pairs) {
    auto target_config = LoadModelConfig(model_test::ModelPath(std::string("shapes/") + target));
    ASSERT_TRUE(target_config.ok()) << target_config.status();
    auto text = ReadFileToString(mine + head + "/config.json");
    ASSERT_TRUE(text.ok()) << text.status();
    auto c = ParseEagle3Config(*text, head, *target_config);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->draft_vocab_size, 32000) << head;
    EXPECT_EQ(c->target_hidden_size, target_config->hidden_size) << head;
    const int32_t layers = target_config->num_layers;
    EXPECT_EQ(c->aux_layer_ids, (std::vector<int32_t>{2, layers / 2, layers - 3})) << head;
    EXPECT_EQ(c->layer.head_dim, 128) << head;
  }
}

// The trained codepair head drafts what the training script's plain-torch reference drafts
// (tools/train/eagle3_golden.py: fp32, the same BF16 weights): the target's hidden states at
// positions 0..t, then seven greedy steps on the head's own state. A step whose two best logits
// lie within 1e-3 of each other may go either way in another summation order; the comparison of
// that chain stops there.
TEST(Eagle3GoldenTest, TrainedHeadDraftsWhatThePyTorchReferenceDrafts) {
  const std::string target_dir = model_test::ModelPath("codepair/target");
  const std::string head_dir = std::string(SPECD_SOURCE_DIR) + "/models/codepair/eagle3";
  auto config = LoadModelConfig(target_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto loaded = Eagle3Head::Load(head_dir, target_dir, *config);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Eagle3Head& head = **loaded;
  LoadOptions options;
  options.num_threads = 1;
  auto model = Model::Load(target_dir, options);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->SetAuxHiddenLayers(head.config().aux_layer_ids).ok());
  const nlohmann::json golden = model_test::ReadJson(head_dir + "/golden.json");
  const int64_t h = head.hidden_size(), vocab = head.vocab_size();
  int compared = 0;
  for (const nlohmann::json& prompt : golden["prompts"]) {
    const std::vector<int32_t> ids = model_test::Ids(prompt["prompt_ids"]);
    const auto n = static_cast<int32_t>(ids.size());
    std::vector<int32_t> blocks((n + 15) / 16);
    for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = static_cast<int32_t>(b);
    auto kv = CpuKvCache::Create((*model)->MakeKvCacheSpec(blocks.size(), 16));
    ASSERT_TRUE(kv.ok());
    const SequenceInput whole{.tokens = ids, .start_pos = 0, .block_table = blocks};
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward({&whole, 1}, **kv, &logits).ok());
    std::vector<float> fused(n * h);
    head.Fuse((*model)->aux_hidden().data(), n, fused.data());
    for (const nlohmann::json& anchor : prompt["anchors"]) {
      const int32_t t = anchor["t"].get<int32_t>();
      Eagle3Head::Kv cache;
      std::vector<Eagle3Head::Row> rows;
      for (int32_t p = 0; p <= t; ++p) {
        rows.push_back({.token = ids[p + 1],
                        .position = p,
                        .hidden = &fused[p * h],
                        .kv = &cache,
                        .logits = p == t});
      }
      std::vector<float> prenorm, row_logits, hidden;
      ASSERT_TRUE(head.Forward(rows, &prenorm, &row_logits).ok());
      hidden.assign(prenorm.end() - h, prenorm.end());
      const auto& drafts = anchor["drafts"];
      for (size_t s = 0; s < drafts.size(); ++s) {
        const int32_t got = model_test::Argmax({row_logits.data(), static_cast<size_t>(vocab)});
        EXPECT_EQ(got, drafts[s].get<int32_t>())
            << "prompt of " << n << " ids, anchor " << t << ", draft " << s;
        ++compared;
        if (anchor["top2_gaps"][s].get<double>() < 1e-3 || got != drafts[s].get<int32_t>()) break;
        Eagle3Head::Row next{.token = got,
                             .position = t + 1 + static_cast<int32_t>(s),
                             .hidden = hidden.data(),
                             .kv = &cache,
                             .logits = true};
        ASSERT_TRUE(head.Forward({&next, 1}, &prenorm, &row_logits).ok());
        hidden = prenorm;
      }
    }
  }
  EXPECT_GE(compared, 60);
}

}  // namespace
}  // namespace specd
