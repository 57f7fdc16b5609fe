// Secret handling and the handshake proofs of the SSD link (link_auth.h).
#include "engine/distributed/link_auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specd {
namespace {

constexpr char kProofLabel[] = "specd-ssd-link-v2 ";

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> RandomBytes(size_t n) {
  std::vector<uint8_t> out(n);
  if (n > 0 && RAND_bytes(out.data(), static_cast<int>(n)) != 1) {
    return absl::InternalError("RAND_bytes failed: no entropy for the SSD link's nonces");
  }
  return out;
}

absl::StatusOr<LinkSecret> NewLinkSecret() {
  LinkSecret secret;
  if (RAND_bytes(secret.bytes.data(), static_cast<int>(secret.bytes.size())) != 1) {
    return absl::InternalError("RAND_bytes failed: no entropy for the SSD link's secret");
  }
  return secret;
}

std::string LinkSecretToHex(const LinkSecret& secret) {
  std::string hex;
  hex.reserve(2 * kLinkSecretBytes);
  for (uint8_t b : secret.bytes) absl::StrAppendFormat(&hex, "%02x", b);
  return hex;
}

absl::StatusOr<LinkSecret> LinkSecretFromHex(std::string_view hex) {
  if (hex.size() != 2 * kLinkSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the SSD link secret must be ",
                                                   2 * kLinkSecretBytes, " hex digits, not ",
                                                   hex.size(), " characters"));
  }
  LinkSecret secret;
  for (size_t i = 0; i < kLinkSecretBytes; ++i) {
    const int hi = HexDigit(hex[2 * i]);
    const int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return absl::InvalidArgumentError("the SSD link secret has a character that is not hex");
    }
    secret.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return secret;
}

absl::StatusOr<LinkSecret> ReadLinkSecretFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("SSD secret file ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  char buf[256];
  ssize_t n = 0;
  if (stat_ok && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 077) == 0) {
    n = ::read(fd, buf, sizeof(buf));
  }
  ::close(fd);
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    return absl::PermissionDeniedError(
        absl::StrCat("SSD secret file ", path, " is not a regular file"));
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "SSD secret file %s has mode %04o and owner uid %d: it must belong to this user (uid %d) "
        "and be readable by nobody else (chmod 600)",
        path, st.st_mode & 07777, st.st_uid, ::geteuid()));
  }
  if (n < 0) {
    return absl::InternalError(absl::StrCat("SSD secret file ", path, ": ", std::strerror(errno)));
  }
  const absl::string_view text =
      absl::StripAsciiWhitespace(absl::string_view(buf, static_cast<size_t>(n)));
  absl::StatusOr<LinkSecret> secret = LinkSecretFromHex(std::string_view(text.data(), text.size()));
  OPENSSL_cleanse(buf, sizeof(buf));
  if (!secret.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SSD secret file ", path, ": ", secret.status().message()));
  }
  return secret;
}

absl::StatusOr<LinkSecret> TakeLinkSecretFromEnv(const char* name) {
  char* value = std::getenv(name);
  if (value == nullptr) return absl::NotFoundError(absl::StrCat("$", name, " is not set"));
  absl::StatusOr<LinkSecret> secret = LinkSecretFromHex(value);
  OPENSSL_cleanse(value, std::strlen(value));  // the bytes /proc/PID/environ shows
  ::unsetenv(name);
  if (!secret.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("$", name, ": ", secret.status().message()));
  }
  return secret;
}

std::array<uint8_t, kLinkProofBytes> LinkProof(const LinkSecret& secret, Role role,
                                               std::span<const uint8_t> own_nonce,
                                               std::span<const uint8_t> peer_nonce) {
  std::string message = kProofLabel;
  message += RoleName(role);
  message.push_back('\0');
  message.append(reinterpret_cast<const char*>(own_nonce.data()), own_nonce.size());
  message.append(reinterpret_cast<const char*>(peer_nonce.data()), peer_nonce.size());
  std::array<uint8_t, kLinkProofBytes> proof{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.bytes.data(), static_cast<int>(secret.bytes.size()),
       reinterpret_cast<const uint8_t*>(message.data()), message.size(), proof.data(), &len);
  return proof;
}

bool LinkProofEquals(std::span<const uint8_t> proof,
                     const std::array<uint8_t, kLinkProofBytes>& expected) {
  return proof.size() == expected.size() &&
         CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace specd
