// SsdSpeculator against a scripted speculator over the real TCP link (no draft model): the
// outcome it sends for a sequence carries the accepted length the engine told it (OnVerified),
// never one guessed from the committed tokens, and a sequence told nothing reports 0; a sampled
// request's Saguaro C comes from its resolved speculation options, else the default by
// temperature. The init exchange: a joining speculator gets the verifier's settings in its
// SsdInit; one that cannot start (SsdReady not ok), answers the init with something else, or
// speaks an older protocol never joins, and the verifier drafts locally meanwhile. The device
// data path: declined, q rows go inline; a link that cannot come up falls back to TCP. An
// EAGLE-3 head in the speculator: requests carry the target's hidden states of committed
// positions.
#include "engine/speculation/ssd/ssd_speculator.h"

#include <array>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/base/monotonic_clock.h"
#include "engine/distributed/link_auth.h"
#include "engine/distributed/nccl_channel.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/speculation/saguaro/saguaro.h"
#include "engine/speculation/ssd/ssd_init.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kMaxNumSeqs = 4;
constexpr int32_t kMaxModelLen = 128;
constexpr int32_t kK = 4;
const std::vector<int32_t> kDrafts = {5, 6, 7, 8};  // what the scripted speculator proposes

// The stage times every scripted response reports, ns (SsdSpeculatorStage order).
constexpr std::array<uint64_t, kNumSsdSpeculatorStages> kStageNs = {1000, 2000, 3000, 4000, 5000};

// How the scripted speculator answers the verifier's SsdInit: ready (taking the device data path
// when offered: kReadyTakingDevicePath), unable to start, or with something else.
enum class InitAnswer { kReady, kReadyTakingDevicePath, kCannotStart, kHeartbeatThenClose };

// The speculator process's end: answers the SsdInit as told, then every request with kDrafts for
// each sequence, and keeps the init and the requests. Serve runs on its own thread until the link
// closes; it returns the handshake's status.
class ScriptedSpeculator {
 public:
  explicit ScriptedSpeculator(InitAnswer answer = InitAnswer::kReady,
                              uint16_t protocol_version = kProtocolVersion)
      : answer_(answer), protocol_version_(protocol_version) {}

