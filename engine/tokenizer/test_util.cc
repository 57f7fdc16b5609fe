#include "engine/tokenizer/test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace specd::tok::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool FileExists(const std::string& path) { return std::filesystem::exists(path); }

std::vector<TokenizerVector> LoadJsonlVectors(const std::string& path) {
  std::vector<TokenizerVector> out;
  std::istringstream lines(ReadAll(path));
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("text") || !j.contains("ids")) {
      ADD_FAILURE() << path << ": bad line " << line;
      continue;
    }
    TokenizerVector v;
    v.text = j["text"].get<std::string>();
    v.ids = j["ids"].get<std::vector<int32_t>>();
    if (j.contains("decoded")) v.decoded = j["decoded"].get<std::string>();
    if (j.contains("category")) v.category = j["category"].get<std::string>();
    v.hf_differs = j.value("hf_differs", false);
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<TokenizerVector> LoadLlamaCppVectors(const std::string& inp_path,
                                                 const std::string& out_path) {
  std::vector<std::string> texts = absl::StrSplit(ReadAll(inp_path), "\n__ggml_vocab_test__\n");
  std::vector<std::string> id_lines = absl::StrSplit(ReadAll(out_path), '\n');
  if (!id_lines.empty() && id_lines.back().empty()) id_lines.pop_back();
  // The .inp file ends with a separator: its last split is not a test text.
  if (texts.size() == id_lines.size() + 1 && texts.back().empty()) texts.pop_back();
  EXPECT_EQ(texts.size(), id_lines.size()) << inp_path;
  std::vector<TokenizerVector> out;
  for (size_t i = 0; i < texts.size() && i < id_lines.size(); ++i) {
    TokenizerVector v;
    v.text = texts[i];
    for (absl::string_view tok : absl::StrSplit(id_lines[i], ' ', absl::SkipEmpty())) {
      v.ids.push_back(std::stoi(std::string(tok)));
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string IdsToString(const std::vector<int32_t>& ids) {
  return "[" + absl::StrJoin(ids, ", ") + "]";
}

}  // namespace specd::tok::testing
