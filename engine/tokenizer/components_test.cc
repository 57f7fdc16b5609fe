// Unit tests of the tokenizer building blocks (UTF-8, regex, normalizers, pre-tokenizers,
// decoders, added tokens, post-processors, tokenizer_config handling) on small synthetic
// tokenizer.json files, malformed-input errors, and cross-checks between the HF and GGUF
// paths on the Llama-2 vocabulary.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/test_util.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode_norm.h"
#include "engine/tokenizer/utf8.h"

namespace specd::tok {
namespace {

using ::testing::ElementsAre;
using Ids = std::vector<int32_t>;

std::string Models(const std::string& rel) {
  return std::string(SPECD_SHARED_DIR) + "/models/" + rel;
}

// Writes tokenizer.json (+ optional tokenizer_config.json / chat_template.jinja) to a
// fresh directory and loads it.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadJson(const std::string& name,
                                                    const std::string& tokenizer_json,
                                                    const std::string& config_json = "",
                                                    const std::string& jinja = "") {
  const std::string dir = ::testing::TempDir() + "/tok_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tokenizer_json;
  if (!config_json.empty()) std::ofstream(dir + "/tokenizer_config.json") << config_json;
  if (!jinja.empty()) std::ofstream(dir + "/chat_template.jinja") << jinja;
  return Tokenizer::FromDir(dir);
}

// A character-level BPE over " a-z" plus `extra` (ids from 100), no merges.
nlohmann::json CharModel(const std::vector<std::string>& extra = {}) {
  nlohmann::json vocab = nlohmann::json::object();
  vocab[" "] = 0;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = c - 'a' + 1;
  int id = 100;
  for (const auto& e : extra) vocab[e] = id++;
  return {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}};
}

nlohmann::json Added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

std::vector<std::string> PreTokenize(const std::string& json, const std::string& text) {
  auto pre = PreTokenizerFromJson(nlohmann::json::parse(json));
  EXPECT_TRUE(pre.ok()) << pre.status();
  std::vector<PreToken> pieces = {{text, true}};
  EXPECT_TRUE((*pre)->PreTokenize(&pieces).ok());
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(p.text);
  return out;
}

TEST(Utf8Test, ValidatesAndRepairsLikeRust) {
  EXPECT_TRUE(IsValidUtf8("héllo 🦙"));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_EQ(Utf8Lossy("a\xE4\xBD"
                      "b"),
            "a\uFFFD"
            "b");                                    // one maximal subpart
  EXPECT_EQ(Utf8Lossy("\xF0\x80"), "\uFFFD\uFFFD");  // F0 80: two invalid bytes
  EXPECT_EQ(Utf8Lossy("\xE4\xBD"), "\uFFFD");        // truncated at the end
  EXPECT_TRUE(IsUnicodeWhitespace(0x3000));
  EXPECT_FALSE(IsUnicodeWhitespace(0x200B));  // zero-width space is not White_Space
}

