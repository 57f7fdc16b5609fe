// The SSD link's init exchange (ssd_init.h, ssd_process.h), CPU only: the verifier's settings
// survive the wire into the speculator's worker options; values no verifier sends are refused
// naming the field; both ends switch from the handshake limits to the init's; a speculator that
// cannot start fails the verifier's offer with its reason; a malformed, oversized or old-version
// SsdInit is a clear error on the speculator; and the speculator process (the codepair draft)
// joins a verifier, loads what the init names (its own --device / --threads overriding), serves
// it, and reports an init it cannot honour.
#include "engine/speculation/ssd/ssd_init.h"

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/base/status.h"
#include "engine/distributed/distributed_test_util.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/speculation/ssd/ssd_process.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using distributed_test::Reseal;
using distributed_test::TestSecret;

const std::string kDraft = std::string(SPECD_SHARED_DIR) + "/models/codepair/draft";
constexpr int32_t kDraftVocab = 8192;

// A verifier's options with every SsdInit field away from its default.
SsdSpeculatorOptions VerifierOptions() {
  absl::StatusOr<SpeculativeConfig> config = ParseSpeculativeConfig(
      R"({"method": "ssd", "model": ")" + kDraft + R"(", "num_speculative_tokens": 5,
          "prompt_lookup_min": 2, "prompt_lookup_max": 3, "draft_kv_cache_bytes": 16777216,
          "fan_out": 4, "fan_out_mode": "constant", "critical_batch_size": 12,
          "backup": "random", "cache_build": "complete", "cache_budget": "fixed",
          "cache_offers": false,
          "replay": {"file": "/data/replay.jsonl", "alpha": 0.6, "candidate_hit": 0.85,
                     "seed": 99}})");
  EXPECT_TRUE(config.ok()) << config.status();
  SsdSpeculatorOptions o;
  o.config = *config;
  o.vocab_size = kDraftVocab;
  o.max_num_seqs = 8;
  o.max_model_len = 512;
  o.max_num_batched_tokens = 1024;
  o.device = "cpu";
  o.num_threads = 1;
  o.block_size = 32;
  o.load_format = "auto";
  o.gpu_memory_utilization = 0.45;
  return o;
}

// `message` through a frame under the handshake limits, as the speculator decodes it.
absl::StatusOr<SsdInit> OverTheWire(const SsdInit& init) {
  FrameBuffer frame;
  SPECD_RETURN_IF_ERROR(EncodeFrame(init, 0, SsdHandshakeLimits(), &frame));
  Message decoded;
  SPECD_RETURN_IF_ERROR(DecodeFrame(frame.bytes(), SsdHandshakeLimits(), &decoded).status());
  return std::get<SsdInit>(decoded);
}

