#include "server/grpc/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/ascii.h"

namespace specd {
namespace {

constexpr std::string_view kScheme = "bearer ";

bool HasScheme(std::string_view authorization) {
  if (authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) {
      return false;
    }
  }
  return true;
}

void Digest(std::string_view s, unsigned char out[SHA256_DIGEST_LENGTH]) {
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), out);
}

}  // namespace

bool BearerTokenMatches(std::string_view authorization, std::string_view api_key) {
  if (!HasScheme(authorization)) return false;
  std::string_view token = authorization.substr(kScheme.size());
  unsigned char got[SHA256_DIGEST_LENGTH];
  unsigned char want[SHA256_DIGEST_LENGTH];
  Digest(token, got);
  Digest(api_key, want);
  return CRYPTO_memcmp(got, want, SHA256_DIGEST_LENGTH) == 0;
}

}  // namespace specd
