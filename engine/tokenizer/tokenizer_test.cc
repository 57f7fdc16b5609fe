// Golden tests of Tokenizer::FromDir against vectors made by SentencePiece and HF
// tokenizers (shared/models), plus special-token metadata and error handling.
#include "engine/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/tokenizer/test_util.h"

namespace specd {
namespace {

using ::specd::tok::testing::IdsToString;
using ::specd::tok::testing::LoadJsonlVectors;
using ::specd::tok::testing::TokenizerVector;

std::string Models(const std::string& rel) {
  return std::string(SPECD_SHARED_DIR) + "/models/" + rel;
}

std::unique_ptr<Tokenizer> LoadDir(const std::string& rel) {
  auto tok = Tokenizer::FromDir(Models(rel));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

struct VectorResult {
  int total = 0;
  int encode_pass = 0;
  int decode_pass = 0;
};

// Encodes every vector (no BOS) and decodes its ids with skip_special; reports mismatches.
VectorResult RunVectors(const Tokenizer& tok, const std::vector<TokenizerVector>& vectors,
                        bool skip_hf_differs, bool check_decode) {
  VectorResult r;
  for (const TokenizerVector& v : vectors) {
    if (skip_hf_differs && v.hf_differs) continue;
    ++r.total;
    auto ids = tok.Encode(v.text, /*add_special=*/false);
    if (ids.ok() && *ids == v.ids) {
      ++r.encode_pass;
    } else {
      ADD_FAILURE() << "encode mismatch for " << ::testing::PrintToString(v.text) << "\n  want "
                    << IdsToString(v.ids) << "\n  got  "
                    << (ids.ok() ? IdsToString(*ids) : ids.status().ToString());
    }
    if (!check_decode) continue;
    auto text = tok.Decode(v.ids, /*skip_special=*/true);
    const std::string want = v.decoded.value_or(v.text);
    if (text.ok() && *text == want) {
      ++r.decode_pass;
    } else {
      ADD_FAILURE() << "decode mismatch for " << IdsToString(v.ids) << "\n  want "
                    << ::testing::PrintToString(want) << "\n  got  "
                    << (text.ok() ? ::testing::PrintToString(*text) : text.status().ToString());
    }
  }
  return r;
}

void ExpectAllPass(const std::string& name, const VectorResult& r, bool check_decode) {
  std::printf("[vectors] %-50s encode %d/%d", name.c_str(), r.encode_pass, r.total);
  if (check_decode) std::printf("  decode %d/%d", r.decode_pass, r.total);
  std::printf("\n");
  EXPECT_GT(r.total, 0);
  EXPECT_EQ(r.encode_pass, r.total);
  if (check_decode) {
    EXPECT_EQ(r.decode_pass, r.total);
  }
}

TEST(TokenizerGoldenTest, Llama2MatchesSentencePieceVectors) {
  auto tok = LoadDir("llama2-tokenizer");
  ASSERT_NE(tok, nullptr);
  auto vectors = LoadJsonlVectors(Models("llama2-tokenizer/sentencepiece_vectors.jsonl"));
  ASSERT_EQ(vectors.size(), 245u);
  const VectorResult r = RunVectors(*tok, vectors, /*skip_hf_differs=*/true, true);
  EXPECT_EQ(r.total, 240);
  ExpectAllPass("llama2-tokenizer/sentencepiece_vectors.jsonl", r, true);
}

TEST(TokenizerGoldenTest, Stories260KMatchesHfVectors) {
  auto tok = LoadDir("stories260K/hf");
  ASSERT_NE(tok, nullptr);
  auto vectors = LoadJsonlVectors(Models("stories260K/golden/hf_tokenizers_vectors.jsonl"));
  ExpectAllPass("stories260K/golden/hf_tokenizers_vectors.jsonl",
                RunVectors(*tok, vectors, false, true), true);
}

TEST(TokenizerGoldenTest, Aidreams260KMatchesHfVectors) {
  auto tok = LoadDir("aidreams260K/hf");
  ASSERT_NE(tok, nullptr);
  auto vectors = LoadJsonlVectors(Models("aidreams260K/golden/hf_tokenizers_vectors.jsonl"));
  ExpectAllPass("aidreams260K/golden/hf_tokenizers_vectors.jsonl",
                RunVectors(*tok, vectors, false, true), true);
}

TEST(TokenizerGoldenTest, BabyLlamaUnkFusionMatchesHfVectors) {
  auto tok = LoadDir("babyllama-tok105/hf");
  ASSERT_NE(tok, nullptr);
  auto vectors = LoadJsonlVectors(Models("babyllama-tok105/golden/hf_tokenizers_vectors.jsonl"));
  ExpectAllPass("babyllama-tok105/golden/hf_tokenizers_vectors.jsonl",
                RunVectors(*tok, vectors, false, true), true);
}

TEST(TokenizerGoldenTest, CodepairByteLevelMatchesHfVectorsAndRoundTrips) {
  auto tok = LoadDir("codepair/target");
  ASSERT_NE(tok, nullptr);
  auto vectors = LoadJsonlVectors(Models("codepair/tokenizer_vectors.jsonl"));
  ASSERT_EQ(vectors.size(), 293u);
  ExpectAllPass("codepair/tokenizer_vectors.jsonl", RunVectors(*tok, vectors, false, true), true);
}

TEST(TokenizerGoldenTest, EncodePromptsWithBos) {
  for (const char* model : {"stories260K", "aidreams260K", "babyllama-tok105"}) {
    auto tok = LoadDir(std::string(model) + "/hf");
    ASSERT_NE(tok, nullptr);
    auto vectors = LoadJsonlVectors(Models(std::string(model) + "/golden/encode_prompts.jsonl"));
    ASSERT_FALSE(vectors.empty());
    int pass = 0;
    for (const TokenizerVector& v : vectors) {
      auto ids = tok->Encode(v.text, /*add_special=*/true);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, v.ids) << model << ": " << v.text;
      pass += *ids == v.ids;
    }
    std::printf("[vectors] %-50s encode %d/%zu\n",
                (std::string(model) + "/golden/encode_prompts.jsonl").c_str(), pass,
                vectors.size());
  }
}

TEST(TokenizerGoldenTest, CodepairGoldenPromptIdsIncludeBos) {
  auto tok = LoadDir("codepair/target");
  ASSERT_NE(tok, nullptr);
  std::ifstream in(Models("codepair/golden.json"));
  auto golden = nlohmann::json::parse(in);
  int n = 0;
  for (const char* side : {"target", "draft"}) {
    for (const auto& entry : golden[side]) {
      auto ids = tok->Encode(entry["prompt"].get<std::string>(), /*add_special=*/true);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*ids, entry["prompt_ids"].get<std::vector<int32_t>>());
      ++n;
    }
  }
  EXPECT_EQ(n, 16);
}

TEST(TokenizerMetadataTest, CodepairSpecialTokensAndTemplate) {
  auto tok = LoadDir("codepair/target");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 8192);
  EXPECT_EQ(tok->bos_id(), 0);
  EXPECT_THAT(tok->eos_ids(), ::testing::ElementsAre(1));
  EXPECT_EQ(tok->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(tok->eos_token(), "<|end_of_text|>");
  EXPECT_THAT(tok->chat_template(), ::testing::HasSubstr("<|assistant|>"));
  EXPECT_TRUE(tok->IsSpecial(4));
  EXPECT_FALSE(tok->IsSpecial(100));
  EXPECT_EQ(tok->TokenToId("<|user|>"), 2);
  EXPECT_EQ(tok->TokenToId("no-such-token"), std::nullopt);
  // Special tokens in text are split out; decode keeps or drops them on request.
  auto ids = tok->Encode("<|user|>hi<|end_of_turn|>", false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), 2);
  EXPECT_EQ(ids->back(), 4);
  EXPECT_EQ(*tok->Decode(*ids, false), "<|user|>hi<|end_of_turn|>");
  EXPECT_EQ(*tok->Decode(*ids, true), "hi");
}