TEST(SsdInitTest, TheVerifiersSettingsSurviveTheWire) {
  SsdSpeculatorOptions o = VerifierOptions();
  o.config.parallel_drafting = true;
  absl::StatusOr<SsdInit> init = OverTheWire(MakeSsdInit(o));
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_EQ(*init, MakeSsdInit(o));
  absl::StatusOr<SsdWorkerOptions> w = SsdWorkerOptionsFrom(*init);
  ASSERT_TRUE(w.ok()) << w.status();
  const SpeculativeConfig& want = o.config;
  const SpeculativeConfig& got = w->config;
  EXPECT_EQ(got.method, SpeculationMethod::kSsd);
  EXPECT_EQ(got.draft_model, want.draft_model);
  EXPECT_EQ(got.num_speculative_tokens, 5);
  EXPECT_EQ(got.prompt_lookup_min, 2);
  EXPECT_EQ(got.prompt_lookup_max, 3);
  EXPECT_EQ(got.draft_kv_cache_bytes, int64_t{16} << 20);
  EXPECT_EQ(got.ssd.fan_out, 4);
  EXPECT_FALSE(got.ssd.geometric_fan_out);
  EXPECT_EQ(got.ssd.critical_batch_size, 12);
  EXPECT_EQ(got.ssd.backup, "random");
  EXPECT_TRUE(got.ssd.complete_cache);
  EXPECT_FALSE(got.ssd.time_budget);
  EXPECT_FALSE(got.ssd.cache_offers);
  EXPECT_TRUE(got.parallel_drafting);
  EXPECT_EQ(got.replay.file, "/data/replay.jsonl");
  EXPECT_EQ(got.replay.alpha, 0.6);
  EXPECT_EQ(got.replay.candidate_hit, 0.85);
  EXPECT_EQ(got.replay.seed, 99u);
  EXPECT_EQ(w->draft.device, "cpu");
  EXPECT_EQ(w->draft.num_threads, 1);
  EXPECT_EQ(w->draft.block_size, 32);
  EXPECT_EQ(w->draft.load_format, "auto");
  EXPECT_EQ(w->draft.gpu_memory_utilization, 0.45);
  EXPECT_EQ(w->draft.kv_cache_bytes, int64_t{16} << 20);
  EXPECT_EQ(w->draft.max_model_len, 512);
  EXPECT_EQ(w->draft.max_num_seqs, 8);
  EXPECT_EQ(w->draft.max_num_batched_tokens, 1024);
  EXPECT_EQ(w->max_num_seqs, 8);
  EXPECT_EQ(w->max_model_len, 512);
  EXPECT_EQ(SsdInitLimits(*init), SsdWireLimits(kDraftVocab, 8, 512));
}

// An EAGLE-3 head in the speculator (issue 34 point 1): the head, the target's directory and the
// width of its hidden-state rows survive the wire, the limits carry that width, and an init that
// names a head without them is refused naming the field.
TEST(SsdInitTest, AnEagle3HeadsSettingsSurviveTheWire) {
  SsdSpeculatorOptions o = VerifierOptions();
  o.config.draft_model.clear();
  o.config.eagle3_model = "/models/head";
  o.config.ssd.eagle3_drafter = true;
  o.target_model = "/models/target";
  o.hidden_width = 1152;
  const SsdInit sent = MakeSsdInit(o);
  EXPECT_EQ(sent.eagle3_head, "/models/head");
  absl::StatusOr<SsdInit> init = OverTheWire(sent);
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_EQ(*init, sent);
  absl::StatusOr<SsdWorkerOptions> w = SsdWorkerOptionsFrom(*init);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->config.ssd.eagle3_drafter);
  EXPECT_EQ(w->config.eagle3_model, "/models/head");
  EXPECT_EQ(w->target_model, "/models/target");
  EXPECT_EQ(w->hidden_width, 1152);
  EXPECT_EQ(w->vocab_size, kDraftVocab);
  const WireLimits limits = SsdInitLimits(*init);
  EXPECT_EQ(limits.hidden_width, 1152u);
  EXPECT_GT(limits.max_hidden_rows, 0u);
  EXPECT_TRUE(limits.Validate().ok());
  // No head: no hidden rows travel.
  EXPECT_EQ(SsdInitLimits(MakeSsdInit(VerifierOptions())).hidden_width, 0u);

  SsdInit no_target = sent;
  no_target.target_model.clear();
  absl::StatusOr<SsdWorkerOptions> refused = SsdWorkerOptionsFrom(no_target);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "SsdInit.target_model"))
      << refused.status();
  SsdInit no_width = sent;
  no_width.hidden_width = 0;
  absl::StatusOr<SsdInit> decoded = OverTheWire(no_width);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::StrContains(decoded.status().message(), "hidden_width")) << decoded.status();
}

