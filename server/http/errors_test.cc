#include "server/http/errors.h"

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"

namespace specd::http {
namespace {

TEST(ErrorsTest, TableMapsCanonicalCodesToHttpStatusAndType) {
  struct Case {
    absl::Status status;
    int http;
    const char* type;
  };
  const Case cases[] = {
      {absl::InvalidArgumentError("x"), 400, "invalid_request_error"},
      {absl::OutOfRangeError("x"), 400, "invalid_request_error"},
      {absl::UnauthenticatedError("x"), 401, "authentication_error"},
      {absl::PermissionDeniedError("x"), 403, "permission_error"},
      {absl::NotFoundError("x"), 404, "not_found_error"},
      {absl::ResourceExhaustedError("x"), 429, "rate_limit_error"},
      {absl::UnavailableError("x"), 503, "service_unavailable_error"},
      {absl::DeadlineExceededError("x"), 504, "timeout_error"},
      {absl::UnimplementedError("x"), 501, "not_implemented_error"},
      {absl::InternalError("x"), 500, "server_error"},
      {absl::UnknownError("x"), 500, "server_error"},
      {absl::DataLossError("x"), 500, "server_error"},
  };
  for (const Case& c : cases) {
    ApiError e = ToApiError(c.status);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.message, "x");
  }
}

TEST(ErrorsTest, OnlyResourceExhaustedAsksToRetryLater) {
  EXPECT_EQ(ToApiError(absl::ResourceExhaustedError("full")).retry_after_s, 1);
  EXPECT_EQ(ToApiError(absl::InvalidArgumentError("bad")).retry_after_s, 0);
}

TEST(ErrorsTest, PayloadsCarryParamCodeAndHttpOverride) {
  ApiError e =
      ToApiError(WithCode(InvalidParam("max_tokens", "too many"), "context_length_exceeded"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_EQ(e.code, "context_length_exceeded");

  ApiError schema = ToApiError(SchemaError("n", "'n' must be an integer"));
  EXPECT_EQ(schema.http_status, 422);
  EXPECT_EQ(schema.type, "invalid_request_error");
  EXPECT_EQ(schema.param, "n");

  EXPECT_EQ(ToApiError(WithHttpStatus(absl::InvalidArgumentError("big"), 413)).http_status, 413);
  // Nonsense overrides are ignored.
  EXPECT_EQ(ToApiError(WithHttpStatus(absl::InvalidArgumentError("x"), 200)).http_status, 400);
}

TEST(ErrorsTest, BodyHasOpenAiShapeWithNullsForMissingParamAndCode) {
  auto body = nlohmann::json::parse(ErrorBody(ToApiError(absl::NotFoundError("no such"))));
  ASSERT_TRUE(body.contains("error"));
  const auto& e = body["error"];
  EXPECT_EQ(e.size(), 4u);
  EXPECT_EQ(e["message"], "no such");
  EXPECT_EQ(e["type"], "not_found_error");
  EXPECT_TRUE(e["param"].is_null());
  EXPECT_TRUE(e["code"].is_null());

  auto with =
      nlohmann::json::parse(ErrorBody(ToApiError(WithCode(InvalidParam("stop", "m"), "c"))));
  EXPECT_EQ(with["error"]["param"], "stop");
  EXPECT_EQ(with["error"]["code"], "c");
}

TEST(ErrorsTest, EmptyMessageFallsBackToCodeName) {
  EXPECT_FALSE(ToApiError(absl::InternalError("")).message.empty());
}

}  // namespace
}  // namespace specd::http
