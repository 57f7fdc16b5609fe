// The TCP transport across real processes (fork): the verifier is this test process, the
// speculator a child that connects to its listener. Covers the handshake, 1000 checked round
// trips, timeouts, a SIGKILLed peer (Unavailable, promptly, no SIGPIPE), a SIGSTOPped peer
// (DeadlineExceeded, then the conversation resumes), a restarted speculator rejoining the same
// listener, refused handshakes, garbage clients, and (in process, over socketpairs) partial
// frames, corrupt frames, frames larger than the socket buffer, limits switched by SetLimits and
// Close() waking a receiver.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "engine/distributed/distributed_test_util.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/distributed/tcp_channel.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using distributed_test::MakeHello;
using distributed_test::MakeRequest;
using distributed_test::MakeResponse;
using distributed_test::TestLimits;
using distributed_test::TestPolicy;
using distributed_test::TestSecret;

constexpr absl::Duration kWait = absl::Seconds(5);
// A call given a deadline returns within this: it does not hang or retry forever. Not a
// precision bound: CI runs on two cores shared with other tests, where a wake-up can be late by
// hundreds of milliseconds (the lower bounds, that it waited its deadline, stay exact).
constexpr absl::Duration kLateBound = absl::Seconds(5);

// A forked child running `body`; its exit code is body's result. The destructor SIGKILLs and
// reaps it, so a failing test never leaves a process behind.
class Child {
 public:
  explicit Child(const std::function<int()>& body) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int code = body();
      std::fflush(nullptr);  // _exit skips stdio's flush
      ::_exit(code);
    }
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  void Signal(int sig) { ::kill(pid_, sig); }
  // Exit code, or 128 + signal number when killed.
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// The speculator child: connects, answers each SpeculateRequest with MakeResponse after
// checking it equals MakeRequest(round), echoes Heartbeats, exits 0 on Shutdown.
int RunSpeculator(uint16_t port) {
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel =
      TcpChannel::Connect("127.0.0.1", port, MakeHello(Role::kSpeculator), TestSecret());
  if (!channel.ok()) return 10;
  const WireLimits limits = TestLimits();
  Message in;
  while (true) {
    absl::StatusOr<MessageType> type = (*channel)->Recv(absl::Seconds(20), &in);
    if (!type.ok()) return 11;
    if (*type == MessageType::kShutdown) return 0;
    if (*type == MessageType::kHeartbeat) {
      if (!(*channel)->Send(in, kWait).ok()) return 12;
      continue;
    }
    if (*type != MessageType::kSpeculateRequest) return 13;
    const auto& request = std::get<SpeculateRequest>(in);
    if (!(request == MakeRequest(request.round_id, limits))) return 14;
    if (!(*channel)->Send(MakeResponse(request, limits), kWait).ok()) return 15;
  }
}

std::unique_ptr<TcpListener> ListenOnLoopback() {
  absl::StatusOr<std::unique_ptr<TcpListener>> listener =
      TcpListener::Listen("127.0.0.1", 0, MakeHello(Role::kVerifier));
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener.ok() ? *std::move(listener) : nullptr;
}

// One verifier round: send MakeRequest(round), expect exactly MakeResponse of it.
void RoundTrip(Channel& channel, uint64_t round, Message* in) {
  const WireLimits limits = TestLimits();
  const SpeculateRequest request = MakeRequest(round, limits);
  ASSERT_TRUE(channel.Send(request, kWait).ok());
  absl::StatusOr<MessageType> type = channel.Recv(kWait, in);
  ASSERT_TRUE(type.ok()) << type.status();
  ASSERT_EQ(*type, MessageType::kSpeculateResponse);
  ASSERT_EQ(std::get<SpeculateResponse>(*in), MakeResponse(request, limits)) << round;
}

