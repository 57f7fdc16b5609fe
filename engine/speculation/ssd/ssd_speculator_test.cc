// SsdSpeculator against a scripted speculator over the real TCP link (no draft model): the
// outcome it sends for a sequence carries the accepted length the engine told it (OnVerified),
// never one guessed from the committed tokens, and a sequence told nothing reports 0; a sampled
// request's Saguaro C comes from its resolved speculation options, else the default by
// temperature. The init exchange: a joining speculator gets the verifier's settings in its
// SsdInit; one that cannot start (SsdReady not ok), answers the init with something else, or
// speaks an older protocol never joins, and the verifier drafts locally meanwhile. The device
// data path: declined, q rows go inline; a link that cannot come up falls back to TCP. Cache
// offers and an EAGLE-3 head's hidden states: ssd_speculator_rows_test.cc.
#include "engine/speculation/ssd/ssd_speculator.h"

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/base/monotonic_clock.h"
#include "engine/speculation/ssd/ssd_speculator_test_util.h"
#include "gtest/gtest.h"

namespace specd::ssd_speculator_test {
namespace {

TEST(SsdSpeculatorTest, SendsTheToldAcceptedLengthAndTheRequestsSaguaroC) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  SsdSpeculator* ssd = v.ssd.get();
  ScriptedSpeculator peer;
  PeerThread serving(v, peer);
  std::vector<Draft> drafts;
  ASSERT_TRUE(WaitConnected(*ssd));  // the acceptor admits it
  const int64_t local_rounds = ssd->stats().local_rounds;

  // Round 1: two greedy sequences and two sampled ones, one with the request's own C.
  SamplingParams greedy;
  greedy.temperature = 0;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  ResolvedSpeculation with_c;
  with_c.method = SpeculationMethod::kSsd;
  with_c.num_speculative_tokens = kK;
  with_c.saguaro_c = 0.3f;
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 14};
  std::vector<DraftInput> inputs(4);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].seq_id = i + 1;
    inputs[i].tokens = prompt;
    inputs[i].num_draft_tokens = kK;
    inputs[i].params = i < 2 ? &greedy : &sampled;
  }
  inputs[2].speculation = &with_c;
  ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
  ASSERT_EQ(drafts.size(), 4u);
  EXPECT_EQ(drafts[0].tokens, kDrafts);
  EXPECT_EQ(drafts[0].origin, DraftOrigin::kPrimary);
  const SpeculateRequest first = peer.LastRequest();
  ASSERT_NE(Find(first, 3), nullptr);
  ASSERT_NE(Find(first, 4), nullptr);
  EXPECT_FLOAT_EQ(Find(first, 3)->saguaro_c, 0.3f);
  EXPECT_FLOAT_EQ(Find(first, 4)->saguaro_c, DefaultDownweight(0.8f));

  // Both greedy sequences commit d_1, d_2 and a token other than d_3; only sequence 1's drafts
  // were verified (told: 2 accepted). Sequence 2's tokens happen to repeat the drafts, but it
  // was told nothing: 0.
  TellAccepted(*ssd, 1, 2, 9);
  const std::vector<int32_t> committed = {10, 11, 12, 13, 14, 5, 6, 9};
  inputs.resize(2);
  inputs[0].tokens = committed;
  inputs[1].tokens = committed;
  ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
  const SpeculateRequest second = peer.LastRequest();
  ASSERT_NE(Find(second, 1), nullptr);
  ASSERT_NE(Find(second, 2), nullptr);
  EXPECT_EQ(Find(second, 1)->accepted_len, 2) << "the accepted length OnVerified told";
  EXPECT_EQ(Find(second, 2)->accepted_len, 0) << "told nothing: no drafts were accepted";
  EXPECT_EQ(second.TokensOf(*Find(second, 1)).size(), 3u);
  EXPECT_EQ(ssd->stats().local_rounds, local_rounds) << "both rounds answered remotely";
}

TEST(SsdSpeculatorTest, AJoiningSpeculatorGetsTheVerifiersSettingsInItsInit) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  ScriptedSpeculator peer;
  PeerThread serving(v, peer);
  ASSERT_TRUE(WaitConnected(*v.ssd));
  const std::optional<SsdInit> init = peer.init();
  ASSERT_TRUE(init.has_value());
  EXPECT_EQ(*init, MakeSsdInit(v.options));
  EXPECT_EQ(init->vocab_size, uint32_t{kVocab});
  EXPECT_EQ(init->max_num_seqs, uint32_t{kMaxNumSeqs});
  EXPECT_EQ(init->max_model_len, uint32_t{kMaxModelLen});
  EXPECT_EQ(init->draft_model, "/models/draft");
  EXPECT_EQ(init->device, "cuda:3");
  EXPECT_EQ(init->num_threads, 6u);
  EXPECT_EQ(init->num_speculative_tokens, 4u);
  EXPECT_EQ(init->fan_out, 5u);
  EXPECT_EQ(v.ssd->stats().refused_joins, 0);
}

