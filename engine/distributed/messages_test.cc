// Wire format tests: every message type round-trips; the header layout is explicit little-endian;
// decoding rejects truncated, corrupted, oversized and wrong-version frames with errors naming
// the field; a seeded random-corruption loop never crashes and never accepts what the encoder
// would refuse; steady-state encoding does not allocate.
#include "engine/distributed/messages.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "engine/distributed/distributed_test_util.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using distributed_test::AllSampleMessages;
using distributed_test::Encode;
using distributed_test::MakeRequest;
using distributed_test::MakeResponse;
using distributed_test::Reseal;
using distributed_test::TestLimits;

absl::Status DecodeStatus(const std::vector<uint8_t>& frame, const WireLimits& limits) {
  Message out;
  return DecodeFrame(frame, limits, &out).status();
}

TEST(Crc32cTest, MatchesPublishedVectorsAndContinues) {
  const std::string digits = "123456789";
  const auto bytes = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  EXPECT_EQ(Crc32c(bytes(digits)), 0xE3069283u);                   // the CRC-32C check value
  EXPECT_EQ(Crc32c(bytes(std::string(32, '\0'))), 0x8A9136AAu);    // RFC 3720 B.4
  EXPECT_EQ(Crc32c(bytes(std::string(32, '\xff'))), 0x62A8AB43u);  // RFC 3720 B.4
  std::vector<uint8_t> data(1000);
  std::mt19937 rng(7);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const std::span<const uint8_t> all(data);
  EXPECT_EQ(Crc32c(all), Crc32c(all.subspan(333), Crc32c(all.first(333))));
}

TEST(MessagesTest, RoundTripsEveryMessageType) {
  const WireLimits limits = TestLimits();
  const std::vector<Message> samples = AllSampleMessages();
  ASSERT_EQ(samples.size(), std::variant_size_v<Message>);
  for (size_t i = 0; i < samples.size(); ++i) {
    SCOPED_TRACE(MessageTypeName(TypeOf(samples[i])));
    const std::vector<uint8_t> frame = Encode(samples[i], 40 + i, limits);
    Message decoded;
    absl::StatusOr<FrameHeader> header = DecodeFrame(frame, limits, &decoded);
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->type, TypeOf(samples[i]));
    EXPECT_EQ(header->sequence, 40 + i);
    EXPECT_EQ(header->payload_bytes, frame.size() - kFrameHeaderBytes);
    EXPECT_EQ(decoded, samples[i]);
  }
}

TEST(MessagesTest, OutOfBandRowsAreCountedButNotCarried) {
  const WireLimits limits = TestLimits();
  SpeculateResponse r;
  r.probs_out_of_band = true;
  r.AddDraft(1, DraftStatus::kMissPrimary, {{3, 4, 5}}, {}, /*has_probs=*/true);
  r.AddDraft(2, DraftStatus::kHit, {{6}}, {});
  const std::vector<uint8_t> frame = Encode(r, 0, limits);
  Message out;
  ASSERT_TRUE(DecodeFrame(frame, limits, &out).ok());
  const auto& decoded = std::get<SpeculateResponse>(out);
  EXPECT_EQ(decoded, r);
  EXPECT_EQ(decoded.NumProbRows(), 3u);
  EXPECT_TRUE(decoded.ProbsOf(decoded.drafts[0], limits.vocab_size).empty());
  // Fixed: 29 bytes, then 4 stage times (version 5); no rows inline.
  EXPECT_EQ(frame.size(), kFrameHeaderBytes + 29 + 4 * 8 + 2 * 12 + 4 * 4);
}

TEST(MessagesTest, HeaderIsExplicitLittleEndian) {
  const std::vector<uint8_t> frame =
      Encode(Heartbeat{.sent_unix_ns = 0x0102030405060708}, 0x1122, TestLimits());
  ASSERT_EQ(frame.size(), kFrameHeaderBytes + 8);
  EXPECT_EQ(std::string(frame.begin(), frame.begin() + 4), "SPCD");
  EXPECT_EQ(frame[4], kProtocolVersion);
  EXPECT_EQ(frame[5], 0);
  EXPECT_EQ(frame[6], static_cast<uint8_t>(MessageType::kHeartbeat));
  EXPECT_EQ(frame[8], 0x22);
  EXPECT_EQ(frame[9], 0x11);
  EXPECT_EQ(frame[16], 8);     // payload bytes
  EXPECT_EQ(frame[24], 0x08);  // payload, least significant byte first
  EXPECT_EQ(frame[31], 0x01);
}