TEST(TcpChannelTest, HandshakeThenThousandRoundTripsAcrossProcesses) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  ASSERT_NE(listener, nullptr);
  ASSERT_NE(listener->port(), 0);
  Child child([port = listener->port()] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Hello peer = (*channel)->peer_hello();
  EXPECT_EQ(peer.nonce.size(), kHelloNonceBytes);
  peer.nonce.clear();
  EXPECT_EQ(peer, MakeHello(Role::kSpeculator));
  Message in;
  const absl::Time start = absl::Now();
  for (uint64_t round = 0; round < 1000; ++round) {
    RoundTrip(**channel, round, &in);
    if (HasFatalFailure()) return;
  }
  const absl::Duration elapsed = absl::Now() - start;
  std::printf("1000 round trips in %s (%.1f us each)\n", absl::FormatDuration(elapsed).c_str(),
              absl::ToDoubleMicroseconds(elapsed) / 1000);
  EXPECT_EQ((*channel)->frames_sent(), 1002u);      // Hello + HelloAck + 1000 requests
  EXPECT_EQ((*channel)->frames_received(), 1002u);  // Hello + HelloAuth + 1000 responses
  // Every frame is at least its 24-byte header; the requests carry tokens on top.
  EXPECT_GT((*channel)->bytes_sent(), 1002u * kFrameHeaderBytes);
  EXPECT_GT((*channel)->bytes_received(), 1002u * kFrameHeaderBytes);
  ASSERT_TRUE((*channel)->Send(Shutdown{.reason = "done"}, kWait).ok());
  EXPECT_EQ(child.Wait(), 0);
}

TEST(TcpChannelTest, RecvTimesOutWithDeadlineExceededAndStaysUsable) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  Child child([port = listener->port()] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  const absl::Time start = absl::Now();
  const absl::StatusOr<MessageType> type = (*channel)->Recv(absl::Milliseconds(200), &in);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(type.status())) << type.status();
  EXPECT_GE(elapsed, absl::Milliseconds(200));
  EXPECT_LT(elapsed, kLateBound);
  RoundTrip(**channel, 7, &in);
  ASSERT_TRUE((*channel)->Send(Shutdown{}, kWait).ok());
  EXPECT_EQ(child.Wait(), 0);
}

TEST(TcpChannelTest, KilledPeerGivesUnavailablePromptly) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  Child child([port = listener->port()] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  RoundTrip(**channel, 1, &in);
  child.Signal(SIGKILL);
  const absl::Time start = absl::Now();
  const absl::StatusOr<MessageType> type = (*channel)->Recv(kWait, &in);
  EXPECT_TRUE(absl::IsUnavailable(type.status())) << type.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable((*channel)->Send(Heartbeat{}, kWait)));
  EXPECT_EQ(child.Wait(), 128 + SIGKILL);
}