// Rounds of `v` with one sequence whose context repeats (n-gram finds drafts in it).
std::vector<Draft> ProposeRepeating(SsdSpeculator& ssd) {
  static const std::vector<int32_t> tokens = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3};
  SamplingParams greedy;
  greedy.temperature = 0;
  DraftInput in;
  in.seq_id = 1;
  in.tokens = tokens;
  in.num_draft_tokens = kK;
  in.params = &greedy;
  std::vector<Draft> drafts;
  EXPECT_TRUE(ssd.Propose({&in, 1}, &drafts).ok());
  return drafts;
}

// A speculator that joins but cannot honour the init (its draft does not load, or it answers
// with anything but SsdReady) never becomes the link: the verifier counts it as refused, keeps
// drafting locally, and a working speculator that comes later joins.
TEST(SsdSpeculatorTest, ASpeculatorThatFailsItsInitNeverJoinsAndRoundsGoLocal) {
  for (const InitAnswer answer : {InitAnswer::kCannotStart, InitAnswer::kHeartbeatThenClose}) {
    SCOPED_TRACE(static_cast<int>(answer));
    Verifier v;
    ASSERT_NE(v.ssd, nullptr);
    ScriptedSpeculator failing(answer);
    PeerThread attempt(v, failing);
    EXPECT_TRUE(attempt.Wait().ok()) << attempt.Wait();
    std::vector<Draft> drafts;
    for (int i = 0; i < 500 && v.ssd->stats().refused_joins == 0; ++i) {
      ASSERT_TRUE(v.ssd->Propose({}, &drafts).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(v.ssd->stats().refused_joins, 1);
    EXPECT_FALSE(v.ssd->stats().connected);
    const int64_t local_rounds = v.ssd->stats().local_rounds;
    drafts = ProposeRepeating(*v.ssd);
    ASSERT_EQ(drafts.size(), 1u);
    EXPECT_EQ(drafts[0].origin, DraftOrigin::kLocal);
    EXPECT_FALSE(drafts[0].tokens.empty()) << "n-gram drafts from the repeating context";
    EXPECT_EQ(v.ssd->stats().local_rounds, local_rounds + 1);

    ScriptedSpeculator working;
    PeerThread serving(v, working);
    ASSERT_TRUE(WaitConnected(*v.ssd));
    drafts = ProposeRepeating(*v.ssd);
    ASSERT_EQ(drafts.size(), 1u);
    EXPECT_EQ(drafts[0].tokens, kDrafts);
    EXPECT_EQ(drafts[0].origin, DraftOrigin::kPrimary);
  }
}

// The round's timeline: each remote round's transfer, wait and cache lookup fall inside the
// Propose that measured them, EndRound adds the engine's stages and the rest of the round, the
// stages sum to the round, and the speculator's stages are the ones its replies reported. Only
// structure is checked (never how long a stage took).
TEST(SsdSpeculatorTest, TheRoundTimelineAddsUpOnBothSides) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  SsdSpeculator* ssd = v.ssd.get();
  ScriptedSpeculator peer;
  PeerThread serving(v, peer);
  ASSERT_TRUE(WaitConnected(*ssd));
  const SsdTimeline before = ssd->stats().timeline;
  EXPECT_EQ(before.verifier_rounds, 0) << "no round ended yet";
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> tokens = {10, 11, 12, 13, 14};
  DraftInput in;
  in.seq_id = 1;
  in.tokens = tokens;
  in.num_draft_tokens = kK;
  in.params = &greedy;
  constexpr int kRounds = 5;
  const SsdSpeculator::EngineRoundSeconds engine = {
      .verify = 0.004, .sampling = 0.001, .commit = 0.002, .round = 0};
  double propose_seconds = 0;  // the Propose calls' wall time (the same clock)
  std::vector<Draft> drafts;
  for (int round = 0; round < kRounds; ++round) {
    const int64_t start = MonotonicNanos();
    ASSERT_TRUE(ssd->Propose({&in, 1}, &drafts).ok());
    const double propose = NanosToSeconds(start, MonotonicNanos());
    propose_seconds += propose;
    EXPECT_GE(ssd->last_wait_seconds(), 0.0);
    EXPECT_LE(ssd->last_wait_seconds(), propose);
    ASSERT_EQ(drafts[0].origin, DraftOrigin::kPrimary);
    SsdSpeculator::EngineRoundSeconds e = engine;
    e.round = propose + engine.verify + engine.sampling + engine.commit + 0.0005;
    ssd->EndRound(e);
    ssd->EndRound(e);     // a round ends once
    tokens.push_back(9);  // the outcome: no draft accepted, the target's token committed
    in.tokens = tokens;
  }
  const SsdTimeline& t = ssd->stats().timeline;
  EXPECT_EQ(t.verifier_rounds - before.verifier_rounds, kRounds);
  EXPECT_EQ(t.speculator_rounds - before.speculator_rounds, kRounds);
  double stages = 0, measured = 0;
  for (int i = 0; i < kNumSsdVerifierStages; ++i) {
    SCOPED_TRACE(kSsdVerifierStageNames[i]);
    EXPECT_GE(t.verifier[i], 0.0);
    stages += t.verifier[i];
    if (i <= static_cast<int>(SsdVerifierStage::kCacheLookup)) measured += t.verifier[i];
  }
  // Every round had a transfer, a wait and a lookup, each at least a clock read long.
  EXPECT_GT(t.at(SsdVerifierStage::kTransfer), 0.0);
  EXPECT_GT(t.at(SsdVerifierStage::kWait), 0.0);
  EXPECT_GT(t.at(SsdVerifierStage::kCacheLookup), 0.0);
  EXPECT_LE(measured, propose_seconds + 1e-9) << "Propose's stages lie inside Propose";
  EXPECT_DOUBLE_EQ(t.at(SsdVerifierStage::kVerify), kRounds * engine.verify);
  EXPECT_DOUBLE_EQ(t.at(SsdVerifierStage::kSampling), kRounds * engine.sampling);
  EXPECT_DOUBLE_EQ(t.at(SsdVerifierStage::kCommit), kRounds * engine.commit);
  EXPECT_GT(t.at(SsdVerifierStage::kRest), 0.0);
  EXPECT_NEAR(stages, t.verifier_round_seconds, 1e-9) << "the stages partition the round";
  for (int i = 0; i < kNumSsdSpeculatorStages; ++i) {
    SCOPED_TRACE(kSsdSpeculatorStageNames[i]);
    EXPECT_NEAR(t.speculator[i] - before.speculator[i], kRounds * kStageNs[i] * 1e-9, 1e-12);
  }
}

// A local round (no speculator) adds nothing to the timeline.
TEST(SsdSpeculatorTest, LocalRoundsAreNotTimed) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  ProposeRepeating(*v.ssd);
  EXPECT_EQ(v.ssd->last_wait_seconds(), 0.0);
  v.ssd->EndRound({.verify = 0.001, .sampling = 0, .commit = 0.001, .round = 0.003});
  EXPECT_EQ(v.ssd->stats().timeline.verifier_rounds, 0);
  EXPECT_EQ(v.ssd->stats().timeline.verifier_round_seconds, 0.0);
}