TEST(RegexTest, WhitespaceIsUnicodeWhiteSpaceAndEmptyMatchesAreSkipped) {
  auto re = Regex::Compile("\\s+");
  ASSERT_TRUE(re.ok());
  std::vector<Regex::Match> m;
  ASSERT_TRUE((*re)->FindAll("a\u0085\u3000b", &m).ok());
  EXPECT_THAT(m, ElementsAre(Regex::Match{1, 6}));
  auto star = Regex::Compile("x*");
  m.clear();
  ASSERT_TRUE((*star)->FindAll("axxb", &m).ok());
  EXPECT_THAT(m, ElementsAre(Regex::Match{1, 3}));
  EXPECT_EQ(Regex::Compile("(unclosed").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NormalizerTest, PrependReplaceStripSequence) {
  auto n = NormalizerFromJson(nlohmann::json::parse(R"({"type":"Sequence","normalizers":[
      {"type":"Strip","strip_left":true,"strip_right":true},
      {"type":"Prepend","prepend":"\u2581"},
      {"type":"Replace","pattern":{"String":" "},"content":"\u2581"},
      {"type":"Replace","pattern":{"Regex":"\\d+"},"content":"#"}]})"));
  ASSERT_TRUE(n.ok()) << n.status();
  std::string text = "  a b 123 \t";
  ASSERT_TRUE((*n)->Normalize(&text).ok());
  EXPECT_EQ(text, "\u2581a\u2581b\u2581#");
  std::string empty;
  ASSERT_TRUE((*n)->Normalize(&empty).ok());
  EXPECT_EQ(empty, "");  // Prepend leaves empty text alone
  EXPECT_EQ(NormalizerFromJson(nlohmann::json::parse(R"({"type":"Precompiled"})")).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(NormalizerTest, NfcComposes) {
  auto n = NormalizerFromJson(nlohmann::json::parse(R"({"type":"NFC"})"));
  ASSERT_TRUE(n.ok()) << n.status();
  std::string text = "Cafe\u0301 ascii";
  ASSERT_TRUE((*n)->Normalize(&text).ok());
  ASSERT_TRUE(HaveUnicodeNormalization()) << "specd is built with ICU";
  EXPECT_EQ(text, "Caf\u00e9 ascii");
}

TEST(PreTokenizerTest, SplitBehaviorsMatchHfDocumentation) {
  auto split = [](const std::string& behavior) {
    return PreTokenize(R"({"type":"Split","pattern":{"String":"-"},"behavior":")" + behavior +
                           R"(","invert":false})",
                       "the-final--countdown");
  };
  EXPECT_THAT(split("Removed"), ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(split("Isolated"), ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(split("MergedWithPrevious"), ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(split("MergedWithNext"), ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(split("Contiguous"), ElementsAre("the", "-", "final", "--", "countdown"));
}

TEST(PreTokenizerTest, MetaspaceDigitsPunctuationByteLevel) {
  EXPECT_THAT(
      PreTokenize(
          R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true})",
          "Hey   friend!"),
      ElementsAre("\u2581Hey", "\u2581", "\u2581", "\u2581friend!"));
  EXPECT_THAT(PreTokenize(R"({"type":"Digits","individual_digits":true})", "ab123"),
              ElementsAre("ab", "1", "2", "3"));
  EXPECT_THAT(PreTokenize(R"({"type":"Digits","individual_digits":false})", "ab123c"),
              ElementsAre("ab", "123", "c"));
  EXPECT_THAT(PreTokenize(R"({"type":"Punctuation","behavior":"Isolated"})", "hi!?"),
              ElementsAre("hi", "!", "?"));
  EXPECT_THAT(PreTokenize(R"({"type":"ByteLevel","add_prefix_space":true,"use_regex":true})",
                          "Hello world's  x"),
              ElementsAre("\u0120Hello", "\u0120world", "'s", "\u0120", "\u0120x"));
}

TEST(DecoderTest, ByteFallbackFuseStripMetaspace) {
  auto d = DecoderFromJson(nlohmann::json::parse(R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"\u2581"},"content":" "},
      {"type":"ByteFallback"},{"type":"Fuse"},
      {"type":"Strip","content":" ","start":1,"stop":0}]})"));
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<DecodePiece> pieces = {{"\u2581hi"}, {"<0xE4>"}, {"<0xBD>"},
                                     {"<0xA0>"},   {"<0xE4>"}, {"\u2581x"}};
  (*d)->DecodeChain(&pieces);
  ASSERT_EQ(pieces.size(), 1u);
  // HF: a run of byte pieces that is not valid UTF-8 as a whole gives one U+FFFD per byte.
  EXPECT_EQ(pieces[0].text, "hi\uFFFD\uFFFD\uFFFD\uFFFD x");
  pieces = {{"<0xE4>"}, {"<0xBD>"}, {"<0xA0>"}, {"\u2581x"}};
  (*d)->DecodeChain(&pieces);
  EXPECT_EQ(pieces[0].text, "你 x");
  auto meta = DecoderFromJson(nlohmann::json::parse(
      R"({"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always"})"));
  ASSERT_TRUE(meta.ok());
  pieces = {{"\u2581Hey"}, {"\u2581friend!"}};
  (*meta)->DecodeChain(&pieces);
  EXPECT_EQ(pieces[0].text + pieces[1].text, "Hey friend!");
}

