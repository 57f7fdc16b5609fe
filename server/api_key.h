// The API-key check both front ends share: HTTP's `Authorization` header and gRPC's
// `authorization` metadata are parsed by the same rule and answered with the same messages.
// A credential is "Bearer KEY": the scheme in any case, then one or more spaces or tabs, then
// the key; whitespace around the whole value is ignored. The key is compared in constant time
// (SHA-256 of both sides compared with CRYPTO_memcmp), so neither its bytes nor its length
// leak through timing. Pure functions; any thread.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace specd {

// What a client is told (as UNAUTHENTICATED / HTTP 401).
inline constexpr absl::string_view kMissingApiKeyMessage =
    "missing API key: send 'Authorization: Bearer <key>'";
inline constexpr absl::string_view kIncorrectApiKeyMessage = "incorrect API key";

// OK when `authorization` is a Bearer credential carrying `api_key`; Unauthenticated with
// kMissingApiKeyMessage when it is empty or not a Bearer credential (another scheme, no
// separator, no key), with kIncorrectApiKeyMessage when the key differs.
absl::Status CheckBearerCredential(absl::string_view authorization, absl::string_view api_key);

}  // namespace specd
