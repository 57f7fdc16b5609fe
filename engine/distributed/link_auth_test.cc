// The SSD link's authentication (issue 15, defect 3): the secret's hex, file and environment
// forms; proofs that change with role and nonces (no replay, no reflection); the handshake over
// real sockets refusing a peer without the secret, with another peer's recorded proof or from
// the wrong process, each refusal leaving the listener usable for the legitimate speculator.
#include "engine/distributed/link_auth.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "engine/distributed/channel.h"
#include "engine/distributed/distributed_test_util.h"
#include "engine/distributed/peer_cred.h"
#include "engine/distributed/tcp_channel.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using distributed_test::MakeHello;
using distributed_test::TestLimits;
using distributed_test::TestPolicy;
using distributed_test::TestSecret;

constexpr absl::Duration kWait = absl::Seconds(5);

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/specd_link_auth_", ::getpid(), "_", name);
}

std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = TempPath(name);
  ::unlink(path.c_str());
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(LinkSecretTest, HexRoundTripsAndBadTextIsRefused) {
  const absl::StatusOr<LinkSecret> a = NewLinkSecret();
  const absl::StatusOr<LinkSecret> b = NewLinkSecret();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->bytes, b->bytes);
  const std::string hex = LinkSecretToHex(*a);
  EXPECT_EQ(hex.size(), 64u);
  ASSERT_TRUE(LinkSecretFromHex(hex).ok());
  EXPECT_EQ(LinkSecretFromHex(hex)->bytes, a->bytes);
  EXPECT_FALSE(LinkSecretFromHex(hex.substr(1)).ok());
  std::string bad = hex;
  bad[10] = 'g';
  const absl::Status status = LinkSecretFromHex(bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_FALSE(absl::StrContains(status.message(), hex.substr(0, 8))) << "never echo the secret";
}

TEST(LinkSecretTest, AFileOthersCanReadIsRefused) {
  const std::string hex = LinkSecretToHex(TestSecret());
  const std::string open = WriteFile("open", hex + "\n", 0644);
  const absl::Status status = ReadLinkSecretFile(open).status();
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "0644")) << status;
  const std::string closed = WriteFile("closed", hex + "\n", 0600);
  absl::StatusOr<LinkSecret> secret = ReadLinkSecretFile(closed);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(secret->bytes, TestSecret().bytes);
  EXPECT_TRUE(absl::IsNotFound(ReadLinkSecretFile(TempPath("missing")).status()));
  ::unlink(open.c_str());
  ::unlink(closed.c_str());
}

TEST(LinkSecretTest, TakingItFromTheEnvironmentScrubsAndUnsetsIt) {
  const std::string hex = LinkSecretToHex(TestSecret());
  ASSERT_EQ(::setenv("SPECD_TEST_LINK_SECRET", hex.c_str(), 1), 0);
  char* value = std::getenv("SPECD_TEST_LINK_SECRET");
  absl::StatusOr<LinkSecret> secret = TakeLinkSecretFromEnv("SPECD_TEST_LINK_SECRET");
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(secret->bytes, TestSecret().bytes);
  EXPECT_EQ(std::getenv("SPECD_TEST_LINK_SECRET"), nullptr);
  EXPECT_EQ(value[0], '\0') << "the value's bytes must be overwritten";
  EXPECT_TRUE(absl::IsNotFound(TakeLinkSecretFromEnv("SPECD_TEST_LINK_SECRET").status()));
}

TEST(LinkProofTest, DependsOnSecretRoleAndBothNoncesInOrder) {
  const std::vector<uint8_t> a(32, 1), b(32, 2);
  const auto proof = LinkProof(TestSecret(), Role::kSpeculator, a, b);
  EXPECT_TRUE(LinkProofEquals(proof, LinkProof(TestSecret(), Role::kSpeculator, a, b)));
  // Reflection: the verifier's proof over the same nonces, either order, is a different value.
  EXPECT_FALSE(LinkProofEquals(proof, LinkProof(TestSecret(), Role::kVerifier, b, a)));
  EXPECT_FALSE(LinkProofEquals(proof, LinkProof(TestSecret(), Role::kVerifier, a, b)));
  EXPECT_FALSE(LinkProofEquals(proof, LinkProof(TestSecret(), Role::kSpeculator, b, a)));
  LinkSecret other = TestSecret();
  other.bytes[31] ^= 1;
  EXPECT_FALSE(LinkProofEquals(proof, LinkProof(other, Role::kSpeculator, a, b)));
  EXPECT_FALSE(LinkProofEquals(std::span<const uint8_t>(proof).first(31),
                               LinkProof(TestSecret(), Role::kSpeculator, a, b)));
}