TEST(AddedTokenTest, LstripRstripSingleWordAndNormalized) {
  nlohmann::json j = {{"version", "1.0"},
                      {"model", CharModel()},
                      {"normalizer", {{"type", "Lowercase"}}},
                      {"added_tokens", nlohmann::json::array()}};
  auto mask = Added(50, "<mask>");
  mask["lstrip"] = true;
  auto x = Added(51, "[X]");
  x["rstrip"] = true;
  auto word = Added(52, "abc", false);
  word["single_word"] = true;
  auto hello = Added(53, "hello", false);
  hello["normalized"] = true;
  j["added_tokens"] = {mask, x, word, hello};
  auto tok = LoadJson("flags", j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("hi  <mask> y", false), (Ids{8, 9, 50, 0, 25}));
  EXPECT_EQ(*(*tok)->Encode("a[X]  b", false), (Ids{1, 51, 2}));
  EXPECT_EQ(*(*tok)->Encode("xabc abc", false), (Ids{24, 1, 2, 3, 0, 52}));
  EXPECT_EQ(*(*tok)->Encode("say HeLLo", false), (Ids{19, 1, 25, 0, 53}));
  EXPECT_TRUE((*tok)->IsSpecial(50));
  EXPECT_FALSE((*tok)->IsSpecial(52));
  // Special dropped, added kept; without a decoder HF joins pieces with spaces.
  EXPECT_EQ(*(*tok)->Decode(Ids{8, 50, 52}, true), "h abc");
}

