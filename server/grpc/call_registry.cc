#include "server/grpc/call_registry.h"

#include <openssl/rand.h>

#include <array>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<std::string> NewRequestId() {
  std::array<unsigned char, 16> bytes;
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    return absl::InternalError("no random request id: OpenSSL's generator failed");
  }
  return absl::StrCat("grpc-", absl::BytesToHexString(absl::string_view(
                                   reinterpret_cast<const char*>(bytes.data()), bytes.size())));
}

}  // namespace specd