// A speculator of the previous protocol (before the stage times) is refused at the Hello with
// both versions named; the verifier never sends it an init and drafts locally.
TEST(SsdSpeculatorTest, ASpeculatorOfAnOlderProtocolIsRefusedAtHello) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  ScriptedSpeculator old(InitAnswer::kReady, kProtocolVersion - 1);
  PeerThread attempt(v, old);
  const absl::Status refused = attempt.Wait();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(
      refused.message(),
      absl::StrCat("protocol version mismatch: verifier speaks ", kProtocolVersion,
                   ", speculator speaks ", kProtocolVersion - 1)))
      << refused;
  EXPECT_FALSE(old.init().has_value());
  std::vector<Draft> drafts;
  for (int i = 0; i < 500 && v.ssd->stats().refused_joins == 0; ++i) {
    ASSERT_TRUE(v.ssd->Propose({}, &drafts).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(v.ssd->stats().refused_joins, 1);
  drafts = ProposeRepeating(*v.ssd);
  ASSERT_EQ(drafts.size(), 1u);
  EXPECT_EQ(drafts[0].origin, DraftOrigin::kLocal);
}

// A speculator that does not take the offered device data path (its draft on the CPU, or no NCCL
// there) gets a link whose q rows go inline over TCP.
TEST(SsdSpeculatorTest, ASpeculatorDecliningTheDevicePathServesOverTcp) {
  Verifier v;
  ASSERT_NE(v.ssd, nullptr);
  v.options.target_device = "cuda:0";
  v.ssd.reset();
  ASSERT_EQ(setenv(kLinkSecretEnv, LinkSecretToHex(v.secret).c_str(), 1), 0);
  absl::StatusOr<std::unique_ptr<SsdSpeculator>> created = SsdSpeculator::Create(v.options);
  unsetenv(kLinkSecretEnv);
  ASSERT_TRUE(created.ok()) << created.status();
  v.ssd = *std::move(created);
  ScriptedSpeculator peer;
  PeerThread thread(v, peer);
  ASSERT_TRUE(WaitConnected(*v.ssd));
  ASSERT_TRUE(peer.init().has_value());
  EXPECT_EQ(peer.init()->bulk_link, NcclChannel::Available()) << "offered from a GPU target";
  EXPECT_FALSE(v.ssd->stats().device_data_path);
  const std::vector<Draft> drafts = ProposeRepeating(*v.ssd);
  ASSERT_EQ(drafts.size(), 1u);
  EXPECT_EQ(drafts[0].origin, DraftOrigin::kPrimary);
  EXPECT_EQ(drafts[0].tokens, kDrafts);
  EXPECT_EQ(drafts[0].device_probs, nullptr);
  EXPECT_EQ(v.ssd->stats().device_rows, 0);
}

// The device data path's fallback: when its NCCL link cannot come up (here the verifier's GPU
// is missing; on a real pair, no peer access or no NCCL), that speculator is refused, later
// joins are not offered the path, and the next one serves over TCP.
TEST(SsdSpeculatorTest, ADevicePathThatCannotComeUpFallsBackToTcp) {
  absl::StatusOr<LinkSecret> secret = NewLinkSecret();
  ASSERT_TRUE(secret.ok()) << secret.status();
  absl::StatusOr<std::unique_ptr<TcpListener>> listener =
      TcpListener::Listen("127.0.0.1", 0, SsdHello(Role::kVerifier), nullptr);
  ASSERT_TRUE(listener.ok()) << listener.status();
  AcceptPolicy policy;
  policy.secret = *secret;
  SsdSpeculatorOptions options;
  options.config.draft_model = "/models/draft";
  options.config.num_speculative_tokens = kK;
  options.vocab_size = kVocab;
  options.max_num_seqs = kMaxNumSeqs;
  options.max_model_len = kMaxModelLen;
  SsdInit init = MakeSsdInit(options);
  init.bulk_link = true;  // offered, whatever this build has
  constexpr int32_t kNoSuchGpu = 4096;
  SsdAcceptor acceptor(*std::move(listener), policy, init, absl::Seconds(30), kNoSuchGpu);
  ScriptedSpeculator first(InitAnswer::kReadyTakingDevicePath);
  std::thread([&, port = acceptor.port()] {
    EXPECT_TRUE(first.Serve(port, *secret).ok());
  }).join();  // its link is closed once the device path failed
  ASSERT_TRUE(first.init().has_value());
  EXPECT_TRUE(first.init()->bulk_link);
  EXPECT_EQ(acceptor.refused(), 1);
  EXPECT_FALSE(acceptor.Take());
  ScriptedSpeculator second(InitAnswer::kReadyTakingDevicePath);
  std::thread serving([&, port = acceptor.port()] { (void)second.Serve(port, *secret); });
  SsdLink link = acceptor.WaitFor(absl::Seconds(60));
  ASSERT_TRUE(link) << "the next speculator joins";
  EXPECT_EQ(link.bulk, nullptr);
  ASSERT_TRUE(second.init().has_value());
  EXPECT_FALSE(second.init()->bulk_link) << "not offered again";
  // A round over TCP.
  SpeculateRequest request;
  request.round_id = 1;
  SpeculateSeq m;
  m.seq_id = 7;
  m.flags = kSeqNew;
  m.num_draft_tokens = kK;
  request.AddSeq(m, std::vector<int32_t>{1, 2, 3});
  ASSERT_TRUE(link.channel->Send(request, absl::Seconds(10)).ok());
  Message reply;
  absl::StatusOr<MessageType> type = link.channel->Recv(absl::Seconds(30), &reply);
  ASSERT_TRUE(type.ok()) << type.status();
  ASSERT_EQ(*type, MessageType::kSpeculateResponse);
  const auto& response = std::get<SpeculateResponse>(reply);
  ASSERT_EQ(response.drafts.size(), 1u);
  EXPECT_FALSE(response.probs_out_of_band);
  link.channel->Close();
  serving.join();
}

}  // namespace
}  // namespace specd::ssd_speculator_test
