// TcpChannel and TcpListener over POSIX sockets: non-blocking fds, poll() for every wait, frames
// received in two parts (header, then the payload it announces) with the partial state kept
// across timeouts so a DeadlineExceeded never desynchronizes the stream.
#include "engine/distributed/tcp_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/log.h"
#include "engine/base/monotonic_clock.h"
#include "engine/base/status.h"
#include "engine/distributed/peer_cred.h"

namespace specd {
namespace {

// A connected peer that never completes its Hello cannot hold Accept longer than this.
constexpr absl::Duration kMaxHandshakeTime = absl::Seconds(10);

std::string ErrnoText(int err) { return std::strerror(err); }

// Milliseconds for poll() until `deadline`, rounded up; -1 for an infinite deadline.
int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left + absl::Microseconds(999)), INT32_MAX));
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

// Waits until `fd` reports `events` (or an error/hangup, left for the next I/O call to read).
absl::Status WaitFd(int fd, short events, absl::Time deadline, std::string_view what) {
  while (true) {
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, PollMillis(deadline));
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(DistView(what), ": poll: ", ErrnoText(errno)));
    }
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(DistView(what), ": timed out"));
    }
  }
}

void SetNoDelay(int fd) {
  int one = 1;
  // Not a TCP socket (a socketpair in tests) refuses the option: nothing to do then.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string AddressText(const sockaddr* sa) {
  char host[NI_MAXHOST] = "?";
  char serv[NI_MAXSERV] = "?";
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  ::getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
  return absl::StrCat(host, ":", serv);
}

using AddrInfoPtr = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

absl::StatusOr<AddrInfoPtr> Resolve(std::string_view host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string host_str(host);
  const std::string port_str = std::to_string(port);
  addrinfo* result = nullptr;
  const char* node = host_str.empty() ? nullptr : host_str.c_str();
  if (passive && host_str.empty()) hints.ai_family = AF_INET;
  const int rc = ::getaddrinfo(node, port_str.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve \"", host_str, "\": ", ::gai_strerror(rc)));
  }
  return AddrInfoPtr(result, &::freeaddrinfo);
}

// One non-blocking connect attempt to `ai`, waiting until `deadline`. Returns the connected fd
// or the errno of the failure (ECONNREFUSED while the listener is not up yet).
absl::StatusOr<int> ConnectOnce(const addrinfo& ai, absl::Time deadline, int* err) {
  const int fd =
      ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) {
    *err = errno;
    return absl::UnavailableError(absl::StrCat("socket: ", ErrnoText(errno)));
  }
  int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    const absl::Status waited = WaitFd(fd, POLLOUT, deadline, "connect");
    if (!waited.ok()) {
      ::close(fd);
      *err = ETIMEDOUT;
      return waited;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    errno = so_error;
    rc = so_error == 0 ? 0 : -1;
  }
  if (rc != 0) {
    *err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(*err)));
  }
  return fd;
}

}  // namespace

// --- TcpChannel ---------------------------------------------------------------------------------

TcpChannel::TcpChannel(int fd, const WireLimits& limits, std::string peer_address)
    : fd_(fd), peer_address_(std::move(peer_address)) {
  const int flags = ::fcntl(fd_, F_GETFL, 0);
  ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  SetNoDelay(fd_);
  absl::MutexLock send_lock(&send_mu_);
  absl::MutexLock recv_lock(&recv_mu_);
  tx_limits_ = rx_limits_ = limits;
  tx_.Reserve(limits.MaxFrameBytes());
  rx_.Reserve(limits.MaxFrameBytes());
}

absl::Status TcpChannel::SetLimits(const WireLimits& limits) {
  SPECD_RETURN_IF_ERROR(limits.Validate());
  absl::MutexLock send_lock(&send_mu_);
  absl::MutexLock recv_lock(&recv_mu_);
  if (rx_have_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("channel to ", peer_address_, ": new limits while a frame is half received"));
  }
  tx_limits_ = limits;
  rx_limits_ = limits;
  tx_.Reserve(limits.MaxFrameBytes());
  rx_.Reserve(limits.MaxFrameBytes());
  return absl::OkStatus();
}