// The device data path is offered only from a target on a GPU, with NCCL in the build and
// "data_path": "device" (the default); the offer and the SsdReady's answer survive the wire.
TEST(SsdInitTest, TheDeviceDataPathIsOfferedOnlyFromAGpuTarget) {
  SsdSpeculatorOptions o = VerifierOptions();
  o.target_device = "cpu";
  EXPECT_FALSE(MakeSsdInit(o).bulk_link) << "a CPU target has no GPU to receive on";
  o.target_device = "cuda:1";
  EXPECT_EQ(MakeSsdInit(o).bulk_link, NcclChannel::Available());
  o.device = "cuda:1";
  EXPECT_FALSE(MakeSsdInit(o).bulk_link)
      << "the speculator on the target's GPU: one NCCL rank each";
  o.device = "cuda:0";
  EXPECT_EQ(MakeSsdInit(o).bulk_link, NcclChannel::Available());
  o.config.ssd.device_data_path = false;
  EXPECT_FALSE(MakeSsdInit(o).bulk_link) << "\"data_path\": \"host\"";
  SsdInit offer = MakeSsdInit(o);
  offer.bulk_link = true;
  absl::StatusOr<SsdInit> init = OverTheWire(offer);
  ASSERT_TRUE(init.ok()) << init.status();
  EXPECT_TRUE(init->bulk_link);
  FrameBuffer frame;
  const SsdReady ready{.ok = true, .device = "cuda:1", .reason = "", .bulk_link = true};
  ASSERT_TRUE(EncodeFrame(ready, 0, SsdHandshakeLimits(), &frame).ok());
  Message decoded;
  ASSERT_TRUE(DecodeFrame(frame.bytes(), SsdHandshakeLimits(), &decoded).ok());
  EXPECT_EQ(std::get<SsdReady>(decoded), ready);
}

TEST(SsdInitTest, ValuesNoVerifierSendsAreRefusedNamingTheField) {
  const SsdInit good = MakeSsdInit(VerifierOptions());
  const struct {
    const char* field;
    void (*spoil)(SsdInit&);
  } cases[] = {
      {"num_speculative_tokens", [](SsdInit& i) { i.num_speculative_tokens = 0; }},
      {"num_speculative_tokens",
       [](SsdInit& i) { i.num_speculative_tokens = kMaxSpeculativeTokens + 1; }},
      {"fan_out", [](SsdInit& i) { i.fan_out = 65; }},
      {"prompt_lookup_min", [](SsdInit& i) { i.prompt_lookup_min = 4; }},
      {"backup", [](SsdInit& i) { i.backup = "oracle"; }},
      {"draft_model", [](SsdInit& i) { i.draft_model.clear(); }},
      // q rows of 2^30 ids: frames far over 4 GiB.
      {"limits", [](SsdInit& i) { i.vocab_size = 1u << 30; }},
  };
  for (const auto& c : cases) {
    SsdInit init = good;
    c.spoil(init);
    absl::StatusOr<SsdWorkerOptions> w = SsdWorkerOptionsFrom(init);
    ASSERT_FALSE(w.ok()) << c.field;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(w.status().message(), absl::StrCat("SsdInit.", c.field)))
        << w.status();
  }
  // What the decoder itself refuses: a count that does not fit the engine's int32.
  SsdInit huge = good;
  huge.max_num_seqs = 1u << 31;
  absl::StatusOr<SsdInit> decoded = OverTheWire(huge);
  ASSERT_FALSE(decoded.ok());
  EXPECT_TRUE(absl::StrContains(decoded.status().message(), "SsdInit.max_num_seqs"))
      << decoded.status();
}

// Two TcpChannels over a socketpair, both under the handshake limits.
struct Link {
  Link() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    verifier = TcpChannel::FromConnectedSocket(fds[0], SsdHandshakeLimits(), "verifier");
    speculator = TcpChannel::FromConnectedSocket(fds[1], SsdHandshakeLimits(), "speculator");
  }
  std::unique_ptr<TcpChannel> verifier, speculator;
};

