#include "server/api_key.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "absl/strings/match.h"

namespace specd {
namespace {

constexpr absl::string_view kScheme = "Bearer";

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

absl::string_view TrimBlanks(absl::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

// SHA-256 both sides first so the comparison takes the same time for any length.
bool KeysEqual(absl::string_view given, absl::string_view expected) {
  unsigned char a[SHA256_DIGEST_LENGTH];
  unsigned char b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

}  // namespace

absl::Status CheckBearerCredential(absl::string_view authorization, absl::string_view api_key) {
  const absl::string_view value = TrimBlanks(authorization);
  const bool bearer = value.size() > kScheme.size() && IsBlank(value[kScheme.size()]) &&
                      absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme);
  // The value was trimmed, so a Bearer scheme followed by blanks always has a key after them.
  if (!bearer) return absl::UnauthenticatedError(kMissingApiKeyMessage);
  if (!KeysEqual(TrimBlanks(value.substr(kScheme.size())), api_key)) {
    return absl::UnauthenticatedError(kIncorrectApiKeyMessage);
  }
  return absl::OkStatus();
}

}  // namespace specd
