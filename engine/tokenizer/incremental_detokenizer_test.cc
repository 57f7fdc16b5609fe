// Streams every shared vector file token by token through IncrementalDetokenizer: each
// chunk must be valid UTF-8 and the chunks must concatenate to exactly the full Decode,
// with and without skip_special, from scratch and continuing a prompt.
#include "engine/tokenizer/incremental_detokenizer.h"

#include <gtest/gtest.h>

#include "engine/tokenizer/test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace specd {
namespace {

using ::specd::tok::testing::IdsToString;
using ::specd::tok::testing::TokenizerVector;

std::string Models(const std::string& rel) {
  return std::string(SPECD_SHARED_DIR) + "/models/" + rel;
}

// Streams `gen` after `prompt`; checks every chunk and returns the concatenation.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& gen, bool skip_special, int* num_chunks) {
  IncrementalDetokenizer detok(tok, prompt, skip_special);
  std::string out;
  for (int32_t id : gen) {
    const std::string chunk = detok.Push(id);
    EXPECT_TRUE(tok::IsValidUtf8(chunk)) << "broken chunk after id " << id;
    *num_chunks += !chunk.empty();
    out += chunk;
  }
  const std::string rest = detok.Flush();
  EXPECT_TRUE(tok::IsValidUtf8(rest));
  return out + rest;
}

struct StreamStats {
  int sequences = 0, exact = 0, prompt_cases = 0, prompt_exact = 0;
};

void StreamFile(const Tokenizer& tok, const std::vector<TokenizerVector>& vectors,
                const std::string& name) {
  StreamStats s;
  for (bool skip : {true, false}) {
    for (const TokenizerVector& v : vectors) {
      const std::string full = *tok.Decode(v.ids, skip);
      int chunks = 0;
      ++s.sequences;
      const std::string streamed = Stream(tok, {}, v.ids, skip, &chunks);
      EXPECT_EQ(streamed, full) << name << " ids " << IdsToString(v.ids);
      s.exact += streamed == full;
      if (v.ids.size() < 2) continue;
      // Continue a prompt: the stream is what the generated ids add to the prompt's text.
      const size_t cut = v.ids.size() / 2;
      const std::vector<int32_t> prompt(v.ids.begin(), v.ids.begin() + cut);
      const std::vector<int32_t> gen(v.ids.begin() + cut, v.ids.end());
      const std::string prompt_text = *tok.Decode(prompt, skip);
      if (full.compare(0, prompt_text.size(), prompt_text) != 0) continue;  // cut inside a char
      ++s.prompt_cases;
      const std::string cont = Stream(tok, prompt, gen, skip, &chunks);
      EXPECT_EQ(cont, full.substr(prompt_text.size())) << name << " " << IdsToString(v.ids);
      s.prompt_exact += cont == full.substr(prompt_text.size());
    }
  }
  std::printf("[stream] %-48s exact %d/%d  after-prompt exact %d/%d\n", name.c_str(), s.exact,
              s.sequences, s.prompt_exact, s.prompt_cases);
  EXPECT_EQ(s.exact, s.sequences);
  EXPECT_EQ(s.prompt_exact, s.prompt_cases);
}

TEST(IncrementalDetokenizerTest, HfVectorFilesStreamExactly) {
  const std::vector<std::pair<std::string, std::string>> sets = {
      {"llama2-tokenizer", "llama2-tokenizer/sentencepiece_vectors.jsonl"},
      {"stories260K/hf", "stories260K/golden/hf_tokenizers_vectors.jsonl"},
      {"aidreams260K/hf", "aidreams260K/golden/hf_tokenizers_vectors.jsonl"},
      {"babyllama-tok105/hf", "babyllama-tok105/golden/hf_tokenizers_vectors.jsonl"},
      {"codepair/target", "codepair/tokenizer_vectors.jsonl"},
  };
  for (const auto& [dir, file] : sets) {
    auto tok = Tokenizer::FromDir(Models(dir));
    ASSERT_TRUE(tok.ok()) << tok.status();
    StreamFile(**tok, ::specd::tok::testing::LoadJsonlVectors(Models(file)), file);
  }
}

TEST(IncrementalDetokenizerTest, GgufVectorFilesStreamExactly) {
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm", "falcon", "mpt", "dbrx"}) {
    const std::string gguf = Models("vocab-tests/ggml-vocab-") + name + ".gguf";
    auto tok = Tokenizer::FromGguf(gguf);
    ASSERT_TRUE(tok.ok()) << tok.status();
    StreamFile(**tok, ::specd::tok::testing::LoadLlamaCppVectors(gguf + ".inp", gguf + ".out"),
               std::string("vocab-tests/") + name);
  }
}