TEST(TcpChannelTest, SendingToAKilledPeerIsUnavailableNotSigpipe) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  Child child([port = listener->port()] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  RoundTrip(**channel, 1, &in);  // the child has read everything: it dies with a clean FIN
  child.Signal(SIGKILL);
  child.Wait();
  // The first send still lands in the kernel's buffer (the peer answers it with a reset); a
  // later one fails with EPIPE, which must be a status, not a SIGPIPE.
  absl::Status status;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 100 && status.ok(); ++i) {
    status = (*channel)->Send(Heartbeat{.sent_unix_ns = i}, kWait);
    if (status.ok()) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(TcpChannelTest, StoppedPeerGivesDeadlineExceededThenResumes) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  Child child([port = listener->port()] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  RoundTrip(**channel, 1, &in);
  child.Signal(SIGSTOP);
  const SpeculateRequest request = MakeRequest(2, TestLimits());
  ASSERT_TRUE((*channel)->Send(request, kWait).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<MessageType> type = (*channel)->Recv(absl::Milliseconds(300), &in);
  EXPECT_TRUE(absl::IsDeadlineExceeded(type.status())) << type.status();
  EXPECT_LT(absl::Now() - start, kLateBound);
  child.Signal(SIGCONT);
  type = (*channel)->Recv(kWait, &in);
  ASSERT_TRUE(type.ok()) << type.status();
  EXPECT_EQ(std::get<SpeculateResponse>(in), MakeResponse(request, TestLimits()));
  RoundTrip(**channel, 3, &in);
  ASSERT_TRUE((*channel)->Send(Shutdown{}, kWait).ok());
  EXPECT_EQ(child.Wait(), 0);
}

TEST(TcpChannelTest, RestartedSpeculatorRejoinsTheSameListener) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  const uint16_t port = listener->port();
  Message in;
  uint64_t round = 0;
  {
    Child first([port] { return RunSpeculator(port); });
    absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
    ASSERT_TRUE(channel.ok()) << channel.status();
    for (; round < 10; ++round) RoundTrip(**channel, round, &in);
    first.Signal(SIGKILL);
    EXPECT_TRUE(absl::IsUnavailable((*channel)->Recv(kWait, &in).status()));
  }
  Child second([port] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (; round < 20; ++round) RoundTrip(**channel, round, &in);
  ASSERT_TRUE((*channel)->Send(Shutdown{}, kWait).ok());
  EXPECT_EQ(second.Wait(), 0);
}

TEST(TcpChannelTest, VersionMismatchIsRefusedWithAReasonAndTheListenerGoesOn) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  const uint16_t port = listener->port();
  Child old_peer([port] {
    Hello hello = MakeHello(Role::kSpeculator);
    hello.protocol_version = kProtocolVersion + 1;
    absl::StatusOr<std::unique_ptr<TcpChannel>> channel =
        TcpChannel::Connect("127.0.0.1", port, hello, TestSecret());
    const bool refused = absl::IsFailedPrecondition(channel.status()) &&
                         absl::StrContains(channel.status().message(), "protocol version");
    return refused ? 0 : 1;
  });
  absl::StatusOr<std::unique_ptr<TcpChannel>> refused = listener->Accept(kWait, TestPolicy());
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StrContains(
      refused.status().message(),
      absl::StrCat("protocol version mismatch: verifier speaks ", kProtocolVersion,
                   ", speculator speaks ", kProtocolVersion + 1)))
      << refused.status();
  EXPECT_EQ(old_peer.Wait(), 0);

  Child good([port] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  Message in;
  RoundTrip(**channel, 4, &in);
  ASSERT_TRUE((*channel)->Send(Shutdown{}, kWait).ok());
  EXPECT_EQ(good.Wait(), 0);
}

TEST(TcpChannelTest, MismatchedLimitsAreRefusedOnBothEnds) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  std::thread speculator([port = listener->port()] {
    Hello hello = MakeHello(Role::kSpeculator);
    hello.limits.vocab_size = 51;
    const absl::Status status =
        TcpChannel::Connect("127.0.0.1", port, hello, TestSecret()).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "limits.vocab_size differs")) << status;
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(listener->Accept(kWait, TestPolicy()).status()));
  speculator.join();
}

TEST(TcpChannelTest, GarbageClientDoesNotBreakTheListener) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  const uint16_t port = listener->port();
  std::thread http([port] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
    char buf[64];
    while (::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
    ::close(fd);
  });
  const absl::Status status = listener->Accept(kWait, TestPolicy()).status();
  EXPECT_TRUE(absl::IsDataLoss(status) && absl::StrContains(status.message(), "bad magic"))
      << status;
  http.join();
  Child good([port] { return RunSpeculator(port); });
  absl::StatusOr<std::unique_ptr<TcpChannel>> channel = listener->Accept(kWait, TestPolicy());
  ASSERT_TRUE(channel.ok()) << channel.status();
  ASSERT_TRUE((*channel)->Send(Shutdown{}, kWait).ok());
  EXPECT_EQ(good.Wait(), 0);
}

TEST(TcpChannelTest, AcceptAndConnectTimeOutWithoutAPeer) {
  std::unique_ptr<TcpListener> listener = ListenOnLoopback();
  absl::Time start = absl::Now();
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(listener->Accept(absl::Milliseconds(100), TestPolicy()).status()));
  EXPECT_LT(absl::Now() - start, kLateBound);
  const uint16_t port = listener->port();
  listener.reset();  // nobody listens on `port` any more
  start = absl::Now();
  const absl::Status status =
      TcpChannel::Connect("127.0.0.1", port, MakeHello(Role::kSpeculator), TestSecret(),
                          {.timeout = absl::Milliseconds(300),
                           .retry_interval = absl::Milliseconds(20),
                           .tls = nullptr})
          .status();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "refused")) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_LT(absl::Now() - start, kLateBound);
}