TEST(TokenizerMetadataTest, Llama2BosAndNoTemplate) {
  auto tok = LoadDir("llama2-tokenizer");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_THAT(tok->eos_ids(), ::testing::ElementsAre(2));
  EXPECT_EQ(tok->bos_token(), "<s>");
  EXPECT_TRUE(tok->chat_template().empty());
  EXPECT_EQ(*tok->Encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(*tok->Encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(*tok->Decode(std::vector<int32_t>{1, 15043, 3186}, false), "<s> Hello world");
  EXPECT_EQ(tok->IdToToken(15043), "\u2581Hello");
}

TEST(TokenizerErrorTest, InvalidUtf8AndOutOfRangeIds) {
  auto tok = LoadDir("codepair/target");
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab\xC3", false).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->Encode("\xED\xA0\x80", false).status().code(),  // surrogate
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{5, 8192}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{-1}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerThreadTest, ConcurrentEncodesAgree) {
  auto tok = LoadDir("codepair/target");
  ASSERT_NE(tok, nullptr);
  const auto vectors = LoadJsonlVectors(Models("codepair/tokenizer_vectors.jsonl"));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < vectors.size(); i += 3) {
          auto ids = tok->Encode(vectors[i].text, false);
          if (!ids.ok() || *ids != vectors[i].ids) ++mismatches;
          auto text = tok->Decode(vectors[i].ids, true);
          if (!text.ok() || *text != *vectors[i].decoded) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// Throughput check, off by default: --gtest_also_run_disabled_tests to run it.
TEST(TokenizerBenchmark, DISABLED_EncodeDecodeThroughput) {
  std::ifstream in(Models("codepair/prompts.jsonl"));
  std::string corpus, line;
  while (std::getline(in, line)) corpus += nlohmann::json::parse(line)["prompt"].get<std::string>();
  std::string text;
  while (text.size() < (1 << 20)) text += corpus;  // ~1 MiB of Python source
  for (const char* dir : {"codepair/target", "llama2-tokenizer"}) {
    auto tok = LoadDir(dir);
    ASSERT_NE(tok, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    auto ids = tok->Encode(text, false);
    auto t1 = std::chrono::steady_clock::now();
    auto back = tok->Decode(*ids, false);
    auto t2 = std::chrono::steady_clock::now();
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
    const double enc = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::printf("[bench] %-18s %zu bytes -> %zu ids: encode %.1f MB/s, decode %.1f MB/s\n", dir,
                text.size(), ids->size(), text.size() / enc / 1e6, text.size() / dec / 1e6);
  }
}

}  // namespace
}  // namespace specd
