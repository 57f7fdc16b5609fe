// Shared fixtures of the NSA engine tests (engine_nsa_test, engine_nsa_sampling_test):
// nsa-codepair, its golden.json (prompts and greedy ids; an exact reference we did not write)
// and the codepair draft, which shares its tokenizer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "gtest/gtest.h"

namespace specd::nsa_test {

inline const std::string kNsaModel = std::string(SPECD_SHARED_DIR) + "/models/nsa-codepair";
inline const std::string kDraftModel = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

inline std::vector<Golden> ReadGoldens() {
  absl::StatusOr<std::string> text = ReadFileToString(kNsaModel + "/golden.json");
  EXPECT_TRUE(text.ok()) << text.status();
  const nlohmann::json list = nlohmann::json::parse(text.ok() ? *text : "[]", nullptr, false);
  std::vector<Golden> out;
  if (!list.is_array()) return out;
  for (const nlohmann::json& e : list) {
    out.push_back(
        {e["prompt_ids"].get<std::vector<int32_t>>(), e["greedy_ids"].get<std::vector<int32_t>>()});
  }
  return out;
}

}  // namespace specd::nsa_test
