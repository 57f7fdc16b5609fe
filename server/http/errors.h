// The one table from absl::Status to an HTTP status and an OpenAI-shaped error body
// ({"error": {"message", "type", "param", "code"}}). Handlers return canonical statuses;
// a status may carry the offending request field ("param"), an OpenAI error code
// ("code") and, for transport-level errors no canonical code names (405, 413, 422), an
// explicit HTTP status, as payloads. Pure; any thread.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace specd::http {

struct ApiError {
  int http_status = 500;
  std::string type;  // OpenAI error type, e.g. "invalid_request_error"
  std::string message;
  std::string param;      // request field at fault; empty: null
  std::string code;       // e.g. "model_not_found"; empty: null
  int retry_after_s = 0;  // > 0: send Retry-After (429, 503)
};

// InvalidArgument naming the request field at fault.
absl::Status InvalidParam(absl::string_view param, absl::string_view message);
// A field has the wrong JSON type or a required one is missing: 422 (as FastAPI-based
// OpenAI servers answer schema violations), still an InvalidArgument.
absl::Status SchemaError(absl::string_view param, absl::string_view message);

// Payload setters (return the status for chaining).
absl::Status WithParam(absl::Status status, absl::string_view param);
absl::Status WithCode(absl::Status status, absl::string_view code);
absl::Status WithHttpStatus(absl::Status status, int http_status);

// The table: canonical code -> HTTP status and error type, payloads applied.
// `status` must not be OK.
ApiError ToApiError(const absl::Status& status);

// {"error": {...}} as compact JSON.
std::string ErrorBody(const ApiError& error);

}  // namespace specd::http