// --- in process, over a socketpair ----------------------------------------------------------

struct Pair {
  std::unique_ptr<TcpChannel> a;
  std::unique_ptr<TcpChannel> b;
  int raw_b = -1;  // b's fd, for writing raw bytes into a
};

Pair MakePair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{TcpChannel::FromConnectedSocket(fds[0], TestLimits(), "pair-a"),
              TcpChannel::FromConnectedSocket(fds[1], TestLimits(), "pair-b"), fds[1]};
}

TEST(TcpChannelTest, HalfAFrameSurvivesATimeout) {
  Pair p = MakePair();
  const SpeculateRequest request = MakeRequest(6, TestLimits());
  const std::vector<uint8_t> frame = distributed_test::Encode(request, 0, TestLimits());
  const size_t half = frame.size() / 2;
  ASSERT_EQ(::send(p.raw_b, frame.data(), half, 0), static_cast<ssize_t>(half));
  Message in;
  EXPECT_TRUE(absl::IsDeadlineExceeded(p.a->Recv(absl::Milliseconds(50), &in).status()));
  ASSERT_EQ(::send(p.raw_b, frame.data() + half, frame.size() - half, 0),
            static_cast<ssize_t>(frame.size() - half));
  ASSERT_TRUE(p.a->Recv(kWait, &in).ok());
  EXPECT_EQ(std::get<SpeculateRequest>(in), request);
}

// SetLimits (a link that shakes hands under small limits, then switches): later frames are
// checked against the new limits both ways; invalid limits and a half-received frame are refused.
TEST(TcpChannelTest, SetLimitsAppliesToLaterFramesBothWays) {
  Pair p = MakePair();
  WireLimits small = TestLimits();
  small.max_batch = 1;
  ASSERT_TRUE(p.a->SetLimits(small).ok());
  const SpeculateRequest request = MakeRequest(6, TestLimits());  // 7 sequences
  EXPECT_TRUE(absl::IsInvalidArgument(p.a->Send(request, kWait)));
  ASSERT_TRUE(p.b->Send(request, kWait).ok());  // b still has TestLimits: a refuses the frame
  Message in;
  EXPECT_TRUE(absl::IsInvalidArgument(p.a->Recv(kWait, &in).status()));

  Pair q = MakePair();
  WireLimits invalid = TestLimits();
  invalid.max_batch = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(q.a->SetLimits(invalid)));
  const std::vector<uint8_t> frame = distributed_test::Encode(request, 0, TestLimits());
  ASSERT_EQ(::send(q.raw_b, frame.data(), 10, 0), 10);
  EXPECT_TRUE(absl::IsDeadlineExceeded(q.a->Recv(absl::Milliseconds(50), &in).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(q.a->SetLimits(TestLimits())));
  ASSERT_EQ(::send(q.raw_b, frame.data() + 10, frame.size() - 10, 0),
            static_cast<ssize_t>(frame.size() - 10));
  ASSERT_TRUE(q.a->Recv(kWait, &in).ok());
  EXPECT_EQ(std::get<SpeculateRequest>(in), request);
}