TEST(MessagesTest, DecodingReusesTheMessageStorage) {
  const WireLimits limits = TestLimits();
  SpeculateResponse big = MakeResponse(MakeRequest(3, limits), limits);
  const std::vector<uint8_t> frame = Encode(big, 0, limits);
  Message out;
  ASSERT_TRUE(DecodeFrame(frame, limits, &out).ok());
  const SpeculateResponse& r = std::get<SpeculateResponse>(out);
  const void* tokens = r.tokens.data();
  const void* probs = r.probs.data();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(DecodeFrame(frame, limits, &out).ok());
  EXPECT_EQ(std::get<SpeculateResponse>(out).tokens.data(), tokens);
  EXPECT_EQ(std::get<SpeculateResponse>(out).probs.data(), probs);
}

TEST(MessagesTest, EncodingDoesNotAllocateOnceReserved) {
  const WireLimits limits = TestLimits();
  FrameBuffer buffer(limits.MaxFrameBytes());
  const uint8_t* storage = buffer.data();
  for (uint64_t round = 0; round < 200; ++round) {
    const SpeculateRequest request = MakeRequest(round, limits);
    ASSERT_TRUE(EncodeFrame(request, round, limits, &buffer).ok());
    ASSERT_TRUE(EncodeFrame(MakeResponse(request, limits), round, limits, &buffer).ok());
  }
  EXPECT_EQ(buffer.data(), storage);
  EXPECT_EQ(buffer.Capacity(), limits.MaxFrameBytes());
}

TEST(MessagesTest, SteadyStateEncodeAndDecodeDoNotAllocate) {
  const WireLimits limits = TestLimits();
  std::vector<SpeculateRequest> requests;
  std::vector<SpeculateResponse> responses;
  for (uint64_t round = 0; round < 40; ++round) {
    requests.push_back(MakeRequest(round, limits));
    responses.push_back(MakeResponse(requests.back(), limits));
  }
  FrameBuffer buffer(limits.MaxFrameBytes());
  Message request_in;
  Message response_in;
  bool all_ok = true;
  int64_t allocations = -1;
  for (int pass = 0; pass < 2; ++pass) {  // the first pass grows the decoded messages' vectors
    const int64_t before = distributed_test::AllocationCount();
    for (size_t i = 0; i < requests.size(); ++i) {
      all_ok &= EncodeFrame(requests[i], i, limits, &buffer).ok();
      all_ok &= DecodeFrame(buffer.bytes(), limits, &request_in).ok();
      all_ok &= EncodeFrame(responses[i], i, limits, &buffer).ok();
      all_ok &= DecodeFrame(buffer.bytes(), limits, &response_in).ok();
    }
    allocations = distributed_test::AllocationCount() - before;
  }
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(allocations, 0);
  EXPECT_EQ(std::get<SpeculateResponse>(response_in), responses.back());
}

TEST(MessagesTest, RejectsEveryTruncation) {
  const WireLimits limits = TestLimits();
  for (const Message& sample : AllSampleMessages()) {
    const std::vector<uint8_t> frame = Encode(sample, 0, limits);
    for (size_t len = 0; len < frame.size(); ++len) {
      std::vector<uint8_t> cut(frame.begin(), frame.begin() + len);
      EXPECT_FALSE(DecodeStatus(cut, limits).ok()) << len;
      if (len < kFrameHeaderBytes) continue;
      // Re-sealed (header and checksum agree with the cut payload): the fields must catch it.
      Reseal(&cut);
      const absl::Status status = DecodeStatus(cut, limits);
      EXPECT_FALSE(status.ok()) << MessageTypeName(TypeOf(sample)) << " cut at " << len;
    }
  }
}

TEST(MessagesTest, TruncatedFieldIsNamed) {
  const WireLimits limits = TestLimits();
  std::vector<uint8_t> frame = Encode(MakeRequest(5, limits), 0, limits);
  // round_id, window_ns, num_seqs, 3 bytes of seqs[0].seq_id
  frame.resize(kFrameHeaderBytes + 8 + 8 + 4 + 3);
  Reseal(&frame);
  const absl::Status status = DecodeStatus(frame, limits);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "SpeculateRequest.seqs[0].seq_id: truncated"))
      << status;
}

