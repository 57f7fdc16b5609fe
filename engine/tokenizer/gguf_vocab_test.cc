// llama.cpp's tokenizer suite (vocab-only GGUFs + .inp/.out vectors made with HF) run
// through Tokenizer::FromGguf, the GGUF metadata parser's bounds checks on truncated and
// corrupt files, and the GGUF stories260K vocab against its HF tokenizer's vectors.
#include "engine/tokenizer/gguf_vocab.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/base/mapped_file.h"
#include "engine/tokenizer/gguf_reader.h"
#include "engine/tokenizer/test_util.h"
#include "engine/tokenizer/tokenizer.h"

namespace specd::tok {
namespace {

using ::specd::tok::testing::IdsToString;
using ::specd::tok::testing::TokenizerVector;

std::string VocabDir() { return std::string(SPECD_SHARED_DIR) + "/models/vocab-tests/"; }

struct Counts {
  int total = 0, encode_pass = 0, decode_pass = 0;
};

Counts RunLlamaCppVocab(const std::string& name) {
  Counts c;
  const std::string gguf = VocabDir() + "ggml-vocab-" + name + ".gguf";
  auto tok = Tokenizer::FromGguf(gguf);
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return c;
  const auto vectors = ::specd::tok::testing::LoadLlamaCppVectors(gguf + ".inp", gguf + ".out");
  for (const TokenizerVector& v : vectors) {
    ++c.total;
    auto ids = (*tok)->Encode(v.text, /*add_special=*/false);
    if (ids.ok() && *ids == v.ids) {
      ++c.encode_pass;
    } else {
      ADD_FAILURE() << name << ": " << ::testing::PrintToString(v.text) << "\n  want "
                    << IdsToString(v.ids) << "\n  got  "
                    << (ids.ok() ? IdsToString(*ids) : ids.status().ToString());
    }
    auto text = (*tok)->Decode(v.ids, /*skip_special=*/false);
    if (text.ok() && *text == v.text) {
      ++c.decode_pass;
    } else {
      ADD_FAILURE() << name << ": decode of " << IdsToString(v.ids) << " gave "
                    << ::testing::PrintToString(text.ok() ? *text : text.status().ToString())
                    << ", want " << ::testing::PrintToString(v.text);
    }
  }
  std::printf("[vocab] %-16s encode %d/%d  decode round trip %d/%d\n", name.c_str(), c.encode_pass,
              c.total, c.decode_pass, c.total);
  return c;
}

class LlamaCppVocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocabTest, EncodesAllVectorsAndDecodesBack) {
  const Counts c = RunLlamaCppVocab(GetParam());
  EXPECT_GE(c.total, 43);
  EXPECT_EQ(c.encode_pass, c.total);
  EXPECT_EQ(c.decode_pass, c.total);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, LlamaCppVocabTest,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                           "deepseek-coder", "deepseek-llm", "falcon", "mpt",
                                           "refact", "dbrx"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = std::isalnum(ch) ? ch : '_';
                           return n;
                         });

TEST(GgufVocabTest, VocabsWithoutVectorsLoad) {
  for (const char* name : {"baichuan", "gpt-neox"}) {
    auto tok = Tokenizer::FromGguf(VocabDir() + "ggml-vocab-" + name + ".gguf");
    ASSERT_TRUE(tok.ok()) << name << ": " << tok.status();
    auto ids = (*tok)->Encode("Hello world", false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*(*tok)->Decode(*ids, false), "Hello world") << name;
  }
}

TEST(GgufVocabTest, WordPieceIsReportedUnsupported) {
  auto tok = Tokenizer::FromGguf(VocabDir() + "ggml-vocab-bert-bge.gguf");
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kUnimplemented) << tok.status();
}