SpeculateRequest RequestOf(int num_seqs) {
  SpeculateRequest r;
  r.round_id = 1;
  for (int i = 0; i < num_seqs; ++i) {
    SpeculateSeq s;
    s.seq_id = static_cast<uint64_t>(i);
    s.flags = kSeqNew;
    s.num_draft_tokens = 4;
    r.AddSeq(s, std::vector<int32_t>{1, 2, 3});
  }
  return r;
}

TEST(SsdInitTest, BothEndsSwitchToTheInitsLimits) {
  Link link;
  const SsdInit init = MakeSsdInit(VerifierOptions());
  // Under the handshake limits there is no room for a round.
  EXPECT_EQ(link.verifier->Send(RequestOf(4), absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);
  std::thread speculator([&] {
    absl::StatusOr<SsdInit> got = ReceiveSsdInit(*link.speculator, absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, init);
    ASSERT_TRUE(link.speculator->SetLimits(SsdInitLimits(*got)).ok());
    ASSERT_TRUE(
        link.speculator->Send(SsdReady{.ok = true, .device = "cpu", .reason = ""}, absl::Seconds(5))
            .ok());
  });
  const absl::Status offered = OfferSsdInit(*link.verifier, init, absl::Seconds(10));
  speculator.join();
  ASSERT_TRUE(offered.ok()) << offered;
  ASSERT_TRUE(link.verifier->Send(RequestOf(4), absl::Seconds(5)).ok());
  Message got;
  ASSERT_TRUE(link.speculator->Recv(absl::Seconds(5), &got).ok());
  EXPECT_EQ(std::get<SpeculateRequest>(got).seqs.size(), 4u);
}

TEST(SsdInitTest, ASpeculatorThatCannotStartFailsTheOfferWithItsReason) {
  Link link;
  std::thread speculator([&] {
    ASSERT_TRUE(ReceiveSsdInit(*link.speculator, absl::Seconds(10)).ok());
    SsdReady no{.ok = false, .device = "", .reason = "no such draft: /models/nowhere"};
    ASSERT_TRUE(link.speculator->Send(no, absl::Seconds(5)).ok());
  });
  const absl::Status offered =
      OfferSsdInit(*link.verifier, MakeSsdInit(VerifierOptions()), absl::Seconds(10));
  speculator.join();
  EXPECT_EQ(offered.code(), absl::StatusCode::kFailedPrecondition) << offered;
  EXPECT_TRUE(absl::StrContains(offered.message(), "SsdReady says: no such draft")) << offered;
  // One that never answers runs out of time; one told to give up stops at once.
  Link silent;
  EXPECT_EQ(OfferSsdInit(*silent.verifier, MakeSsdInit(VerifierOptions()), absl::Milliseconds(300))
                .code(),
            absl::StatusCode::kDeadlineExceeded);
  Link cancelled;
  EXPECT_EQ(OfferSsdInit(*cancelled.verifier, MakeSsdInit(VerifierOptions()), absl::Seconds(30),
                         [] { return true; })
                .code(),
            absl::StatusCode::kCancelled);
}

// The speculator's end of a socketpair whose other end writes raw frames.
absl::Status ReceiveRaw(const std::vector<uint8_t>& frame) {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  std::unique_ptr<TcpChannel> speculator =
      TcpChannel::FromConnectedSocket(fds[1], SsdHandshakeLimits(), "speculator");
  EXPECT_EQ(::write(fds[0], frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  const absl::Status s = ReceiveSsdInit(*speculator, absl::Seconds(5)).status();
  ::close(fds[0]);
  return s;
}

TEST(SsdInitTest, AMalformedOversizedOrOldVersionInitIsAClearErrorOnTheSpeculator) {
  FrameBuffer buffer;
  ASSERT_TRUE(EncodeFrame(MakeSsdInit(VerifierOptions()), 0, SsdHandshakeLimits(), &buffer).ok());
  const std::vector<uint8_t> good(buffer.bytes().begin(), buffer.bytes().end());
  EXPECT_TRUE(ReceiveRaw(good).ok());

  std::vector<uint8_t> zero_vocab = good;  // vocab_size is the payload's first u32
  std::fill_n(zero_vocab.begin() + kFrameHeaderBytes, 4, 0);
  Reseal(&zero_vocab);
  absl::Status s = ReceiveRaw(zero_vocab);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "SsdInit.vocab_size")) << s;

  std::vector<uint8_t> oversized = good;  // a payload longer than any SsdInit
  oversized.resize(good.size() + 8192, 0);
  Reseal(&oversized);
  s = ReceiveRaw(oversized);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "limit")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "for SsdInit")) << s;

  std::vector<uint8_t> old = good;  // the header's version: bytes 4..5
  old[4] = static_cast<uint8_t>(kProtocolVersion - 1);
  s = ReceiveRaw(old);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), absl::StrCat("speaks version ", kProtocolVersion)))
      << s;
}