  absl::Status Serve(uint16_t port, const LinkSecret& secret) {
    Hello hello = SsdHello(Role::kSpeculator);
    hello.protocol_version = protocol_version_;
    ConnectOptions connect;
    connect.timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<TcpChannel>> channel =
        TcpChannel::Connect("127.0.0.1", port, hello, secret, connect);
    if (!channel.ok()) return channel.status();
    absl::StatusOr<SsdInit> init = ReceiveSsdInit(**channel, absl::Seconds(10));
    if (!init.ok()) return init.status();
    {
      std::lock_guard lock(mu_);
      init_ = *init;
    }
    switch (answer_) {
      case InitAnswer::kReady:
      case InitAnswer::kReadyTakingDevicePath: {
        if (absl::Status s = (*channel)->SetLimits(SsdInitLimits(*init)); !s.ok()) return s;
        const bool take = answer_ == InitAnswer::kReadyTakingDevicePath && init->bulk_link;
        (void)(*channel)->Send(
            SsdReady{.ok = true, .device = "scripted", .reason = "", .bulk_link = take},
            absl::Seconds(5));
        break;
      }
      case InitAnswer::kCannotStart:
        (void)(*channel)->Send(
            SsdReady{.ok = false, .device = "", .reason = "no draft on this host"},
            absl::Seconds(5));
        return absl::OkStatus();
      case InitAnswer::kHeartbeatThenClose:
        (void)(*channel)->Send(Heartbeat{}, absl::Seconds(5));
        (void)(*channel)->Send(Shutdown{"changed my mind"}, absl::Seconds(5));
        return absl::OkStatus();
    }
    Message message;
    Message reply = SpeculateResponse();
    while ((*channel)->Recv(absl::Seconds(30), &message).ok()) {
      if (TypeOf(message) != MessageType::kSpeculateRequest) continue;
      const auto& request = std::get<SpeculateRequest>(message);
      auto& response = std::get<SpeculateResponse>(reply);
      response.Clear();
      response.round_id = request.round_id;
      // Its stage times (SsdSpeculatorStage order): what the verifier's timeline must add up.
      response.receive_ns = kStageNs[0];
      response.triage_ns = kStageNs[1];
      response.draft_ns = kStageNs[2];
      response.cache_build_ns = kStageNs[3];
      response.reply_ns = kStageNs[4];
      for (const SpeculateSeq& m : request.seqs) {
        response.AddDraft(m.seq_id, DraftStatus::kMissPrimary, kDrafts, {});
      }
      {
        std::lock_guard lock(mu_);
        requests_.push_back(request);
      }
      if (!request.WantsResponse()) continue;  // its drafts came from an offer
      if (!(*channel)->Send(reply, absl::Seconds(5)).ok()) break;
      std::optional<CacheOffer> offer;
      {
        std::lock_guard lock(mu_);
        if (!offers_.empty()) {
          offer = std::move(offers_.front());
          offers_.erase(offers_.begin());
        }
      }
      if (!offer) continue;
      offer->round_id = request.round_id;
      if (!(*channel)->Send(*offer, absl::Seconds(5)).ok()) break;
      std::lock_guard lock(mu_);
      ++offers_sent_;
    }
    return absl::OkStatus();
  }
  // Sends `offer` (its round_id set) right after the next response.
  void OfferAfterNextResponse(CacheOffer offer) {
    std::lock_guard lock(mu_);
    offers_.push_back(std::move(offer));
  }
  // Waits up to 10 s until `n` offers went out, or `n` requests came in.
  bool WaitOffersSent(int n) {
    return WaitFor([&] { return offers_sent_ >= n; });
  }
  bool WaitRequests(size_t n) {
    return WaitFor([&] { return requests_.size() >= n; });
  }
  size_t NumRequests() {
    std::lock_guard lock(mu_);
    return requests_.size();
  }
  // The last request that carried sequences.
  SpeculateRequest LastRequest() {
    std::lock_guard lock(mu_);
    for (auto it = requests_.rbegin(); it != requests_.rend(); ++it) {
      if (!it->seqs.empty()) return *it;
    }
    return {};
  }
  // The SsdInit the verifier sent, if one came.
  std::optional<SsdInit> init() {
    std::lock_guard lock(mu_);
    return init_;
  }

 private:
  const InitAnswer answer_;
  const uint16_t protocol_version_;
  std::mutex mu_;
  std::optional<SsdInit> init_;
  std::vector<SpeculateRequest> requests_;
  std::vector<CacheOffer> offers_;  // to send after the next responses
  int offers_sent_ = 0;