TEST(MessagesTest, RejectsWrongVersionNamingBoth) {
  const WireLimits limits = TestLimits();
  std::vector<uint8_t> frame = Encode(MakeRequest(1, limits), 0, limits);
  frame[4] = static_cast<uint8_t>(kProtocolVersion + 1);
  const absl::Status status = DecodeStatus(frame, limits);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), absl::StrCat("protocol version ", kProtocolVersion + 1)))
      << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), absl::StrCat("speaks version ", kProtocolVersion)))
      << status;
}

// Version 1 peers send no nonce and no proof: their Hello and HelloAck still decode (so the
// refusal can name the versions); a nonce or proof longer than its limit is refused.
TEST(MessagesTest, HandshakeFieldsOfVersionOneAndOverlongOnes) {
  const WireLimits limits = TestLimits();
  Hello v1 = distributed_test::MakeHello(Role::kSpeculator);
  v1.protocol_version = 1;
  Message out;
  ASSERT_TRUE(DecodeFrame(Encode(v1, 0, limits), limits, &out).ok());
  EXPECT_EQ(std::get<Hello>(out), v1);
  std::vector<uint8_t> ack =
      Encode(HelloAck{.accepted = false, .reason = "old", .proof = {}}, 0, limits);
  ack.resize(ack.size() - 2);  // a version-1 HelloAck ends after its reason
  Reseal(&ack);
  EXPECT_FALSE(DecodeFrame(ack, limits, &out).ok()) << "version 2 needs the proof field";
  ack[4] = 1;
  ASSERT_TRUE(DecodeFrame(ack, limits, &out).ok());
  EXPECT_EQ(std::get<HelloAck>(out).reason, "old");
  Hello long_nonce = distributed_test::MakeHello(Role::kSpeculator);
  long_nonce.nonce.assign(kHelloNonceBytes + 1, 1);
  FrameBuffer buffer;
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeFrame(long_nonce, 0, limits, &buffer)));
  std::vector<uint8_t> frame = Encode(HelloAuth{.proof = std::vector<uint8_t>(32, 1)}, 0, limits);
  frame[kFrameHeaderBytes] = 200;  // the proof's length
  Reseal(&frame);
  const absl::Status status = DecodeStatus(frame, limits);
  EXPECT_TRUE(absl::StrContains(status.message(), "HelloAuth.proof: length 200 > limit 64"))
      << status;
}

TEST(MessagesTest, HelloOfALaterVersionStillDecodes) {
  const WireLimits limits = TestLimits();
  Hello hello = distributed_test::MakeHello(Role::kSpeculator);
  hello.protocol_version = kProtocolVersion + 1;
  std::vector<uint8_t> frame = Encode(hello, 0, limits);
  EXPECT_EQ(frame[4], kProtocolVersion + 1);
  // A later version may append fields to its Hello.
  frame.insert(frame.end(), {1, 2, 3, 4});
  Reseal(&frame);
  Message out;
  ASSERT_TRUE(DecodeFrame(frame, limits, &out).ok());
  EXPECT_EQ(std::get<Hello>(out), hello);
  EXPECT_TRUE(absl::StrContains(HelloMismatch(distributed_test::MakeHello(Role::kVerifier), hello),
                                "protocol version mismatch"));
}

TEST(MessagesTest, RejectsLengthsOverTheReceiversLimits) {
  WireLimits big = TestLimits();
  big.max_batch = 64;
  big.max_draft_tokens = 32;
  big.max_seq_tokens = big.max_request_tokens = 4096;
  const WireLimits small = TestLimits();
  SpeculateRequest request = MakeRequest(0, big);
  while (request.seqs.size() <= small.max_batch) request.AddSeq(request.seqs[0], {{1, 2}});
  absl::Status status = DecodeStatus(Encode(request, 0, big), small);
  EXPECT_TRUE(absl::StrContains(status.message(), "SpeculateRequest.num_seqs: 9 > max_batch 8"))
      << status;

  SpeculateRequest long_prompt;
  SpeculateSeq prompt_seq;
  prompt_seq.seq_id = 1;
  prompt_seq.flags = kSeqNew;
  long_prompt.AddSeq(prompt_seq, std::vector<int32_t>(small.max_seq_tokens + 1, 3));
  status = DecodeStatus(Encode(long_prompt, 0, big), small);
  EXPECT_TRUE(absl::StrContains(status.message(), "seqs[0].num_tokens: 65 > max_seq_tokens 64"))
      << status;

  SpeculateResponse long_draft;
  long_draft.AddDraft(9, DraftStatus::kHit, std::vector<int32_t>(small.max_draft_tokens + 1, 4),
                      {});
  status = DecodeStatus(Encode(long_draft, 0, big), small);
  EXPECT_TRUE(absl::StrContains(status.message(), "drafts[0].num_tokens: 7 > max_draft_tokens 6"))
      << status;

  std::vector<uint8_t> huge = Encode(Heartbeat{}, 0, small);
  huge[16] = 9;  // payload_bytes 9 > 8 for a Heartbeat
  status = DecodeStatus(huge, small);
  EXPECT_TRUE(absl::StrContains(status.message(), "payload_bytes 9 > limit 8")) << status;
}

