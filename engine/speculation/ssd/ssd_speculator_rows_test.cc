// SsdSpeculator against the scripted speculator (ssd_speculator_test_util.h), what its requests
// carry beyond the outcomes: cache offers (wire version 10: a round whose outcomes were offered
// takes the offered drafts and waits for nothing), and an EAGLE-3 head's hidden states of the
// committed positions.
#include <span>
#include <vector>

#include "engine/speculation/ssd/ssd_speculator.h"
#include "engine/speculation/ssd/ssd_speculator_test_util.h"
#include "gtest/gtest.h"

namespace specd::ssd_speculator_test {
namespace {

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
      TellAccepted(*ssd, i + 1, accepted, fresh.back());
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
  TellAccepted(*ssd, 1, 2, 30);
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
}  // namespace specd::ssd_speculator_test