std::unique_ptr<TcpChannel> TcpChannel::FromConnectedSocket(int fd, const WireLimits& limits,
                                                            std::string peer_address) {
  return std::unique_ptr<TcpChannel>(new TcpChannel(fd, limits, std::move(peer_address)));
}

TcpChannel::~TcpChannel() {
  Close();
  ::close(fd_);
}

absl::Status TcpChannel::Break(absl::Status reason) {
  {
    absl::MutexLock lock(&state_mu_);
    if (dead_reason_.ok()) dead_reason_ = reason;
    dead_.store(true, std::memory_order_release);
  }
  ::shutdown(fd_, SHUT_RDWR);
  return reason;
}

absl::Status TcpChannel::DeadStatus() const {
  absl::MutexLock lock(&state_mu_);
  if (absl::IsUnavailable(dead_reason_)) return dead_reason_;
  return absl::UnavailableError(
      absl::StrCat("channel to ", peer_address_, " is closed after: ", dead_reason_.ToString()));
}

void TcpChannel::Close() {
  if (dead_.load(std::memory_order_acquire)) return;
  Break(absl::UnavailableError(absl::StrCat("channel to ", peer_address_, " closed by this side")))
      .IgnoreError();
}

absl::Status TcpChannel::Send(MessageRef message, absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&send_mu_);
  if (dead_.load(std::memory_order_acquire)) return DeadStatus();
  SPECD_RETURN_IF_ERROR(EncodeFrame(message, frames_sent(), tx_limits_, &tx_));
  size_t sent = 0;
  while (sent < tx_.size()) {
    short want = POLLOUT;
    const ssize_t n = SendSome(tx_.data() + sent, tx_.size() - sent, &want);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const absl::Status waited = WaitFd(fd_, want, deadline, "send");
      if (waited.ok()) continue;
      if (!absl::IsDeadlineExceeded(waited)) return Break(waited);
      if (sent == 0) return waited;  // nothing went out: the channel stays usable
      // Part of the frame is on the wire: the stream cannot be resumed cleanly.
      Break(absl::UnavailableError(
                absl::StrCat("send to ", peer_address_, " timed out mid-frame; the peer stalled")))
          .IgnoreError();
      return absl::DeadlineExceededError(
          absl::StrCat("send to ", peer_address_, " timed out mid-frame; channel closed"));
    }
    if (dead_.load(std::memory_order_acquire)) return DeadStatus();
    return Break(absl::UnavailableError(
        absl::StrCat("send to ", peer_address_, ": ", IoErrorText(n < 0 ? errno : EPIPE))));
  }
  frames_sent_.fetch_add(1, std::memory_order_relaxed);
  bytes_sent_.fetch_add(tx_.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

ssize_t TcpChannel::RecvSome(uint8_t* data, size_t size, short* want) {
  if (tls_) return tls_->Read(data, size, want);
  *want = POLLIN;
  return ::recv(fd_, data, size, 0);
}

ssize_t TcpChannel::SendSome(const uint8_t* data, size_t size, short* want) {
  if (tls_) return tls_->Write(data, size, want);
  *want = POLLOUT;
  return ::send(fd_, data, size, MSG_NOSIGNAL);
}

std::string TcpChannel::IoErrorText(int err) const {
  if (tls_) {
    const std::string tls_error = tls_->error();
    if (!tls_error.empty()) return absl::StrCat("TLS: ", tls_error);
  }
  return ErrnoText(err);
}

absl::Status TcpChannel::ReadFramePart(size_t need, absl::Time deadline) {
  while (rx_have_ < need) {
    short want = POLLIN;
    const ssize_t n = RecvSome(rx_.data() + rx_have_, need - rx_have_, &want);
    if (n > 0) {
      if (rx_have_ == 0 && !rx_have_header_) rx_first_byte_ns_ = MonotonicNanos();
      rx_have_ += static_cast<size_t>(n);
      continue;
    }
    if (dead_.load(std::memory_order_acquire)) return DeadStatus();
    if (n == 0) {
      return Break(absl::UnavailableError(
          absl::StrCat("peer ", peer_address_, " closed the connection",
                       rx_have_ > 0 ? absl::StrCat(" mid-frame (", rx_have_, " bytes in)") : "")));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const absl::Status waited = WaitFd(fd_, want, deadline, "recv");
      if (waited.ok()) continue;
      return absl::IsDeadlineExceeded(waited) ? waited : Break(waited);
    }
    return Break(absl::UnavailableError(
        absl::StrCat("recv from ", peer_address_, ": ", IoErrorText(errno))));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TcpChannel::DecodeFramePart(Message* message) {
  if (!rx_have_header_) {
    absl::StatusOr<FrameHeader> header = DecodeFrameHeader(rx_.bytes().first(rx_have_), rx_limits_);
    if (!header.ok()) return Break(header.status());
    if (header->sequence != frames_received()) {
      return Break(absl::DataLossError(absl::StrCat("frame sequence ", header->sequence, " from ",
                                                    peer_address_, ", expected ", frames_received(),
                                                    ": a frame was lost or duplicated")));
    }
    rx_header_ = *header;
    rx_have_header_ = true;
    rx_.Resize(kFrameHeaderBytes + rx_header_.payload_bytes);
    if (rx_header_.payload_bytes > 0) return false;
  }
  const absl::Status status =
      DecodePayload(rx_header_, rx_.bytes().subspan(kFrameHeaderBytes, rx_header_.payload_bytes),
                    rx_limits_, message);
  if (!status.ok()) return Break(status);
  bytes_received_.fetch_add(kFrameHeaderBytes + rx_header_.payload_bytes,
                            std::memory_order_relaxed);
  rx_have_ = 0;
  rx_have_header_ = false;
  last_first_byte_ns_.store(rx_first_byte_ns_, std::memory_order_relaxed);
  frames_received_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

absl::StatusOr<MessageType> TcpChannel::Recv(absl::Duration timeout, Message* message) {
  const absl::Time deadline = DeadlineAfter(timeout);
  absl::MutexLock lock(&recv_mu_);
  while (true) {
    if (dead_.load(std::memory_order_acquire)) return DeadStatus();
    if (!rx_have_header_) rx_.Resize(kFrameHeaderBytes);
    SPECD_RETURN_IF_ERROR(ReadFramePart(rx_.size(), deadline));
    SPECD_ASSIGN_OR_RETURN(const bool complete, DecodeFramePart(message));
    if (complete) return rx_header_.type;
  }
}

absl::StatusOr<std::unique_ptr<TcpChannel>> TcpChannel::Connect(std::string_view host,
                                                                uint16_t port, const Hello& local,
                                                                const LinkSecret& secret,
                                                                const ConnectOptions& options) {
  SPECD_RETURN_IF_ERROR(local.limits.Validate());
  const absl::Time deadline = DeadlineAfter(options.timeout);
  SPECD_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/false));
  const std::string target = absl::StrCat(DistView(host), ":", port);
  int last_err = 0;
  while (true) {
    for (const addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
      absl::StatusOr<int> fd = ConnectOnce(*ai, deadline, &last_err);
      if (!fd.ok()) continue;
      std::unique_ptr<TcpChannel> channel(new TcpChannel(*fd, local.limits, target));
      if (options.tls) {
        SPECD_ASSIGN_OR_RETURN(channel->tls_, options.tls->Handshake(*fd, host, deadline));
      }
      SPECD_ASSIGN_OR_RETURN(channel->peer_hello_,
                             ConnectHandshake(*channel, local, secret, deadline - absl::Now()));
      SPECD_LOG_INFO("dist: {} connected to {} {}{}", RoleName(local.role),
                     RoleName(channel->peer_hello_.role), target, options.tls ? " (TLS)" : "");
      return channel;
    }
    if (absl::Now() + options.retry_interval >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "connect to ", target, ": no listener within ", absl::FormatDuration(options.timeout),
          " (last error: ", ErrnoText(last_err), ")"));
    }
    absl::SleepFor(options.retry_interval);
  }
}