// Target hidden states (an EAGLE-3 head in the speculator, version 8): a request over
// max_hidden_rows, or whose rows run past max_seq_tokens, is refused naming the field; the
// encoder refuses rows out of range of SpeculateRequest::hidden.
TEST(MessagesTest, HiddenRowsAreBoundedByTheLimits) {
  const WireLimits small = TestLimits();
  WireLimits big = small;
  big.max_hidden_rows = 200;
  SpeculateRequest r;
  SpeculateSeq s;
  s.seq_id = 3;
  s.flags = kSeqNew;
  const std::vector<float> rows(size_t{small.max_hidden_rows + 1} * small.hidden_width, 0.5f);
  r.AddHidden(r.AddSeq(s, std::vector<int32_t>(small.max_hidden_rows + 2, 1)), 0, rows,
              small.hidden_width);
  ASSERT_EQ(r.seqs[0].num_hidden, small.max_hidden_rows + 1);
  absl::Status status = DecodeStatus(Encode(r, 0, big), small);
  EXPECT_TRUE(absl::StrContains(status.message(), "num_hidden: request total > max_hidden_rows 40"))
      << status;
  r.Clear();
  r.AddHidden(r.AddSeq(s, {{1, 2, 3}}), small.max_seq_tokens - 1,
              std::span<const float>(rows).first(2 * small.hidden_width), small.hidden_width);
  status = DecodeStatus(Encode(r, 0, big), small);
  EXPECT_TRUE(absl::StrContains(status.message(), "hidden_position: 63 + 2 > max_seq_tokens 64"))
      << status;
  FrameBuffer buffer;
  r.Clear();
  r.AddHidden(r.AddSeq(s, {{1, 2, 3}}), 0, std::span<const float>(rows).first(6),
              small.hidden_width);
  r.hidden.resize(3);  // one row of the two
  status = EncodeFrame(r, 0, small, &buffer);
  EXPECT_TRUE(absl::StrContains(status.message(), "hidden_offset: rows out of range")) << status;
  // Both limits or neither.
  WireLimits half = small;
  half.max_hidden_rows = 0;
  EXPECT_FALSE(half.Validate().ok());
}

// Version 9: on the device data path the hidden rows travel on the NCCL link; the frame carries
// each sequence's position and count, its rows' place in the bulk transfer follows the
// sequences' order, and inline rows beside the flag are refused.
TEST(MessagesTest, OutOfBandHiddenRowsCarryCountsOnly) {
  const WireLimits limits = TestLimits();
  SpeculateRequest r;
  r.hidden_out_of_band = true;
  SpeculateSeq s;
  s.seq_id = 3;
  s.flags = kSeqNew;
  r.AddHiddenOutOfBand(r.AddSeq(s, {{1, 2, 3, 4}}), 0, 3, limits.hidden_width);
  s.seq_id = 4;
  r.AddSeq(s, {{5}});  // no rows
  s.seq_id = 5;
  r.AddHiddenOutOfBand(r.AddSeq(s, {{6, 7}}), 9, 1, limits.hidden_width);
  EXPECT_EQ(r.NumHiddenRows(), 4u);
  EXPECT_EQ(r.seqs[2].hidden_offset, 3u * limits.hidden_width);
  EXPECT_TRUE(r.HiddenOf(r.seqs[0], limits.hidden_width).empty());
  const std::vector<uint8_t> frame = Encode(r, 0, limits);
  Message decoded;
  ASSERT_TRUE(DecodeFrame(frame, limits, &decoded).ok());
  ASSERT_TRUE(std::holds_alternative<SpeculateRequest>(decoded));
  EXPECT_EQ(std::get<SpeculateRequest>(decoded), r);
  FrameBuffer buffer;
  r.hidden.assign(limits.hidden_width, 0.5f);
  absl::Status status = EncodeFrame(r, 0, limits, &buffer);
  EXPECT_TRUE(absl::StrContains(status.message(), "inline rows with hidden_out_of_band")) << status;
  r.hidden.clear();
  r.seqs[2].hidden_offset = 0;
  status = EncodeFrame(r, 0, limits, &buffer);
  EXPECT_TRUE(absl::StrContains(status.message(), "not in the sequences' order")) << status;
}