  template <typename Done>
  bool WaitFor(Done done) {
    for (int i = 0; i < 1000; ++i) {
      {
        std::lock_guard lock(mu_);
        if (done()) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

// A verifier that lets speculators join on its own (launch off) with a fresh secret, whose
// Create does not wait for one.
struct Verifier {
  // hidden_width > 0: an EAGLE-3 head drafts in the speculator, requests carry hidden states
  // (at most max_hidden_rows a request, 0: the wire limit's).
  explicit Verifier(int32_t hidden_width = 0, int32_t max_hidden_rows = 0,
                    bool cache_offers = true) {
    absl::StatusOr<LinkSecret> s = NewLinkSecret();
    EXPECT_TRUE(s.ok()) << s.status();
    secret = *s;
    EXPECT_EQ(setenv(kLinkSecretEnv, LinkSecretToHex(secret).c_str(), 1), 0);
    absl::StatusOr<SpeculativeConfig> config = ParseSpeculativeConfig(
        R"({"method": "ssd", "model": "/models/draft", "num_speculative_tokens": 4,
            "fan_out": 5, "launch_speculator": false, "speculator_address": "127.0.0.1:0"})");
    EXPECT_TRUE(config.ok()) << config.status();
    options.config = *config;
    options.config.ssd.cache_offers = cache_offers;
    options.vocab_size = kVocab;
    options.max_num_seqs = kMaxNumSeqs;
    options.max_model_len = kMaxModelLen;
    options.device = "cuda:3";
    options.num_threads = 6;
    options.startup_timeout = absl::Milliseconds(1);  // the scripted speculator joins afterwards
    if (hidden_width > 0) {
      options.config.ssd.eagle3_drafter = true;
      options.config.eagle3_model = "/models/head";
      options.target_model = "/models/target";
      options.hidden_width = hidden_width;
      options.max_hidden_rows = max_hidden_rows;
    }
    absl::StatusOr<std::unique_ptr<SsdSpeculator>> created = SsdSpeculator::Create(options);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) ssd = *std::move(created);
    unsetenv(kLinkSecretEnv);
  }
  LinkSecret secret;
  SsdSpeculatorOptions options;
  std::unique_ptr<SsdSpeculator> ssd;
};

// Runs `peer` against `v` on its own thread; the verifier's end (its Shutdown on destruction)
// ends Serve, also after a failed assertion.
class PeerThread {
 public:
  PeerThread(Verifier& v, ScriptedSpeculator& peer)
      : v_(v), thread_([this, &peer, port = static_cast<uint16_t>(v.ssd->port())] {
          status_ = peer.Serve(port, v_.secret);
        }) {}
  ~PeerThread() { Join(); }
  // Stops the verifier and waits for the peer; what its handshake gave.
  const absl::Status& Join() {
    if (thread_.joinable()) {
      v_.ssd.reset();
      thread_.join();
    }
    return status_;
  }
  // Waits for a peer that ends by itself (the verifier stays).
  const absl::Status& Wait() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }

 private:
  Verifier& v_;
  absl::Status status_;
  std::thread thread_;
};

// Proposes empty rounds until the link is up or `tries` ran out.
bool WaitConnected(SsdSpeculator& ssd, int tries = 500) {
  std::vector<Draft> drafts;
  for (int i = 0; i < tries && !ssd.stats().connected; ++i) {
    if (!ssd.Propose({}, &drafts).ok()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ssd.stats().connected;
}

const SpeculateSeq* Find(const SpeculateRequest& r, uint64_t seq_id) {
  for (const SpeculateSeq& m : r.seqs) {
    if (m.seq_id == seq_id) return &m;
  }
  return nullptr;
}

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
  const VerifiedRound told{.seq_id = 1,
                           .num_drafts = kK,
                           .num_accepted = 2,
                           .next_token = 9,
                           .scores = {},
                           .num_scored = 0};
  ssd->OnVerified({&told, 1});
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

// Cache offers (wire version 10): a round whose every outcome the speculator offered takes the
// offered drafts, flags each sequence kSeqOfferHit and waits for no response; a round with one
// outcome not offered asks for all of them, as does a sampled sequence; with cache_offers off
// the verifier never takes an offer.
TEST(SsdSpeculatorTest, ARoundWhoseOutcomesWereOfferedTakesTheOfferWithoutWaiting) {
  for (const bool offers_on : {true, false}) {
    SCOPED_TRACE(offers_on ? "cache offers on" : "cache offers off");
    Verifier v(0, 0, offers_on);
    ASSERT_NE(v.ssd, nullptr);
    SsdSpeculator* ssd = v.ssd.get();
    ScriptedSpeculator peer;
    PeerThread serving(v, peer);
    ASSERT_TRUE(WaitConnected(*ssd));
    SamplingParams greedy;
    greedy.temperature = 0;
    SamplingParams sampled;
    sampled.temperature = 0.7f;
    const std::vector<int32_t> prompt = {10, 11, 12, 13, 14};
    std::vector<DraftInput> inputs(2);
    std::vector<std::vector<int32_t>> tokens(2, prompt);
    for (size_t i = 0; i < inputs.size(); ++i) {
      inputs[i].seq_id = i + 1;
      inputs[i].tokens = tokens[i];
      inputs[i].num_draft_tokens = kK;
      inputs[i].params = &greedy;
    }
    auto commit = [&](size_t i, int32_t accepted, std::vector<int32_t> fresh) {
      const VerifiedRound told{.seq_id = i + 1,
                               .num_drafts = kK,
                               .num_accepted = accepted,
                               .next_token = fresh.back(),
                               .scores = {},
                               .num_scored = 0};
      ssd->OnVerified({&told, 1});
      tokens[i].insert(tokens[i].end(), fresh.begin(), fresh.end());
      inputs[i].tokens = tokens[i];
    };
    // Round 1 asks (nothing offered yet); the peer then offers sequence 1's outcome (2
    // accepted, bonus 9) and another of it, and sequence 2's (none accepted, bonus 30).
    CacheOffer offer;
    offer.cache_build_ns = 7000;
    offer.AddDraft(1, 2, 9, std::vector<int32_t>{21, 22, 23, 24});
    offer.AddDraft(1, 2, 3, std::vector<int32_t>{41, 42, 43, 44});
    offer.AddDraft(2, 0, 30, std::vector<int32_t>{31, 32, 33, 34, 35});
    peer.OfferAfterNextResponse(offer);
    std::vector<Draft> drafts;
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    EXPECT_EQ(drafts[0].tokens, kDrafts);
    ASSERT_TRUE(peer.WaitOffersSent(1));
    commit(0, 2, {5, 6, 9});
    commit(1, 0, {30});
    const size_t asked = peer.NumRequests();
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    ASSERT_TRUE(peer.WaitRequests(asked + 1));
    const SpeculateRequest second = peer.LastRequest();
    ASSERT_NE(Find(second, 1), nullptr);
    ASSERT_NE(Find(second, 2), nullptr);
    EXPECT_EQ(Find(second, 1)->accepted_len, 2);
    EXPECT_EQ(Find(second, 2)->accepted_len, 0);
    if (offers_on) {
      EXPECT_EQ(drafts[0].tokens, (std::vector<int32_t>{21, 22, 23, 24}));
      EXPECT_EQ(drafts[1].tokens, (std::vector<int32_t>{31, 32, 33, 34})) << "K of them";
      EXPECT_EQ(drafts[0].origin, DraftOrigin::kCacheHit);
      EXPECT_EQ(ssd->stats().offer_rounds, 1);
      EXPECT_EQ(ssd->stats().drafts_hit, 2);
      EXPECT_EQ(ssd->last_wait_seconds(), 0.0);
      EXPECT_FALSE(second.WantsResponse());
      EXPECT_TRUE(Find(second, 1)->flags & kSeqOfferHit);
      EXPECT_TRUE(Find(second, 2)->flags & kSeqOfferHit);
    } else {
      EXPECT_EQ(drafts[0].tokens, kDrafts) << "asked the speculator";
      EXPECT_EQ(ssd->stats().offer_rounds, 0);
      EXPECT_TRUE(second.WantsResponse());
    }
    // Nothing was offered for round 2: round 3 asks. Its response is followed by an offer of
    // sequence 1's outcome only (all 4 drafts accepted, bonus 50).
    CacheOffer partial;
    partial.AddDraft(1, 4, 50, std::vector<int32_t>{1, 2, 3, 4});
    peer.OfferAfterNextResponse(partial);
    commit(
        0, 4,
        {drafts[0].tokens[0], drafts[0].tokens[1], drafts[0].tokens[2], drafts[0].tokens[3], 51});
    commit(1, 1, {drafts[1].tokens[0], 60});
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    EXPECT_EQ(drafts[0].tokens, kDrafts);
    EXPECT_EQ(drafts[1].origin, DraftOrigin::kPrimary);
    EXPECT_TRUE(peer.LastRequest().WantsResponse());
    ASSERT_TRUE(peer.WaitOffersSent(2));
    // Round 4: sequence 1's outcome was offered, sequence 2's was not: the round asks.
    commit(0, 4, {5, 6, 7, 8, 50});
    commit(1, 0, {61});
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    EXPECT_EQ(drafts[0].tokens, kDrafts);
    EXPECT_EQ(drafts[0].origin, DraftOrigin::kPrimary);
    EXPECT_TRUE(peer.LastRequest().WantsResponse());
    EXPECT_EQ(ssd->stats().offer_rounds, offers_on ? 1 : 0);
    // A sampled sequence never takes an offer (its drafts need q rows).
    CacheOffer sampled_offer;
    sampled_offer.AddDraft(1, 0, 7, std::vector<int32_t>{1, 2, 3, 4});
    peer.OfferAfterNextResponse(sampled_offer);
    inputs.resize(1);
    inputs[0].params = &sampled;
    commit(0, 0, {62});
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    ASSERT_TRUE(peer.WaitOffersSent(3));
    commit(0, 0, {7});
    ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
    EXPECT_EQ(drafts[0].tokens, kDrafts);
    EXPECT_EQ(ssd->stats().offer_rounds, offers_on ? 1 : 0);
  }
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

// A target whose last pass "captured" the rows a test sets ([rows, width] f32); it runs nothing.
class CapturedRowsRunner : public ModelRunner {
 public:
  const ModelConfig& config() const override { return config_; }
  std::string device_name() const override { return "captured rows"; }
  int32_t num_kv_blocks() const override { return 0; }
  int32_t block_size() const override { return 16; }
  int32_t max_model_len() const override { return kMaxModelLen; }
  int32_t max_sample_rows() const override { return 1; }
  absl::Status Run(const StepRequest&, StepResult*) override {
    return absl::UnimplementedError("captured rows only");
  }
  std::span<const float> captured_hidden_states() const override { return captured; }

  std::vector<float> captured;

 private:
  ModelConfig config_;
};

constexpr int32_t kWidth = 3;  // floats of a hidden row

// The value the target's pass "computed" at (sequence, position, column): distinct and exact.
float HiddenValue(int64_t seq, int32_t position, int32_t column) {
  return static_cast<float>(seq * 10000 + position * 10 + column);
}

// Sets `runner`'s capture to the rows of `batch` (each chunk's positions, in batch order).
void Capture(std::span<const SequenceInput> batch, CapturedRowsRunner& runner) {
  runner.captured.clear();
  for (const SequenceInput& in : batch) {
    for (size_t i = 0; i < in.tokens.size(); ++i) {
      for (int32_t c = 0; c < kWidth; ++c) {
        runner.captured.push_back(
            HiddenValue(in.seq_id, in.start_pos + static_cast<int32_t>(i), c));
      }
    }
  }
}

// What `request` carries for `m` are the rows of positions [first, first + n) of sequence m.
void ExpectRows(const SpeculateRequest& request, const SpeculateSeq& m, int32_t first, int32_t n) {
  EXPECT_EQ(m.hidden_position, static_cast<uint32_t>(first));
  ASSERT_EQ(m.num_hidden, static_cast<uint32_t>(n));
  const std::span<const float> rows = request.HiddenOf(m, kWidth);
  ASSERT_EQ(rows.size(), static_cast<size_t>(n * kWidth));
  for (int32_t r = 0; r < n; ++r) {
    for (int32_t c = 0; c < kWidth; ++c) {
      EXPECT_EQ(rows[r * kWidth + c], HiddenValue(static_cast<int64_t>(m.seq_id), first + r, c))
          << "row " << r << " column " << c;
    }
  }
}

// An EAGLE-3 head in the speculator reads, at position p, the target's hidden state of p: a new
// sequence's request carries its prompt's rows (the first sampled token has none yet); after a
// verified round, exactly the rows of the positions the round committed before its bonus token
// (the verification chunk's first position and the accepted drafts'), never a rejected draft's,
// nor a row sent before; a request carries at most max_hidden_rows, the latest of each sequence.
TEST(SsdSpeculatorTest, SendsTheTargetsHiddenStatesOfCommittedPositionsOnly) {
  constexpr int32_t kMaxHiddenRows = 6;
  Verifier v(kWidth, kMaxHiddenRows);
  ASSERT_NE(v.ssd, nullptr);
  SsdSpeculator* ssd = v.ssd.get();
  ASSERT_TRUE(ssd->wants_hidden());
  ScriptedSpeculator peer;
  PeerThread serving(v, peer);
  ASSERT_TRUE(WaitConnected(*ssd));
  CapturedRowsRunner target;
  SamplingParams greedy;
  greedy.temperature = 0;

  // The prompt's pass, beside a chunk of a sequence that does not draft with SSD.
  std::vector<int32_t> tokens = {10, 11, 12, 13, 14};  // positions 0..4
  const std::vector<int32_t> other = {20, 21};
  std::vector<SequenceInput> batch(2);
  batch[0].seq_id = 9;
  batch[0].tokens = other;
  batch[1].seq_id = 1;
  batch[1].tokens = tokens;
  const std::vector<uint8_t> wanted = {0, 1};
  Capture(batch, target);
  ASSERT_TRUE(ssd->OnTargetPass(batch, wanted, target).ok());

  // Round 1: the prompt and the first sampled token (position 5, not run yet).
  tokens.push_back(15);
  DraftInput in;
  in.seq_id = 1;
  in.tokens = tokens;
  in.num_draft_tokens = kK;
  in.params = &greedy;
  std::vector<Draft> drafts;
  ASSERT_TRUE(ssd->Propose({&in, 1}, &drafts).ok());
  ASSERT_EQ(drafts[0].tokens, kDrafts);
  SpeculateRequest request = peer.LastRequest();
  ASSERT_EQ(request.seqs.size(), 1u);
  EXPECT_TRUE(request.seqs[0].flags & kSeqNew);
  ExpectRows(request, request.seqs[0], 0, 5);

  // Its verification: the last token and the four drafts at positions 5..9; two accepted.
  std::vector<int32_t> chunk = {15};
  chunk.insert(chunk.end(), kDrafts.begin(), kDrafts.end());
  batch.assign(1, SequenceInput{});
  batch[0].seq_id = 1;
  batch[0].start_pos = 5;
  batch[0].tokens = chunk;
  Capture(batch, target);
  ASSERT_TRUE(ssd->OnTargetPass(batch, std::vector<uint8_t>{1}, target).ok());
  const VerifiedRound told{.seq_id = 1,
                           .num_drafts = kK,
                           .num_accepted = 2,
                           .next_token = 30,
                           .scores = {},
                           .num_scored = 0};
  ssd->OnVerified({&told, 1});
  tokens.insert(tokens.end(), {kDrafts[0], kDrafts[1], 30});  // L = 9: positions 0..8

  // Round 2, with a new sequence whose prompt has 7 rows: seq 1 gets positions 5..7 (L - 1 ..
  // L + k - 1 of the chunk at L = 6, k = 2), seq 2 the last 3 of its 7 that fit the budget.
  std::vector<int32_t> prompt2 = {40, 41, 42, 43, 44, 45, 46};
  batch[0].seq_id = 2;
  batch[0].start_pos = 0;
  batch[0].tokens = prompt2;
  Capture(batch, target);
  ASSERT_TRUE(ssd->OnTargetPass(batch, std::vector<uint8_t>{1}, target).ok());
  prompt2.push_back(47);
  std::vector<DraftInput> inputs(2, in);
  inputs[0].tokens = tokens;
  inputs[1].seq_id = 2;
  inputs[1].tokens = prompt2;
  ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
  request = peer.LastRequest();
  ASSERT_EQ(request.seqs.size(), 2u);
  EXPECT_EQ(request.seqs[0].accepted_len, 2);
  ExpectRows(request, request.seqs[0], 5, 3);
  ExpectRows(request, request.seqs[1], 4, kMaxHiddenRows - 3);
  EXPECT_EQ(request.hidden.size(), static_cast<size_t>(kMaxHiddenRows * kWidth));
  EXPECT_EQ(ssd->stats().hidden_rows, 5 + kMaxHiddenRows);

  // Plain decodes of both (their last tokens at positions 8 and 7), one token each: round 3
  // carries those rows alone; seq 2's rows left over the budget are not sent later either.
  batch.assign(2, SequenceInput{});
  batch[0].seq_id = 1;
  batch[0].start_pos = 8;
  batch[0].tokens = std::span<const int32_t>(tokens).subspan(8);
  batch[1].seq_id = 2;
  batch[1].start_pos = 7;
  batch[1].tokens = std::span<const int32_t>(prompt2).subspan(7);
  Capture(batch, target);
  ASSERT_TRUE(ssd->OnTargetPass(batch, std::vector<uint8_t>{1, 1}, target).ok());
  tokens.push_back(31);
  prompt2.push_back(48);
  inputs[0].tokens = tokens;
  inputs[1].tokens = prompt2;
  ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
  request = peer.LastRequest();
  ASSERT_EQ(request.seqs.size(), 2u);
  ExpectRows(request, request.seqs[0], 8, 1);
  ExpectRows(request, request.seqs[1], 7, 1);
}

// A runner that hands over fewer rows than the pass had tokens leaves nothing for that pass; a
// released sequence's rows are gone.
TEST(SsdSpeculatorTest, AShortCaptureStoresNothingAndReleaseDropsTheRows) {
  Verifier v(kWidth);
  ASSERT_NE(v.ssd, nullptr);
  SsdSpeculator* ssd = v.ssd.get();
  ScriptedSpeculator peer;
  PeerThread serving(v, peer);
  ASSERT_TRUE(WaitConnected(*ssd));
  CapturedRowsRunner target;
  SamplingParams greedy;
  greedy.temperature = 0;
  std::vector<int32_t> tokens = {10, 11, 12, 13};
  std::vector<SequenceInput> batch(1);
  batch[0].seq_id = 1;
  batch[0].tokens = tokens;
  Capture(batch, target);
  target.captured.resize(target.captured.size() - kWidth);  // one row short
  ASSERT_TRUE(ssd->OnTargetPass(batch, std::vector<uint8_t>{1}, target).ok());
  batch[0].seq_id = 2;
  Capture(batch, target);
  ASSERT_TRUE(ssd->OnTargetPass(batch, std::vector<uint8_t>{1}, target).ok());
  ssd->Release(2);
  tokens.push_back(14);
  std::vector<DraftInput> inputs(2);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i].seq_id = i + 1;
    inputs[i].tokens = tokens;
    inputs[i].num_draft_tokens = kK;
    inputs[i].params = &greedy;
  }
  std::vector<Draft> drafts;
  ASSERT_TRUE(ssd->Propose(inputs, &drafts).ok());
  const SpeculateRequest request = peer.LastRequest();
  ASSERT_EQ(request.seqs.size(), 2u);
  EXPECT_EQ(request.seqs[0].num_hidden, 0u);
  EXPECT_EQ(request.seqs[1].num_hidden, 0u);
  EXPECT_TRUE(request.hidden.empty());
}

}  // namespace
}  // namespace specd