// --- the handshake over a socketpair -------------------------------------------------------

struct Pair {
  std::unique_ptr<TcpChannel> verifier;
  std::unique_ptr<TcpChannel> speculator;
};

Pair MakePair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{TcpChannel::FromConnectedSocket(fds[0], TestLimits(), "verifier"),
              TcpChannel::FromConnectedSocket(fds[1], TestLimits(), "speculator")};
}

TEST(LinkHandshakeTest, BothEndsWithTheSecretJoin) {
  Pair p = MakePair();
  absl::StatusOr<Hello> at_speculator;
  std::thread speculator([&] {
    at_speculator =
        ConnectHandshake(*p.speculator, MakeHello(Role::kSpeculator), TestSecret(), kWait);
  });
  absl::StatusOr<Hello> at_verifier =
      AcceptHandshake(*p.verifier, MakeHello(Role::kVerifier), TestSecret(), kWait);
  speculator.join();
  ASSERT_TRUE(at_verifier.ok()) << at_verifier.status();
  ASSERT_TRUE(at_speculator.ok()) << at_speculator.status();
  EXPECT_EQ(at_verifier->nonce.size(), kHelloNonceBytes);
  EXPECT_EQ(at_speculator->role, Role::kVerifier);
}

TEST(LinkHandshakeTest, APeerWithoutTheSecretIsRefusedAndLearnsNoProof) {
  Pair p = MakePair();
  LinkSecret wrong = TestSecret();
  wrong.bytes[0] ^= 0x80;
  absl::Status at_speculator;
  std::thread speculator([&] {
    at_speculator =
        ConnectHandshake(*p.speculator, MakeHello(Role::kSpeculator), wrong, kWait).status();
  });
  const absl::Status at_verifier =
      AcceptHandshake(*p.verifier, MakeHello(Role::kVerifier), TestSecret(), kWait).status();
  speculator.join();
  EXPECT_TRUE(absl::IsPermissionDenied(at_verifier)) << at_verifier;
  EXPECT_TRUE(absl::IsPermissionDenied(at_speculator)) << at_speculator;
  EXPECT_TRUE(absl::StrContains(at_speculator.message(), "authentication failed")) << at_speculator;
}

// A rogue that recorded a legitimate speculator's HelloAuth replays it on a new connection:
// the verifier's nonce is fresh, so the recorded proof does not answer it.
TEST(LinkHandshakeTest, ARecordedProofIsRefusedOnANewConnection) {
  // The legitimate exchange, done by hand to record the speculator's proof and nonces.
  const Hello rogue_hello = [] {
    Hello h = MakeHello(Role::kSpeculator);
    h.nonce.assign(kHelloNonceBytes, 7);
    return h;
  }();
  const std::vector<uint8_t> old_verifier_nonce(kHelloNonceBytes, 9);
  const auto recorded =
      LinkProof(TestSecret(), Role::kSpeculator, rogue_hello.nonce, old_verifier_nonce);
  Pair p = MakePair();
  absl::Status at_verifier;
  std::thread verifier([&] {
    at_verifier =
        AcceptHandshake(*p.verifier, MakeHello(Role::kVerifier), TestSecret(), kWait).status();
  });
  ASSERT_TRUE(p.speculator->Send(rogue_hello, kWait).ok());
  Message in;
  ASSERT_EQ(*p.speculator->Recv(kWait, &in), MessageType::kHello);
  EXPECT_NE(std::get<Hello>(in).nonce, old_verifier_nonce);
  ASSERT_TRUE(
      p.speculator->Send(HelloAuth{.proof = {recorded.begin(), recorded.end()}}, kWait).ok());
  ASSERT_EQ(*p.speculator->Recv(kWait, &in), MessageType::kHelloAck);
  EXPECT_FALSE(std::get<HelloAck>(in).accepted);
  EXPECT_TRUE(std::get<HelloAck>(in).proof.empty()) << "the verifier proves nothing to a rogue";
  verifier.join();
  EXPECT_TRUE(absl::IsPermissionDenied(at_verifier)) << at_verifier;
}