// A verifier's end for the speculator process: listens, admits the process with TestSecret(),
// sends `init`, and keeps the SsdReady it got.
class FakeVerifier {
 public:
  explicit FakeVerifier(Hello hello = SsdHello(Role::kVerifier)) {
    absl::StatusOr<std::unique_ptr<TcpListener>> l = TcpListener::Listen("127.0.0.1", 0, hello);
    EXPECT_TRUE(l.ok()) << l.status();
    if (l.ok()) listener_ = *std::move(l);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", listener_->port()); }
  // Accepts the speculator and sends `init`; its SsdReady, or the error.
  absl::StatusOr<SsdReady> Offer(const SsdInit& init) {
    SPECD_ASSIGN_OR_RETURN(channel_, listener_->Accept(absl::Seconds(20), TestPolicy()));
    SPECD_RETURN_IF_ERROR(channel_->Send(init, absl::Seconds(5)));
    Message m;
    SPECD_RETURN_IF_ERROR(channel_->Recv(absl::Seconds(60), &m).status());
    if (!std::holds_alternative<SsdReady>(m)) return absl::InternalError("not an SsdReady");
    return std::get<SsdReady>(m);
  }
  TcpChannel& channel() { return *channel_; }
  // Ends the speculator's join (its channel closes) and stops listening.
  void Close() {
    if (channel_) channel_->Close();
    listener_->Close();
  }

 private:
  static AcceptPolicy TestPolicy() { return AcceptPolicy{.secret = TestSecret()}; }
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<TcpChannel> channel_;
};

// Runs RunSsdSpeculator on its own thread; the destructor closes the verifier's end (so a failed
// assertion cannot leave the process serving) and joins.
class ProcessThread {
 public:
  ProcessThread(FakeVerifier& verifier, const SsdProcessOptions& options)
      : verifier_(verifier), thread_([this, options] { status_ = RunSsdSpeculator(options); }) {}
  ~ProcessThread() { Join(); }
  // Waits for the process to end; its status.
  const absl::Status& Join() {
    if (thread_.joinable()) {
      if (!joining_) verifier_.Close();
      thread_.join();
    }
    return status_;
  }
  // Waits for the process to end by itself (the verifier's end stays open).
  const absl::Status& Wait() {
    joining_ = true;
    return Join();
  }

