// The CPU transport of the SSD channel and its rendezvous: length-prefixed frames (messages.h)
// over one TCP connection with TCP_NODELAY, non-blocking sockets and poll() for timeouts. It runs
// the whole verifier/speculator topology on one CPU machine (CI) or across hosts, and carries the
// control messages when device payloads go over NCCL.
//
// Rendezvous: the verifier calls TcpListener::Listen (port 0 picks a free port, port() reports
// it) and Accept(); the speculator calls TcpChannel::Connect, which retries until the listener is
// up. Both run the authenticated Hello handshake (channel.h) before returning, over TLS when
// given a TlsContext (tls.h); Accept first checks, when told which process it expects, that a
// local peer is that process (peer_cred.h). When a speculator dies, the verifier's channel
// reports Unavailable, and Accept() may be called again for its replacement.
// Sends use MSG_NOSIGNAL: a dead peer is a status, never SIGPIPE.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/messages.h"
#include "engine/distributed/tls.h"
#include "engine/distributed/wire.h"

namespace specd {

// How TcpChannel::Connect keeps trying while the verifier is not listening yet.
struct ConnectOptions {
  absl::Duration timeout = absl::Seconds(30);              // connecting + handshake, in all
  absl::Duration retry_interval = absl::Milliseconds(50);  // between refused attempts
  std::shared_ptr<const TlsContext> tls;                   // a client context: TLS; null: plain
};

// Who may join through TcpListener::Accept.
struct AcceptPolicy {
  LinkSecret secret;         // the peer must prove it holds it (channel.h)
  int32_t expected_pid = 0;  // > 0: the peer must be this process of our uid, on loopback
                             // (peer_cred.h), checked before any handshake
};

// One connected TCP socket speaking frames. Thread-safe (see Channel): one mutex serializes
// senders, another receivers, so a sender and a receiver run concurrently. The frame buffers are
// reserved once from the WireLimits (WireLimits::MaxFrameBytes() each way, again on SetLimits;
// untouched pages cost no memory), so steady-state Send never allocates.
class TcpChannel final : public Channel {
 public:
  // Takes ownership of `fd`, a connected stream socket (TCP or, in tests, a socketpair); makes it
  // non-blocking. `limits` must pass Validate(). No handshake is run.
  static std::unique_ptr<TcpChannel> FromConnectedSocket(int fd, const WireLimits& limits,
                                                         std::string peer_address);

  // Speculator side of the rendezvous: connects to host:port (retrying refused connections
  // until options.timeout), runs the TLS handshake when options.tls, then ConnectHandshake with
  // `local` and `secret`. DeadlineExceeded when no listener answered in time;
  // FailedPrecondition with the verifier's reason when refused; PermissionDenied when either
  // end failed to authenticate (certificate or secret).
  static absl::StatusOr<std::unique_ptr<TcpChannel>> Connect(std::string_view host, uint16_t port,
                                                             const Hello& local,
                                                             const LinkSecret& secret,
                                                             const ConnectOptions& options = {});

  ~TcpChannel() override;  // closes the socket
  TcpChannel(const TcpChannel&) = delete;
  TcpChannel& operator=(const TcpChannel&) = delete;

  absl::Status Send(MessageRef message, absl::Duration timeout) override;
  absl::StatusOr<MessageType> Recv(absl::Duration timeout, Message* message) override;
  int64_t last_recv_first_byte_ns() const override {
    return last_first_byte_ns_.load(std::memory_order_relaxed);
  }
  void Close() override;

  // Replaces the limits later frames are checked against, both ways, and reserves the frame
  // buffers for them: for a link that shakes hands under small fixed limits and then agrees on
  // its real ones (SSD's SsdInit). Call between messages, while no other thread sends or
  // receives. InvalidArgument when `limits` do not Validate(); FailedPrecondition while a frame is
  // half received.
  absl::Status SetLimits(const WireLimits& limits);

  // The peer's Hello from the handshake (default-constructed before one ran). Not thread-safe
  // against the handshake itself, which completes before Connect/Accept return.
  const Hello& peer_hello() const { return peer_hello_; }
  // "host:port" of the peer, for logs.
  const std::string& peer_address() const { return peer_address_; }
  // Frames sent / received so far (the next frame's sequence number). Any thread.
  uint64_t frames_sent() const { return frames_sent_.load(std::memory_order_relaxed); }
  uint64_t frames_received() const { return frames_received_.load(std::memory_order_relaxed); }
  // Whole frames (header included) sent and received, in bytes.
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  friend class TcpListener;
  TcpChannel(int fd, const WireLimits& limits, std::string peer_address);

