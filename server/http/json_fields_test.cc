#include "server/http/json_fields.h"

#include <chrono>
#include <string>

#include "gtest/gtest.h"
#include "server/http/errors.h"

namespace specd::http {
namespace {

std::string Nested(int depth, const std::string& open, const std::string& close) {
  std::string out;
  for (int i = 0; i < depth; ++i) out += open;
  for (int i = 0; i < depth; ++i) out += close;
  return out;
}

// {"prompt": "x", "k0": 1, "k1": 1, ...}
std::string ManyKeys(int num_keys) {
  std::string body = R"({"prompt": "x")";
  for (int i = 0; i < num_keys; ++i) body += ",\"key" + std::to_string(i) + "\": 1";
  return body + "}";
}

double SecondsToParse(const std::string& body, absl::Status* status) {
  const auto start = std::chrono::steady_clock::now();
  *status = ParseJsonObject(body).status();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(ParseJsonObjectTest, RefusesDeepNestingWithAClearMessage) {
  // 100,000 levels: once a stack overflow; now refused at level 65 without recursion.
  for (const auto& [open, close] : {std::pair{"[", "]"}, std::pair{"{\"a\":", "}"}}) {
    const std::string body =
        std::string(R"({"prompt": )") + Nested(100000, open, close) + std::string("}");
    absl::StatusOr<Json> j = ParseJsonObject(body);
    ASSERT_FALSE(j.ok());
    const ApiError e = ToApiError(j.status());
    EXPECT_EQ(e.http_status, 400);
    EXPECT_NE(e.message.find("nested deeper than 64 levels"), std::string::npos) << e.message;
  }
}

TEST(ParseJsonObjectTest, AcceptsExactlyTheDepthLimit) {
  // The body object is level 1, so 63 more arrays reach 64.
  EXPECT_TRUE(ParseJsonObject("{\"a\": " + Nested(kMaxJsonDepth - 1, "[", "]") + "}").ok());
  EXPECT_FALSE(ParseJsonObject("{\"a\": " + Nested(kMaxJsonDepth, "[", "]") + "}").ok());
}

TEST(ParseJsonObjectTest, RefusesAnObjectWithTooManyKeysQuickly) {
  absl::Status status;
  const double seconds = SecondsToParse(ManyKeys(100000), &status);
  ASSERT_FALSE(status.ok());
  const ApiError e = ToApiError(status);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("more than 1024 keys"), std::string::npos) << e.message;
  EXPECT_LT(seconds, 1.0);  // nlohmann's ordered_json parse took 14-31 s
  EXPECT_TRUE(ParseJsonObject(ManyKeys(kMaxJsonObjectKeys - 1)).ok());
  EXPECT_FALSE(ParseJsonObject(ManyKeys(kMaxJsonObjectKeys)).ok());
}

TEST(ParseJsonObjectTest, ManyObjectsAtTheKeyLimitParseInLinearTime) {
  // About 1.5 MB: 130 objects of 1,000 keys. A per-insertion key scan costs ~65M string
  // comparisons here; the hash index keeps it to milliseconds.
  std::string body = R"({"a": [)";
  for (int o = 0; o < 130; ++o) {
    body += o ? ",{" : "{";
    for (int i = 0; i < 1000; ++i) body += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
    body += "}";
  }
  body += "]}";
  absl::Status status;
  const double seconds = SecondsToParse(body, &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LT(seconds, 2.0);
}

TEST(ParseJsonObjectTest, DuplicateKeysKeepFirstPlaceAndLastValue) {
  std::string body = "{\"z\": 0";
  for (int i = 0; i < 40; ++i) body += ",\"k" + std::to_string(i) + "\": " + std::to_string(i);
  body += R"(, "z": 9, "k30": "last"})";  // past the linear-scan size: found by the index
  absl::StatusOr<Json> j = ParseJsonObject(body);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->size(), 41u);
  EXPECT_EQ(j->begin().key(), "z");
  EXPECT_EQ((*j)["z"], 9);
  EXPECT_EQ((*j)["k30"], "last");
  EXPECT_EQ(ParseJsonObject(R"({"a": 1, "a": 2})")->dump(), R"({"a":2})");
}

TEST(ParseJsonObjectTest, KeepsValuesTypesAndOrder) {
  absl::StatusOr<Json> j = ParseJsonObject(
      R"({"b": [1, -2, 3.5, "s", true, null, {"y": 1, "x": [ ]}], "a": 18446744073709551615})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->dump(), R"({"b":[1,-2,3.5,"s",true,null,{"y":1,"x":[]}],"a":18446744073709551615})");
  EXPECT_TRUE((*j)["a"].is_number_unsigned());
}

TEST(ParseJsonObjectTest, RefusesWhatIsNotOneJsonObject) {
  EXPECT_EQ(ToApiError(ParseJsonObject("{").status()).http_status, 400);
  EXPECT_EQ(ToApiError(ParseJsonObject("").status()).http_status, 400);
  EXPECT_EQ(ToApiError(ParseJsonObject("{} {}").status()).http_status, 400);
  EXPECT_EQ(ToApiError(ParseJsonObject("[1]").status()).http_status, 422);
  EXPECT_EQ(ToApiError(ParseJsonObject("{\"a\": 1e999}").status()).http_status, 400);
  EXPECT_EQ(ToApiError(ParseJsonObject("{\"a\": \"\xff\"}").status()).http_status, 400);
}

}  // namespace
}  // namespace specd::http
