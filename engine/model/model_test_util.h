// Helpers shared by the model's golden and tensor-parallel tests: paths under the shared test
// assets, JSON goldens, and the max-relative row error the golden tests measure. Tests only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "engine/base/mapped_file.h"
#include "engine/model/json_fields.h"
#include "gtest/gtest.h"

namespace specd::model_test {

// A model folder under $SPECD_SHARED_DIR/models (a missing one fails the test at load).
inline std::string ModelPath(const std::string& rel) {
  return std::string(SPECD_SHARED_DIR) + "/models/" + rel;
}

inline nlohmann::json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<nlohmann::json> json = ParseJsonObject(text.ok() ? *text : "{}", path);
  EXPECT_TRUE(json.ok()) << json.status();
  return json.ok() ? *json : nlohmann::json::object();
}

inline std::vector<int32_t> Ids(const nlohmann::json& list) {
  return list.get<std::vector<int32_t>>();
}

// max |ours - reference| / max |reference| over one row (of equal sizes).
inline double RelError(std::span<const float> ours, std::span<const float> reference) {
  EXPECT_EQ(ours.size(), reference.size());
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < reference.size() && i < ours.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double{ours[i]} - reference[i]));
    max_ref = std::max(max_ref, std::fabs(double{reference[i]}));
  }
  return max_diff / max_ref;
}

inline int32_t Argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace specd::model_test
