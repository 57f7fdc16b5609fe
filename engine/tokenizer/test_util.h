// Test helpers for the tokenizer tests: loaders for the shared test-vector files (JSONL
// and llama.cpp's .inp/.out pairs) and a fixed-size table printer. Test thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace specd::tok::testing {

struct TokenizerVector {
  std::string text;
  std::vector<int32_t> ids;
  std::optional<std::string> decoded;  // expected decode(ids, skip_special=true), if given
  std::string category;
  bool hf_differs = false;
};

// One JSON object per line with at least "text" and "ids". Fails the test on bad input.
std::vector<TokenizerVector> LoadJsonlVectors(const std::string& path);

// llama.cpp's pair: texts separated by "\n__ggml_vocab_test__\n", one id line per text.
std::vector<TokenizerVector> LoadLlamaCppVectors(const std::string& inp_path,
                                                 const std::string& out_path);

// True if the file exists.
bool FileExists(const std::string& path);

// "[1, 2, 3]" for failure messages.
std::string IdsToString(const std::vector<int32_t>& ids);

}  // namespace specd::tok::testing
