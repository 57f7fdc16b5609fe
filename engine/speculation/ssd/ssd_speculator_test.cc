// SsdSpeculator against a scripted speculator over the real TCP link (no draft model): the
// outcome it sends for a sequence carries the accepted length the engine told it (OnVerified),
// never one guessed from the committed tokens, and a sequence told nothing reports 0; a sampled
// request's Saguaro C comes from its resolved speculation options, else the default by
// temperature.
#include "engine/speculation/ssd/ssd_speculator.h"

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/distributed/link_auth.h"
#include "engine/distributed/tcp_channel.h"
#include "engine/speculation/saguaro/saguaro.h"
#include "engine/speculation/ssd/ssd_protocol.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kMaxNumSeqs = 4;
constexpr int32_t kMaxModelLen = 128;
constexpr int32_t kK = 4;
const std::vector<int32_t> kDrafts = {5, 6, 7, 8};  // what the scripted speculator proposes

// The speculator process's end: answers every request with kDrafts for each sequence and keeps
// the requests. Serve runs on its own thread until the link closes.
class ScriptedSpeculator {
 public:
  void Serve(uint16_t port, const LinkSecret& secret) {
    Hello hello;
    hello.role = Role::kSpeculator;
    hello.model_fingerprint = SsdFingerprint(kVocab);
    hello.limits = SsdWireLimits(kVocab, kMaxNumSeqs, kMaxModelLen);
    ConnectOptions connect;
    connect.timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<TcpChannel>> channel =
        TcpChannel::Connect("127.0.0.1", port, hello, secret, connect);
    if (!channel.ok()) return;
    Message message;
    Message reply = SpeculateResponse();
    while ((*channel)->Recv(absl::Seconds(30), &message).ok()) {
      if (TypeOf(message) != MessageType::kSpeculateRequest) continue;
      const auto& request = std::get<SpeculateRequest>(message);
      auto& response = std::get<SpeculateResponse>(reply);
      response.Clear();
      response.round_id = request.round_id;
      for (const SpeculateSeq& m : request.seqs) {
        response.AddDraft(m.seq_id, DraftStatus::kMissPrimary, kDrafts, {});
      }
      {
        std::lock_guard lock(mu_);
        requests_.push_back(request);
      }
      if (!(*channel)->Send(reply, absl::Seconds(5)).ok()) return;
    }
  }
  // The last request that carried sequences.
  SpeculateRequest LastRequest() {
    std::lock_guard lock(mu_);
    for (auto it = requests_.rbegin(); it != requests_.rend(); ++it) {
      if (!it->seqs.empty()) return *it;
    }
    return {};
  }

 private:
  std::mutex mu_;
  std::vector<SpeculateRequest> requests_;
};

const SpeculateSeq* Find(const SpeculateRequest& r, uint64_t seq_id) {
  for (const SpeculateSeq& m : r.seqs) {
    if (m.seq_id == seq_id) return &m;
  }
  return nullptr;
}

TEST(SsdSpeculatorTest, SendsTheToldAcceptedLengthAndTheRequestsSaguaroC) {
  absl::StatusOr<LinkSecret> secret = NewLinkSecret();
  ASSERT_TRUE(secret.ok()) << secret.status();
  ASSERT_EQ(setenv(kLinkSecretEnv, LinkSecretToHex(*secret).c_str(), 1), 0);
  absl::StatusOr<SpeculativeConfig> config = ParseSpeculativeConfig(
      R"({"method": "ssd", "model": "unused", "num_speculative_tokens": 4,
          "launch_speculator": false, "speculator_address": "127.0.0.1:0"})");
  ASSERT_TRUE(config.ok()) << config.status();
  SsdSpeculatorOptions o;
  o.config = *config;
  o.vocab_size = kVocab;
  o.max_num_seqs = kMaxNumSeqs;
  o.max_model_len = kMaxModelLen;
  o.startup_timeout = absl::Milliseconds(1);  // the scripted speculator joins afterwards
  absl::StatusOr<std::unique_ptr<SsdSpeculator>> created = SsdSpeculator::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<SsdSpeculator> ssd = *std::move(created);
  unsetenv(kLinkSecretEnv);
  ScriptedSpeculator peer;
  std::thread serving(
      [&, port = static_cast<uint16_t>(ssd->port())] { peer.Serve(port, *secret); });
  struct Joiner {  // the verifier's Shutdown ends Serve, also after a failed assertion
    std::unique_ptr<SsdSpeculator>* ssd;
    std::thread* serving;
    ~Joiner() {
      ssd->reset();
      serving->join();
    }
  } joiner{&ssd, &serving};
  std::vector<Draft> drafts;
  for (int i = 0; i < 500 && !ssd->stats().connected; ++i) {  // the acceptor admits it
    ASSERT_TRUE(ssd->Propose({}, &drafts).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(ssd->stats().connected);
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

}  // namespace
}  // namespace specd
