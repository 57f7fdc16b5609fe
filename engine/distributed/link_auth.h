// The shared secret of the SSD link and the HMAC-SHA256 challenge-response of the handshake
// (channel.h): only a peer holding the secret joins. The verifier makes a fresh secret for each
// speculator it launches and hands it over in the child's environment (never argv, which `ps`
// shows); a speculator started by hand reads it from a file only its owner can read, or from the
// environment. Each end sends a fresh random nonce in its Hello and proves it holds the secret
// with HMAC(secret, label || own nonce || peer nonce); the labels differ per role, so a proof
// can neither be replayed (new nonces every connection) nor reflected back (other label).
// Pure functions over OpenSSL's libcrypto; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/distributed/messages.h"

namespace specd {

inline constexpr size_t kLinkSecretBytes = 32;
inline constexpr size_t kLinkProofBytes = 32;  // HMAC-SHA256

// The environment variable that carries the secret (64 hex digits) to a speculator process.
inline constexpr char kLinkSecretEnv[] = "SPECD_SPECULATOR_SECRET";

// 32 secret bytes. Compared only through LinkProofEquals (constant time).
struct LinkSecret {
  std::array<uint8_t, kLinkSecretBytes> bytes{};
};

// A fresh secret from OpenSSL's CSPRNG (RAND_bytes); Internal when it has no entropy.
absl::StatusOr<LinkSecret> NewLinkSecret();
// `n` fresh random bytes (nonces); Internal when RAND_bytes fails.
absl::StatusOr<std::vector<uint8_t>> RandomBytes(size_t n);

// 64 lowercase hex digits, and back (InvalidArgument naming what is wrong, never the value).
std::string LinkSecretToHex(const LinkSecret& secret);
absl::StatusOr<LinkSecret> LinkSecretFromHex(std::string_view hex);

// Reads a secret file: 64 hex digits (surrounding whitespace ignored). PermissionDenied when the
// file is not a regular file owned by this user with no group/other permission bits (mode
// 0600 or 0400), so a secret others can read is never used.
absl::StatusOr<LinkSecret> ReadLinkSecretFile(const std::string& path);

// Takes the secret from environment variable `name`: parses it, overwrites the value in place
// (so /proc/PID/environ no longer shows it) and unsets the variable. NotFound when it is unset.
// Call before other threads start (it edits the environment).
absl::StatusOr<LinkSecret> TakeLinkSecretFromEnv(const char* name = kLinkSecretEnv);

// The proof that the holder of `secret` playing `role` took part in the handshake with these
// nonces: HMAC-SHA256(secret, "specd-ssd-link-v2 " + role name + 0 + own_nonce + peer_nonce).
std::array<uint8_t, kLinkProofBytes> LinkProof(const LinkSecret& secret, Role role,
                                               std::span<const uint8_t> own_nonce,
                                               std::span<const uint8_t> peer_nonce);

// Whether `proof` equals `expected`, in time independent of where they differ (CRYPTO_memcmp).
bool LinkProofEquals(std::span<const uint8_t> proof,
                     const std::array<uint8_t, kLinkProofBytes>& expected);

}  // namespace specd