TEST(GgufVocabTest, MetadataOfLlamaSpm) {
  auto tok = Tokenizer::FromGguf(VocabDir() + "ggml-vocab-llama-spm.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 32000);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ((*tok)->bos_token(), "<s>");
  EXPECT_TRUE((*tok)->IsSpecial(0));
  EXPECT_TRUE((*tok)->IsSpecial(2));
  EXPECT_FALSE((*tok)->IsSpecial(3));  // <0x00> byte piece
  EXPECT_EQ(*(*tok)->Encode("Hello", true), (std::vector<int32_t>{1, 15043}));
}

TEST(GgufVocabTest, MetadataOfDeepseekCoderAndPhi3Template) {
  auto ds = Tokenizer::FromGguf(VocabDir() + "ggml-vocab-deepseek-coder.gguf");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->bos_id(), 32013);
  EXPECT_EQ((*ds)->eos_ids(), std::vector<int32_t>{32014});
  EXPECT_EQ(*(*ds)->Encode("a", true), (std::vector<int32_t>{32013, 64}));
  auto phi = Tokenizer::FromGguf(VocabDir() + "ggml-vocab-phi-3.gguf");
  ASSERT_TRUE(phi.ok()) << phi.status();
  EXPECT_NE((*phi)->chat_template().find("<|assistant|>"), std::string::npos);
  EXPECT_EQ((*phi)->eos_token(), "<|endoftext|>");
}

