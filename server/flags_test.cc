#include "server/flags.h"

#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(FlagParserTest, ParsesSpaceAndEqualsFormsAndBareBooleans) {
  std::string model;
  int32_t n = 0;
  float t = 1.0f;
  bool json = false;
  std::optional<int64_t> seed;
  FlagParser p;
  p.Add("model", &model, "");
  p.Add("max-tokens", &n, "");
  p.Add("temperature", &t, "");
  p.Add("json", &json, "");
  p.Add("seed", &seed, "");
  ASSERT_TRUE(p.Parse({"--model", "dir", "--max-tokens=7", "--json", "--temperature", "0.5",
                       "--seed", "-3"})
                  .ok());
  EXPECT_EQ(model, "dir");
  EXPECT_EQ(n, 7);
  EXPECT_TRUE(json);
  EXPECT_FLOAT_EQ(t, 0.5f);
  EXPECT_EQ(seed, -3);
}

TEST(FlagParserTest, RejectsUnknownFlagsBadValuesAndMissingValues) {
  int32_t n = 0;
  FlagParser p;
  p.Add("max-tokens", &n, "");
  EXPECT_EQ(p.Parse({"--nope", "1"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Parse({"--max-tokens", "x"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Parse({"--max-tokens"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Parse({"positional"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FlagParserTest, ReadsSecondsAsDurationsAndNegatedBooleans) {
  absl::Duration timeout = absl::Seconds(60);
  bool enable = true, enable_too = true;
  FlagParser p;
  p.Add("timeout", &timeout, "");
  p.Add("disable", FlagParser::Negated{&enable}, "");
  p.Add("disable-too", FlagParser::Negated{&enable_too}, "");
  ASSERT_TRUE(p.Parse({"--timeout", "2.5", "--disable", "--disable-too=false"}).ok());
  EXPECT_EQ(timeout, absl::Milliseconds(2500));
  EXPECT_FALSE(enable);
  EXPECT_TRUE(enable_too);
  ASSERT_TRUE(p.Parse({"--timeout=inf"}).ok());
  EXPECT_EQ(timeout, absl::InfiniteDuration());
  EXPECT_EQ(p.Parse({"--timeout", "nan"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.Parse({"--disable=maybe"}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParseIdListTest, ParsesCommaSeparatedIds) {
  std::vector<int32_t> ids;
  ASSERT_TRUE(ParseIdList("1, 2,3", &ids).ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(ParseIdList("1,x", &ids).ok());
  EXPECT_FALSE(ParseIdList("-1", &ids).ok());
  EXPECT_FALSE(ParseIdList("", &ids).ok());
}

}  // namespace
}  // namespace specd