// --- TcpListener --------------------------------------------------------------------------------

TcpListener::TcpListener(int fd, uint16_t port, const Hello& local,
                         std::shared_ptr<const TlsContext> tls)
    : fd_(fd), port_(port), local_(local), tls_(std::move(tls)) {}

TcpListener::~TcpListener() {
  Close();
  ::close(fd_);
}

void TcpListener::Close() {
  if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(
    std::string_view host, uint16_t port, const Hello& local,
    std::shared_ptr<const TlsContext> tls) {
  SPECD_RETURN_IF_ERROR(local.limits.Validate());
  SPECD_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/true));
  std::string last_error = "no address";
  for (const addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_error = ErrnoText(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      last_error = ErrnoText(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const uint16_t bound_port =
        ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    SPECD_LOG_INFO("dist: {} listening on {}{}", RoleName(local.role),
                   AddressText(reinterpret_cast<sockaddr*>(&bound)), tls ? " (TLS)" : "");
    return std::unique_ptr<TcpListener>(new TcpListener(fd, bound_port, local, std::move(tls)));
  }
  return absl::UnavailableError(
      absl::StrCat("listen on ", DistView(host), ":", port, ": ", last_error));
}

absl::Status TcpListener::Admit(TcpChannel& channel, const AcceptPolicy& policy,
                                absl::Time deadline) {
  if (policy.expected_pid > 0) {
    SPECD_RETURN_IF_ERROR(CheckPeerProcess(channel.fd_, policy.expected_pid));
  }
  if (tls_) {
    SPECD_ASSIGN_OR_RETURN(channel.tls_, tls_->Handshake(channel.fd_, "", deadline));
  }
  SPECD_ASSIGN_OR_RETURN(channel.peer_hello_,
                         AcceptHandshake(channel, local_, policy.secret, deadline - absl::Now()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TcpChannel>> TcpListener::Accept(absl::Duration timeout,
                                                                const AcceptPolicy& policy) {
  return Accept(timeout, [&policy] { return policy; });
}

absl::StatusOr<std::unique_ptr<TcpChannel>> TcpListener::Accept(
    absl::Duration timeout, const std::function<AcceptPolicy()>& policy) {
  const absl::Time deadline = DeadlineAfter(timeout);
  while (true) {
    if (closed_.load()) return absl::UnavailableError("listener closed");
    SPECD_RETURN_IF_ERROR(WaitFd(fd_, POLLIN, deadline, "accept"));
    if (closed_.load()) return absl::UnavailableError("listener closed");
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    const int fd =
        ::accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // The connection may have gone before we took it, or a signal interrupted us: wait again.
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
        continue;
      }
      return absl::UnavailableError(absl::StrCat("accept: ", ErrnoText(errno)));
    }
    std::unique_ptr<TcpChannel> channel(
        new TcpChannel(fd, local_.limits, AddressText(reinterpret_cast<sockaddr*>(&peer))));
    // A connected peer gets the handshake time even when Accept was asked not to wait.
    const absl::Time handshake_deadline = absl::Now() + kMaxHandshakeTime;
    if (const absl::Status admitted = Admit(*channel, policy(), handshake_deadline);
        !admitted.ok()) {
      SPECD_LOG_WARN("dist: refused a peer from {}: {}", channel->peer_address(),
                     admitted.ToString());
      channel->Close();
      return admitted;
    }
    SPECD_LOG_INFO("dist: {} accepted {} from {}{}", RoleName(local_.role),
                   RoleName(channel->peer_hello_.role), channel->peer_address(),
                   tls_ ? " (TLS)" : "");
    return channel;
  }
}

}  // namespace specd
