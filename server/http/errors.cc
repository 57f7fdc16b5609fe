#include "server/http/errors.h"

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "engine/base/field_status.h"

namespace specd::http {
namespace {

constexpr char kCodeUrl[] = "specd/code";
constexpr char kHttpStatusUrl[] = "specd/http_status";

struct Row {
  absl::StatusCode code;
  int http_status;
  const char* type;
};

// The table. Codes not listed are server errors (500).
constexpr Row kTable[] = {
    {absl::StatusCode::kInvalidArgument, 400, "invalid_request_error"},
    {absl::StatusCode::kOutOfRange, 400, "invalid_request_error"},
    {absl::StatusCode::kFailedPrecondition, 400, "invalid_request_error"},
    {absl::StatusCode::kUnauthenticated, 401, "authentication_error"},
    {absl::StatusCode::kPermissionDenied, 403, "permission_error"},
    {absl::StatusCode::kNotFound, 404, "not_found_error"},
    {absl::StatusCode::kAlreadyExists, 409, "conflict_error"},
    {absl::StatusCode::kResourceExhausted, 429, "rate_limit_error"},
    {absl::StatusCode::kCancelled, 499, "cancelled_error"},
    {absl::StatusCode::kUnimplemented, 501, "not_implemented_error"},
    {absl::StatusCode::kUnavailable, 503, "service_unavailable_error"},
    {absl::StatusCode::kDeadlineExceeded, 504, "timeout_error"},
};

// Seconds a client should wait before retrying a request refused for load.
constexpr int kRetryAfterSeconds = 1;

std::string Payload(const absl::Status& status, const char* url) {
  auto p = status.GetPayload(url);
  return p ? std::string(*p) : std::string();
}

}  // namespace

absl::Status WithParam(absl::Status status, absl::string_view param) {
  return WithField(std::move(status), param);
}

absl::Status WithCode(absl::Status status, absl::string_view code) {
  status.SetPayload(kCodeUrl, absl::Cord(std::string(code)));
  return status;
}

absl::Status WithHttpStatus(absl::Status status, int http_status) {
  status.SetPayload(kHttpStatusUrl, absl::Cord(std::to_string(http_status)));
  return status;
}

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(message), param);
}

absl::Status SchemaError(absl::string_view param, absl::string_view message) {
  return WithHttpStatus(InvalidParam(param, message), 422);
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e{500, "server_error", std::string(status.message()), "", "", 0};
  for (const Row& row : kTable) {
    if (row.code == status.code()) {
      e.http_status = row.http_status;
      e.type = row.type;
    }
  }
  if (status.code() == absl::StatusCode::kResourceExhausted) e.retry_after_s = kRetryAfterSeconds;
  int override_status = 0;
  if (absl::SimpleAtoi(Payload(status, kHttpStatusUrl), &override_status) &&
      override_status >= 400 && override_status < 600) {
    e.http_status = override_status;
  }
  e.param = FieldOf(status);
  e.code = Payload(status, kCodeUrl);
  if (e.message.empty()) e.message = absl::StatusCodeToString(status.code());
  return e;
}

std::string ErrorBody(const ApiError& error) {
  nlohmann::ordered_json body = {
      {"error",
       {{"message", error.message}, {"type", error.type}, {"param", nullptr}, {"code", nullptr}}}};
  if (!error.param.empty()) body["error"]["param"] = error.param;
  if (!error.code.empty()) body["error"]["code"] = error.code;
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace specd::http
