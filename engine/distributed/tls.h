// TLS 1.3 with mutual certificate verification for the SSD link between hosts (OpenSSL). Both
// ends hold a certificate and key signed by a CA they share and trust only that CA: the
// verifier accepts only a speculator whose client certificate chains to it, and the speculator
// accepts only a verifier whose server certificate chains to it and names the host (DNS name or
// IP address in subjectAltName) it connected to. The records then carry the usual frames
// (messages.h), and the authenticated Hello handshake (channel.h) still runs inside.
// TlsContext: immutable after Create, any thread. TlsSession: one per connection; its Read and
// Write are serialized by a mutex, so one sender and one receiver thread may use it at once.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace specd {

// PEM files of one end. All three or none (plain TCP).
struct TlsFiles {
  std::string cert_file;  // this end's certificate (chain), signed by the CA
  std::string key_file;   // its private key
  std::string ca_file;    // the CA both ends trust (and nothing else)

  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// One TLS connection over a connected non-blocking socket (not owned).
class TlsSession {
 public:
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Like recv()/send() on a non-blocking socket: bytes moved (> 0); 0 from Read when the peer
  // closed; -1 with errno EAGAIN and *want set to POLLIN or POLLOUT when it would block, or with
  // another errno after a failure (then error() says what TLS reported).
  ssize_t Read(void* data, size_t size, short* want) ABSL_LOCKS_EXCLUDED(mu_);
  ssize_t Write(const void* data, size_t size, short* want) ABSL_LOCKS_EXCLUDED(mu_);
  // The last failure's text (OpenSSL's error queue, certificate verification result).
  std::string error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class TlsContext;
  explicit TlsSession(SSL* ssl) : ssl_(ssl) {}
  // Maps a failed SSL_read_ex/SSL_write_ex to the recv/send convention.
  ssize_t Failed(int ret, short* want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  SSL* const ssl_;
  std::string error_ ABSL_GUARDED_BY(mu_);
};

class TlsContext {
 public:
  enum class Side { kServer, kClient };

  // Loads the certificate, key and CA (InvalidArgument naming the file and OpenSSL's reason).
  static absl::StatusOr<std::shared_ptr<const TlsContext>> Create(const TlsFiles& files, Side side);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // Runs the TLS handshake on connected non-blocking socket `fd` until `deadline`. A client
  // checks that the server's certificate names `host` (ignored by a server).
  // PermissionDenied when a certificate does not verify, Unavailable when the connection
  // failed, DeadlineExceeded when the peer did not finish in time.
  absl::StatusOr<std::unique_ptr<TlsSession>> Handshake(int fd, std::string_view host,
                                                        absl::Time deadline) const;

 private:
  TlsContext(SSL_CTX* ctx, Side side) : ctx_(ctx), side_(side) {}
  SSL_CTX* const ctx_;
  const Side side_;
};

}  // namespace specd
