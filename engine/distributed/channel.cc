// The authenticated Hello handshake, written once over the Channel interface so every transport
// shares it.
#include "engine/distributed/channel.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/base/status.h"

namespace specd {
namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// Receives one message of type T; any other type is a protocol error.
template <typename T>
absl::StatusOr<T> RecvExpected(Channel& channel, absl::Time deadline, Message* scratch) {
  SPECD_ASSIGN_OR_RETURN(const MessageType type, channel.Recv(Left(deadline), scratch));
  constexpr MessageType want = MessageTypeOf<T>();
  if (type != want) {
    channel.Close();
    return absl::FailedPreconditionError(absl::StrCat("handshake: expected ",
                                                      DistView(MessageTypeName(want)), ", got ",
                                                      DistView(MessageTypeName(type))));
  }
  return std::move(std::get<T>(*scratch));
}

// `local` with a fresh nonce.
absl::StatusOr<Hello> WithNonce(const Hello& local) {
  Hello hello = local;
  SPECD_ASSIGN_OR_RETURN(hello.nonce, RandomBytes(kHelloNonceBytes));
  return hello;
}

// Why the two Hellos cannot talk (HelloMismatch), or a peer Hello without a proper nonce.
std::string Incompatible(const Hello& local, const Hello& peer) {
  std::string why = HelloMismatch(local, peer);
  if (why.empty() && peer.nonce.size() != kHelloNonceBytes) {
    why = absl::StrCat("the ", DistView(RoleName(peer.role)), "'s Hello has a ", peer.nonce.size(),
                       "-byte nonce, not ", kHelloNonceBytes);
  }
  return why;
}

absl::Status Fail(Channel& channel, absl::Status status) {
  channel.Close();
  return status;
}

}  // namespace

absl::StatusOr<Hello> ConnectHandshake(Channel& channel, const Hello& local,
                                       const LinkSecret& secret, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Message scratch;
  SPECD_ASSIGN_OR_RETURN(const Hello own, WithNonce(local));
  SPECD_RETURN_IF_ERROR(channel.Send(own, Left(deadline)));
  SPECD_ASSIGN_OR_RETURN(Hello peer, RecvExpected<Hello>(channel, deadline, &scratch));
  if (const std::string why = Incompatible(own, peer); !why.empty()) {
    // The verifier refuses too (the verdict is symmetric) and says why in its HelloAck.
    absl::StatusOr<HelloAck> ack = RecvExpected<HelloAck>(channel, deadline, &scratch);
    channel.Close();
    const std::string reason = ack.ok() && !ack->accepted ? ack->reason : why;
    return absl::FailedPreconditionError(
        absl::StrCat("handshake refused by the ", DistView(RoleName(peer.role)), ": ", reason));
  }
  HelloAuth auth;
  const auto proof = LinkProof(secret, own.role, own.nonce, peer.nonce);
  auth.proof.assign(proof.begin(), proof.end());
  SPECD_RETURN_IF_ERROR(channel.Send(auth, Left(deadline)));
  SPECD_ASSIGN_OR_RETURN(const HelloAck ack, RecvExpected<HelloAck>(channel, deadline, &scratch));
  if (!ack.accepted) {
    return Fail(channel,
                absl::PermissionDeniedError(absl::StrCat(
                    "handshake refused by the ", DistView(RoleName(peer.role)), ": ", ack.reason)));
  }
  if (!LinkProofEquals(ack.proof, LinkProof(secret, peer.role, peer.nonce, own.nonce))) {
    return Fail(channel, absl::PermissionDeniedError(absl::StrCat(
                             "handshake: the ", DistView(RoleName(peer.role)),
                             " accepted but could not prove it holds the link secret")));
  }
  return peer;
}

absl::StatusOr<Hello> AcceptHandshake(Channel& channel, const Hello& local,
                                      const LinkSecret& secret, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Message scratch;
  SPECD_ASSIGN_OR_RETURN(Hello peer, RecvExpected<Hello>(channel, deadline, &scratch));
  SPECD_ASSIGN_OR_RETURN(const Hello own, WithNonce(local));
  SPECD_RETURN_IF_ERROR(channel.Send(own, Left(deadline)));
  if (const std::string why = Incompatible(own, peer); !why.empty()) {
    channel.Send(HelloAck{.accepted = false, .reason = why, .proof = {}}, Left(deadline))
        .IgnoreError();
    return Fail(channel, absl::FailedPreconditionError(absl::StrCat("handshake refused: ", why)));
  }
  SPECD_ASSIGN_OR_RETURN(const HelloAuth auth,
                         RecvExpected<HelloAuth>(channel, deadline, &scratch));
  if (!LinkProofEquals(auth.proof, LinkProof(secret, peer.role, peer.nonce, own.nonce))) {
    channel
        .Send(HelloAck{.accepted = false, .reason = "authentication failed", .proof = {}},
              Left(deadline))
        .IgnoreError();
    return Fail(channel, absl::PermissionDeniedError(
                             absl::StrCat("handshake: the ", DistView(RoleName(peer.role)),
                                          " could not prove it holds the link secret")));
  }
  HelloAck ack{.accepted = true, .reason = "", .proof = {}};
  const auto proof = LinkProof(secret, own.role, own.nonce, peer.nonce);
  ack.proof.assign(proof.begin(), proof.end());
  SPECD_RETURN_IF_ERROR(channel.Send(ack, Left(deadline)));
  return peer;
}

}  // namespace specd
