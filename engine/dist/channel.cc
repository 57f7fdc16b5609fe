// The Hello handshake, written once over the Channel interface so every transport shares it.
#include "engine/dist/channel.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"

namespace specd {
namespace {

// Receives one message of type T; any other type is a protocol error.
template <typename T>
absl::StatusOr<T> RecvExpected(Channel& channel, absl::Time deadline, Message* scratch) {
  SPECD_ASSIGN_OR_RETURN(
      const MessageType type,
      channel.Recv(std::max(deadline - absl::Now(), absl::ZeroDuration()), scratch));
  constexpr MessageType want = MessageTypeOf<T>();
  if (type != want) {
    channel.Close();
    return absl::FailedPreconditionError(absl::StrCat("handshake: expected ",
                                                      DistView(MessageTypeName(want)), ", got ",
                                                      DistView(MessageTypeName(type))));
  }
  return std::move(std::get<T>(*scratch));
}

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

}  // namespace

absl::StatusOr<Hello> ConnectHandshake(Channel& channel, const Hello& local,
                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Message scratch;
  SPECD_RETURN_IF_ERROR(channel.Send(local, Left(deadline)));
  SPECD_ASSIGN_OR_RETURN(Hello peer, RecvExpected<Hello>(channel, deadline, &scratch));
  SPECD_ASSIGN_OR_RETURN(const HelloAck ack, RecvExpected<HelloAck>(channel, deadline, &scratch));
  if (!ack.accepted) {
    channel.Close();
    return absl::FailedPreconditionError(
        absl::StrCat("handshake refused by the ", DistView(RoleName(peer.role)), ": ", ack.reason));
  }
  // The verdict is symmetric; checking it here too guards against a buggy peer.
  if (const std::string why = HelloMismatch(local, peer); !why.empty()) {
    channel.Close();
    return absl::FailedPreconditionError(absl::StrCat("handshake: peer accepted, but ", why));
  }
  return peer;
}

absl::StatusOr<Hello> AcceptHandshake(Channel& channel, const Hello& local,
                                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Message scratch;
  SPECD_ASSIGN_OR_RETURN(Hello peer, RecvExpected<Hello>(channel, deadline, &scratch));
  const std::string why = HelloMismatch(local, peer);
  HelloAck ack{.accepted = why.empty(), .reason = why};
  SPECD_RETURN_IF_ERROR(channel.Send(local, Left(deadline)));
  SPECD_RETURN_IF_ERROR(channel.Send(ack, Left(deadline)));
  if (!why.empty()) {
    channel.Close();
    return absl::FailedPreconditionError(absl::StrCat("handshake refused: ", why));
  }
  return peer;
}

}  // namespace specd