// Mistral / Llama-2 (non-legacy) layout: Metaspace pre-tokenizer with prepend "first".
TEST(TokenizerJsonTest, MetaspacePrependFirstOnlyAtTheStart) {
  const std::string json = R"({"version":"1.0","normalizer":null,
    "pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"first","split":false},
    "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
       "pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
    "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},
       {"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
    "added_tokens":[{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
    "model":{"type":"BPE","unk_token":"<unk>","byte_fallback":true,"fuse_unk":true,
      "vocab":{"<unk>":0,"<s>":1,"</s>":2,"\u2581":3,"H":4,"i":5,"\u2581H":6,"\u2581Hi":7},
      "merges":[["\u2581","H"],["\u2581H","i"]]}})";
  auto tok = LoadJson("metaspace", json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("Hi", false), (Ids{7}));
  EXPECT_EQ(*(*tok)->Encode(" Hi", false), (Ids{7}));  // already starts with ▁: no second one
  EXPECT_EQ(*(*tok)->Encode("Hi<s>Hi", true), (Ids{1, 7, 1, 4, 5}));
  EXPECT_EQ(*(*tok)->Decode(Ids{7, 3, 6}, false), "Hi  H");
  EXPECT_EQ((*tok)->bos_id(), 1);  // from the template, no tokenizer_config
}

// Llama-3 layout: Split regex + ByteLevel without its own regex, ignore_merges, NFC.
TEST(TokenizerJsonTest, Llama3StyleSplitThenByteLevelWithIgnoreMerges) {
  nlohmann::json vocab = {{"h", 0}, {"i", 1}, {"\u0120", 2}, {"\u0120hi", 3}, {"\u0120h", 4},
                          {"1", 5}, {"2", 6}, {"3", 7},      {"4", 8},        {"12", 9}};
  nlohmann::json j = {
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer", nlohmann::json::parse(R"({"type":"Sequence","pretokenizers":[
          {"type":"Split","pattern":{"Regex":"\\p{N}{1,3}| ?\\p{L}+"},"behavior":"Isolated","invert":false},
          {"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})")},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", {"\u0120 h", "1 2"}}}}};
  auto tok = LoadJson("llama3ish", j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode(" hi", false), (Ids{3}));         // whole word in vocab
  EXPECT_EQ(*(*tok)->Encode(" hh", false), (Ids{4, 0}));      // merges otherwise
  EXPECT_EQ(*(*tok)->Encode("1234", false), (Ids{9, 7, 8}));  // \p{N}{1,3} chunks
  EXPECT_EQ(*(*tok)->Decode(Ids{3, 9}, false), " hi12");
}

TEST(TokenizerJsonTest, PostProcessorForms) {
  nlohmann::json j = {{"model", CharModel({"<s>", "</s>"})}};
  j["post_processor"] = {{"type", "RobertaProcessing"},
                         {"sep", {"</s>", 101}},
                         {"cls", {"<s>", 100}},
                         {"trim_offsets", true},
                         {"add_prefix_space", false}};
  auto roberta = LoadJson("roberta", j.dump());
  ASSERT_TRUE(roberta.ok()) << roberta.status();
  EXPECT_EQ(*(*roberta)->Encode("a", true), (Ids{100, 1, 101}));
  j["post_processor"] = nlohmann::json::parse(R"({"type":"Sequence","processors":[
      {"type":"ByteLevel"},
      {"type":"TemplateProcessing","single":"<s> $A </s>","pair":"",
       "special_tokens":{"<s>":{"id":"<s>","ids":[100],"tokens":["<s>"]},
                         "</s>":{"id":"</s>","ids":[101],"tokens":["</s>"]}}}]})");
  auto seq = LoadJson("seqpp", j.dump());
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*(*seq)->Encode("b", true), (Ids{100, 2, 101}));
  EXPECT_EQ(*(*seq)->Encode("b", false), (Ids{2}));
}

TEST(TokenizerConfigTest, TokensTemplatesAndAddFlags) {
  nlohmann::json j = {{"model", CharModel({"<s>", "</s>"})},
                      {"added_tokens", {Added(100, "<s>"), Added(101, "</s>")}}};
  j["post_processor"] = nlohmann::json::parse(R"({"type":"TemplateProcessing",
      "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
      "pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[100],"tokens":["<s>"]}}})");
  const std::string config = R"({
    "bos_token": {"__type":"AddedToken","content":"<s>","lstrip":false},
    "eos_token": "</s>", "add_bos_token": false, "add_eos_token": true,
    "tokenizer_class": "LlamaTokenizerFast",
    "chat_template": [{"name":"tool_use","template":"T"},{"name":"default","template":"D"}]})";
  auto tok = LoadJson("config", j.dump(), config);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->bos_id(), 100);
  EXPECT_THAT((*tok)->eos_ids(), ElementsAre(101));
  EXPECT_EQ((*tok)->eos_token(), "</s>");
  EXPECT_EQ((*tok)->chat_template(), "D");
  EXPECT_EQ(*(*tok)->Encode("a", true), (Ids{1, 101}));  // Llama class: flags rule
  // A generic class keeps the template's BOS; the .jinja file supplies the template.
  auto generic = LoadJson("config2", j.dump(),
                          R"({"bos_token":"<s>","eos_token":"</s>","add_bos_token":false,
                              "tokenizer_class":"PreTrainedTokenizerFast"})",
                          "{{ messages }}");
  ASSERT_TRUE(generic.ok()) << generic.status();
  EXPECT_EQ(*(*generic)->Encode("a", true), (Ids{100, 1}));
  EXPECT_EQ((*generic)->chat_template(), "{{ messages }}");
}