class Llama2StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::FromDir(Models("llama2-tokenizer"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(Llama2StreamTest, EmitsWordsEagerlyWithSentencePieceSpaces) {
  IncrementalDetokenizer detok(*tok_, {}, true);
  EXPECT_EQ(detok.Push(15043), "Hello");  // "▁Hello": leading space stripped at the start
  EXPECT_EQ(detok.Push(3186), " world");  // "▁world"
  EXPECT_EQ(detok.Flush(), "");
}

TEST_F(Llama2StreamTest, KeepsTheSpaceWhenContinuingAPrompt) {
  IncrementalDetokenizer detok(*tok_, std::vector<int32_t>{1, 15043}, true);  // "<s>Hello"
  EXPECT_EQ(detok.Push(3186), " world");
  IncrementalDetokenizer from_bos(*tok_, std::vector<int32_t>{1}, true);
  EXPECT_EQ(from_bos.Push(15043), "Hello");  // as Decode([<s>, ▁Hello], skip) gives
}

TEST_F(Llama2StreamTest, HoldsByteFallbackBytesUntilTheCharacterIsComplete) {
  auto ids = tok_->Encode("a🦙b", false);  // 🦙 has no piece: four <0x..> byte tokens
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 6u) << IdsToString(*ids);  // ▁a, 4 bytes, b
  EXPECT_EQ(tok_->IdToToken((*ids)[1]), "<0xF0>");
  IncrementalDetokenizer detok(*tok_, {}, true);
  std::vector<std::string> chunks;
  for (int32_t id : *ids) chunks.push_back(detok.Push(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "", "", "🦙", "b"}))
      << "ids " << IdsToString(*ids);
}

TEST_F(Llama2StreamTest, PromptEndingInsideACharacterIsCompletedByTheStream) {
  auto ids = tok_->Encode("x🦙", false);  // ▁x, 4 byte tokens
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 5u) << IdsToString(*ids);
  const std::vector<int32_t> prompt(ids->begin(), ids->begin() + 3);  // cut after 2 bytes
  IncrementalDetokenizer detok(*tok_, prompt, true);
  EXPECT_EQ(detok.Push((*ids)[3]), "");
  EXPECT_EQ(detok.Push((*ids)[4]), "🦙");
}

TEST_F(Llama2StreamTest, FlushTurnsIncompleteBytesIntoReplacementChars) {
  const std::vector<int32_t> ids = {*tok_->TokenToId("<0xE4>"), *tok_->TokenToId("<0xBD>")};
  IncrementalDetokenizer detok(*tok_, {}, true);
  EXPECT_EQ(detok.Push(ids[0]), "");
  EXPECT_EQ(detok.Push(ids[1]), "");
  EXPECT_EQ(detok.Flush(), *tok_->Decode(ids, true));
  EXPECT_EQ(*tok_->Decode(ids, true), "\uFFFD\uFFFD");
}

TEST_F(Llama2StreamTest, SpecialTokensFollowSkipSpecial) {
  IncrementalDetokenizer skip(*tok_, {}, true);
  IncrementalDetokenizer keep(*tok_, {}, false);
  std::string a, b;
  for (int32_t id : {15043, 2, 3186}) {
    a += skip.Push(id);
    b += keep.Push(id);
  }
  a += skip.Flush();
  b += keep.Flush();
  EXPECT_EQ(a, "Hello world");
  EXPECT_EQ(b, "Hello</s> world");
}

TEST_F(Llama2StreamTest, OutOfRangeIdsDecodeToNothing) {
  IncrementalDetokenizer detok(*tok_, {}, true);
  EXPECT_EQ(detok.Push(-5), "");
  EXPECT_EQ(detok.Push(32000), "");
  EXPECT_EQ(detok.Push(15043), "Hello");
}

TEST(IncrementalDetokenizerTest, ByteLevelCjkAndEmojiSplitAcrossTokens) {
  auto tok = Tokenizer::FromGguf(Models("vocab-tests/ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "你好，世界 🦙😶‍🌫️ done";
  auto ids = (*tok)->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  ASSERT_GT(ids->size(), 8u);
  IncrementalDetokenizer detok(**tok, {}, true);
  std::string out;
  int empty_chunks = 0;
  for (int32_t id : *ids) {
    const std::string chunk = detok.Push(id);
    ASSERT_TRUE(tok::IsValidUtf8(chunk));
    empty_chunks += chunk.empty();
    out += chunk;
  }
  out += detok.Flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(empty_chunks, 0);  // some tokens carry only part of a character
}

}  // namespace
}  // namespace specd