// A version-1 speculator (no nonce, no proof) is refused with the reason, not let in.
TEST(LinkHandshakeTest, AVersionOnePeerIsRefusedNamingTheVersions) {
  Pair p = MakePair();
  absl::Status at_verifier;
  std::thread verifier([&] {
    at_verifier =
        AcceptHandshake(*p.verifier, MakeHello(Role::kVerifier), TestSecret(), kWait).status();
  });
  Hello v1 = MakeHello(Role::kSpeculator);
  v1.protocol_version = 1;
  ASSERT_TRUE(p.speculator->Send(v1, kWait).ok());
  Message in;
  ASSERT_EQ(*p.speculator->Recv(kWait, &in), MessageType::kHello);
  ASSERT_EQ(*p.speculator->Recv(kWait, &in), MessageType::kHelloAck);
  EXPECT_FALSE(std::get<HelloAck>(in).accepted);
  EXPECT_TRUE(absl::StrContains(std::get<HelloAck>(in).reason, "speaks 1"))
      << std::get<HelloAck>(in).reason;
  verifier.join();
  EXPECT_TRUE(absl::IsFailedPrecondition(at_verifier)) << at_verifier;
}

// --- peer credentials and the listener ----------------------------------------------------

TEST(PeerCredTest, UnixPeerIsThisProcessAndNoOther) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_TRUE(PeerIsLocal(fds[0]));
  EXPECT_TRUE(CheckPeerProcess(fds[0], ::getpid()).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(CheckPeerProcess(fds[0], ::getpid() + 1)));
  ::close(fds[0]);
  ::close(fds[1]);
}

// A forked speculator connecting with `secret`; exits 0 once the handshake gives `want`.
pid_t ForkSpeculator(uint16_t port, const LinkSecret& secret, absl::StatusCode want) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const absl::Status s =
        TcpChannel::Connect("127.0.0.1", port, MakeHello(Role::kSpeculator), secret).status();
    ::_exit(s.code() == want ? 0 : 1);
  }
  return pid;
}

int ExitCode(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The verifier launched process P: a connection from any other process over loopback is
// refused before the handshake (even one that holds the secret), P's own is accepted.
TEST(PeerCredTest, OnlyTheLaunchedProcessJoinsOverLoopback) {
  auto listener = TcpListener::Listen("127.0.0.1", 0, MakeHello(Role::kVerifier));
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint16_t port = (*listener)->port();
  // The "launched" child waits until the impostor (this process) was refused.
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t launched = ::fork();
  if (launched == 0) {
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    const absl::Status s =
        TcpChannel::Connect("127.0.0.1", port, MakeHello(Role::kSpeculator), TestSecret()).status();
    ::_exit(s.ok() ? 0 : 1);
  }
  AcceptPolicy policy = TestPolicy();
  policy.expected_pid = launched;
  absl::Status impostor;
  std::thread thread([&] {
    impostor = TcpChannel::Connect(
                   "127.0.0.1", port, MakeHello(Role::kSpeculator), TestSecret(),
                   {.timeout = kWait, .retry_interval = absl::Milliseconds(50), .tls = nullptr})
                   .status();
  });
  const absl::Status refused = (*listener)->Accept(kWait, policy).status();
  thread.join();
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "not held by the launched speculator"))
      << refused;
  EXPECT_FALSE(impostor.ok());
  ASSERT_EQ(::write(go[1], "x", 1), 1);
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = (*listener)->Accept(kWait, policy);
  EXPECT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ(ExitCode(launched), 0);
  ::close(go[0]);
  ::close(go[1]);
}

// Rogues without the secret come and go; the listener refuses each and then admits the
// speculator that has it.
TEST(PeerCredTest, RefusedRoguesLeaveTheListenerUsable) {
  auto listener = TcpListener::Listen("127.0.0.1", 0, MakeHello(Role::kVerifier));
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint16_t port = (*listener)->port();
  LinkSecret wrong = TestSecret();
  wrong.bytes[5] ^= 1;
  for (int i = 0; i < 3; ++i) {
    const pid_t rogue = ForkSpeculator(port, wrong, absl::StatusCode::kPermissionDenied);
    const absl::Status status = (*listener)->Accept(kWait, TestPolicy()).status();
    EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
    EXPECT_EQ(ExitCode(rogue), 0);
  }
  const pid_t good = ForkSpeculator(port, TestSecret(), absl::StatusCode::kOk);
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = (*listener)->Accept(kWait, TestPolicy());
  EXPECT_TRUE(channel.ok()) << channel.status();
  EXPECT_EQ(ExitCode(good), 0);
}

}  // namespace
}  // namespace specd