// Version 10: a cache offer's branches are checked as drafts are (token ids, K) and bounded per
// offer; links without a speculation cache (the handshake's, tensor parallelism's) carry none.
// A request whose every sequence took an offer wants no response.
TEST(MessagesTest, CacheOffersAreCheckedAndBounded) {
  const WireLimits limits = TestLimits();
  FrameBuffer buffer;
  const auto error_of = [&](const CacheOffer& o) {
    return std::string(EncodeFrame(o, 0, limits, &buffer).message());
  };
  CacheOffer o = distributed_test::MakeOffer();
  EXPECT_EQ(error_of(o), "");
  o.drafts[1].bonus = static_cast<int32_t>(limits.vocab_size);
  EXPECT_TRUE(absl::StrContains(error_of(o), "CacheOffer.drafts[1].bonus: token 0 is 50"))
      << error_of(o);
  o = distributed_test::MakeOffer();
  o.drafts[0].accepted_len = static_cast<uint16_t>(limits.max_draft_tokens + 1);
  EXPECT_TRUE(absl::StrContains(error_of(o), "drafts[0].accepted_len: 7 > max_draft_tokens 6"))
      << error_of(o);
  o = distributed_test::MakeOffer();
  o.AddDraft(9, 0, 1, std::vector<int32_t>(limits.max_draft_tokens + 1, 2));
  EXPECT_TRUE(absl::StrContains(error_of(o), "drafts[3].num_tokens")) << error_of(o);
  o = distributed_test::MakeOffer();
  o.tokens[o.drafts[2].token_offset] = -1;
  EXPECT_TRUE(absl::StrContains(error_of(o), "drafts[2].tokens: token 0 is -1")) << error_of(o);
  o.Clear();
  for (uint32_t i = 0; i <= kMaxOfferDrafts; ++i) o.AddDraft(i, 0, 1, std::vector<int32_t>{2});
  EXPECT_TRUE(absl::StrContains(error_of(o), "num_drafts: 1025 > limit 1024")) << error_of(o);
  // A tensor-parallel link has no speculation cache: not even one branch fits its frames.
  EXPECT_EQ(CacheOffer::MaxDrafts(TpWireLimits()), 0u);
  EXPECT_FALSE(EncodeFrame(distributed_test::MakeOffer(), 0, TpWireLimits(), &buffer).ok());
  const std::vector<uint8_t> frame = Encode(distributed_test::MakeOffer(), 0, limits);
  EXPECT_FALSE(DecodeStatus(frame, TpWireLimits()).ok());

  SpeculateRequest r;
  EXPECT_TRUE(r.WantsResponse()) << "an empty request is answered";
  SpeculateSeq s;
  s.seq_id = 1;
  s.flags = kSeqOfferHit;
  r.AddSeq(s, {{4}});
  s.seq_id = 2;
  r.AddSeq(s, {{5}});
  EXPECT_FALSE(r.WantsResponse());
  r.seqs[1].flags = 0;
  EXPECT_TRUE(r.WantsResponse()) << "one sequence asks: the request is answered";
}

TEST(MessagesTest, EncoderRefusesBadFieldsNamingThem) {
  const WireLimits limits = TestLimits();
  FrameBuffer buffer;
  const auto error_of = [&](const SpeculateRequest& r) {
    return std::string(EncodeFrame(r, 0, limits, &buffer).message());
  };
  SpeculateRequest r = MakeRequest(2, limits);
  r.seqs[1].sampling.top_p = 0.0f;
  EXPECT_TRUE(absl::StrContains(error_of(r), "SpeculateRequest.seqs[1].top_p")) << error_of(r);
  r = MakeRequest(2, limits);
  r.seqs[0].sampling.temperature = std::nanf("");
  EXPECT_TRUE(absl::StrContains(error_of(r), "seqs[0].temperature")) << error_of(r);
  r = MakeRequest(2, limits);
  r.seqs[1].flags |= 0x80;
  EXPECT_TRUE(absl::StrContains(error_of(r), "seqs[1].flags: unknown bits 0x80")) << error_of(r);
  r = MakeRequest(2, limits);
  r.tokens[r.seqs[1].token_offset] = static_cast<int32_t>(limits.vocab_size);
  EXPECT_TRUE(absl::StrContains(error_of(r), "seqs[1].tokens: token 0 is 50")) << error_of(r);
  r = MakeRequest(2, limits);
  r.seqs[0].saguaro_c = 1.5f;
  EXPECT_TRUE(absl::StrContains(error_of(r), "seqs[0].saguaro_c")) << error_of(r);
}

