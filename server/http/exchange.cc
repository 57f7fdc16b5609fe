#include "server/http/exchange.h"

#include "server/http/errors.h"

namespace specd::http {

HttpReply JsonReply(int status, std::string body) {
  HttpReply reply;
  reply.status = status;
  reply.body = std::move(body);
  return reply;
}

HttpReply ErrorReply(const absl::Status& status) {
  const ApiError error = ToApiError(status);
  HttpReply reply = JsonReply(error.http_status, ErrorBody(error));
  if (error.retry_after_s > 0) {
    reply.headers.emplace_back("Retry-After", std::to_string(error.retry_after_s));
  }
  if (error.http_status == 401) reply.headers.emplace_back("WWW-Authenticate", "Bearer");
  return reply;
}

}  // namespace specd::http