 private:
  FakeVerifier& verifier_;
  absl::Status status_ = absl::UnknownError("not run");
  bool joining_ = false;
  std::thread thread_;
};

SsdProcessOptions ProcessOptions(const FakeVerifier& verifier) {
  SsdProcessOptions p;
  p.connect = verifier.address();
  p.connect_timeout = absl::Seconds(20);
  p.secret = TestSecret();
  return p;
}

TEST(SsdProcessTest, LoadsWhatTheInitNamesWithItsOverridesAndServes) {
  FakeVerifier verifier;
  SsdProcessOptions p = ProcessOptions(verifier);
  p.device = "cpu";  // the verifier asks for a GPU this host lacks
  p.num_threads = 1;
  ProcessThread process(verifier, p);
  SsdSpeculatorOptions o = VerifierOptions();
  o.device = "cuda:7";
  o.config.replay = {};
  o.config.ssd.backup = "ngram";
  absl::StatusOr<SsdReady> ready = verifier.Offer(MakeSsdInit(o));
  ASSERT_TRUE(ready.ok()) << ready.status();
  ASSERT_TRUE(ready->ok) << ready->reason;
  EXPECT_TRUE(absl::StrContains(ready->device, "cpu")) << ready->device;
  // Its limits are the init's: a round of 8 sequences, over the 1 of the handshake.
  ASSERT_TRUE(verifier.channel().SetLimits(SsdWireLimits(kDraftVocab, 8, 512)).ok());
  ASSERT_TRUE(verifier.channel().Send(RequestOf(8), absl::Seconds(5)).ok());
  Message reply;
  ASSERT_TRUE(verifier.channel().Recv(absl::Seconds(60), &reply).ok());
  ASSERT_TRUE(std::holds_alternative<SpeculateResponse>(reply));
  EXPECT_EQ(std::get<SpeculateResponse>(reply).drafts.size(), 8u);
  ASSERT_TRUE(verifier.channel().Send(Shutdown{"done"}, absl::Seconds(5)).ok());
  const absl::Status served = process.Wait();
  EXPECT_TRUE(served.ok()) << served;
}

TEST(SsdProcessTest, AnInitItCannotHonourIsReportedToTheVerifierAndReturned) {
  struct Case {
    const char* what;
    void (*spoil)(SsdInit&);
    const char* reason;
  };
  const Case cases[] = {
      {"bad K", [](SsdInit& i) { i.num_speculative_tokens = 0; }, "SsdInit.num_speculative_tokens"},
      {"other vocabulary", [](SsdInit& i) { i.vocab_size = kDraftVocab + 1; }, "token ids"},
      {"no draft", [](SsdInit& i) { i.draft_model = "/no/such/draft"; }, "/no/such/draft"},
      // The codepair draft was not trained for parallel drafting: no mask token.
      {"not a parallel draft", [](SsdInit& i) { i.parallel_drafting = true; }, "pard_token"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    FakeVerifier verifier;
    SsdProcessOptions p = ProcessOptions(verifier);
    p.num_threads = 1;
    ProcessThread process(verifier, p);
    SsdInit init = MakeSsdInit(VerifierOptions());
    init.replay_file.clear();
    c.spoil(init);
    absl::StatusOr<SsdReady> ready = verifier.Offer(init);
    const absl::Status served = process.Wait();
    ASSERT_TRUE(ready.ok()) << ready.status();
    EXPECT_FALSE(ready->ok);
    EXPECT_TRUE(absl::StrContains(ready->reason, c.reason)) << ready->reason;
    EXPECT_FALSE(served.ok());
    EXPECT_TRUE(absl::StrContains(served.message(), c.reason)) << served;
  }
}

TEST(SsdProcessTest, AVerifierOfAnotherProtocolVersionIsRefusedAtHello) {
  Hello old = SsdHello(Role::kVerifier);
  old.protocol_version = kProtocolVersion - 1;
  FakeVerifier verifier(old);
  ProcessThread process(verifier, ProcessOptions(verifier));
  EXPECT_FALSE(verifier.Offer(MakeSsdInit(VerifierOptions())).ok());
  const absl::Status served = process.Wait();
  EXPECT_EQ(served.code(), absl::StatusCode::kFailedPrecondition) << served;
  EXPECT_TRUE(absl::StrContains(
      served.message(),
      absl::StrCat("protocol version mismatch: verifier speaks ", kProtocolVersion - 1,
                   ", speculator speaks ", kProtocolVersion)))
      << served;
}

}  // namespace
}  // namespace specd
