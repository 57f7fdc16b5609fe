// TLS on the SSD link (issue 15, defect 3): certificates made at test time by the openssl CLI
// (a CA, a verifier certificate for 127.0.0.1, a speculator certificate, and a second CA with a
// rogue certificate). Mutual verification: frames flow both ways over TLS 1.3 and the secret
// handshake runs inside; a client certificate from another CA, a plain-TCP client and a server
// certificate that does not name the host are refused, and the listener goes on.
#include "engine/distributed/tls.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/distributed/distributed_test_util.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/distributed/tls_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using distributed_test::Certificates;
using distributed_test::MakeHello;
using distributed_test::MakeRequest;
using distributed_test::MakeResponse;
using distributed_test::TestLimits;
using distributed_test::TestPolicy;
using distributed_test::TestSecret;

constexpr absl::Duration kWait = absl::Seconds(10);

std::shared_ptr<const TlsContext> Context(const TlsFiles& files, TlsContext::Side side) {
  absl::StatusOr<std::shared_ptr<const TlsContext>> c = TlsContext::Create(files, side);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::unique_ptr<TcpListener> TlsListener() {
  const Certificates& certs = Certificates::Get();
  EXPECT_TRUE(certs.ok()) << "openssl could not make the test certificates";
  auto listener =
      TcpListener::Listen("127.0.0.1", 0, MakeHello(Role::kVerifier),
                          Context(certs.Files("verifier", "ca"), TlsContext::Side::kServer));
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener.ok() ? *std::move(listener) : nullptr;
}

// A speculator on another thread connecting to `host` with `files` (or plain TCP without).
absl::StatusOr<std::unique_ptr<TcpChannel>> ConnectWith(const std::string& host, uint16_t port,
                                                        const TlsFiles* files) {
  ConnectOptions options{
      .timeout = kWait, .retry_interval = absl::Milliseconds(50), .tls = nullptr};
  if (files != nullptr) options.tls = Context(*files, TlsContext::Side::kClient);
  return TcpChannel::Connect(host, port, MakeHello(Role::kSpeculator), TestSecret(), options);
}

TEST(TlsTest, FramesFlowBothWaysOverMutualTls) {
  std::unique_ptr<TcpListener> listener = TlsListener();
  ASSERT_NE(listener, nullptr);
  const TlsFiles files = Certificates::Get().Files("speculator", "ca");
  std::thread speculator([port = listener->port(), &files] {
    auto channel = ConnectWith("127.0.0.1", port, &files);
    ASSERT_TRUE(channel.ok()) << channel.status();
    Message in;
    for (uint64_t round = 0; round < 20; ++round) {
      ASSERT_EQ(*(*channel)->Recv(kWait, &in), MessageType::kSpeculateRequest);
      const auto& request = std::get<SpeculateRequest>(in);
      ASSERT_TRUE((*channel)->Send(MakeResponse(request, TestLimits()), kWait).ok());
    }
  });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  for (uint64_t round = 0; round < 20; ++round) {
    const SpeculateRequest request = MakeRequest(round, TestLimits());
    ASSERT_TRUE((*channel)->Send(request, kWait).ok());
    ASSERT_EQ(*(*channel)->Recv(kWait, &in), MessageType::kSpeculateResponse);
    EXPECT_EQ(std::get<SpeculateResponse>(in), MakeResponse(request, TestLimits()));
  }
  speculator.join();
}

TEST(TlsTest, ACertificateFromAnotherCaIsRefusedAndTheListenerGoesOn) {
  std::unique_ptr<TcpListener> listener = TlsListener();
  ASSERT_NE(listener, nullptr);
  const uint16_t port = listener->port();
  const TlsFiles rogue = Certificates::Get().Files("rogue", "ca");
  absl::Status at_rogue;
  std::thread thread([&] { at_rogue = ConnectWith("127.0.0.1", port, &rogue).status(); });
  const absl::Status refused = listener->Accept(kWait, TestPolicy()).status();
  thread.join();
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  EXPECT_FALSE(at_rogue.ok());

  const TlsFiles good = Certificates::Get().Files("speculator", "ca");
  absl::Status at_good;
  std::thread second([&] { at_good = ConnectWith("127.0.0.1", port, &good).status(); });
  EXPECT_TRUE(listener->Accept(kWait, TestPolicy()).ok());
  second.join();
  EXPECT_TRUE(at_good.ok()) << at_good;
}

TEST(TlsTest, APlainTcpSpeculatorIsRefused) {
  std::unique_ptr<TcpListener> listener = TlsListener();
  ASSERT_NE(listener, nullptr);
  absl::Status at_plain;
  std::thread thread([&, port = listener->port()] {
    at_plain = ConnectWith("127.0.0.1", port, nullptr).status();
  });
  const absl::Status refused = listener->Accept(kWait, TestPolicy()).status();
  thread.join();
  EXPECT_FALSE(refused.ok());
  EXPECT_FALSE(at_plain.ok());
}

// The speculator checks the verifier too: a certificate for 127.0.0.1 and verifier.test does
// not do for "localhost".
TEST(TlsTest, AVerifierCertificateNotNamingTheHostIsRefused) {
  std::unique_ptr<TcpListener> listener = TlsListener();
  ASSERT_NE(listener, nullptr);
  const TlsFiles files = Certificates::Get().Files("speculator", "ca");
  absl::Status at_speculator;
  std::thread thread([&, port = listener->port()] {
    at_speculator = ConnectWith("localhost", port, &files).status();
  });
  EXPECT_FALSE(listener->Accept(kWait, TestPolicy()).ok());
  thread.join();
  EXPECT_TRUE(absl::IsPermissionDenied(at_speculator)) << at_speculator;
  EXPECT_TRUE(absl::StrContains(at_speculator.message(), "does not verify")) << at_speculator;
}

TEST(TlsTest, MissingOrMismatchedFilesAreNamed) {
  const Certificates& certs = Certificates::Get();
  ASSERT_TRUE(certs.ok());
  TlsFiles files = certs.Files("speculator", "ca");
  files.key_file = certs.Path("verifier.key");
  const absl::Status mismatch = TlsContext::Create(files, TlsContext::Side::kClient).status();
  EXPECT_TRUE(absl::IsInvalidArgument(mismatch)) << mismatch;
  EXPECT_TRUE(absl::StrContains(mismatch.message(), "SSD link TLS")) << mismatch;
  files.key_file = certs.Path("speculator.key");
  files.ca_file = certs.Path("nothing.pem");
  const absl::Status missing = TlsContext::Create(files, TlsContext::Side::kClient).status();
  EXPECT_TRUE(absl::StrContains(missing.message(), "nothing.pem")) << missing;
  EXPECT_TRUE(absl::IsInvalidArgument(TlsContext::Create({}, TlsContext::Side::kServer).status()));
}

}  // namespace
}  // namespace specd
