#include "engine/base/json_fields.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

TEST(JsonFieldsTest, AbsentAndNullFieldsLeaveTheDefault) {
  const nlohmann::json j = nlohmann::json::parse(R"({"n": null})");
  int64_t n = 7;
  double d = 0.5;
  std::string s = "keep";
  bool b = true;
  EXPECT_EQ(ReadJsonInt(j, "n", 0, 10, &n), JsonFieldError::kNone);
  EXPECT_EQ(ReadJsonNumber(j, "missing", 0, 1, &d), JsonFieldError::kNone);
  EXPECT_EQ(ReadJsonString(j, "missing", &s), JsonFieldError::kNone);
  EXPECT_EQ(ReadJsonBool(j, "missing", &b), JsonFieldError::kNone);
  EXPECT_EQ(n, 7);
  EXPECT_EQ(d, 0.5);
  EXPECT_EQ(s, "keep");
  EXPECT_TRUE(b);
  EXPECT_EQ(FindJsonField(j, "n"), nullptr);
}

TEST(JsonFieldsTest, TellsWrongTypesFromValuesOutOfRange) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(
      R"({"i": 3, "f": 1.0, "big": 18446744073709551615, "neg": -4, "s": "x", "b": false})");
  int64_t i = 0;
  EXPECT_EQ(ReadJsonInt(j, "i", 0, 10, &i), JsonFieldError::kNone);
  EXPECT_EQ(i, 3);
  EXPECT_EQ(ReadJsonInt(j, "f", 0, 10, &i), JsonFieldError::kWrongType);  // 1.0 is no integer
  EXPECT_EQ(ReadJsonInt(j, "big", 0, INT64_MAX, &i), JsonFieldError::kOutOfRange);
  EXPECT_EQ(ReadJsonInt(j, "neg", 0, 10, &i), JsonFieldError::kOutOfRange);
  EXPECT_EQ(ReadJsonInt(j, "s", 0, 10, &i), JsonFieldError::kWrongType);
  EXPECT_EQ(i, 3);
  double d = 0;
  EXPECT_EQ(ReadJsonNumber(j, "i", 0, 2, &d), JsonFieldError::kOutOfRange);
  EXPECT_EQ(ReadJsonNumber(j, "f", 0, 2, &d), JsonFieldError::kNone);
  EXPECT_EQ(d, 1.0);
  std::string s;
  EXPECT_EQ(ReadJsonString(j, "b", &s), JsonFieldError::kWrongType);
  EXPECT_EQ(ReadJsonString(j, "s", &s), JsonFieldError::kNone);
  EXPECT_EQ(s, "x");
  bool b = true;
  EXPECT_EQ(ReadJsonBool(j, "s", &b), JsonFieldError::kWrongType);
  EXPECT_EQ(ReadJsonBool(j, "b", &b), JsonFieldError::kNone);
  EXPECT_FALSE(b);
}

}  // namespace
}  // namespace specd