TEST(TcpChannelTest, CorruptFrameIsDataLossThenTheChannelIsClosed) {
  Pair p = MakePair();
  std::vector<uint8_t> frame =
      distributed_test::Encode(MakeRequest(6, TestLimits()), 0, TestLimits());
  frame.back() ^= 1;
  ASSERT_EQ(::send(p.raw_b, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  Message in;
  EXPECT_TRUE(absl::IsDataLoss(p.a->Recv(kWait, &in).status()));
  const absl::Status after = p.a->Recv(kWait, &in).status();
  EXPECT_TRUE(absl::IsUnavailable(after) && absl::StrContains(after.message(), "checksum"))
      << after;
  // The peer sees the connection closed.
  EXPECT_TRUE(absl::IsUnavailable(p.b->Recv(kWait, &in).status()));
}

TEST(TcpChannelTest, SkippedSequenceNumberIsDataLoss) {
  Pair p = MakePair();
  const std::vector<uint8_t> frame = distributed_test::Encode(Heartbeat{}, 5, TestLimits());
  ASSERT_EQ(::send(p.raw_b, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  Message in;
  const absl::Status status = p.a->Recv(kWait, &in).status();
  EXPECT_TRUE(absl::IsDataLoss(status) && absl::StrContains(status.message(), "expected 0"))
      << status;
}

TEST(TcpChannelTest, FramesLargerThanTheSocketBufferFlowBothWays) {
  WireLimits limits = TestLimits();
  limits.vocab_size = 32000;  // 48 q rows: ~6 MB per response
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  auto a = TcpChannel::FromConnectedSocket(fds[0], limits, "a");
  auto b = TcpChannel::FromConnectedSocket(fds[1], limits, "b");
  SpeculateRequest request = MakeRequest(7, limits);  // batch 8, every seq K = 6, all sampled
  for (SpeculateSeq& s : request.seqs) {
    s.num_draft_tokens = 6;
    s.flags |= kSeqWantProbs;
  }
  const SpeculateResponse response = MakeResponse(request, limits);
  ASSERT_EQ(response.NumProbRows(), 48u);
  std::thread sender([&] {
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(b->Send(response, kWait).ok());
  });
  Message in;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a->Recv(kWait, &in).ok());
    EXPECT_EQ(std::get<SpeculateResponse>(in), response);
  }
  sender.join();
}

TEST(TcpChannelTest, SteadyStateSendAndRecvDoNotAllocate) {
  Pair p = MakePair();
  const WireLimits limits = TestLimits();
  std::vector<SpeculateRequest> requests;
  std::vector<SpeculateResponse> responses;
  for (uint64_t round = 0; round < 40; ++round) {
    requests.push_back(MakeRequest(round, limits));
    responses.push_back(MakeResponse(requests.back(), limits));
  }
  Message at_a;
  Message at_b;
  bool all_ok = true;
  int64_t allocations = -1;
  for (int pass = 0; pass < 2; ++pass) {  // the first pass grows the received messages' vectors
    const int64_t before = distributed_test::AllocationCount();
    for (size_t i = 0; i < requests.size(); ++i) {
      all_ok &= p.a->Send(requests[i], kWait).ok();
      all_ok &= p.b->Recv(kWait, &at_b).ok();
      all_ok &= p.b->Send(responses[i], kWait).ok();
      all_ok &= p.a->Recv(kWait, &at_a).ok();
    }
    allocations = distributed_test::AllocationCount() - before;
  }
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(std::get<SpeculateResponse>(at_a), responses.back());
}

TEST(TcpChannelTest, CloseWakesABlockedReceiverAndThePeer) {
  Pair p = MakePair();
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    p.a->Close();
  });
  Message in;
  const absl::Time start = absl::Now();
  const absl::Status status = p.a->Recv(kWait, &in).status();
  closer.join();
  EXPECT_TRUE(absl::IsUnavailable(status) && absl::StrContains(status.message(), "this side"))
      << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(absl::IsUnavailable(p.b->Recv(kWait, &in).status()));
  EXPECT_TRUE(absl::IsUnavailable(p.a->Send(Heartbeat{}, kWait)));
}

// Without NCCL (or here, without a GPU or a peer) the bulk link fails with a status, never a hang
// or a crash; the 2-GPU behaviour is nccl_channel_test's (label gpu).
TEST(NcclChannelTest, CreateFailsCleanlyWithoutNcclGpuOrPeer) {
  Pair p = MakePair();
  const absl::Time start = absl::Now();
  const absl::Status status =
      NcclChannel::Create(*p.a, Role::kVerifier, 0, absl::Milliseconds(300)).status();
  EXPECT_FALSE(status.ok());
  if (!NcclChannel::Available()) {
    EXPECT_TRUE(absl::IsUnimplemented(status)) << status;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace specd
