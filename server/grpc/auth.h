// API-key check of the gRPC front end: the `authorization` metadata must be
// "Bearer <api_key>". The key is compared in constant time (digests compared with
// CRYPTO_memcmp), so neither its bytes nor its length leak through timing. Any thread.
#pragma once

#include <string_view>

namespace specd {

// True when `authorization` is "Bearer KEY" (scheme case-insensitive) with KEY == api_key.
bool BearerTokenMatches(std::string_view authorization, std::string_view api_key);

}  // namespace specd