TEST(TokenizerJsonTest, MalformedFilesAreClearErrors) {
  const auto code = [](const std::string& name, const std::string& json,
                       const std::string& config = "") {
    auto tok = LoadJson(name, json, config);
    EXPECT_FALSE(tok.ok()) << name;
    if (!tok.ok()) {
      EXPECT_THAT(std::string(tok.status().message()), ::testing::HasSubstr("tokenizer"))
          << name << ": " << tok.status();
    }
    return tok.status().code();
  };
  const auto invalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code("syntax", "{\"model\": {"), invalid);
  EXPECT_EQ(code("no_model", "{}"), invalid);
  EXPECT_EQ(code("vocab_type", R"({"model":{"type":"BPE","vocab":{"a":"x"},"merges":[]}})"),
            invalid);
  EXPECT_EQ(code("bad_merge", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]}})"),
            invalid);
  EXPECT_EQ(code("merge_form", R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}})"),
            invalid);
  EXPECT_EQ(code("unigram", R"({"model":{"type":"Unigram","vocab":[]}})"),
            absl::StatusCode::kUnimplemented);
  nlohmann::json j = {{"model", CharModel()}};
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(["}}}, {"behavior", "Isolated"}};
  EXPECT_EQ(code("bad_regex", j.dump()), invalid);
  j.erase("pre_tokenizer");
  j["added_tokens"] = {{{"id", 5}, {"special", true}}};
  EXPECT_EQ(code("added_no_content", j.dump()), invalid);
  j.erase("added_tokens");
  EXPECT_EQ(code("bad_config", j.dump(), "{\"bos_token\": 5}"), invalid);
  EXPECT_EQ(Tokenizer::FromDir(::testing::TempDir() + "/no_such_dir").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenizerJsonTest, RandomMutationsNeverCrash) {
  std::ifstream in(Models("stories260K/hf/tokenizer.json"));
  const std::string original((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  std::mt19937 rng(7);
  int loaded = 0;
  for (int trial = 0; trial < 200; ++trial) {
    std::string text = original;
    // Alphanumeric-for-alphanumeric swaps keep most files valid JSON but break names,
    // numbers, pieces and merges.
    const std::string alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (int k = 0; k < 3;) {
      char& c = text[rng() % text.size()];
      if (alnum.find(c) == std::string::npos) continue;
      c = alnum[rng() % alnum.size()];
      ++k;
    }
    auto tok = LoadJson("mutant", text);
    if (!tok.ok()) continue;
    ++loaded;
    auto ids = (*tok)->Encode("Once upon a time 🦙", true);
    if (ids.ok()) {
      EXPECT_TRUE((*tok)->Decode(*ids, false).ok());
    }
  }
  std::printf("[mutants] %d of 200 mutated tokenizer.json files still loaded\n", loaded);
}

// The HF tokenizer.json and the GGUF SPM path (merges ranked by score) agree on Llama-2.
TEST(CrossCheckTest, Llama2JsonAndGgufAgreeOnBothVectorSets) {
  auto json_tok = Tokenizer::FromDir(Models("llama2-tokenizer"));
  auto gguf_tok = Tokenizer::FromGguf(Models("vocab-tests/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(json_tok.ok() && gguf_tok.ok());
  int n = 0;
  for (const auto& v : ::specd::tok::testing::LoadJsonlVectors(
           Models("llama2-tokenizer/sentencepiece_vectors.jsonl"))) {
    if (v.hf_differs) continue;
    EXPECT_EQ(*(*gguf_tok)->Encode(v.text, false), v.ids) << v.text;
    ++n;
  }
  for (const auto& v :
       ::specd::tok::testing::LoadJsonlVectors(Models("vocab-tests/ggml-vocab-llama-spm.jsonl"))) {
    EXPECT_EQ(*(*json_tok)->Encode(v.text, false), v.ids) << v.text;
    ++n;
  }
  std::printf("[cross] llama2 tokenizer.json <-> ggml-vocab-llama-spm.gguf: %d vectors\n", n);
  EXPECT_EQ(n, 240 + 46);
}

}  // namespace
}  // namespace specd::tok
