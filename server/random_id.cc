#include "server/random_id.h"

#include <openssl/rand.h>

#include <array>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<std::string> NewRandomId(absl::string_view prefix) {
  std::array<unsigned char, 16> bytes;
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError("no random request id: OpenSSL's generator failed");
  }
  return absl::StrCat(prefix, absl::BytesToHexString(absl::string_view(
                                  reinterpret_cast<const char*>(bytes.data()), bytes.size())));
}

}  // namespace specd
