// Helpers of the SsdSpeculator tests (ssd_speculator_test.cc, ssd_speculator_rows_test.cc): a
// scripted speculator process over the real TCP link (no draft model), a verifier that lets
// it join, the thread that runs it. Test-only.
#pragma once

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
#include "engine/speculation/ssd/ssd_speculator.h"
#include "gtest/gtest.h"

namespace specd::ssd_speculator_test {

inline constexpr int32_t kVocab = 64;
inline constexpr int32_t kMaxNumSeqs = 4;
inline constexpr int32_t kMaxModelLen = 128;
inline constexpr int32_t kK = 4;
inline const std::vector<int32_t> kDrafts = {5, 6, 7, 8};  // what the scripted speculator proposes

// The stage times every scripted response reports, ns (SsdSpeculatorStage order).
inline constexpr std::array<uint64_t, kNumSsdSpeculatorStages> kStageNs = {1000, 2000, 3000, 4000,
                                                                           5000};

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
inline bool WaitConnected(SsdSpeculator& ssd, int tries = 500) {
  std::vector<Draft> drafts;
  for (int i = 0; i < tries && !ssd.stats().connected; ++i) {
    if (!ssd.Propose({}, &drafts).ok()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ssd.stats().connected;
}

inline const SpeculateSeq* Find(const SpeculateRequest& r, uint64_t seq_id) {
  for (const SpeculateSeq& m : r.seqs) {
    if (m.seq_id == seq_id) return &m;
  }
  return nullptr;
}

// Tells `ssd` (OnVerified) that `accepted` of sequence `seq_id`'s kK drafts were accepted and
// `next_token` came after them.
inline void TellAccepted(SsdSpeculator& ssd, uint64_t seq_id, int32_t accepted,
                         int32_t next_token) {
  const VerifiedRound told{.seq_id = seq_id,
                           .num_drafts = kK,
                           .num_accepted = accepted,
                           .next_token = next_token,
                           .scores = {},
                           .num_scored = 0};
  ssd.OnVerified({&told, 1});
}

}  // namespace specd::ssd_speculator_test
