// The request field a status is about, carried as a payload. Any thread.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace specd {

// The request field a status is about, by its path in the HTTP API ("speculation.tree.depth",
// "temperature"), carried as a payload so that front ends name it without reading the message
// (the HTTP error table maps it to OpenAI's "param").
inline constexpr char kFieldPayloadUrl[] = "specd/param";

inline absl::Status WithField(absl::Status status, absl::string_view field) {
  status.SetPayload(kFieldPayloadUrl, absl::Cord(field));
  return status;
}

// InvalidArgument naming `field`.
inline absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return WithField(absl::InvalidArgumentError(message), field);
}

// The field `status` names; "" when none.
inline std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayloadUrl);
  return field ? std::string(*field) : std::string();
}

}  // namespace specd
