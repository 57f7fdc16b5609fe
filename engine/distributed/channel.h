// Channel: a connection carrying typed messages (messages.h) between the verifier and the SSD
// speculator process. Transports implement it: TcpChannel (CPU, any host; what CI runs) and,
// for the device payloads beside it, NcclChannel. The engine talks to the speculator only
// through this interface, so a crashed or stalled speculator turns into a status it can fall
// back on (draft in process, or verify without drafts) instead of a crash or a hang.
//
// Status codes, the same for every transport:
//   DeadlineExceeded  nothing complete arrived (Recv) or could be handed to the transport (Send)
//                     within the timeout; the channel stays usable (a half-received frame is kept
//                     and completed by the next Recv).
//   Unavailable       the peer closed the connection, died or reset it, or this side called
//                     Close(); the channel is dead for good. Reconnect or fall back.
//   DataLoss, InvalidArgument, FailedPrecondition
//                     the peer's bytes do not decode (checksum, field, version; the message
//                     names the field). Returned once; the channel is then closed and later
//                     calls return Unavailable.
//   InvalidArgument   from Send: the message breaks this side's WireLimits (nothing was sent,
//                     the channel stays usable).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/messages.h"

namespace specd {

class Channel {
 public:
  virtual ~Channel() = default;

  // Sends one message (any message struct or a Message; see MessageRef), blocking until the
  // transport took all of it or `timeout` passed (absl::InfiniteDuration() waits forever; zero
  // only tries). Steady-state sends do not allocate. Thread-safe; concurrent senders are
  // serialized.
  virtual absl::Status Send(MessageRef message, absl::Duration timeout) = 0;

  // Receives the next message into *message, reusing its storage when it already holds the
  // arriving type, and returns that type. Blocks up to `timeout`. Thread-safe; concurrent
  // receivers are serialized (one Send and one Recv may run at the same time).
  virtual absl::StatusOr<MessageType> Recv(absl::Duration timeout, Message* message) = 0;

  // When the message the last successful Recv returned began to arrive: MonotonicNanos()
  // (engine/base/monotonic_clock.h) as its first byte was read, so a caller can tell waiting
  // for a message from reading and decoding it (the SSD round's timeline). 0 when the transport
  // does not know. Call from the receiving thread, after its Recv.
  virtual int64_t last_recv_first_byte_ns() const { return 0; }

  // Closes the connection: the peer sees Unavailable, and so do this side's later calls and any
  // Send/Recv blocked in another thread. Idempotent; thread-safe.
  virtual void Close() = 0;
};

// The Hello handshake over a freshly connected channel, authenticated from protocol version 2
// (link_auth.h). Both ends send a Hello with a fresh nonce; the accepting end (the verifier)
// judges compatibility (HelloMismatch) and refuses with a HelloAck; otherwise the connecting end
// proves it holds `secret` (HelloAuth), the verifier checks the proof in constant time and
// answers with a HelloAck carrying its own proof, which the connecting end checks in turn.
// The connecting end returns the peer's Hello; a refusal for a mismatch is FailedPrecondition
// with the verifier's reason, a failed proof (either way) PermissionDenied. The channel is
// closed after any failure.
absl::StatusOr<Hello> ConnectHandshake(Channel& channel, const Hello& local,
                                       const LinkSecret& secret, absl::Duration timeout);
// The accepting end: receives the peer's Hello, answers with its own, checks the peer's proof
// and acknowledges with its own proof; returns the peer's Hello, or FailedPrecondition with the
// reason it refused (the peer was told the same reason), or PermissionDenied when the peer
// could not prove it holds `secret` (it is told only that authentication failed).
absl::StatusOr<Hello> AcceptHandshake(Channel& channel, const Hello& local,
                                      const LinkSecret& secret, absl::Duration timeout);

}  // namespace specd
