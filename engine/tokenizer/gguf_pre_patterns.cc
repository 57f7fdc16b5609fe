// The pre-tokenizer regexes behind llama.cpp's tokenizer.ggml.pre names. They are the
// Split patterns of each model family's HF tokenizer.json (GPT-2, Llama 3, Qwen2,
// DeepSeek, Falcon, StarCoder, ...); a family with several splits lists them in order.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/gguf_vocab.h"
#include "engine/tokenizer/string_view_compat.h"

namespace specd::tok {
namespace {

constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's (?i:'s|...) with the case folding spelled out, as llama.cpp does.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// CJK ideographs U+4E00..U+9FA5, U+0800..U+4E00 and Hangul U+AC00..U+D7FF.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

constexpr const char* kPoro =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

struct Flavour {
  std::vector<std::string_view> names;
  std::vector<std::string> patterns;
};

const std::vector<Flavour>& Flavours() {
  static const auto* flavours = new std::vector<Flavour>{
      {{"", "default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "chatglm-bpe"},
       {kLlama3}},
      {{"qwen2", "stablelm2", "megrez", "deepseek-r1-qwen"}, {kQwen2}},
      {{"tekken"}, {kTekken}},
      // DeepSeek's Latin/Greek/Cyrillic/... letter class is exactly the cased letters.
      {{"deepseek-llm"},
       {R"([\r\n])", R"(\s?\p{L&}+)",
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      {{"gpt-2", "mpt", "olmo", "jais", "phi-2", "roberta-bpe", "gigachat", "jina-es", "jina-de",
        "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"},
       {kGpt2}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kPoro}},
      {{"viking"}, {kPoro, R"(\p{N})"}},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
        R"(\p{N})", R"([\p{P}!-/:-@\[-`{-~])", kGpt2}},
  };
  return *flavours;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> GgufPreTokenizerPatterns(std::string_view pre) {
  for (const Flavour& f : Flavours()) {
    for (std::string_view name : f.names) {
      if (name == pre) return f.patterns;
    }
  }
  return absl::UnimplementedError(absl::StrCat("unknown GGUF pre-tokenizer '", AsAbsl(pre), "'"));
}

}  // namespace specd::tok