// The GGUF of stories260K and its converted tokenizer.json must tokenize identically.
TEST(GgufVocabTest, Stories260KGgufMatchesHfVectors) {
  const std::string models = std::string(SPECD_SHARED_DIR) + "/models/";
  auto tok = Tokenizer::FromGguf(models + "stories260K/stories260K.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  int pass = 0, total = 0;
  for (const TokenizerVector& v : ::specd::tok::testing::LoadJsonlVectors(
           models + "stories260K/golden/hf_tokenizers_vectors.jsonl")) {
    ++total;
    auto ids = (*tok)->Encode(v.text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, v.ids) << ::testing::PrintToString(v.text);
    pass += *ids == v.ids;
    EXPECT_EQ(*(*tok)->Decode(v.ids, true), *v.decoded);
  }
  std::printf("[vocab] %-16s encode %d/%d (vs HF vectors)\n", "stories260K.gguf", pass, total);
  EXPECT_EQ(pass, 245);
}

TEST(GgufVocabTest, EveryPreTokenizerFlavourCompiles) {
  for (const char* pre :
       {"default", "llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
        "starcoder", "gpt-2", "mpt", "refact", "dbrx", "command-r", "tekken", "poro-chat", "viking",
        "chameleon", "chatglm-bpe", "smollm"}) {
    auto patterns = GgufPreTokenizerPatterns(pre);
    ASSERT_TRUE(patterns.ok()) << pre;
    std::vector<std::string> list = *patterns;
    EXPECT_TRUE(MakeRegexByteLevelPreTokenizer(list).ok()) << pre;
  }
  EXPECT_EQ(GgufPreTokenizerPatterns("no-such-flavour").status().code(),
            absl::StatusCode::kUnimplemented);
}

// --- corrupt files ---------------------------------------------------------------------

// A small GGUF v3 with a SPM vocab, written by hand.
class GgufWriter {
 public:
  GgufWriter() {
    Bytes("GGUF", 4);
    U32(3);
    U64(0);  // tensors
    count_pos_ = out_.size();
    U64(0);  // kv count, patched by Finish()
  }
  void KvString(const std::string& key, const std::string& value) {
    Key(key, 8);
    Str(value);
  }
  void KvU32(const std::string& key, uint32_t v) {
    Key(key, 4);
    U32(v);
  }
  void KvStrings(const std::string& key, const std::vector<std::string>& values) {
    Key(key, 9);
    U32(8);
    U64(values.size());
    for (const auto& s : values) Str(s);
  }
  void KvFloats(const std::string& key, const std::vector<float>& values) {
    Key(key, 9);
    U32(6);
    U64(values.size());
    for (float f : values) Bytes(&f, 4);
  }
  void KvInts(const std::string& key, const std::vector<int32_t>& values) {
    Key(key, 9);
    U32(5);
    U64(values.size());
    for (int32_t v : values) Bytes(&v, 4);
  }
  std::string Finish() {
    std::memcpy(&out_[count_pos_], &num_kv_, 8);
    return out_;
  }

 private:
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void U32(uint32_t v) { Bytes(&v, 4); }
  void U64(uint64_t v) { Bytes(&v, 8); }
  void Str(const std::string& s) {
    U64(s.size());
    out_ += s;
  }
  void Key(const std::string& key, uint32_t type) {
    Str(key);
    U32(type);
    ++num_kv_;
  }
  std::string out_;
  size_t count_pos_ = 0;
  uint64_t num_kv_ = 0;
};

std::string TinySpmGguf() {
  GgufWriter w;
  w.KvString("tokenizer.ggml.model", "llama");
  w.KvStrings("tokenizer.ggml.tokens",
              {"<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "ab"});
  w.KvFloats("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -0.5f, -0.25f});
  w.KvInts("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
  w.KvU32("tokenizer.ggml.bos_token_id", 1);
  w.KvU32("tokenizer.ggml.eos_token_id", 2);
  return w.Finish();
}

absl::StatusOr<GgufMetadata> ParseString(const std::string& bytes) {
  return GgufMetadata::Parse(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

TEST(GgufReaderTest, ParsesHandWrittenVocab) {
  auto meta = ParseString(TinySpmGguf());
  ASSERT_TRUE(meta.ok()) << meta.status();
  auto parts = BuildGgufTokenizer(*meta);
  ASSERT_TRUE(parts.ok()) << parts.status();
  Tokenizer tok(*std::move(parts));
  // "ab" scores above "▁a", so "▁ab" -> "▁" + "ab".
  EXPECT_EQ(*tok.Encode("ab", false), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(*tok.Encode("a", true), (std::vector<int32_t>{1, 6}));
  EXPECT_EQ(*tok.Decode(std::vector<int32_t>{3, 7}, false), "ab");
}

TEST(GgufReaderTest, EveryTruncationIsAnError) {
  const std::string full = TinySpmGguf();
  for (size_t len = 0; len < full.size(); ++len) {
    auto meta = ParseString(full.substr(0, len));
    EXPECT_FALSE(meta.ok()) << "prefix of " << len << " bytes parsed";
  }
}

TEST(GgufReaderTest, CorruptHeadersAndCountsAreErrors) {
  std::string bad_magic = TinySpmGguf();
  bad_magic[0] = 'X';
  EXPECT_FALSE(ParseString(bad_magic).ok());
  std::string bad_version = TinySpmGguf();
  bad_version[4] = 9;
  EXPECT_FALSE(ParseString(bad_version).ok());
  std::string huge_kv = TinySpmGguf();
  const uint64_t n = uint64_t{1} << 60;
  std::memcpy(&huge_kv[16], &n, 8);
  EXPECT_FALSE(ParseString(huge_kv).ok());
}

TEST(GgufReaderTest, RandomByteFlipsNeverCrash) {
  const std::string full = TinySpmGguf();
  std::mt19937 rng(42);
  int errors = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = full;
    for (int k = 0; k < 3; ++k) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xFF);
    }
    auto meta = ParseString(bytes);
    if (!meta.ok()) {
      ++errors;
      continue;
    }
    auto parts = BuildGgufTokenizer(*meta);  // must not crash either
    if (!parts.ok()) continue;
    Tokenizer tok(*std::move(parts));
    auto ids = tok.Encode("ab a", true);
    if (ids.ok()) {
      EXPECT_TRUE(tok.Decode(*ids, false).ok());
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(GgufReaderTest, TruncatedRealFilesAreClearErrors) {
  const std::string src = VocabDir() + "ggml-vocab-gpt-2.gguf";
  auto file = MappedFile::Open(src);
  ASSERT_TRUE(file.ok());
  const std::string dir = ::testing::TempDir() + "/gguf_trunc";
  std::filesystem::create_directories(dir);
  for (size_t len :
       {size_t{0}, size_t{3}, size_t{20}, size_t{1000}, file->size() / 2, file->size() - 1}) {
    const std::string path = dir + "/cut_" + std::to_string(len) + ".gguf";
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(file->bytes().data()), len);
    auto tok = Tokenizer::FromGguf(path);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << len;
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
  }
  EXPECT_EQ(Tokenizer::FromGguf(dir + "/missing.gguf").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specd::tok