  // Marks the channel dead with `reason` (kept for later calls) and shuts the socket down,
  // waking any thread blocked in poll(). Returns `reason`.
  absl::Status Break(absl::Status reason) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Unavailable naming why the channel died.
  absl::Status DeadStatus() const ABSL_LOCKS_EXCLUDED(state_mu_);
  // recv()/send() on the socket, or through tls_ when set: bytes moved, 0 (Recv: closed), or -1
  // with errno (EAGAIN: wait for *want).
  ssize_t RecvSome(uint8_t* data, size_t size, short* want);
  ssize_t SendSome(const uint8_t* data, size_t size, short* want);
  // Text for a failed RecvSome/SendSome's errno.
  std::string IoErrorText(int err) const;
  // Reads until the current frame part (header or payload) is complete.
  absl::Status ReadFramePart(size_t need, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv_mu_);
  // Decodes a complete header or payload in rx_; on completion of a frame returns true.
  absl::StatusOr<bool> DecodeFramePart(Message* message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(recv_mu_);

  const int fd_;
  const std::string peer_address_;
  std::unique_ptr<TlsSession> tls_;  // set once, before the Hello handshake; null: plain TCP
  Hello peer_hello_;
  std::atomic<bool> dead_{false};
  std::atomic<uint64_t> frames_sent_{0};
  std::atomic<uint64_t> frames_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};

  mutable absl::Mutex state_mu_;
  absl::Status dead_reason_ ABSL_GUARDED_BY(state_mu_);

  absl::Mutex send_mu_;
  WireLimits tx_limits_ ABSL_GUARDED_BY(send_mu_);  // what Send checks (SetLimits sets both)
  FrameBuffer tx_ ABSL_GUARDED_BY(send_mu_);

  absl::Mutex recv_mu_;
  WireLimits rx_limits_ ABSL_GUARDED_BY(recv_mu_);  // what Recv checks
  FrameBuffer rx_ ABSL_GUARDED_BY(recv_mu_);        // the frame being received
  size_t rx_have_ ABSL_GUARDED_BY(recv_mu_) = 0;    // bytes of it received so far
  bool rx_have_header_ ABSL_GUARDED_BY(recv_mu_) = false;
  FrameHeader rx_header_ ABSL_GUARDED_BY(recv_mu_);
  int64_t rx_first_byte_ns_ ABSL_GUARDED_BY(recv_mu_) = 0;  // the frame being received's
  std::atomic<int64_t> last_first_byte_ns_{0};              // the last frame received's
};

// Verifier side of the rendezvous: a listening socket that hands out one handshaken channel per
// Accept(). Accept may be called again after an earlier channel died (a restarted speculator
// rejoins). Accept from one thread at a time; Close from any thread.
class TcpListener {
 public:
  // Binds host:port ("" or "0.0.0.0" = all IPv4 interfaces, "::" = all, "127.0.0.1" = loopback;
  // port 0 = a free port) and listens. `local` is this side's Hello; its limits must Validate().
  // With `tls` (a server context) every connection runs TLS first.
  static absl::StatusOr<std::unique_ptr<TcpListener>> Listen(
      std::string_view host, uint16_t port, const Hello& local,
      std::shared_ptr<const TlsContext> tls = nullptr);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // The bound port (the chosen one when Listen was given 0).
  uint16_t port() const { return port_; }

  // Waits up to `timeout` for a peer to connect, pass `policy` and finish the handshake (a
  // connected peer gets at most 10 s for TLS and its Hello). DeadlineExceeded when none did;
  // PermissionDenied when one failed the peer check, TLS or the proof of the secret;
  // FailedPrecondition when one was refused (it was told why); DataLoss etc. when it sent
  // garbage; Unavailable after Close(). Each of these leaves the listener usable, and a refused
  // peer is only disconnected.
  absl::StatusOr<std::unique_ptr<TcpChannel>> Accept(absl::Duration timeout,
                                                     const AcceptPolicy& policy);
  // The same, asking `policy` for the policy only once a connection arrived (so a policy that
  // changes while Accept waits, such as a relaunched speculator's secret and pid, is current).
  absl::StatusOr<std::unique_ptr<TcpChannel>> Accept(absl::Duration timeout,
                                                     const std::function<AcceptPolicy()>& policy);

  // Stops listening; a later Accept returns Unavailable. Idempotent.
  void Close();

 private:
  TcpListener(int fd, uint16_t port, const Hello& local, std::shared_ptr<const TlsContext> tls);
  // Checks the freshly accepted `channel` against `policy` and runs TLS and the handshake.
  absl::Status Admit(TcpChannel& channel, const AcceptPolicy& policy, absl::Time deadline);

  const int fd_;
  const uint16_t port_;
  const Hello local_;
  const std::shared_ptr<const TlsContext> tls_;
  std::atomic<bool> closed_{false};
};

}  // namespace specd