TEST(MessagesTest, RejectsBadMagicAndChecksumAsDataLoss) {
  const WireLimits limits = TestLimits();
  std::vector<uint8_t> frame = Encode(MakeRequest(4, limits), 0, limits);
  std::vector<uint8_t> flipped = frame;
  flipped[kFrameHeaderBytes + 5] ^= 0x10;
  absl::Status status = DecodeStatus(flipped, limits);
  EXPECT_TRUE(absl::IsDataLoss(status) && absl::StrContains(status.message(), "checksum"))
      << status;
  frame[0] = 'X';
  status = DecodeStatus(frame, limits);
  EXPECT_TRUE(absl::IsDataLoss(status) && absl::StrContains(status.message(), "bad magic"))
      << status;
}

// Random byte flips, overwrites, truncations and extensions, half of them re-sealed so the
// field checks (not only the checksum) see them. Nothing may crash or hang, and whatever the
// decoder accepts must be a message the encoder accepts too.
TEST(MessagesTest, RandomCorruptionsNeverCrashOrSlipThrough) {
  const WireLimits limits = TestLimits();
  const std::vector<Message> samples = AllSampleMessages();
  std::vector<std::vector<uint8_t>> frames;
  for (const Message& m : samples) frames.push_back(Encode(m, 0, limits));
  std::mt19937_64 rng(20240611);
  FrameBuffer reencoded;
  Message out;
  int accepted = 0;
  constexpr int kIterations = 200000;
  for (int it = 0; it < kIterations; ++it) {
    std::vector<uint8_t> frame = frames[rng() % frames.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % frame.size();
      switch (rng() % 5) {
        case 0:
          frame[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        case 1:
          frame[at] = static_cast<uint8_t>(rng());
          break;
        case 2:
          frame[at] = (rng() % 2) ? 0xFF : 0x00;
          break;
        case 3:
          frame.resize(std::max<size_t>(1, at));
          break;
        case 4:
          frame.insert(frame.begin() + at, static_cast<uint8_t>(rng()));
          break;
      }
    }
    if (rng() % 2 && frame.size() >= kFrameHeaderBytes) Reseal(&frame);
    absl::StatusOr<FrameHeader> header = DecodeFrame(frame, limits, &out);
    if (!header.ok()) {
      ASSERT_FALSE(header.status().message().empty());
      continue;
    }
    ++accepted;
    ASSERT_TRUE(EncodeFrame(out, header->sequence, limits, &reencoded).ok())
        << "decoder accepted what the encoder refuses: " << EncodeFrame(out, 0, limits, &reencoded);
  }
  std::printf("%d of %d corrupted frames decoded (harmless edits)\n", accepted, kIterations);
  // Some edits are harmless (a token id within range, a float): the loop exercises both paths.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kIterations / 2);
}

TEST(WireLimitsTest, RejectsLimitsAllowingFramesOver4GiB) {
  WireLimits limits = TestLimits();
  EXPECT_TRUE(limits.Validate().ok());
  limits.vocab_size = 152064;
  limits.max_prob_rows = 256 * 32;  // 8192 rows x 152064 x 4 bytes = 5 GB
  const absl::Status status = limits.Validate();
  EXPECT_TRUE(absl::IsInvalidArgument(status) && absl::StrContains(status.message(), "4 GiB"))
      << status;
}

TEST(HelloMismatchTest, NamesTheFirstDifference) {
  const Hello verifier = distributed_test::MakeHello(Role::kVerifier);
  Hello speculator = distributed_test::MakeHello(Role::kSpeculator);
  EXPECT_EQ(HelloMismatch(verifier, speculator), "");
  EXPECT_EQ(HelloMismatch(speculator, verifier), "");
  EXPECT_TRUE(absl::StrContains(HelloMismatch(verifier, verifier), "both ends are verifiers"));
  speculator.limits.max_batch = 4;
  EXPECT_EQ(HelloMismatch(verifier, speculator),
            "limits.max_batch differs: verifier 8, speculator 4");
  speculator = distributed_test::MakeHello(Role::kSpeculator);
  speculator.model_fingerprint = "other";
  EXPECT_TRUE(absl::StrContains(HelloMismatch(verifier, speculator), "fingerprint mismatch"));
}

}  // namespace
}  // namespace specd
