// TLS for the SSD link over OpenSSL (tls.h).
#include "engine/distributed/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace specd {
namespace {

// OpenSSL writes to the socket with write(), which raises SIGPIPE when the peer is gone; the
// channel promises a status instead. Blocks SIGPIPE in this thread for the scope and discards
// one it raised (the usual technique where MSG_NOSIGNAL cannot be passed).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

// OpenSSL's queued errors as one line (and clears the queue).
std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {  // NOLINT(runtime/int): OpenSSL's type
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&text, text.empty() ? "" : "; ", buf);
  }
  return text.empty() ? "unknown TLS error" : text;
}

absl::Status Waited(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("TLS handshake: the peer did not finish in time");
    }
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("TLS handshake: poll: ", std::strerror(errno)));
    }
  }
}

// Restricts a client's verification to certificates naming `host` (an IP or a DNS name).
bool ExpectHost(SSL* ssl, std::string_view host) {
  const std::string h(host);
  in6_addr ip{};
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (::inet_pton(AF_INET, h.c_str(), &ip) == 1 || ::inet_pton(AF_INET6, h.c_str(), &ip) == 1) {
    return X509_VERIFY_PARAM_set1_ip_asc(param, h.c_str()) == 1;
  }
  return SSL_set_tlsext_host_name(ssl, h.c_str()) == 1 && SSL_set1_host(ssl, h.c_str()) == 1;
}

}  // namespace

TlsSession::~TlsSession() { SSL_free(ssl_); }

ssize_t TlsSession::Failed(int ret, short* want) {
  const int err = SSL_get_error(ssl_, ret);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    *want = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    errno = EAGAIN;
    return -1;
  }
  if (err == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
  const int saved = errno;
  error_ = err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0
               ? std::string(saved != 0 ? std::strerror(saved) : "connection closed")
               : OpenSslErrors();
  ERR_clear_error();
  errno = err == SSL_ERROR_SYSCALL && saved != 0 ? saved : ECONNRESET;
  return -1;
}

ssize_t TlsSession::Read(void* data, size_t size, short* want) {
  absl::MutexLock lock(&mu_);
  const SigpipeGuard no_sigpipe;
  size_t n = 0;
  const int ret = SSL_read_ex(ssl_, data, size, &n);
  return ret == 1 ? static_cast<ssize_t>(n) : Failed(ret, want);
}

ssize_t TlsSession::Write(const void* data, size_t size, short* want) {
  absl::MutexLock lock(&mu_);
  const SigpipeGuard no_sigpipe;
  size_t n = 0;
  const int ret = SSL_write_ex(ssl_, data, size, &n);
  return ret == 1 ? static_cast<ssize_t>(n) : Failed(ret, want);
}

std::string TlsSession::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const TlsFiles& files,
                                                                     Side side) {
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS for the SSD link needs a certificate, its key and the CA, all three");
  }
  SSL_CTX* ctx = SSL_CTX_new(side == Side::kServer ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(OpenSslErrors());
  std::shared_ptr<const TlsContext> context(new TlsContext(ctx, side));
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: nothing arrives after the handshake
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  auto failed = [](const std::string& what, const std::string& file) {
    return absl::InvalidArgumentError(
        absl::StrCat("SSD link TLS: ", what, " ", file, ": ", OpenSslErrors()));
  };
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return failed("cannot load the certificate", files.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return failed("cannot load the key", files.key_file);
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return failed("the key does not match the certificate", files.cert_file);
  }
  if (SSL_CTX_load_verify_locations(ctx, files.ca_file.c_str(), nullptr) != 1) {
    return failed("cannot load the CA", files.ca_file);
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return context;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::unique_ptr<TlsSession>> TlsContext::Handshake(int fd, std::string_view host,
                                                                  absl::Time deadline) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return absl::InternalError(OpenSslErrors());
  std::unique_ptr<TlsSession> session(new TlsSession(ssl));
  SSL_set_fd(ssl, fd);
  if (side_ == Side::kClient && !ExpectHost(ssl, host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SSD link TLS: bad host name '", std::string(host), "'"));
  }
  const SigpipeGuard no_sigpipe;
  while (true) {
    const int ret = side_ == Side::kServer ? SSL_accept(ssl) : SSL_connect(ssl);
    if (ret == 1) return session;
    const int err = SSL_get_error(ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      const absl::Status waited =
          Waited(fd, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline);
      if (!waited.ok()) return waited;
      continue;
    }
    const long verify = SSL_get_verify_result(ssl);  // NOLINT(runtime/int): OpenSSL's type
    const std::string errors = OpenSslErrors();
    if (verify != X509_V_OK) {
      return absl::PermissionDeniedError(
          absl::StrCat("TLS handshake: the peer's certificate does not verify: ",
                       X509_verify_cert_error_string(verify)));
    }
    if (errors.find("certificate") != std::string::npos ||
        errors.find("alert") != std::string::npos) {
      return absl::PermissionDeniedError(absl::StrCat("TLS handshake refused: ", errors));
    }
    return absl::UnavailableError(absl::StrCat("TLS handshake failed: ", errors));
  }
}

}  // namespace specd
