// Request ids that reveal nothing and cannot be guessed: a prefix and 128 bits from OpenSSL's
// CSPRNG in hex. Both front ends name their requests with it (HTTP's cmpl-/chatcmpl- ids,
// gRPC's server-assigned grpc- ids). Any thread.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd {

// `prefix` + 32 lowercase hex digits. Internal when the generator fails.
absl::StatusOr<std::string> NewRandomId(absl::string_view prefix);

}  // namespace specd
